"""Printing a generation in a terminal as it comes, each token coloured by where it came from."""
from __future__ import annotations

import os
from typing import Callable, Iterable, Sequence, TextIO

from .generation import GenerationResult, LinkEvent, RetractEvent, TokenEvent, TokenOrigin

COLORS = {TokenOrigin.ACCEPTED: "\033[32m", TokenOrigin.BONUS: "", TokenOrigin.OFFLINE: "\033[33m"}
RESET = "\033[0m"


def use_color(mode: str, stream: TextIO) -> bool:
    """auto: only on a terminal that is not dumb and when NO_COLOR is unset."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return bool(getattr(stream, "isatty", lambda: False)()) and os.environ.get("TERM") != "dumb" \
        and "NO_COLOR" not in os.environ


def token_pieces(decode: Callable[[Sequence[int]], str], tokens: Sequence[int], shown: str) -> tuple[str, str]:
    """(new text, all text) after `tokens`, given the text shown so far; holds an unfinished character."""
    text = decode(tokens).rstrip("\ufffd")
    if not text.startswith(shown):
        return "", shown
    return text[len(shown):], text


class TerminalPrinter:
    def __init__(self, decode: Callable[[Sequence[int]], str], out: TextIO, err: TextIO, color: bool):
        self.decode, self.out, self.err, self.color = decode, out, err, color

    def run(self, items: Iterable) -> GenerationResult:
        tokens: list[int] = []
        shown = ""
        retracted = False
        result = None
        for item in items:
            if isinstance(item, GenerationResult):
                result = item
            elif isinstance(item, TokenEvent):
                tokens.append(item.token)
                piece, shown = token_pieces(self.decode, tokens, shown)
                if piece:
                    code = COLORS[item.origin] if self.color else ""
                    self.out.write(f"{code}{piece}{RESET if code else ''}")
                    self.out.flush()
            elif isinstance(item, RetractEvent):
                del tokens[item.index:]
                shown = self.decode(tokens).rstrip("\ufffd")
                retracted = True
                self.err.write(f"\n[edgespec: the target disagreed; {item.count} offline tokens rolled back]\n")
            elif isinstance(item, LinkEvent):
                self.err.write(f"\n[edgespec: {'link back' if item.online else 'link lost, going offline'}: "
                               f"{item.detail}]\n")
        self.out.write("\n")
        if retracted and result is not None:
            self.out.write("--- final text ---\n" + self.decode(result.token_ids) + "\n")
        self.out.flush()
        return result
