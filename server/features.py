"""Feature export: what the drafter gets back per verified token, through the activation codec.

Kinds (the wire's FeatureKind; the names are ``shared.wire``'s constants):
- NONE: nothing.
- LAST_HIDDEN: ``"hidden"`` [n, E], the target's final-norm output (EAGLE).
- MOA: ``"lsa"`` [n, 2*E_kv], Layer Self-Attention over the per-token K|V of
  every layer; for TLI = N > 0 also ``"tli_k"`` and ``"tli_v"`` [N, n, E_kv],
  the K and V of the last N layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edgespec.shared.codec import ActivationCodec
from edgespec.shared.drafters.moa.lsa import LayerSelfAttention
from edgespec.shared.session_settings import FeatureRequest
from edgespec.shared.wire import HIDDEN, LSA, TLI_K, TLI_V, FeatureKind

from .errors import InvalidRequestError


@dataclass(frozen=True)
class FeatureSpec:
    """What one session exports: its request as the server resolved it (codec, MoA part)."""

    kind: FeatureKind = FeatureKind.NONE
    codec: ActivationCodec = ActivationCodec()  # how every payload is encoded
    lsa: LayerSelfAttention | None = None  # MoA server part (required for MOA)
    tli_layers: int = 0  # MOA only: K and V of the last N layers are sent too


def check_feature_request(request: FeatureRequest, num_layers: int,
                          lsa_parts: dict[str, LayerSelfAttention]) -> None:
    """Refuse a feature request this server cannot serve (an unknown kind is refused where Open is read)."""
    if request.kind is not FeatureKind.MOA:
        if request.tli_layers:
            raise InvalidRequestError("tli_layers is only meaningful with FEATURE_KIND_MOA")
        return
    if not 0 <= request.tli_layers <= num_layers:
        raise InvalidRequestError(f"tli_layers={request.tli_layers} but the target has {num_layers} layers")
    if not lsa_parts:
        raise InvalidRequestError("FEATURE_KIND_MOA needs a MoA server part, and this server has none loaded: "
                                  "start it with --moa-server-part NAME=PATH")
    if lsa_part(request, lsa_parts) is None:
        raise InvalidRequestError(f"unknown MoA server part {request.moa_server_part!r}; this server has "
                                  f"{sorted(lsa_parts)}")


def lsa_part(request: FeatureRequest, lsa_parts: dict[str, LayerSelfAttention]) -> LayerSelfAttention | None:
    """The MoA server part a MOA request names (the only one loaded when it names none); None otherwise."""
    if request.kind is not FeatureKind.MOA:
        return None
    return lsa_parts.get(request.moa_server_part or (next(iter(lsa_parts)) if len(lsa_parts) == 1 else ""))


@torch.inference_mode()
def export_features(spec: FeatureSpec, hidden: torch.Tensor, kv: torch.Tensor | None) -> list[tuple[str, bytes]]:
    """Encoded features of n tokens. hidden: [n, E]; kv: [n, L, 2*E_kv] (MOA only)."""
    if spec.kind is FeatureKind.NONE:
        return []
    if spec.kind is FeatureKind.LAST_HIDDEN:
        return [(HIDDEN, spec.codec.encode(hidden.float()))]
    assert kv is not None and spec.lsa is not None, "MOA features need the K|V rows and a server part"
    lsa_param = next(spec.lsa.parameters())
    lsa = spec.lsa(kv.to(lsa_param.device, lsa_param.dtype)).float()  # [n, 2*E_kv]
    # The LSA's output is what the codec rounds (not its input): MoA's training rounds the same tensor with
    # the same codec (shared/drafters/moa/lsa.py, as_received). Change one, change the other.
    out = [(LSA, spec.codec.encode(lsa))]
    if spec.tli_layers:
        e_kv = kv.shape[-1] // 2
        last = kv[:, -spec.tli_layers:].transpose(0, 1).float()  # [N, n, 2*E_kv]
        out.append((TLI_K, spec.codec.encode(last[..., :e_kv].contiguous())))
        out.append((TLI_V, spec.codec.encode(last[..., e_kv:].contiguous())))
    return out
