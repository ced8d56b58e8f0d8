"""Recorded links to replay: mahimahi delivery traces and per-second CSV traces.

- mahimahi (https://github.com/ravinet/mahimahi): one integer a line, the time in
  ms at which the link may deliver one 1500-byte packet; the file loops with a
  period equal to its last timestamp.
- CSV, in the style of G-NetTrack exports used by public 4G/5G data sets: a header
  row, then one row a second; a throughput column (kbit/s by default, e.g.
  `DL_bitrate`) and optionally an RTT column in ms. The trace loops.
"""
from __future__ import annotations

import bisect
import csv
from dataclasses import dataclass
from pathlib import Path

from .profile import ProfileError, TraceSpec

MAHIMAHI_SLOT_BYTES = 1500


@dataclass(frozen=True)
class MahimahiTrace:
    times_s: tuple[float, ...]  # delivery slots within one period, seconds, non-decreasing
    period_s: float  # the trace repeats after this long (its last timestamp)
    slot_bytes: int = MAHIMAHI_SLOT_BYTES  # bytes one slot can deliver

    def slot_time(self, k: int) -> float:
        """Trace time of the k-th slot counted from the start, across loops."""
        n = len(self.times_s)
        return (k // n) * self.period_s + self.times_s[k % n]

    def first_slot_at(self, t: float) -> int:
        """Index of the first slot at or after trace time t."""
        n = len(self.times_s)
        loops = max(0, int(t // self.period_s))
        i = bisect.bisect_left(self.times_s, t - loops * self.period_s)
        return loops * n + i  # i == n rolls over to the next loop's first slot


@dataclass(frozen=True)
class CsvTrace:
    rates_bits_s: tuple[float, ...]  # throughput of each second
    rtts_ms: tuple[float, ...] | None  # RTT of each second, when the trace has it

    @property
    def has_rtt(self) -> bool:
        return self.rtts_ms is not None

    def rate_bits_s(self, second: int) -> float:
        return self.rates_bits_s[second % len(self.rates_bits_s)]

    def rtt_ms(self, second: int) -> float:
        assert self.rtts_ms is not None
        return self.rtts_ms[second % len(self.rtts_ms)]


def parse_mahimahi(text: str, source: str = "<trace>") -> MahimahiTrace:
    times: list[float] = []
    last_ms = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        try:
            ms = int(line)
        except ValueError:
            raise ProfileError(f"mahimahi trace {source!r} line {lineno}: expected an integer "
                               f"time in ms, got {line!r}") from None
        if ms < 0 or ms < last_ms:
            raise ProfileError(f"mahimahi trace {source!r} line {lineno}: times must be >= 0 and "
                               f"non-decreasing, got {ms} after {last_ms}")
        last_ms = ms
        times.append(ms / 1000)
    if not times or times[-1] <= 0:
        raise ProfileError(f"mahimahi trace {source!r} has no delivery slot after 0 ms, so it "
                           f"carries nothing")
    return MahimahiTrace(tuple(times), times[-1])


def parse_csv_trace(text: str, throughput_column: str, throughput_unit: str = "kbit",
                    rtt_column: str | None = None, source: str = "<trace>") -> CsvTrace:
    rows = list(csv.DictReader(text.splitlines()))
    if not rows:
        raise ProfileError(f"CSV trace {source!r} has no rows after its header")
    for col in (throughput_column, rtt_column):
        if col is not None and col not in rows[0]:
            raise ProfileError(f"CSV trace {source!r} has no column {col!r} "
                               f"(columns: {', '.join(rows[0])})")
    scale = 1e3 if throughput_unit == "kbit" else 1e6
    rates, rtts = [], []
    last_rtt = None
    for i, row in enumerate(rows, 2):
        rates.append(_number(row[throughput_column], source, i, throughput_column, missing=0.0) * scale)
        if rtt_column is not None:
            # G-NetTrack leaves a cell empty ("-") when nothing was measured: keep the last value.
            last_rtt = _number(row[rtt_column], source, i, rtt_column, missing=last_rtt)
            rtts.append(last_rtt)
    if not any(r > 0 for r in rates):
        raise ProfileError(f"CSV trace {source!r}: column {throughput_column!r} is 0 everywhere, "
                           f"so the link would carry nothing")
    if rtt_column is not None:
        first = next((r for r in rtts if r is not None), None)
        if first is None:
            raise ProfileError(f"CSV trace {source!r}: column {rtt_column!r} has no value")
        rtts = [first if r is None else r for r in rtts]
    return CsvTrace(tuple(rates), tuple(rtts) if rtt_column is not None else None)


def _number(cell: str | None, source: str, row: int, col: str, missing):
    cell = (cell or "").strip()
    if cell in ("", "-"):
        return missing
    try:
        value = float(cell)
    except ValueError:
        raise ProfileError(f"CSV trace {source!r} row {row} column {col!r}: expected a number, "
                           f"got {cell!r}") from None
    if value < 0:
        raise ProfileError(f"CSV trace {source!r} row {row} column {col!r}: must be >= 0, got {value}")
    return value


def load_trace(spec: TraceSpec) -> MahimahiTrace | CsvTrace:
    path = Path(spec.path)
    text = path.read_text()
    if spec.format == "mahimahi":
        return parse_mahimahi(text, str(path))
    return parse_csv_trace(text, spec.throughput_column, spec.throughput_unit, spec.rtt_column,
                           str(path))
