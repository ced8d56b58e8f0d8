"""MoA training (paper eq. 2): 0.1 x KL(target || drafter) + SmoothL1 on the activation entering
target layer L-N, with the Cross-Attention mask T-step bounded (T ~ U{min_T..max_T}).

Within one segment of the bounded mask every query sees the same verified prefix, and its
Self-Attention sees the tokens before it: exactly a draft chain grown from the segment's
first token. So one teacher-forced pass with a fixed T is also the validation measure of
per-position acceptance (on data the target generated greedily, accepted drafts equal the
data tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from edgespec.shared.codec import ActivationCodec, Codec
from edgespec.shared.drafters.blocks import KV, bounded_mask, causal_mask, mixed_kv_mask, step_bounds
from edgespec.shared.drafters.moa.lsa import as_received
from edgespec.shared.drafters.moa.model import MoADrafterModel, save_moa
from edgespec.shared.drafters.target_parts import TargetParts
from .features import StoredSequence
from .losses import Acceptance, Term, chain_accepted, forward_kl, smooth_l1
from .recipe import LossTerm, Outputs


# MoARecipeConfig.wire_codec's names: the codecs a client may ask the server for (none: no rounding).
WIRE_CODECS = {"int8_outlier": Codec.INT8_OUTLIER, "int8": Codec.INT8, "fp16": Codec.FP16, "none": None}


@dataclass(frozen=True)
class MoARecipeConfig:
    min_T: int = 5  # smallest step bound drawn per sequence
    max_T: int = 15  # largest step bound drawn per sequence
    activation_weight: float = 1.0  # SmoothL1 on the predicted activation
    kl_weight: float = 0.1  # forward KL against the target's distribution
    detach_own: bool = False  # HASS (TLI >= 1): earlier drafted rows' own TLI K/V as detached context
    wire_codec: str = "int8_outlier"  # the codec whose rounding of the LSA output training applies, as the server's
    # does to what it sends: int8_outlier (the client's default), int8, fp16, or none (unrounded)

    def __post_init__(self) -> None:
        if self.wire_codec not in WIRE_CODECS:
            raise ValueError(f"wire_codec must be one of {', '.join(WIRE_CODECS)}, got {self.wire_codec!r}")

    @property
    def wire(self) -> ActivationCodec | None:
        codec = WIRE_CODECS[self.wire_codec]
        return None if codec is None else ActivationCodec(codec)


def moa_window(model: MoADrafterModel, parts: TargetParts, tokens: torch.Tensor, kv: torch.Tensor,
               positions: torch.Tensor, bounds: torch.Tensor, detach_own: bool = False,
               wire: ActivationCodec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(predicted activation [n, E], drafter logits [n, V']) of a window under per-query bounds.

    kv: [n, L, 2*E_kv] the target's K|V per token and layer; bounds: [n] (masks.step_bounds).
    detach_own (TLI >= 1): the TLI layers' own K/V of the earlier drafted rows a query sees are
    made from detached activations (same values, no gradient): each row's loss trains only its
    own prediction, the earlier rows are fixed context, as while drafting (HASS).
    wire: the codec the server sends the LSA output with (``lsa.as_received``); None: unrounded.
    """
    client, n = model.client, tokens.shape[0]
    memory = client.with_null(client.memory(as_received(model.lsa(kv), wire), positions))
    mem_mask = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=tokens.device), bounded_mask(bounds, n)], 1)
    x = client.sa_input(parts.embed(tokens))
    act = client.predict(x, positions, client.sa_kv(x, positions), causal_mask(n, tokens.device), memory, mem_mask)
    past = None
    if parts.tli:
        e_kv, heads = parts.shape.kv_size, parts.shape.kv_heads
        layers = range(parts.shape.num_layers - parts.tli, parts.shape.num_layers)
        dt = parts.dtype

        def rows(t):  # [n, E_kv] -> [kv_heads, n, D]
            return t.to(dt).view(n, heads, -1).transpose(0, 1)
        past = [KV(rows(kv[:, l, :e_kv]), rows(kv[:, l, e_kv:])) for l in layers]
    if parts.tli and detach_own:
        out = _run_layers_detached_context(parts, act, positions, bounds, past)
    else:
        out, _ = parts.run_layers(act, positions, mixed_kv_mask(bounds), past)
    return act, parts.logits(parts.norm(out))


def _run_layers_detached_context(parts: TargetParts, act: torch.Tensor, positions: torch.Tensor,
                                 bounds: torch.Tensor, past: list[KV]) -> torch.Tensor:
    """The TLI layers with the own K/V of earlier drafted rows taken from a no-grad pass.

    Keys per layer: [target's K/V 0..n-1 ; own K/V of 0..n-1 (detached) ; this row's own K/V].
    Query i sees the target's rows up to its bound, detached own rows bound < j < i, and itself:
    the same values as ``mixed_kv_mask``, so the forward is unchanged; only the gradient differs.
    """
    n = act.shape[0]
    with torch.no_grad():
        _, own = parts.run_layers(act.detach(), positions, mixed_kv_mask(bounds), past)
    mixed = mixed_kv_mask(bounds)
    j = torch.arange(n, device=act.device)
    earlier = mixed[:, n:] & (j[None, :] < j[:, None])
    mask = torch.cat([mixed[:, :n], earlier, torch.eye(n, dtype=torch.bool, device=act.device)], 1)
    context = [p.cat(KV(o.k.detach(), o.v.detach())) for p, o in zip(past, own)]
    out, _ = parts.run_layers(act, positions, mask, context)
    return out


