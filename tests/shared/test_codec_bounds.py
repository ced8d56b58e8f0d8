"""Activation frame decoding under hostile input: one test per finding of the mutation run (issue 17).

Frames are built by hand here (header packed field by field) so that a test
says exactly what the hostile frame claims. Memory is measured with
tracemalloc, which sees bytes objects and numpy arrays: what the decoder
allocated before it refused.
"""
from __future__ import annotations

import struct
import tracemalloc
from typing import Callable

import numpy as np
import pytest
import torch
import zstandard

from edgespec.shared.codec import Codec, decode_frame, encode_frame
from edgespec.shared.errors import FrameError
from edgespec.shared.wire import MAX_ELEMENTS

F32 = 0  # dtype id of torch.float32 on the wire


def frame(codec: Codec, shape: tuple[int, ...], payload: bytes, *, outliers: int = 0, level: int = 0,
          dtype_id: int = F32) -> bytes:
    """A frame as the wire lays it out (shared/codec.py's docstring), with any header values."""
    head = struct.pack("<4sBBBBB", b"ESAF", 1, int(codec), level, dtype_id, len(shape))
    return head + struct.pack(f"<{len(shape)}I", *shape) + struct.pack("<HI", outliers, len(payload)) + payload


def traced_peak(call: Callable[[], object]) -> int:
    """Bytes the call allocated at its peak (bytes and numpy arrays), whatever it raised."""
    tracemalloc.start()
    try:
        call()
    except Exception:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def zstd_of_zeros(size: int, state_size: bool) -> bytes:
    """A zstd frame of `size` zero bytes, streamed so that the test never holds `size` bytes itself."""
    cobj = zstandard.ZstdCompressor(level=3, write_content_size=state_size).compressobj(
        size=size if state_size else -1)
    chunk = bytes(1 << 20)
    parts = [cobj.compress(chunk[:min(len(chunk), size - done)]) for done in range(0, size, len(chunk))]
    return b"".join(parts) + cobj.flush()


def with_payload(valid: bytes, raw: bytes, level: int) -> bytes:
    """A valid frame's header with another (raw) payload, zstd'd at `level`, length field fixed."""
    ndim = valid[8]
    start = 9 + 4 * ndim + 6
    payload = zstandard.ZstdCompressor(level=level).compress(raw) if level else raw
    return valid[:start - 4] + struct.pack("<I", len(payload)) + payload


# ---- a huge shape with no elements ---------------------------------------------------------------

def test_the_23_byte_frame_claiming_4g_channels_is_refused_before_allocating():
    hostile = frame(Codec.INT8_OUTLIER, (0, 2**32 - 1), b"")
    assert len(hostile) == 23
    with pytest.raises(FrameError, match=r"shape \(0, 4294967295\).*the limit is 134,217,728"):
        decode_frame(hostile)
    assert traced_peak(lambda: decode_frame(hostile)) < 64 << 10


def test_an_empty_tensor_within_the_limit_costs_no_per_channel_memory():
    # T = 0 and C = 2**27: legal, no element, and nothing worth 2**27 may be built for it.
    empty = frame(Codec.INT8_OUTLIER, (0, MAX_ELEMENTS), struct.pack("<2H", 1, 5), outliers=2)
    out = decode_frame(empty)
    assert out.shape == (0, MAX_ELEMENTS) and out.dtype == torch.float32
    assert traced_peak(lambda: decode_frame(empty)) < 64 << 10


# ---- element counts past int64, past the limit -------------------------------------------------

@pytest.mark.parametrize("codec", list(Codec))
def test_a_shape_whose_element_count_wraps_int64_is_a_frame_error(codec):
    # (2**32 - 1)**2 * 4 wraps int64 (np.prod); Python ints do not.
    with pytest.raises(FrameError, match="the limit is"):
        decode_frame(frame(codec, (2**32 - 1, 2**32 - 1, 4), bytes(64)))


