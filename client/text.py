"""Token events to text a caller can show as it comes.

``TextStreamer`` turns the loop's events into text deltas that never need taking
back: it holds text that may still change (an unfinished UTF-8 sequence, the
start of what could be a stop string, and, when asked, provisional offline
tokens that a rollback may drop) until it is settled.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .commit import first_stop
from .generation import LinkEvent, RetractEvent, TokenEvent, TokenOrigin


class TextStreamer:
    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = (), hold_offline: bool = True):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.hold_offline = hold_offline  # True under `rollback`: offline tokens may still be dropped
        self.tokens: list[int] = []
        self.origins: list[TokenOrigin] = []
        self.shown = ""  # text already handed out

    def _settled_tokens(self) -> int:
        n = len(self.tokens)
        if self.hold_offline:
            while n and self.origins[n - 1] is TokenOrigin.OFFLINE:
                n -= 1
        return n

    def _text(self, final: bool) -> str:
        text = self.decode(self.tokens if final else self.tokens[: self._settled_tokens()])
        cut = first_stop(text, self.stops)
        if cut is not None:
            return text[:cut]
        if final:
            return text
        text = text.rstrip("\ufffd")  # an unfinished multi-byte character
        hold = max((len(s) - 1 for s in self.stops), default=0)
        return text[: len(text) - hold] if hold else text

    def _delta(self, final: bool) -> str:
        text = self._text(final)
        if not text.startswith(self.shown):  # cannot happen for settled text; show what is new and go on
            common = len(next((self.shown[:i] for i in range(len(self.shown), -1, -1)
                               if text.startswith(self.shown[:i])), ""))
            self.shown = self.shown[:common]
        delta = text[len(self.shown):]
        self.shown = text if len(text) >= len(self.shown) else self.shown
        return delta

    def feed(self, event) -> str:
        """Text newly settled by this event ('' if none)."""
        if isinstance(event, TokenEvent):
            self.tokens.append(event.token)
            self.origins.append(event.origin)
        elif isinstance(event, RetractEvent):
            del self.tokens[event.index:]
            del self.origins[event.index:]
            return ""
        elif isinstance(event, LinkEvent):
            return ""
        return self._delta(final=False)

    def finish(self) -> str:
        """The rest of the text once the generation ended."""
        return self._delta(final=True)