class MoARecipe:
    kind = "moa"

    def __init__(self, model: MoADrafterModel, parts: TargetParts, config: MoARecipeConfig = MoARecipeConfig()):
        self.model, self.parts, self.config = model, parts, config
        self.tli = model.client.config.tli
        self.feature_names = ("hidden", "kv", f"act{self.tli}")
        self.terms = [LossTerm("activation", config.activation_weight, self._activation_term),
                      LossTerm("kl", config.kl_weight, self._kl_term)]

    def trainable(self):
        return {"lsa": self.model.lsa, "client": self.model.client}

    def forward(self, seq: StoredSequence, start: int, end: int, gen: torch.Generator) -> Outputs:
        T = int(torch.randint(self.config.min_T, self.config.max_T + 1, (1,), generator=gen))
        offset = int(torch.randint(0, T, (1,), generator=gen))
        return self.window_outputs(seq, start, end, step_bounds(end - start, T, offset, seq.tokens.device))

    def window_outputs(self, seq: StoredSequence, start: int, end: int, bounds: torch.Tensor) -> Outputs:
        """Training outputs of the window [start, end) under per-query bounds [end - start]."""
        tokens, kv = seq.tokens[start:end], seq.kv[start:end].float()
        positions = torch.arange(start, end, device=tokens.device)
        act, logits = moa_window(self.model, self.parts, tokens, kv, positions, bounds, self.config.detach_own,
                                 self.config.wire)
        with torch.no_grad():
            target_logits = self.parts.logits(seq.hidden[start:end])
        # Row i predicts c_{i+1}: it counts when that token is one to learn.
        w = torch.cat([seq.loss_mask[start + 1:end].float(), torch.zeros(1, device=tokens.device)])
        return {"act": act, "logits": logits, "target_act": seq.acts[self.tli][start:end],
                "target_logits": target_logits, "w": w}

    def _activation_term(self, out: Outputs) -> Term:
        # Standardised per channel: in raw units a handful of outlier channels would be the whole loss.
        z = self.model.client.standardise
        return smooth_l1(z(out["act"]), z(out["target_act"]), out["w"])

    def calibrate(self, seqs: list[StoredSequence]) -> None:
        """Per-channel activation stats of the training data, before the first step."""
        self.model.client.calibrate(torch.cat([s.acts[self.tli] for s in seqs]))

    def _kl_term(self, out: Outputs) -> Term:
        return forward_kl(out["logits"], out["target_logits"], out["w"])

    def acceptance(self, seq: StoredSequence, depth: int) -> Acceptance:
        return moa_acceptance(self.model, self.parts, seq, depth, wire=self.config.wire)

    def save_drafter(self, out_dir: Path) -> list[Path]:
        return save_moa_drafter(self.model, self.parts, out_dir)


@torch.no_grad()
def moa_acceptance(model: MoADrafterModel, parts: TargetParts, seq: StoredSequence, depth: int,
                   drafting=None, wire: ActivationCodec | None = None) -> Acceptance:
    """Per-position acceptance of chains drafted in segments of ``depth``. ``drafting``: the parts the
    drafter's own logits are read through (the router's head tap; default ``parts``); ``wire``: the
    codec the LSA output is rounded with, as served (None: unrounded)."""
    tokens, n = seq.tokens, seq.tokens.shape[0]
    if n <= depth + 1:
        return Acceptance(0, [0] * depth)
    # Segments start at 1, 1+depth, ...: each first query is a root seeing the features before it.
    bounds = step_bounds(n, depth, 1, tokens.device)
    positions = torch.arange(n, device=tokens.device)
    _, logits = moa_window(model, parts if drafting is None else drafting, tokens, seq.kv.float(), positions, bounds,
                           wire=wire)
    greedy = parts.logits(seq.hidden).argmax(-1)
    ok = (logits.argmax(-1) == greedy)[:-1] & (parts.to_target_ids(greedy[:-1]) == tokens[1:])
    starts = torch.arange(1, n - depth, depth, device=tokens.device)
    matches = torch.stack([ok[starts + k] for k in range(depth)], 1)
    keep = seq.loss_mask[starts + 1]
    return Acceptance.of(chain_accepted(matches[keep]), depth)


def save_moa_drafter(model: MoADrafterModel, parts: TargetParts, out_dir: Path) -> list[Path]:
    """The server part and the client part (with the reduced vocabulary) in ``out_dir/moa-tli<N>``."""
    model.vocab_ids = parts.vocab_ids
    d = save_moa(model, Path(out_dir) / f"moa-tli{model.client.config.tli}")
    return [d / "server.safetensors", d / "client.safetensors"]
