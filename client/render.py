"""Printing a generation in a terminal as it comes, each token coloured by where it came from."""
from __future__ import annotations

import os
from typing import Callable, Iterable, Sequence, TextIO

from edgespec.shared.text_stream import IncrementalDecoder

from .loop.generation import GenerationResult, LinkEvent, RetractEvent, TokenEvent, TokenOrigin

COLORS = {TokenOrigin.ACCEPTED: "\033[32m", TokenOrigin.BONUS: "", TokenOrigin.OFFLINE: "\033[33m"}
RESET = "\033[0m"


def use_color(mode: str, stream: TextIO) -> bool:
    """always, never, or auto: only on a terminal that is not dumb and when NO_COLOR is unset."""
    if mode != "auto":
        return mode == "always"
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb" \
        and "NO_COLOR" not in os.environ


class TerminalPrinter:
    def __init__(self, decode: Callable[[Sequence[int]], str], out: TextIO, err: TextIO, color: bool):
        self.decode, self.out, self.err, self.color = decode, out, err, color

    def run(self, items: Iterable) -> GenerationResult:
        # Text is decoded a window at a time (shared.text_stream), not the whole output again per token; an
        # unfinished character waits for its last byte, and is coloured by the token that completes it.
        text = IncrementalDecoder(self.decode)
        retracted, result, code = False, None, ""
        for item in items:
            if isinstance(item, GenerationResult):
                result = item
            elif isinstance(item, TokenEvent):
                code = COLORS[item.origin] if self.color else ""
                self._write(text.push(item.token), code)
            elif isinstance(item, RetractEvent):
                kept, text = text.ids[:item.index], IncrementalDecoder(self.decode)
                for token in kept:  # what was shown of them stays on the terminal
                    text.push(token)
                retracted = True
                self.err.write(f"\n[edgespec: the target disagreed; {item.count} offline tokens rolled back]\n")
            elif isinstance(item, LinkEvent):
                self.err.write(f"\n[edgespec: {'link back' if item.online else 'link lost, going offline'}: "
                               f"{item.detail}]\n")
        # Whole characters the last token held back beside an unfinished one, which never came: not shown.
        self._write(text.finish().rstrip("\ufffd"), code)
        self.out.write("\n")
        if retracted and result is not None:
            self.out.write("--- final text ---\n" + self.decode(result.token_ids) + "\n")
        self.out.flush()
        return result

    def _write(self, piece: str, code: str) -> None:
        if piece:
            self.out.write(f"{code}{piece}{RESET if code else ''}")
            self.out.flush()
