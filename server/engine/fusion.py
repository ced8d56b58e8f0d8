"""Fewer, larger kernels for the batched engine's decoder, with the model's own modules.

An eager or graph-captured step launches what the model's Python calls: per decoder layer three
projections for Q, K and V, two for the MLP's gate and up, and RMSNorms of six or seven elementwise
kernels each. Inductor would fuse some of it, but a server captures its grid by hand (``graphs``),
so the fusions are made on the model, each a switch (``Fusion``):

- ``qkv`` / ``gate_up``: the weights of the projections that read the same input are concatenated once
  (one matmul, as vLLM's QKVParallelLinear and MergedColumnParallelLinear); the model's attention and MLP
  still call ``q_proj``, ``k_proj``, ``v_proj`` (``gate_proj``, ``up_proj``) one after another, and each
  now returns its slice of the one matmul, made when the first of them is called with a new input. The
  original weights become views into the concatenated one (no second copy);
- ``norm``: each RMSNorm of a known family calls ``torch.nn.functional.rms_norm`` (one fused kernel on
  CUDA) with the module's own weight and epsilon, checked against the module's own output at switch time.

Nothing of the model's code is copied: the switches replace submodules by wrappers around the same
weights, and ``set_fusion`` puts back the model's own modules (the GPU check measures each switch on one
loaded model). The outputs are the same sums in float32, up to a matmul's summation order.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

NORMS = ("Qwen2RMSNorm", "Qwen3RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Phi3RMSNorm")  # weight * x / rms(x):
# Gemma's (1 + weight) is not one of them


@dataclass(frozen=True)
class Fusion:
    """Which fusions the target's decoder runs with."""

    qkv: bool = False  # one matmul for Q, K and V
    gate_up: bool = False  # one matmul for the MLP's gate and up projections
    norm: bool = False  # RMSNorm as torch's fused rms_norm


class _Merged(nn.Module):
    """The concatenated weight of projections that read one input, and the last input's split output."""

    def __init__(self, parts: list[nn.Linear]):
        super().__init__()
        self.sizes = [p.out_features for p in parts]
        self.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]), requires_grad=False)
        biases = [p.bias for p in parts]
        self.bias = (nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)
                     if all(b is not None for b in biases) else None)
        self._input: torch.Tensor | None = None
        self._outputs: tuple[torch.Tensor, ...] = ()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Projection `index`'s output for x: the one matmul runs when x is new. The split is dropped again after
        the last part is read, so no layer holds another's activations."""
        if self._input is not x:
            self._input = x
            self._outputs = torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, -1)
        out = self._outputs[index]
        if index == len(self.sizes) - 1:
            self._input, self._outputs = None, ()
        return out

    def slices(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Each projection's (weight, bias) as views of the concatenated ones."""
        weights = self.weight.split(self.sizes)
        biases = self.bias.split(self.sizes) if self.bias is not None else [None] * len(self.sizes)
        return list(zip(weights, biases))


class _Slice(nn.Module):
    """Stands in for one projection of a ``_Merged`` group: the same call, its share of one matmul."""

    def __init__(self, merged: _Merged, index: int, original: type):
        super().__init__()
        self.merged = [merged]  # in a list: not a submodule of each slice (the group is the parent's)
        self.index = index
        self.original = original
        self.weight, self.bias = merged.slices()[index]  # views: what a reader of q_proj.weight finds
        self.in_features, self.out_features = self.weight.shape[1], self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merged[0].part(x, self.index)


class _FusedRMSNorm(nn.Module):
    """An RMSNorm as one ``rms_norm`` call on the original module's weight and epsilon."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.original = [original]  # put back by ``set_fusion``; not a submodule (its weight is this one's)
        self.weight = original.weight
        self.eps = float(original.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)


QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def set_fusion(model: nn.Module, fusion: Fusion) -> Fusion:
    """Make the model's decoder run with exactly these fusions (fusing or putting back the model's own modules as
    needed); returns what applies (a fusion the architecture has no modules for stays off)."""
    applied = {"qkv": False, "gate_up": False, "norm": False}
    for layer in model.get_decoder().layers:
        for owner, names, key in ((getattr(layer, "self_attn", None), QKV, "qkv"),
                                  (getattr(layer, "mlp", None), GATE_UP, "gate_up")):
            if owner is not None:
                applied[key] |= _set_merged(owner, names, getattr(fusion, key))
    applied["norm"] = _set_norms(model, fusion.norm)
    return Fusion(**applied)


def _set_merged(owner: nn.Module, names: tuple[str, ...], on: bool) -> bool:
    """Merge (on) or split back the projections `names` of `owner`; whether they are merged now."""
    current = [getattr(owner, n, None) for n in names]
    merged = all(isinstance(m, _Slice) for m in current)
    if on and not merged and all(type(m) is nn.Linear for m in current):
        group = _earlier_group(owner, current) or _Merged(current)
        owner.fused_projections = group  # the parent holds the group, so it moves with the model (.to, state)
        for i, (name, old) in enumerate(zip(names, current)):
            setattr(owner, name, _Slice(group, i, type(old)))
        return True
    if not on and merged:
        for name, part in zip(names, current):
            linear = nn.Linear(part.in_features, part.out_features, bias=part.bias is not None,
                               device=part.weight.device, dtype=part.weight.dtype)
            linear.weight = nn.Parameter(part.weight, requires_grad=False)  # views of the group's weight
            if part.bias is not None:
                linear.bias = nn.Parameter(part.bias, requires_grad=False)
            setattr(owner, name, linear)
        # kept: fused again, the projections take back the same weight, where CUDA graphs captured while fused
        # still read it (a new concatenation would leave them reading freed memory)
        owner._split_from = [owner.fused_projections]
        del owner.fused_projections
        return False
    return merged


def _earlier_group(owner: nn.Module, current: list[nn.Linear]) -> _Merged | None:
    """The group these projections were split from, if their weights are still its views."""
    group = getattr(owner, "_split_from", [None])[0]
    if group is None or any(m.weight.data_ptr() != w.data_ptr() for m, (w, _) in zip(current, group.slices())):
        return None
    return group


def _set_norms(model: nn.Module, on: bool) -> bool:
    """Swap every RMSNorm of a known family for ``_FusedRMSNorm`` (on) or back; whether any is fused now."""
    fused = False
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if on and type(child).__name__ in NORMS and _same_output(child):
                setattr(parent, name, _FusedRMSNorm(child))
                fused = True
            elif isinstance(child, _FusedRMSNorm):
                if on:
                    fused = True
                else:
                    setattr(parent, name, child.original[0])
    return fused


@torch.no_grad()
def _same_output(norm: nn.Module) -> bool:
    """Whether torch's rms_norm gives what this module gives on a random input, in float32 (a module of the same
    name that computes something else keeps its own forward)."""
    weight = norm.weight
    x = torch.randn(3, weight.shape[-1], device=weight.device, dtype=weight.dtype)
    want = norm(x).float()
    got = torch.nn.functional.rms_norm(x, weight.shape, weight, float(norm.variance_epsilon)).float()
    tolerance = 1e-5 if weight.dtype == torch.float32 else 2e-2
    return torch.allclose(got, want, rtol=tolerance, atol=tolerance)
