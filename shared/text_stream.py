"""Token ids in, text out, for streaming APIs: incremental decoding and stop strings.

Both OpenAI-compatible APIs (the server's plain API and the client's local one)
turn generated token ids into text deltas that never need taking back:

- ``IncrementalDecoder`` decodes only a short window of recent tokens per step
  (as Text Generation Inference does), so a token costs the same at the end of a
  long answer as at its start; a character split over byte tokens is held back
  until it is whole.
- ``StopMatcher`` finds stop strings with an Aho-Corasick automaton fed only
  the new characters, so a step costs the same for one stop string as for a
  thousand. The automaton's depth is also how much text to hold back: the
  longest tail that could still grow into a stop string.
- ``TextStream`` joins the two.

Where stop strings overlap inside one step, the text is cut at the earliest
start among the stops that appeared (what ``str.find`` over the whole text
would say), so streamed and whole answers are cut at the same place.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

Decode = Callable[[Sequence[int]], str]

# A window whose text has ended in U+FFFD for this many tokens holds invalid bytes, not
# a character in progress (UTF-8 needs at most 4 bytes): it is settled up to its last
# PARTIAL_CHAR_TOKENS tokens, which may still start a character.
MAX_UNFINISHED_TOKENS = 8
PARTIAL_CHAR_TOKENS = 3


class IncrementalDecoder:
    """The window's ids already shown (``ids[prefix:read]``) are decoded again with the new ids as
    context, because a tokenizer may render a token differently after its neighbour (a leading space,
    a merged byte)."""

    def __init__(self, decode: Decode):
        self.decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # start of the window
        self._read = 0  # ids before this are settled (their text is final)
        self._shown = 0  # characters of the window's text already handed out

    def push(self, token: int) -> str:
        """Add a token; return the text it settles ('' while a character is unfinished)."""
        self.ids.append(token)
        text = self.decode(self.ids[self._prefix:])
        if not text.endswith("\ufffd"):
            return self._settle(len(self.ids), text)
        if len(self.ids) - self._read < MAX_UNFINISHED_TOKENS:
            return ""
        return self._settle(len(self.ids) - PARTIAL_CHAR_TOKENS)

    def _settle(self, upto: int, text: str | None = None) -> str:
        """ids[:upto] are final: hand out their text (the window's decoded text, if known) and slide the window."""
        if text is None:
            text = self.decode(self.ids[self._prefix:upto])
        delta = text[self._shown:]
        self._prefix, self._read = self._read, upto
        self._shown = len(self.decode(self.ids[self._prefix:self._read]))
        return delta

    def finish(self) -> str:
        """The text not handed out yet (an unfinished character included, as U+FFFD)."""
        text = self.decode(self.ids[self._prefix:])
        delta = text[self._shown:]
        self._shown = len(text)
        return delta


@dataclass
class _Automaton:
    """Aho-Corasick over the stop strings. State 0 is the root; a state is a prefix of some stop."""

    goto: list[dict[str, int]] = field(default_factory=lambda: [{}])
    fail: list[int] = field(default_factory=lambda: [0])
    depth: list[int] = field(default_factory=lambda: [0])  # length of the state's prefix
    longest: list[int] = field(default_factory=lambda: [0])  # longest stop that ends the state's prefix; 0 = none

    @classmethod
    def build(cls, stops: Sequence[str]) -> "_Automaton":
        a = cls()
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = a.goto[state].get(ch)
                if nxt is None:
                    nxt = len(a.goto)
                    a.goto[state][ch] = nxt
                    a.goto.append({})
                    a.fail.append(0)
                    a.depth.append(a.depth[state] + 1)
                    a.longest.append(0)
                state = nxt
            a.longest[state] = len(stop)
        # Breadth first, so a state's failure link (a shorter state) is final before the state's children.
        queue = list(a.goto[0].values())
        for state in queue:
            for ch, child in a.goto[state].items():
                f = a.fail[state]
                while f and ch not in a.goto[f]:
                    f = a.fail[f]
                target = a.goto[f].get(ch, 0)
                a.fail[child] = target if target != child else 0
                a.longest[child] = a.longest[child] or a.longest[a.fail[child]]
                queue.append(child)
        return a

    def step(self, state: int, ch: str) -> int:
        while state and ch not in self.goto[state]:
            state = self.fail[state]
        return self.goto[state].get(ch, 0)


class StopMatcher:
    """Text in, text safe to show out; stops at the first stop string, which is not shown."""

    def __init__(self, stops: Sequence[str] = ()):
        self._automaton = _Automaton.build([s for s in stops if s])
        self._state = 0
        self._held = ""  # text seen but not shown: it may be the start of a stop string
        self.stopped = False  # a stop string was reached; nothing more is shown

    def feed(self, text: str, armed: bool = True) -> str:
        """Add text; return what is now safe to show. A stop string that ends in text fed unarmed does not stop
        (vLLM's min_tokens: stop strings count from there on)."""
        if self.stopped or not text:
            return ""
        a, state = self._automaton, self._state
        base = len(self._held)  # index of text[0] in held + text
        cut = None  # earliest start of a stop ending in this text, in held + text
        for i, ch in enumerate(text):
            state = a.step(state, ch)
            if a.longest[state] and armed:
                start = base + i + 1 - a.longest[state]
                cut = start if cut is None else min(cut, start)
        buffered = self._held + text
        if cut is not None:
            self.stopped, self._held = True, ""
            return buffered[:cut]
        self._state = state
        keep = a.depth[state]
        self._held = buffered[len(buffered) - keep:] if keep else ""
        return buffered[:len(buffered) - keep]

    def finish(self) -> str:
        """The held text, once no more text will come (it did not become a stop string)."""
        held, self._held = ("" if self.stopped else self._held), ""
        return held


class TextStream:
    """Generated token ids in, text deltas out: incremental decoding, then stop strings."""

    def __init__(self, decode: Decode, stops: Sequence[str] = (), min_tokens: int = 0):
        self._decoder = IncrementalDecoder(decode)
        self._stops = StopMatcher(stops)
        self._min_tokens = min_tokens  # stop strings end the text once this many tokens came (vLLM's min_tokens)
        self._count = 0

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def push(self, token: int) -> str:
        """Add a token; return the text that is now safe to show (possibly '')."""
        if self.stopped:
            return ""
        self._count += 1
        return self._stops.feed(self._decoder.push(token), armed=self._count >= self._min_tokens)

    def finish(self) -> str:
        """The rest of the text once generation ends."""
        if self.stopped:
            return ""
        return self._stops.feed(self._decoder.finish()) + self._stops.finish()