def test_max_elements_is_configurable_and_named_in_the_refusal():
    valid = encode_frame(torch.randn(4, 16), Codec.INT8, 0)
    assert decode_frame(valid, max_elements=64).shape == (4, 16)
    with pytest.raises(FrameError, match=r"\(4, 16\) \(64 elements.*the limit is 63 \(max_elements\)"):
        decode_frame(valid, max_elements=63)


# ---- outlier channel ids ------------------------------------------------------------------------

def outlier_frame(ids: tuple[int, ...], level: int) -> bytes:
    """A valid INT8_OUTLIER frame of [4, 16] whose channel ids are replaced by `ids`."""
    valid = encode_frame(torch.randn(4, 16), Codec.INT8_OUTLIER, level, outlier_channels=len(ids))
    raw = zstandard.ZstdDecompressor().decompress(valid[9 + 8 + 6:]) if level else valid[9 + 8 + 6:]
    return with_payload(valid, struct.pack(f"<{len(ids)}H", *ids) + raw[2 * len(ids):], level)


@pytest.mark.parametrize("level", [0, 3])
@pytest.mark.parametrize("ids, message", [
    ((3, 3), "id 3 at position 1 repeats 3"),
    ((2, 9, 9), "id 9 at position 2 repeats 9"),
    ((5, 3), "id 3 at position 1 comes after 5"),  # the encoder sorts them: unsorted is corruption
    ((3, 16), "outlier channel id 16 is outside 16 channels"),
])
def test_outlier_channel_ids_must_be_strictly_increasing_and_in_range(ids, message, level):
    with pytest.raises(FrameError, match=message):
        decode_frame(outlier_frame(ids, level))


def test_sorted_distinct_ids_still_decode():
    out = decode_frame(outlier_frame((0, 15), 3))
    assert out.shape == (4, 16) and torch.isfinite(out).all()


@pytest.mark.parametrize("codec", [Codec.FP16, Codec.INT8])
def test_outlier_count_on_codecs_without_outliers_is_refused(codec):
    valid = encode_frame(torch.randn(4, 16), codec, 0)
    lying = valid[:9 + 8] + struct.pack("<H", 2) + valid[9 + 8 + 2:]
    with pytest.raises(FrameError, match=f"{codec.name} frame claims 2 outlier channels"):
        decode_frame(lying)


# ---- zstd: output capped at what the header claims ----------------------------------------------

@pytest.mark.parametrize("state_size", [True, False], ids=["content size stated", "content size unknown"])
def test_an_8_kib_zstd_bomb_is_refused_without_inflating(state_size):
    bomb = zstd_of_zeros(256 << 20, state_size)
    assert len(bomb) < 9 << 10
    # [4, 16] INT8 needs 4 * 4 + 64 = 80 bytes; the payload would inflate to 256 MiB.
    hostile = frame(Codec.INT8, (4, 16), bomb, level=3)
    with pytest.raises(FrameError, match="inflates to 268435456 bytes" if state_size else "does not state its content"):
        decode_frame(hostile)
    assert traced_peak(lambda: decode_frame(hostile)) < 1 << 20


@pytest.mark.parametrize("shape", [(4, 1 << 20), (1, 1 << 22)], ids=["4 rows", "1 row"])
@pytest.mark.parametrize("codec", list(Codec))
def test_a_small_frame_honestly_claiming_a_big_tensor_costs_a_small_multiple_of_the_claim(codec, shape):
    # All zeros compress ~1000:1, so a few KiB may claim 4M elements; that is a valid frame, and
    # what bounds it is max_elements. Its traced peak stays under 5x the claim as float32 (the
    # worst case is one INT8_OUTLIER row: payload, rows, dequantized values, channel mask and index).
    rows, channels = shape
    need = 2 * rows * channels if codec is Codec.FP16 else 4 * rows + rows * channels
    honest = frame(codec, shape, zstd_of_zeros(need, state_size=True), level=3)
    assert len(honest) < 64 << 10
    out = decode_frame(honest)
    assert out.shape == shape and not out.any()
    assert traced_peak(lambda: decode_frame(honest)) < 5 * 4 * out.numel()


