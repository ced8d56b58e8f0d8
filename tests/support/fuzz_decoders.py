"""Long fuzz run of the two decoders that read bytes off the link: activation frames and draft trees.

    python tests/support/fuzz_decoders.py --inputs 1000000 --seed 0

Each input is a valid frame (or tree) from a small corpus, mutated one to a
few times: bit flips, byte overwrites, truncation, extension, splices of two
inputs, header fields set to extreme values, the zstd payload swapped for a
bomb, trailing data, a lying content size or a mutated inner payload (with the
frame's length field fixed up half the time, so that mutations reach past the
first check), or plain random bytes. Each goes to its decoder, which may
return or raise its documented error (``FrameError``, ``InvalidTreeError``);
anything else is an undocumented exception, counted and saved (the first few
of each kind, beside the inputs over the memory bound or SLOW_MS) under ``--out``.

Per input it times the call and takes the traced memory peak (tracemalloc:
bytes objects and numpy arrays; torch's own allocator is not traced, and the
process's peak RSS is reported beside it), and compares the peak with what the
input claims: ``memory_bound``, a few times its claimed size as float32 plus
its own length. At the end the slowest inputs (the 64 slowest) are timed again
untraced, best of 3, which tells a slow input from a moment of CPU contention on
a shared machine.

Prints a Markdown table, one row per decoder. The exit status is 1 when an
undocumented exception was seen or an input passed its memory bound.

The mutators are plain functions of (bytes, random.Random) so that the test
suite's hypothesis fuzzing (tests/shared/test_decoder_fuzz.py) drives the
same ones with its own recorded randomness. The long run is a test of the
installed package, so it lives with the tests (as `support.fuzz_decoders`).
"""
from __future__ import annotations

import argparse
import heapq
import math
import random
import resource
import struct
import sys
import tempfile
import time
import tracemalloc
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import zstandard

from edgespec.shared.codec import MAGIC, Codec, claimed_elements, decode_frame, encode_frame
from edgespec.shared.errors import FrameError, InvalidTreeError
from edgespec.shared.tree import DraftTree, decode_tree, encode_tree
from edgespec.shared.wire import MAX_ELEMENTS, MAX_NODES, MAX_TOKEN_ID, ROOT

Mutator = Callable[[bytes, random.Random], bytes]

U8_EXTREMES = (0, 1, 2, 3, 4, 7, 8, 9, 22, 23, 127, 128, 254, 255)
U16_EXTREMES = (0, 1, 2, 7, 8, 9, 255, 256, 32767, 32768, 65534, 65535)
U32_EXTREMES = (0, 1, 2, 3, 4, 7, 16, 255, 256, 65535, 65536, 65537, MAX_ELEMENTS, MAX_ELEMENTS + 1,
                (1 << 31) - 1, 1 << 31, (1 << 32) - 2, (1 << 32) - 1)
_WIDTH_EXTREMES = {"B": U8_EXTREMES, "<H": U16_EXTREMES, "<I": U32_EXTREMES}
SLOW_MS = 50.0  # an input slower than this is reported
SLOWEST_KEPT = 64  # the slowest inputs kept to be timed again at the end
TREE_VOCABS = (None, 320, 151_936)
TREE_MAX_NODES = (MAX_NODES, 64, 1, 0)


# ---- frame layout (see shared/codec.py's docstring) -------------------------------------------

@dataclass(frozen=True)
class Field:
    """One header field of a frame: where it sits and how it is packed."""

    name: str
    offset: int
    fmt: str  # struct format: "B", "<H" or "<I"

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt)


def frame_fields(frame: bytes) -> list[Field]:
    """Header fields of a frame, laid out by the ndim byte it holds.

    An ndim over 8 is laid out as 8: the decoder refuses it before reading any field past ndim.
    """
    ndim = min(frame[8], 8) if len(frame) > 8 else 0
    fields = [Field(name, offset, "B") for offset, name in
              enumerate(("version", "codec", "zstd_level", "dtype", "ndim"), start=4)]
    fields += [Field(f"dim{i}", 9 + 4 * i, "<I") for i in range(ndim)]
    return fields + [Field("outliers", 9 + 4 * ndim, "<H"), Field("length", 11 + 4 * ndim, "<I")]


