"""Prepacked weights for a float32 model on a CPU: a tree's rows at nearly the price of one row.

On a CPU, torch's float32 linear runs one row as a matrix-vector product that streams the weight once, but a few
rows as a GEMM that reorders the whole weight into its blocked layout on every call. Measured on an AMD EPYC with
AVX2 only (one thread, a 8,960 x 1,536 projection of Qwen2.5-1.5B): 5.1 ms for one row, 11.7 for two, 25 for
seventeen, so a 16-node tree cost nearly five decode steps and verification rarely paid. oneDNN's linear over a
weight reordered once ahead of time (what inductor's freezing does for CPUs; there in oneDNN's layout for 17
rows) took 5.9 / 6.0 / 13.8 ms, and on the
151,936 x 1,536 LM head 98 / 110 / 194 ms against torch's 74 / 164 / 378. One row stays on torch's kernel, which
is the faster there, so each weight is held twice: the model's own (one-row decoding, a tied embedding) and
oneDNN's packed copy (trees, prefill). ``packed_bytes`` says what that costs.

Both sides use it: the server's float32 target (``--packed-weights``, ``server/app.py``) and the client's
float32 independent drafter, whose tree levels are products of several rows too.

The packed kernel computes each row alone: a row gives the same bits in a batch of any size, so a tree's rows do
not depend on its size. Its sums are ordered unlike torch's, as a GEMM's already are unlike a matrix-vector
product's: float32 outputs agree to about 1e-6 of their scale.

Nothing of the model's code is touched: each ``nn.Linear`` of the model is replaced by a ``PackedLinear`` holding
the same parameters under the same names (the state dict and tied weights stay as they were).
"""
from __future__ import annotations

import torch
from torch import nn

MIN_ROWS = 2  # products of fewer rows run on torch's own kernel


def packed_weights_wanted(device: torch.device, dtype: torch.dtype, asked: bool | None,
                          model: nn.Module | None = None) -> bool:
    """Whether a model on `device` in `dtype` gets packed weights: as asked, else (unset) on for float32 on a
    CPU, where it was measured, if `model`'s copy leaves a quarter of the machine's memory free
    (``memory_allows``). Asking for them where oneDNN cannot serve them is refused."""
    possible = device.type == "cpu" and torch.backends.mkldnn.is_available()
    if asked and not possible:
        raise ValueError(f"packed weights need a CPU with oneDNN (mkldnn) in torch; the model is on "
                         f"{device.type}" + ("" if torch.backends.mkldnn.is_available() else
                                             " and this torch has no oneDNN"))
    if asked is None:
        return possible and dtype == torch.float32 and (model is None or memory_allows(linear_bytes(model)))
    return asked


def memory_allows(extra: int, meminfo: str = "/proc/meminfo") -> bool:
    """Whether `extra` bytes more still leave a quarter of the machine's memory available (MemAvailable: free
    memory plus what the page cache would give back). True where the figures cannot be read (not Linux)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            fields = dict(line.split(":", 1) for line in f)
        total, available = (int(fields[k].split()[0]) * 1024 for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        return True
    return available - extra >= total // 4


def _packable(module: nn.Module) -> bool:
    """A plain float32 ``nn.Linear`` on the CPU (a subclass may compute something else)."""
    return type(module) is nn.Linear and module.weight.dtype == torch.float32 and module.weight.device.type == "cpu"


def linear_bytes(model: nn.Module) -> int:
    """Bytes of the weights ``pack_linears`` would copy: every float32 CPU ``nn.Linear``'s."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if _packable(m))


class PackedLinear(nn.Module):
    """An ``nn.Linear``'s weight and bias, and the weight reordered once into oneDNN's layout for multi-row
    products. ``active`` False runs every product on the model's own weight (``set_packed``)."""

    def __init__(self, linear: nn.Linear, min_rows: int = MIN_ROWS):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter: a tied embedding stays tied
        self.bias = linear.bias
        self.min_rows = min_rows
        self.active = True
        # The batch-size hint picks oneDNN's blocking; 16 rows (a tree) measured as fast as 1 or 2 for trees and
        # prefill alike. Not a buffer: an opaque oneDNN tensor cannot be saved, moved or copied like one.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active or x.numel() < self.min_rows * self.in_features:
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, packed from {self.min_rows} rows")


def pack_linears(model: nn.Module, min_rows: int = MIN_ROWS, exclude: tuple[nn.Module, ...] = ()) -> int:
    """Replace every float32 ``nn.Linear`` of `model` (its LM head included) but those in `exclude` by a
    ``PackedLinear``; how many (``_packable``: plain float32 CPU ``nn.Linear`` modules only)."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _packable(child) and not any(child is e for e in exclude):
                setattr(parent, name, PackedLinear(child, min_rows))
                count += 1
    return count


def is_packed(model: nn.Module) -> bool:
    """Whether `model` holds packed weights (``pack_linears`` ran on it)."""
    return any(isinstance(m, PackedLinear) for m in model.modules())


def set_packed(model: nn.Module, active: bool) -> int:
    """Turn the packed products of `model`'s ``PackedLinear`` modules on or off; how many there are."""
    modules = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for m in modules:
        m.active = active
    return len(modules)


def packed_bytes(model: nn.Module) -> int:
    """Bytes the packed copies hold (the model's own weights not counted)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, PackedLinear))
