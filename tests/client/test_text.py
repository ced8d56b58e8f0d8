"""TextStreamer: streamed text never has to be taken back."""
from __future__ import annotations

from edgespec.client.generation import LinkEvent, RetractEvent, TokenEvent, TokenOrigin
from edgespec.client.render import token_pieces
from edgespec.client.text import TextStreamer

A, B, O = TokenOrigin.ACCEPTED, TokenOrigin.BONUS, TokenOrigin.OFFLINE


def decode(ids):
    return "".join(chr(96 + t) if t > 0 else "\ufffd" for t in ids)  # 1 -> a; 0 -> an unfinished character


def _feed(streamer, events):
    return [streamer.feed(e) for e in events]


def test_tokens_stream_as_they_come():
    s = TextStreamer(decode)
    assert _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, A, 1)]) == ["a", "b"]
    assert s.finish() == ""


def test_offline_tokens_wait_until_settled_and_retracted_ones_never_show():
    s = TextStreamer(decode, hold_offline=True)
    out = _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, O, 1), TokenEvent(3, O, 2), LinkEvent(True, "back"),
                    RetractEvent(1, 2), TokenEvent(4, B, 2)])
    assert out == ["a", "", "", "", "", "bd"]
    assert s.shown == "abd"


def test_offline_tokens_flow_when_kept():
    s = TextStreamer(decode, hold_offline=False)
    assert _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, O, 1)]) == ["a", "b"]


def test_stop_string_prefix_is_held_and_stop_is_cut():
    s = TextStreamer(decode, stops=["cd"])
    out = _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, B, 1), TokenEvent(3, B, 2), TokenEvent(4, B, 3)])
    assert "".join(out) + s.finish() == "ab"


def test_unfinished_character_is_held():
    s = TextStreamer(decode)
    assert _feed(s, [TokenEvent(1, B, 0), TokenEvent(0, B, 1)]) == ["a", ""]


def test_token_pieces():
    assert token_pieces(decode, [1, 2], "a") == ("b", "ab")
    assert token_pieces(decode, [1, 0], "a") == ("", "a")