def payload_offset(frame: bytes) -> int:
    return frame_fields(frame)[-1].offset + 4


def set_field(frame: bytes, fld: Field, value: int) -> bytes:
    """The frame with one header field set to value (wrapped to the field's width); unchanged if too short."""
    if len(frame) < fld.offset + fld.size:
        return frame
    packed = struct.pack(fld.fmt, value % (1 << (8 * fld.size)))
    return frame[:fld.offset] + packed + frame[fld.offset + fld.size:]


def fix_length(frame: bytes) -> bytes:
    """The frame with its length field telling the truth, so that the payload checks are reached."""
    length = frame_fields(frame)[-1]
    return set_field(frame, length, max(0, len(frame) - payload_offset(frame)))


def replace_payload(frame: bytes, payload: bytes) -> bytes:
    return fix_length(frame[:payload_offset(frame)] + payload)


# ---- byte-level mutators (frames and trees) ----------------------------------------------------

def flip_bits(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        bit = rng.randrange(8 * len(out))
        out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def overwrite_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.choice((1, 2, 4))):
        out[rng.randrange(len(out))] = rng.choice((0, 1, 127, 128, 255, rng.randrange(256)))
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(len(data) + 1)]


def extend(data: bytes, rng: random.Random) -> bytes:
    return data + rng.randbytes(rng.choice((1, 2, 4, rng.randrange(64))))


def repeat_chunk(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    j = rng.randrange(i, len(data) + 1)
    return data[:j] + data[i:j] * rng.choice((1, 2, 16)) + data[j:]


def splice(data: bytes, other: bytes, rng: random.Random) -> bytes:
    """A prefix of one input followed by a suffix of another."""
    return data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]


BYTE_MUTATORS: tuple[Mutator, ...] = (flip_bits, overwrite_bytes, truncate, extend, repeat_chunk)


# ---- frame mutators -----------------------------------------------------------------------------

def extreme_value(fld: Field, rng: random.Random) -> int:
    if rng.random() < 0.2:
        return rng.randrange(1 << (8 * fld.size))
    return rng.choice(_WIDTH_EXTREMES[fld.fmt])


def overwrite_field(frame: bytes, rng: random.Random) -> bytes:
    """One header field set to an extreme value (0, 1, 2**32 - 1, MAX_ELEMENTS + 1, ...)."""
    fld = rng.choice(frame_fields(frame))
    return set_field(frame, fld, extreme_value(fld, rng))


def _zstd_content_size_field(payload: bytes) -> tuple[int, int] | None:
    """(offset, size) of a zstd frame's content size field, or None (not zstd, or no such field)."""
    if len(payload) < 5 or payload[:4] != b"\x28\xb5\x2f\xfd":
        return None
    fhd = payload[4]
    single_segment = (fhd >> 5) & 1
    offset = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[fhd & 3]
    size = ((1 if single_segment else 0), 2, 4, 8)[fhd >> 6]
    return (offset, size) if size and len(payload) >= offset + size else None


def lie_about_content_size(frame: bytes, rng: random.Random) -> bytes:
    """The zstd payload's content size field set to another value (the blocks left as they were)."""
    start = payload_offset(frame)
    field_at = _zstd_content_size_field(frame[start:])
    if field_at is None:
        return flip_bits(frame, rng)
    offset, size = field_at
    value = rng.choice((0, 1, rng.randrange(1 << (8 * size)), (1 << (8 * size)) - 1))
    at = start + offset
    return frame[:at] + value.to_bytes(size, "little") + frame[at + size:]


def mutate_inner_payload(frame: bytes, rng: random.Random) -> bytes:
    """Decompress, mutate the raw payload (channel ids, scales, values), compress again: reaches the checks after zstd."""
    payload, level = frame[payload_offset(frame):], frame[6] if len(frame) > 6 else 0
    raw = _small_inflate(payload) if level else payload
    if raw is None:
        return flip_bits(frame, rng)
    if rng.random() < 0.5 and len(raw) >= 4:
        # The first u16s are the outlier channel ids in INT8_OUTLIER: duplicate or reorder them.
        raw = raw[2:4] + raw[:2] + raw[4:] if rng.random() < 0.5 else raw[:2] + raw[:2] + raw[4:]
    else:
        raw = rng.choice(BYTE_MUTATORS)(raw, rng)
    packed = zstandard.ZstdCompressor(level=min(level, 3)).compress(raw) if level else raw
    return replace_payload(frame, packed)