def test_rows_without_channels_claim_their_scales_and_get_no_more():
    # (2**27, 0) as INT8 has no element but 2**27 scales (512 MiB): the long fuzz run found an
    # unstated 256 MiB bomb behind it made the decoder reserve 512 MiB, then inflate 256 MiB.
    hostile = frame(Codec.INT8, (MAX_ELEMENTS, 0), zstd_of_zeros(256 << 20, state_size=False), level=3)
    with pytest.raises(FrameError, match="does not state its content size"):
        decode_frame(hostile)
    assert traced_peak(lambda: decode_frame(hostile)) < 1 << 20


@pytest.mark.parametrize("extra", [b"\x00", zstandard.ZstdCompressor().compress(b"more")],
                         ids=["a trailing byte", "a second zstd frame"])
def test_data_after_the_zstd_frame_is_refused(extra):
    valid = encode_frame(torch.randn(4, 16), Codec.INT8, 3)
    padded = valid[:9 + 8 + 2] + struct.pack("<I", len(valid) - 23 + len(extra)) + valid[23:] + extra
    with pytest.raises(FrameError, match="unused data"):
        decode_frame(padded)


def test_a_zstd_payload_of_the_wrong_size_is_refused():
    valid = encode_frame(torch.randn(4, 16), Codec.INT8, 3)
    raw = zstandard.ZstdDecompressor().decompress(valid[23:])
    for size in (len(raw) - 1, len(raw) + 1):
        with pytest.raises(FrameError, match=f"inflates to {size} bytes but shape \\(4, 16\\) as INT8 needs 80"):
            decode_frame(with_payload(valid, raw[:size].ljust(size, b"\x00"), 3))


def test_a_zstd_frame_that_does_not_state_its_size_is_refused():
    # Even an honest one: its size could only be checked after inflating it, bounded by the claim
    # alone (the encoder's one-shot zstd always states it).
    valid = encode_frame(torch.randn(4, 16), Codec.INT8, 3)
    raw = zstandard.ZstdDecompressor().decompress(valid[23:])
    cobj = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    streamed = cobj.compress(raw) + cobj.flush()
    assert zstandard.frame_content_size(streamed) == -1  # unknown
    with pytest.raises(FrameError, match="does not state its content size"):
        decode_frame(valid[:19] + struct.pack("<I", len(streamed)) + streamed)


def test_every_frame_the_encoder_makes_states_its_zstd_content_size():
    for x in (torch.zeros(0, 8), torch.tensor(1.0), torch.randn(300, 70)):
        for codec in Codec:
            for level in (1, 3, 9, 22):
                payload = encode_frame(x, codec, level, 2)[9 + 4 * x.dim() + 6:]
                assert zstandard.frame_content_size(payload) >= 0


def test_a_zstd_level_the_encoder_cannot_write_is_refused():
    valid = encode_frame(torch.randn(4, 16), Codec.INT8, 3)
    with pytest.raises(FrameError, match="zstd level 200"):
        decode_frame(valid[:6] + bytes([200]) + valid[7:])


# ---- the encoder's side of the same contract ----------------------------------------------------

def test_the_encoder_refuses_channels_its_u16_ids_cannot_name():
    with pytest.raises(FrameError, match="channel ids are u16"):
        encode_frame(torch.zeros(1, (1 << 16) + 1), Codec.INT8_OUTLIER, 0, outlier_channels=1)
    # Up to 65536 channels every id fits, and the outlier comes back where it was.
    x = torch.zeros(1, 1 << 16)
    x[0, 65535] = 1000.0
    assert decode_frame(encode_frame(x, Codec.INT8_OUTLIER, 0, outlier_channels=1))[0, 65535] == 1000.0


def test_hostile_scales_decode_to_inf_without_warnings():
    # A scale of f32 max times 127 overflows: inf is what the frame says, not an error, not a warning.
    payload = np.full(1, np.finfo(np.float32).max, np.float32).tobytes() + bytes([127])
    with np.errstate(over="raise"):
        out = decode_frame(frame(Codec.INT8, (1, 1), payload))
    assert torch.isinf(out).all()
