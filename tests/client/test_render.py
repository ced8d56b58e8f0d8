"""The terminal printer: the same text, colours and rollback notes as decoding the whole output again on
every token (the printer's old way, kept here as the reference), while decoding only a window per token."""
from __future__ import annotations

import io
import random

import pytest

from edgespec.client.loop.generation import RetractEvent, TokenEvent, TokenOrigin
from edgespec.client.render import COLORS, RESET, TerminalPrinter

ORIGINS = list(TokenOrigin)
TEXT = "def f(x):\n    return 'héllo wörld' + \"€ 😀 ∑ ñ\"  # ünïcödé ok\n" * 3


def reference(decode, items, color: bool) -> str:
    """What the printer wrote when it decoded every token's whole output (the behaviour to keep)."""
    out, tokens, shown, code = [], [], "", ""
    for item in items:
        if isinstance(item, TokenEvent):
            tokens.append(item.token)
            text = decode(tokens).rstrip("\ufffd")
            piece, shown = (text[len(shown):], text) if text.startswith(shown) else ("", shown)
            code = COLORS[item.origin] if color else ""
            if piece:
                out.append(f"{code}{piece}{RESET if code else ''}")
        elif isinstance(item, RetractEvent):
            del tokens[item.index:]
            shown = decode(tokens).rstrip("\ufffd")
    return "".join(out) + "\n"


def printed(decode, items, color: bool) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    TerminalPrinter(decode, out, err, color).run(items)
    return out.getvalue(), err.getvalue()


def events(ids: list[int], rng: random.Random, retract: bool) -> list:
    """Token events of random origins; with `retract`, a rollback of a few offline tokens midway, then the
    rest again (as a Resume that kept the first part)."""
    items = [TokenEvent(t, rng.choice(ORIGINS), i) for i, t in enumerate(ids)]
    if retract:
        cut = rng.randrange(1, len(ids) - 5)
        dropped = [TokenEvent(t, TokenOrigin.OFFLINE, cut + i) for i, t in enumerate(ids[cut:cut + 4])]
        items = items[:cut] + dropped + [RetractEvent(len(dropped), cut)] + items[cut:]
    return items


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("color", [False, True])
def test_byte_tokens_print_as_the_whole_decode_did(tiny_tokenizer, seed, color):
    """One byte a token (the tiny tokenizer): multi-byte characters split over 2-4 tokens, offline tokens
    rolled back mid-character; the output, colour codes included, is the reference's byte for byte."""
    decode = tiny_tokenizer.decode
    ids = tiny_tokenizer.encode(TEXT, add_special_tokens=False)
    items = events(ids, random.Random(seed), retract=seed % 2 == 1)
    out, err = printed(decode, items, color)
    assert out == reference(decode, items, color)
    assert "\ufffd" not in out
    if seed % 2:
        assert "4 offline tokens rolled back" in err


@pytest.mark.parametrize("seed", range(6))
def test_tokens_of_several_bytes_print_the_same_text(seed):
    """Tokens of 1-5 bytes cut anywhere, so one token can end a character and start the next (as a merged
    byte-level BPE token does): the printed text is the reference's. (The one difference: the whole characters
    of such a token wait with its unfinished one, as the APIs' text does, so a rollback right then shows less
    of the text it drops.)"""
    data = TEXT.encode()
    rng = random.Random(seed)
    pieces, start = [], 0
    while start < len(data):
        end = min(len(data), start + rng.randint(1, 5))
        pieces.append(data[start:end])
        start = end

    def decode(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    items = events(list(range(len(pieces))), rng, retract=False)
    out, _ = printed(decode, items, color=False)
    assert out == reference(decode, items, color=False) == TEXT + "\n"


def test_a_character_left_unfinished_at_the_end_is_not_printed(tiny_tokenizer):
    ids = tiny_tokenizer.encode("ok €", add_special_tokens=False)[:-1]  # the euro sign's last byte never comes
    items = [TokenEvent(t, TokenOrigin.BONUS, i) for i, t in enumerate(ids)]
    assert printed(tiny_tokenizer.decode, items, color=False)[0] == "ok \n"


def test_each_token_decodes_a_window_not_the_whole_output(tiny_tokenizer):
    """The cost of a token does not grow with the output: no decode call sees more than a short window."""
    longest = 0

    def decode(ids):
        nonlocal longest
        longest = max(longest, len(ids))
        return tiny_tokenizer.decode(ids)

    ids = tiny_tokenizer.encode(TEXT * 4, add_special_tokens=False)
    out, _ = printed(decode, [TokenEvent(t, TokenOrigin.ACCEPTED, i) for i, t in enumerate(ids)], color=False)
    assert out == TEXT * 4 + "\n"
    assert longest <= 8 < len(ids)