def _small_inflate(payload: bytes, limit: int = 1 << 20) -> bytes | None:
    """The payload inflated, or None when it is not zstd or states more than limit (a bomb from an earlier step)."""
    try:
        if zstandard.frame_content_size(payload) > limit:
            return None
        return zstandard.ZstdDecompressor().decompress(payload, max_output_size=limit)
    except zstandard.ZstdError:
        return None


@dataclass(frozen=True)
class Bombs:
    """zstd payloads that inflate far beyond any small frame's claim (built once: they take a moment)."""

    payloads: tuple[bytes, ...]

    @classmethod
    def build(cls, sizes: Sequence[int] = (1 << 20, 64 << 20, 256 << 20)) -> "Bombs":
        out = []
        chunk = bytes(1 << 20)
        for size in sizes:
            for stated in (True, False):
                # Streamed in 1 MiB chunks: the bomb is built without holding its inflated size.
                cobj = zstandard.ZstdCompressor(level=3, write_content_size=stated).compressobj(
                    size=size if stated else -1)
                parts = [cobj.compress(chunk[:min(len(chunk), size - done)]) for done in range(0, size, len(chunk))]
                out.append(b"".join(parts) + cobj.flush())
        return cls(tuple(out))


def swap_payload(bombs: Bombs) -> Mutator:
    """A mutator that swaps a frame's payload: a bomb, trailing data, a second zstd frame, nothing, noise."""
    def mutate(frame: bytes, rng: random.Random) -> bytes:
        payload = frame[payload_offset(frame):]
        choice = rng.randrange(5)
        if choice == 0:
            new = rng.choice(bombs.payloads)
        elif choice == 1:
            new = payload + rng.randbytes(rng.choice((1, 3, 100)))
        elif choice == 2:
            new = payload + zstandard.ZstdCompressor(level=1).compress(rng.randbytes(rng.randrange(64)))
        elif choice == 3:
            new = b""
        else:
            new = rng.randbytes(rng.randrange(256))
        return replace_payload(frame, new)
    return mutate


