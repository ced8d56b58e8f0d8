"""The target's frozen pieces a drafter runs on the client.

The client always has the target's token embedding, final norm and LM head, and
for MoA with TLI = N its last N decoder layers: they come from the target's own
files, never from a drafter checkpoint. ``TargetParts`` holds them, frozen, and
runs the TLI layers as the target's own Hugging Face modules (no copied model
code): the K/V those layers attend to are handed in through a minimal cache
object, so verified tokens use the server's K/V and drafted tokens their own.

The LM head can be held in int8 (``Int8Head`` and the pure functions that make and run it, first in this
module), which is how a drafter runs it on a CPU. A learned drafter's step is mostly the LM head: a few rows
against [V', E] weights, so it runs at the speed the weights are read. Int8 weights halve bf16's bytes, and int8
x int8 products with int32 sums (``torch._int_mm``) take a drafting level of a width-768 EAGLE head over 65,536
ids of the 1.5B's head from 22 to 13 ms for one row and from 29 to 23 ms for eight, on one AVX512 core (``bench
drafter_cost``). The rows are quantized one scale per vocabulary row; each input row one scale per row, at run
time. The final norm's output has a few channels far above the rest (the 1.5B's absmax is ~12x its RMS), which
would set every row's scale: the channels with the norm's largest weights are kept out of the int8 product and
added in float32 (8 of 1,536 channels: [V', 8] floats). On the 1.5B's own answers the top-1 id then agrees with
float32's on 99.55 % of positions (bf16: 99.65 %; int8 without the kept channels: 98.25 %).

Without int8 dot products in hardware (VNNI, AVX-VNNI, AMX: many AVX2 laptops) ``torch._int_mm`` is slow: on an
AVX2 EPYC core a drafting level of 4 rows over 65,536 ids took 278 ms with it, 93 in float32 and 35 with
``torch._weight_int8pack_mm`` (the same int8 rows, bf16 inputs, one scale per row; ``bench drafter_cost``). That
kernel is the ``"int8pack"`` path: its logits come out in bf16, whose steps (0.125 at 16-32) would tie the
candidates a tree ranks, so each row's best ``REFINE`` ids are computed again in float32 from the same int8 rows
and the float32 inputs.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from edgespec.shared.errors import InvalidTreeError
from edgespec.shared.kv import with_cache
from edgespec.shared.models.loading import model_location

from .blocks import KV, additive
from .checkpoint import DrafterCheckpointError


# -- the LM head in int8: pure functions ---------------------------------------------------------
KEPT_CHANNELS = 8


REFINE = 32  # "int8pack": ids per row whose logits are computed again in float32 (a tree takes a few per node)


@functools.cache  # the CPU's flags do not change while a process runs
def int8_head_kernel() -> str:
    """The int8 head's kernel on this CPU: "int_mm" (int8 x int8, ``torch._int_mm``) where int8 dot products are
    in hardware, else "int8pack" (bf16 inputs, ``torch._weight_int8pack_mm``); see the module's note."""
    from edgespec.shared.device import cpu_has_int8_dot

    return "int_mm" if cpu_has_int8_dot() else "int8pack"


@dataclass(frozen=True)
class Int8Head:
    """LM-head rows in int8 with the kept channels apart."""

    weight: torch.Tensor  # int8 [V, E]; the kept channels' columns are zero
    scale: torch.Tensor  # float32 [V]: row v's weights are weight[v] * scale[v]
    kept: torch.Tensor  # float32 [V, K]: the weights of the kept channels
    channels: torch.Tensor  # long [K]: input channels kept in float
    scale_bf16: torch.Tensor | None = None  # bf16 [V]: ``scale`` as "int8pack" takes it (None: made per call)

    @property
    def rows(self) -> int:
        return self.weight.shape[0]


def kept_channels(norm_weight: torch.Tensor, k: int = KEPT_CHANNELS) -> torch.Tensor:
    """The input channels to keep in float: the final norm's largest weights, which scale its outliers up."""
    return torch.topk(norm_weight.detach().float().abs(), min(k, norm_weight.numel())).indices.sort().values


def quantize_head(weight: torch.Tensor, channels: torch.Tensor, chunk: int = 16384) -> Int8Head:
    """[V, E] LM-head rows (any float dtype) -> int8 rows with one scale each, ``channels`` kept in float.
    Rows go ``chunk`` at a time, so the float copies stay small beside a 151,936-row head."""
    parts = [_quantize_rows(weight[i:i + chunk].detach().float(), channels)
             for i in range(0, max(1, weight.shape[0]), chunk)]
    q, scale, kept = (torch.cat(x) for x in zip(*parts))
    return Int8Head(q, scale, kept, channels, scale.to(torch.bfloat16))


