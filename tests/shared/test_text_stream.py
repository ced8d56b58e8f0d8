"""shared.text_stream: incremental decoding and stop strings, as both OpenAI APIs use them."""
from __future__ import annotations

import random
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.shared.text_stream import IncrementalDecoder, StopMatcher, TextStream


def byte_decode(ids):
    """Ids as UTF-8 bytes, like a byte-level BPE: a character may span tokens."""
    return bytes(ids).decode("utf-8", errors="replace")


def streamed(stream: TextStream, ids) -> str:
    return "".join(stream.push(i) for i in ids) + stream.finish()


def test_a_character_split_over_tokens_waits_until_it_is_whole():
    stream = TextStream(byte_decode)
    deltas = [stream.push(i) for i in "añb".encode()]
    assert deltas == ["a", "", "ñ", "b"] and stream.finish() == ""


def test_a_possible_stop_string_is_held_back_and_the_text_cut_before_it():
    stream = TextStream(byte_decode, ["END"])
    assert "".join(stream.push(i) for i in b"xyEN") == "xy"  # "EN" might start "END"
    assert stream.push(ord("D")) == "" and stream.stopped
    assert stream.finish() == ""
    stream = TextStream(byte_decode, ["END"])
    assert streamed(stream, b"ENx") == "ENx" and not stream.stopped


def test_overlapping_stops_in_one_step_cut_at_the_earliest_start():
    matcher = StopMatcher(["bc", "abcd"])
    assert matcher.feed("xabcd") == "x" and matcher.stopped
    matcher = StopMatcher(["bc", "abcd"])
    assert matcher.feed("xab") == "x" and matcher.feed("c") == "a" and matcher.stopped  # "bc" ended first


def test_a_stop_that_is_inside_another_is_found():
    matcher = StopMatcher(["abcx", "bc"])
    assert matcher.feed("zab") == "z"
    assert matcher.feed("cy") == "a" and matcher.stopped


def test_invalid_bytes_do_not_hold_the_window_forever():
    decoder = IncrementalDecoder(byte_decode)
    ids = [0xFF] * 50 + list("é".encode())
    out = "".join(decoder.push(i) for i in ids) + decoder.finish()
    assert out == byte_decode(ids)
    assert len(decoder.ids) - decoder._prefix < 20  # the window slid: each step decodes a few tokens only


def first_end(text: str, stops: list[str]) -> int | None:
    ends = [text.find(s) + len(s) for s in stops if s in text]
    return min(ends) if ends else None


@given(st.text(alphabet="ab", max_size=30), st.lists(st.text(alphabet="ab", min_size=1, max_size=4), max_size=4))
@settings(max_examples=300, deadline=None)
def test_one_character_tokens_cut_where_str_find_says(text, stops):
    """Tokens of one character each: the cut is str.find's over the text up to the first stop's end."""
    stream = TextStream(lambda ids: "".join(chr(i) for i in ids), stops)
    out = streamed(stream, [ord(c) for c in text])
    end = first_end(text, stops)
    if end is None:
        assert out == text and not stream.stopped
    else:
        seen = text[:end]
        assert out == seen[:min(seen.find(s) for s in stops if s in seen)] and stream.stopped


@given(st.lists(st.integers(0, 255), max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_bytes_stream_to_the_whole_decoded_text(ids):
    assert streamed(TextStream(byte_decode), ids) == byte_decode(ids)


def test_matching_costs_the_same_for_1000_stops_as_for_one():
    """Every stop was searched in the whole text per token: 1,000 stops cost 6-27x one stop."""
    rng = random.Random(0)
    ids = [rng.randrange(32, 127) for _ in range(2000)]
    many = ["".join(rng.choice("XYZ#@") for _ in range(8)) for _ in range(1000)]

    def cost(stops) -> float:
        best = float("inf")
        for _ in range(3):
            stream = TextStream(byte_decode, stops)
            t0 = time.perf_counter()
            for i in ids:
                stream.push(i)
            stream.finish()
            best = min(best, time.perf_counter() - t0)
        return best

    one, thousand = cost(["XYZ#@XYZ"]), cost(many)
    assert thousand < 2.5 * one, f"1 stop {one * 1e3:.0f} ms, 1000 stops {thousand * 1e3:.0f} ms"


def test_min_tokens_lets_a_stop_string_pass_until_that_many_tokens_came():
    """vLLM's min_tokens: a stop string completed by one of the first min_tokens - 1 tokens does not end the text."""
    text = b"ab;cd;ef"
    assert streamed(TextStream(byte_decode, [";"]), text) == "ab"
    assert streamed(TextStream(byte_decode, [";"], min_tokens=4), text) == "ab;cd"  # the ';' at token 6 ends it
    assert streamed(TextStream(byte_decode, [";"], min_tokens=3), text) == "ab"  # token 3 is the first ';'