def frame_corpus(seed: int = 0) -> list[bytes]:
    """Valid frames of every codec, zstd level and dtype, small shapes (empty and 0-d included)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(4, 16), (3, 5, 8), (1, 1), (2, 64), (7, 33), (0, 8), (3, 0), ()]
    frames = []
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=gen) * 3
        if x.dim() and x.shape[-1] > 4:
            x[..., 2] *= 300  # an outlier channel, as in real activations
        for codec in Codec:
            for level in (0, 1, 3):
                dtype = (torch.float32, torch.float16, torch.bfloat16)[(i + level) % 3]
                k = (0, 2, 8)[(i + level) % 3]
                frames.append(encode_frame(x.to(dtype), codec, level, k))
    return frames


def mutate_frame(frame: bytes, corpus: Sequence[bytes], bombs: Bombs, rng: random.Random) -> bytes:
    """One to a few mutations of a valid frame; the length field fixed up half the time."""
    if rng.random() < 0.04:  # noise, a third of it wearing a valid magic and version
        noise = rng.randbytes(rng.randrange(96))
        return MAGIC + b"\x01" + noise if rng.random() < 0.33 else noise
    mutators: list[Mutator] = [*BYTE_MUTATORS, overwrite_field, overwrite_field, lie_about_content_size,
                               mutate_inner_payload, swap_payload(bombs)]
    out = frame
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        out = splice(out, rng.choice(corpus), rng) if rng.random() < 0.08 else rng.choice(mutators)(out, rng)
    return fix_length(out) if rng.random() < 0.5 else out


# ---- tree mutators ------------------------------------------------------------------------------

def tree_corpus(seed: int = 0) -> list[bytes]:
    """Valid wire trees: empty, one node, chains, a star, random trees up to 255 nodes."""
    rng = random.Random(seed)
    trees = [DraftTree((), ()), DraftTree((5,), (ROOT,)), DraftTree.chain(range(8)),
             DraftTree.chain([MAX_TOKEN_ID] * MAX_NODES), DraftTree(tuple(range(16)), (ROOT,) * 16)]
    for n in (3, 10, 60, 200, MAX_NODES):
        parents = tuple(rng.choice([ROOT, *range(i)]) for i in range(n))
        trees.append(DraftTree(tuple(rng.randrange(320) for _ in range(n)), parents))
    return [encode_tree(t) for t in trees]


def set_node(data: bytes, rng: random.Random) -> bytes:
    """One node's parent or token set to an edge value: ROOT, itself, the next node, the vocabulary's end."""
    n = len(data) // 4
    if not n:
        return data
    i = rng.randrange(n)
    if rng.random() < 0.5:
        value = rng.choice((ROOT, 0, i, i + 1, 254, rng.randrange(256))) % 256
        return data[:4 * i + 3] + bytes([value]) + data[4 * i + 4:]
    token = rng.choice((0, 319, 320, 151_935, 151_936, MAX_TOKEN_ID, rng.randrange(MAX_TOKEN_ID + 1)))
    return data[:4 * i] + token.to_bytes(3, "little") + data[4 * i + 3:]


def mutate_tree(data: bytes, corpus: Sequence[bytes], rng: random.Random) -> bytes:
    if rng.random() < 0.04:
        return rng.randbytes(rng.choice((rng.randrange(64), rng.randrange(1100))))
    mutators: list[Mutator] = [*BYTE_MUTATORS, set_node, set_node]
    out = data
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        out = splice(out, rng.choice(corpus), rng) if rng.random() < 0.08 else rng.choice(mutators)(out, rng)
    return out


# ---- running ------------------------------------------------------------------------------------

def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def claimed_output_bytes(frame: bytes) -> int:
    """The size a frame's header claims (codec.claimed_elements), as float32; 0 when no header can be read.

    Capped at MAX_ELEMENTS: a larger claim is refused, so it must not widen the bound.
    """
    if len(frame) < 9 or frame[8] > 8 or len(frame) < 9 + 4 * frame[8]:
        return 0
    shape = struct.unpack_from(f"<{frame[8]}I", frame, 9)
    return 4 * min(claimed_elements(shape), MAX_ELEMENTS)


def memory_bound(data: bytes, claimed: int) -> int:
    """The most traced memory decoding one input may take: a few times its claimed size, its length, a constant.

    `claimed` is the claimed size as float32 (4 bytes an element). Decoding holds
    the inflated payload (2 bytes an element for FP16, 1 plus 4 a row for INT8),
    the float32 rows, the dequantized values before they are scattered, and for
    INT8_OUTLIER a channel mask and its index (9 bytes a channel): at worst, one
    row of many channels, 18 bytes an element, 4.5 times the claim.
    """
    return 5 * claimed + 4 * len(data) + (1 << 20)


@dataclass
class Tally:
    """What one decoder did with its inputs."""

    decoder: str
    documented: type[Exception]
    inputs: int = 0
    decoded: int = 0
    refused: int = 0  # raised the documented error
    undocumented: Counter = field(default_factory=Counter)  # exception type name -> count
    saved: Counter = field(default_factory=Counter)  # finding kind -> inputs saved
    over_ms: int = 0  # inputs slower than SLOW_MS as run (traced, on a shared CPU)
    slowest: list = field(default_factory=list)  # heap of (ms, input index, data, decoder): the slowest kept
    peak_bytes: int = 0  # largest traced peak of one input
    peak_ratio: float = 0.0  # largest peak / memory_bound
    over_bound: int = 0  # inputs whose peak passed memory_bound
    retimed_ms: float = 0.0  # the kept inputs' worst best-of-3, untraced, at the end
    retimed_over_ms: int = 0  # kept inputs still slower than SLOW_MS when timed again
    seconds: float = 0.0

    def add(self, index: int, data: bytes, decode: Callable[[bytes], object], outcome: str, ms: float,
            peak: int, bound: int) -> None:
        self.inputs += 1
        if outcome == "decoded":
            self.decoded += 1
        elif outcome == "refused":
            self.refused += 1
        else:
            self.undocumented[outcome] += 1
        self.over_ms += ms > SLOW_MS
        entry = (ms, index, data, decode)  # indices are unique: ties never compare the rest
        if len(self.slowest) < SLOWEST_KEPT:
            heapq.heappush(self.slowest, entry)
        elif ms > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, entry)
        self.peak_bytes = max(self.peak_bytes, peak)
        self.peak_ratio = max(self.peak_ratio, peak / bound)
        self.over_bound += peak > bound


def run_one(decode: Callable[[bytes], object], data: bytes,
            documented: type[Exception]) -> tuple[str, float, int, BaseException | None]:
    """(outcome, ms, traced peak bytes, exception): outcome is "decoded", "refused" or the exception's type.

    tracemalloc must be tracing (the peak is then what this call added to what was
    live before it). fuzz() keeps it on for the whole run rather than starting and
    stopping it per call: on CPython 3.11 each start/stop cycle leaks a few hundred
    bytes, which would make the process's own peak RSS meaningless after 10**6 inputs.
    """
    error: BaseException | None = None
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    t0 = time.perf_counter_ns()
    try:
        decode(data)
        outcome = "decoded"
    except documented:
        outcome = "refused"
    except Exception as exc:  # the point of fuzzing: anything else is a finding, kept and reported
        outcome, error = type(exc).__name__, exc
    ms = (time.perf_counter_ns() - t0) / 1e6
    peak = max(0, tracemalloc.get_traced_memory()[1] - base)
    return outcome, ms, peak, error


def finding(outcome: str, ms: float, peak: int, bound: int) -> str | None:
    """What is wrong with one input's run, if anything: an undocumented exception, memory, time."""
    if outcome not in ("decoded", "refused"):
        return outcome
    if peak > bound:
        return "over-memory-bound"
    return "slow" if ms > SLOW_MS else None


