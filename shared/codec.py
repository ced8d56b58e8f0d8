"""Activation codec: how target activations cross the link.

A tensor is seen as rows of channels, [T, C] (the last dimension is C, all
others fold into T: one row per token, or per token and layer). Codecs:

- FP16: the rows as float16; the reference.
- INT8: per row, scale = absmax / 127 and values rounded to int8.
- INT8_OUTLIER: LLM activations have a handful of channels far larger than the
  rest, which would set every row's absmax and crush the others to a few int8
  levels. The K channels with the largest magnitude in the frame travel apart
  in float16; the rest is INT8.

Then zstd over the payload (level 0 = none).

Frame layout (little endian):
    magic b"ESAF" | version u8 | codec u8 | zstd level u8 | dtype u8 | ndim u8
    | shape u32 * ndim | outliers u16 | payload length u32 | payload
Payload before zstd:
    FP16:         values f16[T*C]
    INT8:         scales f32[T] | values i8[T*C]
    INT8_OUTLIER: channel ids u16[K] | outlier values f16[T*K] | scales f32[T] | values i8[T*(C-K)]
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from .errors import FrameError

MAGIC = b"ESAF"
VERSION = 1
_HEAD = struct.Struct("<4sBBBBB")
_TAIL = struct.Struct("<HI")
_MAX_NDIM = 8


class Codec(enum.IntEnum):
    """Codec ids; the same numbers as the wire's ``edgespec.v1.Codec``."""

    FP16 = 1
    INT8 = 2
    INT8_OUTLIER = 3


_DTYPES = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}
_DTYPE_IDS = {v: k for k, v in _DTYPES.items()}


@dataclass(frozen=True)
class ActivationCodec:
    """Encoder settings. Decoding needs none: a frame says how it was made."""

    codec: Codec = Codec.INT8_OUTLIER
    zstd_level: int = 3  # 0 = no zstd; 1..3 are the fast levels worth paying on a live link
    outlier_channels: int = 8  # K for INT8_OUTLIER

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec(self.codec))
        if not 0 <= self.zstd_level <= 22:
            raise ValueError(f"zstd_level must be in 0..22, got {self.zstd_level}")
        if self.outlier_channels < 0 or self.outlier_channels > 65535:
            raise ValueError(f"outlier_channels must be in 0..65535, got {self.outlier_channels}")

    def encode(self, tensor: torch.Tensor) -> bytes:
        return encode_frame(tensor, self.codec, self.zstd_level, self.outlier_channels)

    @staticmethod
    def decode(frame: bytes) -> torch.Tensor:
        return decode_frame(frame)


def _row_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """[T, C] view of a shape: C is the last dimension, T the product of the rest."""
    if not shape:
        return 1, 1
    return int(np.prod(shape[:-1], dtype=np.int64)), int(shape[-1])


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(_row_shape(x.shape))


def _quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    absmax = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], np.float32)
    # f32, not f16: rows with a small absmax would get a subnormal f16 scale and lose precision.
    scales = (absmax / 127.0).astype(np.float32)
    safe = np.where(scales == 0, 1.0, scales)
    q = np.clip(np.rint(rows / safe[:, None]), -127, 127).astype(np.int8)
    return scales, q


def encode_frame(tensor: torch.Tensor, codec: Codec = Codec.INT8_OUTLIER, zstd_level: int = 3,
                 outlier_channels: int = 8) -> bytes:
    """Encode one tensor into a self-describing frame."""
    codec = Codec(codec)
    if tensor.dtype not in _DTYPE_IDS:
        raise FrameError(f"cannot encode dtype {tensor.dtype}; expected one of {list(_DTYPE_IDS)}")
    if tensor.dim() > _MAX_NDIM:
        raise FrameError(f"cannot encode a {tensor.dim()}-D tensor; at most {_MAX_NDIM} dimensions")
    shape = tuple(tensor.shape)
    x = tensor.detach().to("cpu", torch.float32).numpy()
    rows = _rows(x)
    k = 0
    if codec is Codec.FP16:
        payload = rows.astype(np.float16).tobytes()
    elif codec is Codec.INT8:
        scales, q = _quantize_rows(rows)
        payload = scales.tobytes() + q.tobytes()
    else:
        k = min(outlier_channels, rows.shape[1])
        peak = np.abs(rows).max(axis=0) if rows.size else np.zeros(rows.shape[1], np.float32)
        channels = np.sort(np.argpartition(-peak, k - 1)[:k]).astype(np.uint16) if k else np.zeros(0, np.uint16)
        keep = np.ones(rows.shape[1], dtype=bool)
        keep[channels] = False
        scales, q = _quantize_rows(np.ascontiguousarray(rows[:, keep]))
        payload = (channels.tobytes() + rows[:, channels].astype(np.float16).tobytes()
                   + scales.tobytes() + q.tobytes())
    if zstd_level:
        payload = zstandard.ZstdCompressor(level=zstd_level).compress(payload)
    head = _HEAD.pack(MAGIC, VERSION, int(codec), zstd_level, _DTYPE_IDS[tensor.dtype], len(shape))
    return head + struct.pack(f"<{len(shape)}I", *shape) + _TAIL.pack(k, len(payload)) + payload