def _quantize_rows(w: torch.Tensor, channels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kept = w[:, channels].contiguous()
    w = w.index_fill(1, channels, 0.0)
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale, kept


def int8_logits(hidden: torch.Tensor, head: Int8Head, kernel: str | None = None) -> torch.Tensor:
    """Logits [T, V] (float32) of LM-head inputs [T, E] through an int8 head; ``kernel`` "int_mm" or "int8pack"
    (None: ``int8_head_kernel()``, this CPU's faster one)."""
    kernel = kernel or int8_head_kernel()
    h = hidden.float()
    rest = h.index_fill(1, head.channels, 0.0)
    if kernel == "int8pack":
        return _int8pack_logits(h, rest, head)
    if kernel != "int_mm":
        raise ValueError(f"unknown int8 head kernel {kernel!r}; choose int_mm or int8pack")
    step = (rest.abs().amax(1, keepdim=True) / 127).clamp_min(1e-12)
    q = torch.round(rest / step).clamp_(-127, 127).to(torch.int8)
    # _int_mm takes [T, E] x [E, V]; the transposed view of the row-major head is the layout it reads fastest.
    return torch._int_mm(q, head.weight.t()).float() * step * head.scale + h[:, head.channels] @ head.kept.T


def _int8pack_logits(h: torch.Tensor, rest: torch.Tensor, head: Int8Head) -> torch.Tensor:
    kept = h[:, head.channels] @ head.kept.T
    scale = head.scale_bf16 if head.scale_bf16 is not None else head.scale.to(torch.bfloat16)
    logits = torch._weight_int8pack_mm(rest.to(torch.bfloat16), head.weight, scale).float() + kept
    top = logits.topk(min(REFINE, head.rows), -1).indices  # [T, R]: the ids a tree may take, in float32 again
    exact = torch.einsum("te,tre->tr", rest, head.weight[top].float()) * head.scale[top] + kept.gather(1, top)
    return logits.scatter_(1, top, exact)


def select_rows(head: Int8Head, ids: torch.Tensor) -> Int8Head:
    return Int8Head(head.weight[ids].contiguous(), head.scale[ids], head.kept[ids].contiguous(), head.channels,
                    None if head.scale_bf16 is None else head.scale_bf16[ids])


# -- the target's parts -------------------------------------------------------------------------

class _GivenKV:
    """What a HF attention layer calls ``past_key_values``: past K/V handed in, new K/V kept.

    HF attention calls ``update(k, v, layer_idx)`` and attends to what it returns, so
    this is the one hook needed to make a target layer attend to K/V we choose.
    """

    def __init__(self, past: KV | None):
        self.past = past
        self.new: KV | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        # k, v: [1, kv_heads, T, D]
        self.new = KV(k[0], v[0])
        if self.past is None:
            return k, v
        return torch.cat([self.past.k[None], k], 2), torch.cat([self.past.v[None], v], 2)


@dataclass(frozen=True)
class TargetShape:
    hidden_size: int  # E
    num_layers: int  # L
    kv_heads: int
    head_dim: int
    vocab_size: int

    @property
    def kv_size(self) -> int:  # E_kv
        return self.kv_heads * self.head_dim


def target_shape(model) -> TargetShape:
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return TargetShape(cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim, cfg.vocab_size)


class TargetParts(nn.Module):
    """Frozen embedding, final norm, LM head (optionally cut to a reduced vocabulary) and the last
    ``tli`` decoder layers of a target ``*ForCausalLM``."""

    def __init__(self, model, tli: int = 0, vocab_ids: torch.Tensor | None = None, dtype: torch.dtype | None = None,
                 head_dtype: torch.dtype | None = None):
        super().__init__()
        self.shape = target_shape(model)
        if not 0 <= tli <= self.shape.num_layers:
            raise ValueError(f"TLI {tli} is out of range for a target of {self.shape.num_layers} layers")
        if vocab_ids is not None and len(vocab_ids) and int(vocab_ids.max()) >= self.shape.vocab_size:
            raise DrafterCheckpointError(f"the drafter's vocabulary names ids up to {int(vocab_ids.max())}, beyond "
                                         f"this target's {self.shape.vocab_size}: it was trained for another target")
        dtype = dtype or next(model.parameters()).dtype
        base = model.model
        self.embed = nn.Embedding.from_pretrained(base.embed_tokens.weight.detach().to(dtype), freeze=True)
        self.norm = copy.deepcopy(base.norm).to(dtype)
        # A drafting step is mostly the LM head: reading [V', E] weights for a few rows. ``head_dtype`` (bf16 on
        # a CPU with native bf16: ~3.5x fp32 for 4 rows of a 65,536-row head) may differ from the layers'.
        # torch.int8: int8 rows with the outlier channels apart (``Int8Head`` above), faster than bf16; the float
        # rows then stay in bf16, for an LM-head router and for the context ids' rows.
        self.dtype = dtype  # the TLI layers' and the norm's (head_weight may be in head_dtype)
        head_dtype = head_dtype or dtype
        int8 = head_dtype == torch.int8
        # (the embedding's own storage when tied and already in that dtype)
        full_head = model.lm_head.weight.detach().to(torch.bfloat16 if int8 else head_dtype)
        head = full_head if vocab_ids is None else full_head[vocab_ids]
        self.register_buffer("head_weight", head.contiguous(), persistent=False)
        self._channels = kept_channels(base.norm.weight) if int8 else None
        self._int8 = quantize_head(head, self._channels) if int8 else None
        self._context_int8: Int8Head | None = None
        self.cast_once = True  # under autocast, keep the frozen weights' casts (False: autocast's own, per call)
        self._autocast_cache: tuple | None = None  # (key, the head's rows in the autocast dtype)
        self._autocast_layer_cache: tuple | None = None  # (key, the TLI layers with autocast-dtype linears)
        self.register_buffer("vocab_ids", None if vocab_ids is None else vocab_ids.clone(), persistent=False)
        # Context ids (set_context_ids): ids of the committed text the list lacks, drafted as extra rows after
        # the list's. A prompt's identifiers are what a code answer copies, and no frequency list holds them all.
        self._full_head = full_head if vocab_ids is not None else None
        self._listed: torch.Tensor | None = None  # bool per target id: in the list (a lookup, not a search per step)
        if vocab_ids is not None:
            self._listed = torch.zeros(full_head.shape[0], dtype=torch.bool)
            self._listed[vocab_ids] = True
        self.context_ids: torch.Tensor | None = None
        self._context_weight: torch.Tensor | None = None
        self._draft_to_target: torch.Tensor | None = None if vocab_ids is None else self.vocab_ids
        self.tli = tli
        self.layers = nn.ModuleList([copy.deepcopy(layer).to(dtype) for layer in base.layers[len(base.layers) - tli:]])
        self.rotary = copy.deepcopy(base.rotary_emb)
        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    @property
    def draft_vocab_size(self) -> int:
        extra = 0 if self.context_ids is None else len(self.context_ids)
        return self.head_weight.shape[0] + extra

    def set_context_ids(self, ids) -> bool:
        """Draft these target ids too (those the reduced list lacks; the rest are ignored), as rows after the
        list's: draft id len(list) + i is the i-th of them, ascending. Returns whether the set changed (a
        caller's draft-id map is then stale). A no-op without a reduced list: every id is drafted already."""
        if self._full_head is None:
            return False
        ids = torch.as_tensor(list(ids), dtype=torch.long).unique()
        ids = ids[(ids >= 0) & (ids < self._full_head.shape[0])]
        unlisted = ids[~self._listed[ids]]
        current = self.context_ids if self.context_ids is not None else torch.empty(0, dtype=torch.long)
        if torch.equal(unlisted, current):
            return False
        if len(unlisted):
            self.context_ids, self._context_weight = unlisted, self._full_head[unlisted].contiguous()
            self._draft_to_target = torch.cat([self.vocab_ids, unlisted])
        else:
            self.context_ids, self._context_weight, self._draft_to_target = None, None, self.vocab_ids
        if self._int8 is not None:
            self._context_int8 = None if self._context_weight is None else quantize_head(self._context_weight,
                                                                                          self._channels)
        return True

    def draft_to_target(self) -> list[int] | None:
        """Draft id -> target id for every draftable row (list, then context ids); None: the same id."""
        return None if self._draft_to_target is None else self._draft_to_target.tolist()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head input (after the final norm) [T, E] -> logits over the draft vocabulary [T, V'] (the
        reduced list's rows, then the context ids')."""
        if self._int8 is not None:
            logits = int8_logits(hidden, self._int8)
            if self._context_int8 is not None:
                logits = torch.cat([logits, int8_logits(hidden, self._context_int8)], dim=-1)
            return logits.to(hidden.dtype)
        weight = self._autocast_head(hidden)
        weight = self.head_weight if weight is None else weight
        h = hidden.to(weight.dtype)
        if self._context_weight is None:
            logits = h @ weight.T
        else:
            logits = torch.cat([h @ weight.T, h @ self._context_weight.T.to(weight.dtype)], dim=-1)
        return logits if logits.dtype == hidden.dtype else logits.to(hidden.dtype)

    def _autocast_head(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The head's rows in the autocast dtype, cast once. Autocast caches its casts only for weights that
        require grad, so a frozen float32 head (training's) was cast again on every call: [32,768, 1,536] rows
        three times a window, a sixth of an EAGLE training step on a CPU. The product is the one autocast makes."""
        device = hidden.device.type
        if not (self.cast_once and torch.is_autocast_enabled(device)) or not self.head_weight.is_floating_point():
            return None
        dtype = torch.get_autocast_dtype(device)
        if self.head_weight.dtype == dtype:
            return None
        key = (dtype, self.head_weight.data_ptr())
        cached = self._autocast_cache
        if cached is None or cached[0] != key:
            cached = (key, self.head_weight.to(dtype))
            self._autocast_cache = cached
        return cached[1]

    def _autocast_layers(self, h: torch.Tensor) -> nn.ModuleList | None:
        """The TLI layers with their linear weights in the autocast dtype, made once (as ``_autocast_head``:
        autocast would cast the frozen float32 weights on every call). Norms stay as they are: autocast
        does not cast them either, so the layers compute what they compute under autocast."""
        device = h.device.type
        if not (self.tli and self.cast_once and torch.is_autocast_enabled(device)):
            return None
        dtype = torch.get_autocast_dtype(device)
        first = next((m.weight for m in self.layers.modules() if isinstance(m, nn.Linear)), None)
        if first is None or first.dtype == dtype:
            return None
        key = (dtype, first.data_ptr())
        cached = self._autocast_layer_cache
        if cached is None or cached[0] != key:
            layers = copy.deepcopy(self.layers)
            for m in layers.modules():
                if isinstance(m, nn.Linear):
                    m.weight.data = m.weight.data.to(dtype)
                    if m.bias is not None:
                        m.bias.data = m.bias.data.to(dtype)
            cached = (key, layers)
            self._autocast_layer_cache = cached
        return cached[1]

    def check_tokens(self, tokens) -> torch.Tensor:
        """Target ids as a tensor, refused with a clear error when outside the vocabulary."""
        ids = torch.as_tensor(list(tokens), dtype=torch.long)
        vocab = self.embed.num_embeddings
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise InvalidTreeError(f"token ids must be in 0..{vocab - 1} for this target, got {ids.tolist()}")
        return ids

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.vocab_ids is None:
            return draft_ids
        if self.context_ids is None:  # the buffer, which follows the module to its device
            return self.vocab_ids[draft_ids]
        return self._draft_to_target.to(draft_ids.device)[draft_ids]

    def run_layers(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                   past: list[KV] | None = None) -> tuple[torch.Tensor, list[KV]]:
        """The last ``tli`` target layers over predicted activations.

        x: [T, E] input of layer L-tli; positions: [T]; mask: bool [T, past + T];
        past[i]: K/V [kv_heads, P, D] layer i attends to before this call's rows.
        Returns the output [T, E] (before the final norm) and this call's K/V per layer.
        """
        if not self.tli:
            return x, []
        h = x[None].to(self.dtype)
        pos = positions[None]
        cos_sin = self.rotary(h, pos)
        attn_mask = additive(mask, h.dtype)[None, None]
        new = []
        for i, layer in enumerate(self._autocast_layers(h) or self.layers):
            cache = _GivenKV(None if past is None else past[i])
            out = layer(h, attention_mask=attn_mask, position_embeddings=cos_sin, position_ids=pos,
                        use_cache=True, **with_cache(layer, cache))
            h = out[0] if isinstance(out, tuple) else out
            new.append(cache.new)
        return h[0], new


def load_target_parts(name_or_path: str, tli: int = 0, vocab_ids: torch.Tensor | None = None,
                      dtype: torch.dtype = torch.float32, head_dtype: torch.dtype | None = None) -> TargetParts:
    """TargetParts read straight from the target's files: only the embedding, final norm, LM head
    and last ``tli`` layers are loaded, so a laptop never holds the whole target."""
    from transformers import AutoConfig, AutoModelForCausalLM

    where = Path(model_location(name_or_path))
    cfg = AutoConfig.from_pretrained(where)
    with torch.device("meta"):  # the skeleton costs no memory; only what is loaded below becomes real
        model = AutoModelForCausalLM.from_config(cfg)
    n_layers = cfg.num_hidden_layers
    wanted = ("model.embed_tokens.", "model.norm.", "lm_head.") + tuple(
        f"model.layers.{i}." for i in range(n_layers - tli, n_layers))
    state = {}
    for file in sorted(where.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            state.update({k: f.get_tensor(k).to(dtype) for k in f.keys() if k.startswith(wanted)})
    if "model.embed_tokens.weight" not in state:
        raise FileNotFoundError(f"no safetensors weights with the token embedding under {where}")
    state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])  # tied embeddings
    model.load_state_dict(state, strict=False, assign=True)
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg)  # its buffers were made on meta
    return TargetParts(model, tli, vocab_ids, dtype, head_dtype)
