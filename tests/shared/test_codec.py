"""Activation codec: round trips, error bounds, refusals of bad frames."""
from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.shared.codec import ActivationCodec, Codec, decode_frame, encode_frame
from edgespec.shared.errors import FrameError


def relative_error(original: torch.Tensor, decoded: torch.Tensor) -> float:
    """||decoded - original|| / ||original||."""
    return ((decoded.float() - original.float()).norm() / original.float().norm()).item()


shapes = st.lists(st.integers(1, 24), min_size=1, max_size=3).map(tuple)


@given(shape=shapes, codec=st.sampled_from(list(Codec)), level=st.sampled_from([0, 1, 3]),
       k=st.integers(0, 6), seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
@settings(max_examples=150, deadline=None)
def test_round_trip_shape_dtype_and_error(shape, codec, level, k, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    frame = ActivationCodec(codec, level, k).encode(x)
    y = decode_frame(frame)
    assert y.shape == x.shape and y.dtype == x.dtype
    xf, yf = x.float(), y.float()
    if codec is Codec.FP16:
        assert torch.allclose(yf, xf, rtol=1e-3, atol=1e-3)
    else:
        # Per-row absmax int8: each value within half a step, plus the rounding of
        # the output dtype (outlier channels are exact to fp16).
        rows = xf.reshape(-1, shape[-1])
        step = rows.abs().amax(dim=1, keepdim=True) / 127
        out_eps = 2.0 ** -8 if dtype is torch.bfloat16 else 2.0 ** -10
        err = (yf - xf).reshape(-1, shape[-1]).abs()
        assert (err <= step * 0.501 + rows.abs() * out_eps + 1e-7).all()


def test_outlier_channels_travel_exactly_in_fp16():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 256, generator=gen)
    x[:, [3, 77]] *= 400  # the massive channels LLM activations have
    plain = decode_frame(encode_frame(x, Codec.INT8, 3))
    kept = decode_frame(encode_frame(x, Codec.INT8_OUTLIER, 3, outlier_channels=2))
    assert torch.allclose(kept[:, [3, 77]], x[:, [3, 77]].half().float())
    rest = [c for c in range(256) if c not in (3, 77)]
    # Without outlier handling the ordinary channels are crushed to a few levels.
    assert relative_error(x[:, rest], kept[:, rest]) < 0.02 < relative_error(x[:, rest], plain[:, rest])


def test_zstd_shrinks_redundant_frames():
    x = torch.zeros(64, 128)
    x[:, 0] = 1.0
    assert len(encode_frame(x, Codec.INT8, 3)) < len(encode_frame(x, Codec.INT8, 0)) / 4


def test_zero_and_empty_tensors():
    for x in (torch.zeros(4, 8), torch.zeros(0, 8), torch.zeros(3, 0), torch.tensor(2.5)):
        for codec in Codec:
            y = decode_frame(encode_frame(x, codec, 1, 2))
            assert y.shape == x.shape
            assert torch.allclose(y, x, atol=0.02)


def _frame():
    return encode_frame(torch.randn(4, 16), Codec.INT8_OUTLIER, 3, 2)


@pytest.mark.parametrize("mutate, message", [
    (lambda f: f[:3], "truncated"),
    (lambda f: b"XXXX" + f[4:], "not an activation frame"),
    (lambda f: f[:4] + bytes([9]) + f[5:], "version 9 is not supported"),
    (lambda f: f[:5] + bytes([7]) + f[6:], "unknown codec id 7"),
    (lambda f: f[:7] + bytes([5]) + f[8:], "unknown dtype id 5"),
    (lambda f: f[:-1], "header says"),
    (lambda f: f + b"\x00", "header says"),
    (lambda f: f[:9], "header needs"),
])
def test_refused_frames(mutate, message):
    with pytest.raises(FrameError, match=message):
        decode_frame(mutate(_frame()))


def test_refused_corrupt_payloads():
    frame = encode_frame(torch.randn(4, 16), Codec.INT8, 3)
    # Corrupt the zstd payload but keep its declared length.
    ndim = frame[8]  # header: magic(4) version codec zstd dtype ndim, then shape u32s, outliers u16, length u32
    start = 9 + 4 * ndim + 6
    bad = frame[:start] + bytes(len(frame) - start)
    with pytest.raises(FrameError, match="not valid zstd"):
        decode_frame(bad)
    # A shape that does not match the payload.
    raw = encode_frame(torch.randn(4, 16), Codec.FP16, 0)
    lying = raw[:9] + struct.pack("<2I", 4, 17) + raw[17:]
    with pytest.raises(FrameError, match="too short"):
        decode_frame(lying)


def test_refused_encode_inputs():
    with pytest.raises(FrameError, match="cannot encode dtype"):
        encode_frame(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="zstd_level"):
        ActivationCodec(Codec.INT8, zstd_level=30)
    with pytest.raises(ValueError):
        ActivationCodec(codec=42)


def test_codec_ids_match_the_wire():
    from edgespec.proto.edgespec.v1 import pb

    for codec in Codec:
        assert pb.Codec.Value(f"CODEC_{codec.name}") == codec.value
