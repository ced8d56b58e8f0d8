"""Fuzzing the two decoders that read the link's bytes: activation frames and draft trees.

Each input must decode or raise the decoder's own documented error (FrameError,
InvalidTreeError), within a hang detector's time (1 s, far above the ~1 ms
these inputs take: it catches a decoder that loops or inflates, not a slow CI
machine) and within ``memory_bound``: a few times the output the input claims,
plus its length. The mutators are those of ``support.fuzz_decoders``
(the long run), driven here by hypothesis's recorded randomness so that a
failure shrinks and replays.
"""
from __future__ import annotations

import random
import tracemalloc
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.shared.codec import MAGIC, decode_frame
from edgespec.shared.errors import FrameError, InvalidTreeError
from support.fuzz_decoders import (TREE_MAX_NODES, TREE_VOCABS, U8_EXTREMES, U16_EXTREMES, U32_EXTREMES, Bombs,
                                   claimed_output_bytes, fix_length, frame_corpus, frame_fields, frame_inputs, fuzz,
                                   memory_bound, mutate_frame, mutate_tree, run_one, set_field, tree_corpus,
                                   tree_inputs)
from edgespec.shared.tree import decode_tree

HANG_MS = 1000.0
FRAMES = frame_corpus(0)
TREES = tree_corpus(0)
BOMBS = Bombs.build((1 << 20, 16 << 20))  # 256 MiB bombs are for the long run; these inflate plenty
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_documented_only(decode: Callable[[bytes], object], data: bytes, documented: type[Exception],
                           claimed: int) -> None:
    tracemalloc.start()  # per call: tracing the whole test would trace hypothesis too, and crawl
    try:
        outcome, ms, peak, error = run_one(decode, data, documented)
    finally:
        tracemalloc.stop()
    if error is not None:
        raise error  # hypothesis shrinks it and shows its traceback
    assert ms < HANG_MS, f"{ms:.0f} ms for a {len(data)}-byte input"
    assert peak <= memory_bound(data, claimed), f"{peak} bytes traced; the input claims {claimed}"


def check_frame(data: bytes) -> None:
    assert_documented_only(decode_frame, data, FrameError, claimed_output_bytes(data))


# ---- frames ---------------------------------------------------------------------------------------

def test_the_corpus_is_valid():
    # Mutations start from frames and trees that decode: otherwise they only test the first check.
    assert all(decode_frame(f) is not None for f in FRAMES)
    assert all(decode_tree(t) is not None for t in TREES)


@given(st.binary(max_size=160) | st.binary(max_size=160).map(lambda b: MAGIC + b"\x01" + b))
@FUZZ
def test_random_bytes_are_refused_with_frame_errors(data):
    check_frame(data)


@given(st.sampled_from(FRAMES), st.randoms(use_true_random=False))
@settings(FUZZ, max_examples=1000)
def test_mutated_frames_raise_only_frame_errors(frame, rng):
    check_frame(mutate_frame(frame, FRAMES, BOMBS, rng))


_EXTREMES = {"B": U8_EXTREMES, "<H": U16_EXTREMES, "<I": U32_EXTREMES}


@st.composite
def header_overwrites(draw) -> bytes:
    """A valid frame with one to three header fields set to extreme values, its length fixed up or not."""
    frame = draw(st.sampled_from(FRAMES))
    for _ in range(draw(st.integers(1, 3))):
        fld = draw(st.sampled_from(frame_fields(frame)))
        width = 8 * fld.size
        frame = set_field(frame, fld, draw(st.sampled_from(_EXTREMES[fld.fmt]) | st.integers(0, (1 << width) - 1)))
    return fix_length(frame) if draw(st.booleans()) else frame


@given(header_overwrites())
@settings(FUZZ, max_examples=800)
def test_extreme_header_fields_raise_only_frame_errors(frame):
    check_frame(frame)


# ---- trees ----------------------------------------------------------------------------------------

@given(st.binary(max_size=1100), st.sampled_from(TREE_VOCABS), st.sampled_from(TREE_MAX_NODES))
@FUZZ
def test_random_bytes_raise_only_tree_errors(data, vocab, max_nodes):
    assert_documented_only(lambda d: decode_tree(d, vocab, max_nodes), data, InvalidTreeError, 0)


@given(st.sampled_from(TREES), st.randoms(use_true_random=False), st.sampled_from(TREE_VOCABS),
       st.sampled_from(TREE_MAX_NODES))
@settings(FUZZ, max_examples=800)
def test_mutated_trees_raise_only_tree_errors(tree, rng, vocab, max_nodes):
    assert_documented_only(lambda d: decode_tree(d, vocab, max_nodes), mutate_tree(tree, TREES, rng),
                           InvalidTreeError, 0)


# ---- the long run's own loop, short and seeded ----------------------------------------------------

@pytest.mark.parametrize("name, inputs, documented, claimed", [
    ("decode_frame", frame_inputs, FrameError, claimed_output_bytes),
    ("decode_tree", tree_inputs, InvalidTreeError, lambda data: 0),
])
def test_a_seeded_run_of_the_fuzz_script_finds_nothing(tmp_path: Path, name, inputs, documented, claimed):
    tally = fuzz(name, 3000, inputs(0), documented, claimed, tmp_path, time_limit=0, progress_every=0)
    assert tally.inputs == 3000 and tally.decoded > 0 and tally.refused > 0
    assert not tally.undocumented, f"{dict(tally.undocumented)}; examples in {tmp_path}"
    assert tally.over_bound == 0
    assert max(tally.slowest)[0] < HANG_MS


def test_mutators_are_deterministic_given_a_seed():
    # The long run's findings are reproducible: the same seed gives the same inputs.
    first = [mutate_frame(FRAMES[i % len(FRAMES)], FRAMES, BOMBS, random.Random(i)) for i in range(50)]
    again = [mutate_frame(FRAMES[i % len(FRAMES)], FRAMES, BOMBS, random.Random(i)) for i in range(50)]
    assert first == again and len(set(first)) > 40
