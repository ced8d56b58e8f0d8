"""SettledTokens and TextStreamer: streamed text never has to be taken back."""
from __future__ import annotations

from edgespec.client.loop.generation import LinkEvent, RetractEvent, TokenEvent, TokenOrigin
from edgespec.client.text import SettledTokens, TextStreamer

A, B, O = TokenOrigin.ACCEPTED, TokenOrigin.BONUS, TokenOrigin.OFFLINE


def decode(ids):
    return "".join(chr(96 + t) if t > 0 else "\ufffd" for t in ids)  # 1 -> a; 0 -> an unfinished character


def ids(events):
    return [e.token for e in events]


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


def test_offline_tokens_flow_when_kept():
    s = TextStreamer(decode, hold_offline=False)
    assert _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, O, 1)]) == ["a", "b"]


def test_offline_tokens_left_when_the_link_never_came_back_stay():
    s = SettledTokens(hold_offline=True)
    assert ids(s.feed(TokenEvent(1, B, 0))) == [1]
    assert s.feed(TokenEvent(2, O, 1)) == [] and s.feed(TokenEvent(3, O, 2)) == []
    assert ids(s.finish()) == [2, 3]


def test_a_rollback_of_every_offline_token_keeps_none():
    s = SettledTokens(hold_offline=True)
    s.feed(TokenEvent(1, B, 0))
    s.feed(TokenEvent(2, O, 1))
    s.feed(TokenEvent(3, O, 2))
    assert s.feed(RetractEvent(2, 1)) == []
    assert ids(s.feed(TokenEvent(5, B, 1))) == [5] and s.finish() == []


def test_stop_string_prefix_is_held_and_stop_is_cut():
    s = TextStreamer(decode, stops=["cd"])
    out = _feed(s, [TokenEvent(1, B, 0), TokenEvent(2, B, 1), TokenEvent(3, B, 2), TokenEvent(4, B, 3)])
    assert out == ["a", "b", "", ""] and s.stopped
    assert s.finish() == ""


def test_unfinished_character_is_held():
    s = TextStreamer(decode)
    assert _feed(s, [TokenEvent(1, B, 0), TokenEvent(0, B, 1)]) == ["a", ""]
    assert s.finish() == "\ufffd"  # never finished: shown as what it is

