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
    INT8_OUTLIER: channel ids u16[K] (strictly increasing) | outlier values f16[T*K] | scales f32[T]
                  | values i8[T*(C-K)]
K is 0 for FP16 and INT8. A zstd payload is one zstd frame that states its
content size (zstd's one-shot compressor, which the encoder uses, always does).

Decoding trusts nothing in a frame: frames come off the network. Before
allocating anything it checks the header against the payload: the claimed
size (``claimed_elements``: the product of the non-zero dimensions) against
``max_elements`` (``shared.wire.MAX_ELEMENTS`` by default), and the payload's length, or
the zstd content size, against exactly what the shape needs; only then does it
inflate, into that many bytes. Its memory is then a small multiple of the
claimed size (the payload, float32 rows and a temporary of the same size) and
its time linear in the frame's length plus the claimed size. Every refusal is
a ``FrameError`` that says what was wrong; no other exception leaves
``decode_frame``.
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

import numpy as np
import torch
import zstandard

from .errors import FrameError
from .wire import MAX_ELEMENTS

MAGIC = b"ESAF"
VERSION = 1
_HEAD = struct.Struct("<4sBBBBB")
_TAIL = struct.Struct("<HI")
_MAX_NDIM = 8
_MAX_ZSTD_LEVEL = 22
# A whole zstd frame of known size inflates straight into its output; a truncated one falls back
# to a window buffer of the size its header asks. An honest window is at most twice the content
# (zstd rounds up to a power of two): never let a hostile header ask for zstd's default 128 MiB.
_ZSTD_WINDOW_FLOOR = 1 << 20
_ZSTD_WINDOW_MAX = 1 << 31  # zstd's own ceiling (windowLog 31)
_ZSTD_SIZE_UNKNOWN = -1  # what zstandard.frame_content_size returns (not its CONTENTSIZE_UNKNOWN)



DEFAULT_ZSTD_LEVEL = 3  # 0 = no zstd; 1..3 are the fast levels worth paying on a live link
DEFAULT_OUTLIER_CHANNELS = 8  # float16 channels INT8_OUTLIER keeps apart per row (the wire's 0 means this)


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
    zstd_level: int = DEFAULT_ZSTD_LEVEL  # 0 = no zstd; at most 22
    outlier_channels: int = DEFAULT_OUTLIER_CHANNELS  # K for INT8_OUTLIER

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec(self.codec))
        if not 0 <= self.zstd_level <= _MAX_ZSTD_LEVEL:
            raise ValueError(f"zstd_level must be in 0..{_MAX_ZSTD_LEVEL}, got {self.zstd_level}")
        if self.outlier_channels < 0 or self.outlier_channels > 65535:
            raise ValueError(f"outlier_channels must be in 0..65535, got {self.outlier_channels}")

    def encode(self, tensor: torch.Tensor) -> bytes:
        return encode_frame(tensor, self.codec, self.zstd_level, self.outlier_channels)


def frame_element_limit(rows: int, values_per_row: int) -> int:
    """The most elements a frame may claim when it carries `rows` tokens of at most `values_per_row` values each:
    what a live message can legitimately hold (a session's rows x its feature width), far below MAX_ELEMENTS,
    so a small hostile frame cannot make the decoder allocate more than the session's own activations."""
    if rows < 0 or values_per_row < 0:
        raise ValueError(f"rows and values_per_row must be >= 0, got {rows} and {values_per_row}")
    return rows * values_per_row


def _row_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """[T, C] view of a shape: C is the last dimension, T the product of the rest."""
    if not shape:
        return 1, 1
    # math.prod, not np.prod: Python ints cannot wrap, so a hostile shape cannot either.
    return math.prod(shape[:-1]), int(shape[-1])


def _quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    absmax = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0], np.float32)
    # f32, not f16: rows with a small absmax would get a subnormal f16 scale and lose precision.
    scales = (absmax / 127.0).astype(np.float32)
    safe = np.where(scales == 0, 1.0, scales)
    q = np.clip(np.rint(rows / safe[:, None]), -127, 127).astype(np.int8)
    return scales, q