def frame_shape(frame: bytes) -> tuple[int, ...]:
    """The tensor shape a frame's header announces (no payload decoding; for byte accounting)."""
    if len(frame) < _HEAD.size:
        raise FrameError(f"frame is truncated: {len(frame)} bytes, the header alone is {_HEAD.size}")
    ndim = _HEAD.unpack_from(frame)[5]
    if ndim > _MAX_NDIM or len(frame) < _HEAD.size + 4 * ndim:
        raise FrameError("frame header is truncated or claims too many dimensions")
    return tuple(struct.unpack_from(f"<{ndim}I", frame, _HEAD.size))


def decode_frame(frame: bytes) -> torch.Tensor:
    """Decode a frame; FrameError says what is wrong with a bad one."""
    frame = bytes(frame)
    if len(frame) < _HEAD.size:
        raise FrameError(f"frame is truncated: {len(frame)} bytes, the header alone is {_HEAD.size}")
    magic, version, codec_id, zstd_level, dtype_id, ndim = _HEAD.unpack_from(frame)
    if magic != MAGIC:
        raise FrameError(f"not an activation frame: starts with {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError(f"frame version {version} is not supported (this build reads version {VERSION})")
    try:
        codec = Codec(codec_id)
    except ValueError:
        raise FrameError(f"unknown codec id {codec_id}; known: {[c.value for c in Codec]}") from None
    if dtype_id not in _DTYPES:
        raise FrameError(f"unknown dtype id {dtype_id}")
    if ndim > _MAX_NDIM:
        raise FrameError(f"frame claims {ndim} dimensions; at most {_MAX_NDIM}")
    pos = _HEAD.size
    need = pos + 4 * ndim + _TAIL.size
    if len(frame) < need:
        raise FrameError(f"frame is truncated: {len(frame)} bytes, the header needs {need}")
    shape = struct.unpack_from(f"<{ndim}I", frame, pos)
    k, length = _TAIL.unpack_from(frame, pos + 4 * ndim)
    payload = frame[need:]
    if len(payload) != length:
        raise FrameError(f"frame payload is {len(payload)} bytes but the header says {length} (truncated or padded)")
    if zstd_level:
        try:
            payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=1 << 31)
        except zstandard.ZstdError as exc:
            raise FrameError(f"frame payload is not valid zstd: {exc}") from None
    n_rows, channels = _row_shape(shape)
    rows = _decode_payload(payload, codec, n_rows, channels, k)
    return torch.from_numpy(rows.reshape(shape)).to(_DTYPES[dtype_id])


def _decode_payload(payload: bytes, codec: Codec, n_rows: int, channels: int, k: int) -> np.ndarray:
    def take(dtype, count, offset):
        end = offset + count * np.dtype(dtype).itemsize
        if end > len(payload):
            raise FrameError(f"frame payload is too short for its shape ({len(payload)} bytes)")
        return np.frombuffer(payload, dtype=dtype, count=count, offset=offset), end

    if codec is Codec.FP16:
        values, end = take(np.float16, n_rows * channels, 0)
        out = values.astype(np.float32).reshape(n_rows, channels)
    elif codec is Codec.INT8:
        scales, off = take(np.float32, n_rows, 0)
        q, end = take(np.int8, n_rows * channels, off)
        out = q.reshape(n_rows, channels).astype(np.float32) * scales[:, None]
    else:
        if k > channels:
            raise FrameError(f"frame has {k} outlier channels but only {channels} channels")
        ids, off = take(np.uint16, k, 0)
        if k and int(ids.max()) >= channels:
            raise FrameError(f"outlier channel id {int(ids.max())} is outside {channels} channels")
        outliers, off = take(np.float16, n_rows * k, off)
        scales, off = take(np.float32, n_rows, off)
        q, end = take(np.int8, n_rows * (channels - k), off)
        out = np.empty((n_rows, channels), dtype=np.float32)
        keep = np.ones(channels, dtype=bool)
        keep[ids] = False
        out[:, keep] = q.reshape(n_rows, channels - k).astype(np.float32) * scales[:, None]
        out[:, ids] = outliers.reshape(n_rows, k).astype(np.float32)
    if end != len(payload):
        raise FrameError(f"frame payload has {len(payload) - end} bytes more than its shape needs")
    return out


def relative_error(original: torch.Tensor, decoded: torch.Tensor) -> float:
    """||decoded - original|| / ||original|| over the whole tensor (0 for an all-zero original)."""
    a = original.detach().float()
    norm = a.norm().item()
    return 0.0 if norm == 0 else (decoded.float() - a).norm().item() / norm
