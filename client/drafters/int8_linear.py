"""Weight-only int8 Linear layers for a drafter on a CPU.

A small LM drafting one to three tokens a pass is bound by reading its weights;
int8 weights (one scale per output channel, activations left in bf16/fp32) halve
the bytes read. On the 2-core test machine the 0.5B's decoder pass fell from
~115 ms (bf16) to ~78 ms, with its top-1 agreeing with bf16 on ~98% of
positions. Only the drafter is quantized: the target verifies in full
precision, so the output stays exactly the target's.

The int8 kernel is a matrix-vector kernel: at one or two rows it is ~2x faster
than bf16, but at a prompt's hundreds of rows it is ~2x slower than bf16's
matrix-matrix kernel. A layer may therefore keep its 16-bit weight as well
(``keep_float``) and use it for passes of ``FLOAT_ROWS_FROM`` rows or more
(the drafter's prefill): 1.5 GB instead of 0.5 GB for the 0.5B, prefill at
bf16 speed, drafting at int8 speed.

Dynamic int8 (``torch.ao.quantization.quantize_dynamic``) is faster still but
quantizes activations per tensor, which Qwen's outlier channels ruin (top-1
agreement ~75%), so it is not used.
"""
from __future__ import annotations

import torch


def int8_matmul_available() -> bool:
    return hasattr(torch, "_weight_int8pack_mm")


FLOAT_ROWS_FROM = 48  # rows per call from which a kept 16-bit weight beats the int8 kernel (2-core CPU)


class Int8Linear(torch.nn.Module):
    """y = x @ (weight_int8 * scale).T + bias, with the int8 kernel torch ships for CPUs."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None,
                 weight_float: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight_int8", weight)  # [N, K] int8
        self.register_buffer("scales", scales)  # [N], the activations' dtype
        self.register_buffer("bias", bias)  # [N] or None
        # [N, K] the original weight, for calls of many rows (not saved: it is the model's own)
        self.register_buffer("weight_float", weight_float, persistent=False)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    keep_float: bool = False) -> "Int8Linear":
        """Symmetric per-output-channel quantization of a float weight [N, K]."""
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
        return cls(q, scale.to(weight.dtype), None if bias is None else bias.detach().clone(),
                   weight.detach() if keep_float else None)

    def rows(self, ids: torch.Tensor) -> "Int8Linear":
        """The layer restricted to output rows ids (a reduced LM head)."""
        return Int8Linear(self.weight_int8[ids].contiguous(), self.scales[ids].contiguous(),
                          None if self.bias is None else self.bias[ids].contiguous(),
                          None if self.weight_float is None else self.weight_float[ids].contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [..., K] -> [..., N]
        flat = x.reshape(-1, x.shape[-1]).to(self.scales.dtype)
        if self.weight_float is not None and flat.shape[0] >= FLOAT_ROWS_FROM:
            return torch.nn.functional.linear(x.to(self.weight_float.dtype), self.weight_float, self.bias)
        y = torch._weight_int8pack_mm(flat, self.weight_int8, self.scales).reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias


def head_rows(head: torch.nn.Module, ids: torch.Tensor | None) -> torch.nn.Module:
    """An LM head (nn.Linear or Int8Linear) cut to output rows ids (all rows when ids is None)."""
    if ids is None:
        return head
    if isinstance(head, Int8Linear):
        return head.rows(ids)
    cut = torch.nn.Linear(head.in_features, len(ids), bias=head.bias is not None,
                          device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        cut.weight.copy_(head.weight[ids])  # a contiguous copy: the matmul streams it
        if head.bias is not None:
            cut.bias.copy_(head.bias[ids])
    return cut.requires_grad_(False)
