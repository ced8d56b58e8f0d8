"""Where an engine's step time goes: the host's parts and the device's forward, apart.

A step's wall time mixes four things that different changes move: the host packing the batch, the
forward itself (a CUDA graph's replay, or the eager/compiled step), the readback (on a GPU the host
waits there for the device), and the Python that hands each item its rows. ``StepTimes`` keeps their
running totals per engine; the scheduler thread is the only writer, readers (metrics, the server bench)
take differences of two reads.

The forward alone is timed with CUDA events around the step on a GPU (the device's own clock, no
synchronisation: the events are read once the readback has waited for the step anyway) and with
``perf_counter`` around the step on a CPU, where the step runs synchronously in the calling thread.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields

import torch


@dataclass
class StepTimes:
    """Running totals, nanoseconds (``steps``: how many steps they cover)."""

    steps: int = 0
    pack_ns: int = 0  # host: the batch's rows and tables built into the one input
    launch_ns: int = 0  # host: inside the step call (upload and launch on a GPU; the whole forward on a CPU)
    device_ns: int = 0  # the forward alone: CUDA events around the step, or the step's wall time on a CPU
    readback_ns: int = 0  # host: the one device-to-host copy (on a GPU, waiting for the device to finish)
    items_ns: int = 0  # host: per-item Python after the readback (each item's outputs, KV lengths)

    def minus(self, other: "StepTimes") -> "StepTimes":
        return StepTimes(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def per_step_ms(self) -> dict[str, float]:
        """Each part's mean per step, in ms, and ``steps`` (empty when no step ran)."""
        if not self.steps:
            return {}
        return {"steps": float(self.steps)} | {f.name.removesuffix("_ns"): getattr(self, f.name) / self.steps / 1e6
                                               for f in fields(self) if f.name != "steps"}

    def copy(self) -> "StepTimes":
        return StepTimes(*(getattr(self, f.name) for f in fields(self)))


class ForwardTimer:
    """Times the forward of one step: ``start()`` before it, ``stop()`` after it; ``device_ns()`` once the
    step's results have been read back (on CUDA the events have completed by then, so reading them does not
    synchronise)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._t0 = self._t1 = 0
        self._events = None

    def start(self) -> None:
        if self.cuda:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._t0 = time.perf_counter_ns()

    def stop(self) -> int:
        """Host nanoseconds inside the step call."""
        self._t1 = time.perf_counter_ns()
        if self.cuda:
            self._events[1].record()
        return self._t1 - self._t0

    def device_ns(self) -> int:
        if not self.cuda:
            return self._t1 - self._t0
        begin, end = self._events
        end.synchronize()  # already complete after the readback: returns at once
        return int(begin.elapsed_time(end) * 1e6)