def encode_frame(tensor: torch.Tensor, codec: Codec = Codec.INT8_OUTLIER, zstd_level: int = DEFAULT_ZSTD_LEVEL,
                 outlier_channels: int = DEFAULT_OUTLIER_CHANNELS) -> bytes:
    """Encode one tensor into a self-describing frame."""
    codec = Codec(codec)
    if tensor.dtype not in _DTYPE_IDS:
        raise FrameError(f"cannot encode dtype {tensor.dtype}; expected one of {list(_DTYPE_IDS)}")
    if tensor.dim() > _MAX_NDIM:
        raise FrameError(f"cannot encode a {tensor.dim()}-D tensor; at most {_MAX_NDIM} dimensions")
    shape = tuple(tensor.shape)
    x = tensor.detach().to("cpu", torch.float32).numpy()
    rows = x.reshape(_row_shape(x.shape))
    k = 0
    if codec is Codec.FP16:
        payload = rows.astype(np.float16).tobytes()
    elif codec is Codec.INT8:
        scales, q = _quantize_rows(rows)
        payload = scales.tobytes() + q.tobytes()
    else:
        k = min(outlier_channels, rows.shape[1])
        if k and rows.shape[1] > 1 << 16:
            # Channel ids travel as u16; past 65536 channels they would wrap and name the wrong channel.
            raise FrameError(f"cannot encode {rows.shape[1]} channels with outliers: channel ids are u16 "
                             f"(at most 65536 channels); use Codec.INT8 or outlier_channels=0")
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


@dataclass(frozen=True)
class _Header:
    """What a frame's header claims, checked against the limits (not yet against the payload)."""

    codec: Codec
    zstd_level: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    n_rows: int  # T
    channels: int  # C
    outliers: int  # K
    payload: bytes  # as it travelled (zstd or not)

    @property
    def raw_size(self) -> int:
        """Bytes of the payload before zstd that this shape, codec and K need."""
        t, c, k = self.n_rows, self.channels, self.outliers
        if self.codec is Codec.FP16:
            return 2 * t * c
        if self.codec is Codec.INT8:
            return 4 * t + t * c
        return 2 * k + 2 * t * k + 4 * t + t * (c - k)


def claimed_elements(shape: tuple[int, ...]) -> int:
    """The size a frame's shape claims: the product of its non-zero dimensions.

    It is the element count when there is one, and otherwise still bounds T and C,
    which cost memory of their own: (0, 2**32 - 1) holds no element, yet would need
    per-channel arrays of 2**32 - 1; (2**27, 0) as INT8 carries 2**27 scales.
    """
    return math.prod(d for d in shape if d)


def decode_frame(frame: bytes, max_elements: int = MAX_ELEMENTS) -> torch.Tensor:
    """Decode a frame; FrameError says what is wrong with a bad one.

    ``max_elements`` bounds the tensor a frame may claim (see ``MAX_ELEMENTS``).
    """
    header = _read_header(bytes(frame), max_elements)
    raw = _inflate(header) if header.zstd_level else _check_raw(header)
    # A hostile frame's scales may be huge or inf: the product is what the frame says, and a
    # warning per frame would only flood the client's log.
    with np.errstate(over="ignore", invalid="ignore"):
        rows = _decode_payload(raw, header.codec, header.n_rows, header.channels, header.outliers)
    return torch.from_numpy(rows.reshape(header.shape)).to(header.dtype)


def _read_header(frame: bytes, max_elements: int) -> _Header:
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
    if zstd_level > _MAX_ZSTD_LEVEL:
        raise FrameError(f"frame claims zstd level {zstd_level}; levels are 0 (none) to {_MAX_ZSTD_LEVEL}")
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
    if claimed_elements(shape) > max_elements:
        raise FrameError(f"frame claims shape {shape} ({claimed_elements(shape):,} elements counting the "
                         f"non-zero dimensions); the limit is {max_elements:,} (max_elements)")
    n_rows, channels = _row_shape(shape)
    if codec is not Codec.INT8_OUTLIER and k:
        raise FrameError(f"{codec.name} frame claims {k} outlier channels; only INT8_OUTLIER frames have them")
    if k > channels:
        raise FrameError(f"frame has {k} outlier channels but only {channels} channels")
    payload = frame[need:]
    if len(payload) != length:
        raise FrameError(f"frame payload is {len(payload)} bytes but the header says {length} (truncated or padded)")
    return _Header(codec, zstd_level, _DTYPES[dtype_id], shape, n_rows, channels, k, payload)


def _check_raw(header: _Header) -> bytes:
    """An uncompressed payload must be exactly as long as its shape needs."""
    size, need = len(header.payload), header.raw_size
    if size < need:
        raise FrameError(f"frame payload is too short for its shape ({size} bytes; shape {header.shape} "
                         f"as {header.codec.name} with {header.outliers} outliers needs {need})")
    if size > need:
        raise FrameError(f"frame payload has {size - need} bytes more than its shape needs "
                         f"(shape {header.shape} as {header.codec.name} needs {need})")
    return header.payload