def save_finding(out: Path, tally: Tally, kind: str, data: bytes, note: str, error: BaseException | None) -> None:
    """Keep the first 5 inputs of each kind of finding, with what was measured and the traceback."""
    tally.saved[kind] += 1
    if tally.saved[kind] > 5:
        return
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{tally.decoder}-{kind}-{tally.saved[kind]}"
    stem.with_suffix(".bin").write_bytes(data)
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__)) if error else ""
    stem.with_suffix(".txt").write_text(f"{note}\n{text}")


def retime(decode: Callable[[bytes], object], data: bytes) -> float:
    """Best of 3 untraced runs, in ms."""
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter_ns()
        try:
            decode(data)
        except Exception:  # its outcome is already tallied; only its time is wanted here
            pass
        best = min(best, (time.perf_counter_ns() - t0) / 1e6)
    return best


def fuzz(name: str, inputs: int, make: Callable[[int], tuple[bytes, Callable[[bytes], object], str]],
         documented: type[Exception], claimed: Callable[[bytes], int], out: Path, time_limit: float,
         progress_every: int = 100_000) -> Tally:
    """Feed `inputs` inputs from make(i) -> (data, decoder, note) to their decoders and tally them."""
    tally = Tally(name, documented)
    start = time.monotonic()
    tracemalloc.start()
    try:
        for i in range(inputs):
            data, decode, note = make(i)
            outcome, ms, peak, error = run_one(decode, data, documented)
            bound = memory_bound(data, claimed(data))
            tally.add(i, data, decode, outcome, ms, peak, bound)
            if kind := finding(outcome, ms, peak, bound):
                save_finding(out, tally, kind, data, f"{note}: {outcome}, {ms:.2f} ms, {peak:,} bytes traced, "
                                                     f"bound {bound:,}", error)
            if progress_every and (i + 1) % progress_every == 0:
                rate = (i + 1) / (time.monotonic() - start)
                print(f"{name}: {i + 1:,} inputs, {sum(tally.undocumented.values())} undocumented, "
                      f"{tally.over_ms} over {SLOW_MS:.0f} ms, {tally.over_bound} over the memory bound, "
                      f"peak RSS {peak_rss_mib():,.0f} MiB, {rate:,.0f}/s", file=sys.stderr, flush=True)
            if time_limit and time.monotonic() - start > time_limit:
                break
    finally:
        tracemalloc.stop()
    tally.seconds = time.monotonic() - start
    retimed = [retime(decode, data) for _, _, data, decode in tally.slowest]
    tally.retimed_ms = max(retimed, default=0.0)
    tally.retimed_over_ms = sum(ms > SLOW_MS for ms in retimed)
    return tally


