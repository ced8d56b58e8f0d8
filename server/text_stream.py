"""TextStream: token ids in, text deltas out, for streaming APIs.

Two things make this more than ``decode(token)``: a token may end in the middle
of a UTF-8 character (the text then ends in U+FFFD until the next token), and a
stop string may arrive split over tokens, so text that could be the start of a
stop string is held back until it is known not to be one.
"""
from __future__ import annotations

from typing import Sequence


class TextStream:
    def __init__(self, tokenizer, stop: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.emitted = 0  # characters of the text already handed out
        self.stopped = False  # a stop string was reached; the text ends before it

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, token: int) -> str:
        """Add a token; return the text that is now safe to emit (possibly empty)."""
        if self.stopped:
            return ""
        self.ids.append(token)
        text = self.text()
        cut = self._stop_index(text)
        if cut is not None:
            self.stopped = True
            return self._emit(text[:cut])
        if text.endswith("\ufffd"):
            return ""  # an unfinished UTF-8 character
        return self._emit(text[:len(text) - self._held_back(text)])

    def finish(self) -> str:
        """The rest of the text once generation ends."""
        if self.stopped:
            return ""
        return self._emit(self.text())

    def _emit(self, upto: str) -> str:
        delta = upto[self.emitted:]
        self.emitted = max(self.emitted, len(upto))
        return delta

    def _stop_index(self, text: str) -> int | None:
        hits = [i for i in (text.find(s, max(0, self.emitted - len(s))) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _held_back(self, text: str) -> int:
        """Length of the longest tail of text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
