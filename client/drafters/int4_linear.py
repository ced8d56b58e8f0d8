"""Weight-only int4 Linear layers (groups along the input dimension) for a drafter's MLP on a CPU.

A drafting pass of the 0.5B reads about 0.5 GB of int8 weights and is bound by that read; the MLP's gate,
up and down projections hold 87 % of a layer's weights. Stored as 4 bits in groups of 64 input channels
(an asymmetric scale and offset per group, the layout of torch's own CPU int4 kernel) they halve again:
on one core of the 2-core test machine a one-token pass fell from ~84 ms (int8) to ~61 ms, and the drafter's top-1
agreed with the 1.5B target as often as the int8 drafter's did (0.558 / 0.800 against 0.558 / 0.808 on a
prose and a code text). The attention projections and the LM head stay int8: as int4 they cost 1-2 points
of that agreement (the GGUF the 0.5B comes from stores them in 5-8 bits). Only the drafter is quantized;
the target verifies in full precision, so the output stays the target's.

As with int8, the kernel is slower than a 16-bit matrix product at a prompt's hundreds of rows, so a layer
may keep its 16-bit weight for passes of ``FLOAT_ROWS_FROM`` rows or more.
"""
from __future__ import annotations

import torch

from .int8_linear import FLOAT_ROWS_FROM

GROUP = 64  # input channels sharing one scale and offset
LEVELS = 15  # 4 bits: codes 0..15


def int4_matmul_available() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")


def fits_int4(weight: torch.Tensor, group: int = GROUP) -> bool:
    """Whether the CPU kernel takes this weight [N, K]: whole groups along K, an even K to pack two codes a byte,
    output rows in blocks of 16 (the packing's)."""
    n, k = weight.shape
    return group > 0 and k % group == 0 and k % 2 == 0 and n > 0 and n % 16 == 0


def quantize_groups(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes of weight [N, K] per group of `group` input channels: (codes [N, K] int32 in 0..15,
    scales [N, K/group], minima [N, K/group], float32), so that weight ~ minimum + code * scale."""
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    low, high = w.amin(-1), w.amax(-1)
    scale = ((high - low) / LEVELS).clamp(min=1e-8)  # a constant group gets codes 0 and stays exact
    codes = torch.round((w - low[..., None]) / scale[..., None]).clamp(0, LEVELS).to(torch.int32)
    return codes.reshape(n, k), scale, low


def dequantize_groups(codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """The float32 weight [N, K] the codes stand for (the reference the kernel is tested against)."""
    n, k = codes.shape
    group = k // scale.shape[1]
    return (low[..., None] + codes.float().reshape(n, -1, group) * scale[..., None]).reshape(n, k)


class Int4Linear(torch.nn.Module):
    """y = x @ dequantized(weight).T + bias with torch's CPU int4 kernel; 16-bit activations."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, group: int, out_features: int,
                 in_features: int, bias: torch.Tensor | None, weight_float: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight_int4", packed)  # the kernel's packed layout
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [K/group, N, 2], the activations' dtype
        self.register_buffer("bias", bias)
        self.register_buffer("weight_float", weight_float, persistent=False)  # for calls of many rows
        self.group, self.out_features, self.in_features = group, out_features, in_features

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group: int = GROUP,
                    keep_float: bool = False) -> "Int4Linear":
        if not fits_int4(weight, group):
            raise ValueError(f"an int4 weight needs whole groups of {group} input channels and output rows in "
                             f"blocks of 16, not shape {tuple(weight.shape)}")
        codes, scale, low = quantize_groups(weight, group)
        # The kernel computes (code - 8) * scale + zero, so its zero is the group's minimum plus 8 steps.
        zeros = low + 8 * scale
        scales_and_zeros = torch.stack([scale.t(), zeros.t()], dim=-1).to(weight.dtype).contiguous()
        packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
        n, k = weight.shape
        return cls(packed, scales_and_zeros, group, n, k, None if bias is None else bias.detach().clone(),
                   weight.detach() if keep_float else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.weight_float is not None and flat.shape[0] >= FLOAT_ROWS_FROM:
            return torch.nn.functional.linear(x.to(self.weight_float.dtype), self.weight_float, self.bias)
        dtype = self.scales_and_zeros.dtype
        y = torch._weight_int4pack_mm_for_cpu(flat.to(dtype), self.weight_int4, self.group, self.scales_and_zeros)
        y = y.reshape(*x.shape[:-1], -1)
        return y if self.bias is None else y + self.bias