def frame_inputs(seed: int, decode: Callable[[bytes], object] = decode_frame):
    corpus, bombs, rng = frame_corpus(seed), Bombs.build(), random.Random(seed)

    def make(i: int) -> tuple[bytes, Callable[[bytes], object], str]:
        return mutate_frame(rng.choice(corpus), corpus, bombs, rng), decode, "decode_frame(data)"
    return make


def tree_inputs(seed: int):
    corpus, rng = tree_corpus(seed), random.Random(seed + 1)
    decoders = {(v, m): (lambda d, v=v, m=m: decode_tree(d, v, m)) for v in TREE_VOCABS for m in TREE_MAX_NODES}

    def make(i: int) -> tuple[bytes, Callable[[bytes], object], str]:
        key = (TREE_VOCABS[i % len(TREE_VOCABS)], TREE_MAX_NODES[(i // 3) % len(TREE_MAX_NODES)])
        return (mutate_tree(rng.choice(corpus), corpus, rng), decoders[key],
                f"decode_tree(data, vocab_size={key[0]}, max_nodes={key[1]})")
    return make


def markdown(tallies: Sequence[Tally], rss_before_mib: float, rss_peak_mib: float) -> str:
    lines = ["| decoder | inputs | decoded | refused (documented error) | undocumented | slowest ms (traced / re-timed) "
             f"| > {SLOW_MS:.0f} ms (as run / re-timed) | peak traced MiB | peak / bound | runtime s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in tallies:
        slowest = max(t.slowest)[0] if t.slowest else 0.0
        undocumented = sum(t.undocumented.values())
        kinds = f" ({', '.join(f'{k} {v}' for k, v in t.undocumented.most_common())})" if undocumented else ""
        lines.append(f"| {t.decoder} | {t.inputs:,} | {t.decoded:,} | {t.refused:,} | {undocumented:,}{kinds} | "
                     f"{slowest:.2f} / {t.retimed_ms:.2f} | {t.over_ms} / {t.retimed_over_ms} | {t.peak_bytes / 2**20:.2f} | "
                     f"{t.peak_ratio:.2f} ({t.over_bound} over) | {t.seconds:,.0f} |")
    lines.append(f"\npeak RSS of the process: {rss_peak_mib:,.0f} MiB ({rss_before_mib:,.0f} MiB before the first "
                 f"input: torch, the corpora, the bombs); bound = 5 x claimed size as float32 + 4 x input "
                 f"length + 1 MiB")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="mutated inputs per decoder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decoders", default="frame,tree", help="comma-separated: frame, tree")
    parser.add_argument("--time-limit", type=float, default=0.0, help="seconds per decoder; 0 = none")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "edgespec-fuzz",
                        help="where inputs that raised undocumented exceptions are saved")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    runs = {"frame": ("decode_frame", frame_inputs, FrameError, claimed_output_bytes),
            "tree": ("decode_tree", tree_inputs, InvalidTreeError, lambda data: 0)}
    names = args.decoders.split(",")
    if unknown := set(names) - set(runs):
        parser.error(f"unknown decoder(s) {sorted(unknown)}; choose from {sorted(runs)}")
    makers = {name: runs[name][1](args.seed) for name in names}
    rss_before = peak_rss_mib()
    tallies = [fuzz(runs[name][0], args.inputs, makers[name], runs[name][2], runs[name][3], args.out,
                    args.time_limit) for name in names]
    print(markdown(tallies, rss_before, peak_rss_mib()))
    if any(t.saved for t in tallies):
        print(f"\nfindings (undocumented exceptions, inputs over the memory bound or {SLOW_MS:.0f} ms) "
              f"saved under {args.out}")
    return 1 if any(t.undocumented or t.over_bound for t in tallies) else 0


if __name__ == "__main__":
    raise SystemExit(main())
