"""The generation loop's events to tokens and text a caller can show as they come.

``SettledTokens`` passes on the tokens that will not be taken back: under the
``rollback`` policy, offline tokens wait until the target has judged them (a
Resume may drop them; a RetractEvent says which). A caller that wants logprobs
holds offline tokens under either policy, so that each token goes out with the
target's log-probability, which a Resume sends (a LogprobsEvent). ``TextStreamer`` puts those
tokens through the shared ``TextStream`` (incremental decoding, UTF-8 and stop
string hold-back), so the Python client shows text exactly as the local API does.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from edgespec.shared.text_stream import TextStream

from .loop.generation import LogprobsEvent, RetractEvent, TokenEvent, TokenOrigin


class SettledTokens:
    """Events in, tokens (``TokenEvent``s, with the target's logprobs when asked) that no rollback can
    withdraw out."""

    def __init__(self, hold_offline: bool = True):
        self.hold_offline = hold_offline  # True under `rollback` (offline tokens may still be dropped) or for logprobs
        self._held: list[TokenEvent] = []  # offline tokens waiting for the target's verdict, in output order

    def feed(self, event) -> list[TokenEvent]:
        """Tokens settled by this event, in order (often none)."""
        if isinstance(event, TokenEvent):
            if self.hold_offline and event.origin is TokenOrigin.OFFLINE:
                self._held.append(event)
                return []
            settled, self._held = [*self._held, event], []  # a verified token: what came before stands
            return settled
        if isinstance(event, RetractEvent):  # a rollback withdraws offline tokens only, and those were held
            self._held = [e for e in self._held if e.index < event.index]
        if isinstance(event, LogprobsEvent):
            scored = dict(enumerate(event.logprobs, event.index))
            self._held = [replace(e, logprob=scored.get(e.index, e.logprob)) for e in self._held]
        return []

    def finish(self) -> list[TokenEvent]:
        """Tokens still held when the generation ended: the link never came back to judge them, so they stay."""
        rest, self._held = self._held, []
        return rest


class TextStreamer:
    """Events in, text deltas that never need taking back out."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = (), hold_offline: bool = True,
                 min_tokens: int = 0):
        self._tokens = SettledTokens(hold_offline)
        self._text = TextStream(decode, stops, min_tokens=min_tokens)  # stop strings count from min_tokens on

    @property
    def stopped(self) -> bool:
        """A stop string was reached: the text ends before it."""
        return self._text.stopped

    def feed(self, event) -> str:
        """Text newly settled by this event ('' if none)."""
        return "".join(self._text.push(e.token) for e in self._tokens.feed(event))

    def finish(self) -> str:
        """The rest of the text once the generation ended."""
        return "".join(self._text.push(e.token) for e in self._tokens.finish()) + self._text.finish()