def _inflate(header: _Header) -> bytes:
    """Decompress a zstd payload into exactly raw_size bytes, never more (a small frame can claim gigabytes)."""
    need = header.raw_size
    try:
        # python-zstandard allocates the stated content size and ignores max_output_size: check it first.
        stated = zstandard.frame_content_size(header.payload)
    except zstandard.ZstdError as exc:
        raise FrameError(f"frame payload is not valid zstd: {exc}") from None
    if stated == _ZSTD_SIZE_UNKNOWN:
        # Without it the only bound is to inflate up to the claim and compare afterwards: work and
        # memory for a claim the payload may not back (the encoder always states it).
        raise FrameError("frame's zstd payload does not state its content size; it must, so that "
                         "the decoder checks it against the shape before inflating")
    if stated != need:
        raise FrameError(f"frame's zstd payload inflates to {stated} bytes but shape {header.shape} as "
                         f"{header.codec.name} needs {need}")
    dctx = zstandard.ZstdDecompressor(max_window_size=min(max(2 * need, _ZSTD_WINDOW_FLOOR), _ZSTD_WINDOW_MAX))
    try:
        # max_output_size for defence in depth (0 would mean no limit, hence at least 1).
        raw = dctx.decompress(header.payload, max_output_size=max(need, 1), allow_extra_data=False)
    except zstandard.ZstdError as exc:
        raise FrameError(f"frame payload is not valid zstd: {exc}") from None
    if len(raw) != need:
        raise FrameError(f"frame's zstd payload inflates to {len(raw)} bytes but shape {header.shape} as "
                         f"{header.codec.name} needs {need}")
    return raw


def _decode_payload(payload: bytes, codec: Codec, n_rows: int, channels: int, k: int) -> np.ndarray:
    """Rows [T, C] as float32 from a payload already checked to be exactly the size they need."""
    def take(dtype, count, offset):
        end = offset + count * np.dtype(dtype).itemsize
        return np.frombuffer(payload, dtype=dtype, count=count, offset=offset), end

    if codec is Codec.FP16:
        values, _ = take(np.float16, n_rows * channels, 0)
        return values.astype(np.float32).reshape(n_rows, channels)
    if codec is Codec.INT8:
        scales, off = take(np.float32, n_rows, 0)
        q, _ = take(np.int8, n_rows * channels, off)
        return _dequantize(q.reshape(n_rows, channels), scales)
    ids, off = take(np.uint16, k, 0)
    _check_channel_ids(ids, channels)
    if not n_rows:
        # No element, but C may be up to max_elements: the channel mask below would cost C, not the output.
        return np.empty((0, channels), dtype=np.float32)
    outliers, off = take(np.float16, n_rows * k, off)
    scales, off = take(np.float32, n_rows, off)
    q, _ = take(np.int8, n_rows * (channels - k), off)
    out = np.empty((n_rows, channels), dtype=np.float32)
    keep = np.ones(channels, dtype=bool)
    keep[ids] = False
    out[:, keep] = _dequantize(q.reshape(n_rows, channels - k), scales)
    out[:, ids] = outliers.reshape(n_rows, k).astype(np.float32)
    return out


def _dequantize(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """q [T, C] int8 times scales [T] as float32: the same numbers as q.astype(float32) * scales,
    without a float32 copy of q (a frame's peak memory drops by 4 bytes an element)."""
    return np.multiply(q, scales[:, None], dtype=np.float32)


def _check_channel_ids(ids: np.ndarray, channels: int) -> None:
    """Outlier ids are strictly increasing (the encoder sorts them) and inside the channels.

    Strictly increasing also rules out duplicates, which would leave fewer kept
    channels than the int8 values to put in them.
    """
    if not len(ids):
        return
    steps = np.flatnonzero(ids[1:] <= ids[:-1])
    if len(steps):
        i = int(steps[0]) + 1
        what = "repeats" if ids[i] == ids[i - 1] else "comes after"
        raise FrameError(f"outlier channel ids must be strictly increasing: id {int(ids[i])} at position {i} "
                         f"{what} {int(ids[i - 1])}")
    if int(ids[-1]) >= channels:
        raise FrameError(f"outlier channel id {int(ids[-1])} is outside {channels} channels")
