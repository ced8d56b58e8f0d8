"""Which Hugging Face causal LMs tree verification can run, decided once when the server loads the target.

Tree verification appends [root] + tree rows to a session's KV, attends with a 4-D
tree mask, and then keeps the accepted rows by index. That needs every layer to
be attention whose cached rows can be kept or dropped one by one:

- full attention: supported as it is;
- sliding-window attention (Mistral; Gemma2's alternate layers): a token sees the
  previous W tokens, so while a whole session fits in W tokens, the window hides
  nothing and full attention gives the same logits. The window is switched off
  (transformers' sliding cache layers keep only the last W rows, which breaks
  keep-by-index) and the context is capped at W;
- anything else (recurrent, linear or chunked attention state, encoder-decoder
  models): refused at start with the reason, never a failure at the first Draft.

Gemma2 also soft-caps its final logits (tanh); the server's LM head call must
apply the same cap or sampling would see a different distribution than the
model's own (``TargetModel.logits`` does).
"""
from __future__ import annotations

import logging

from edgespec.shared.errors import EdgespecError

log = logging.getLogger("edgespec.server")

ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class UnsupportedModelError(EdgespecError):
    """The target cannot be tree-verified; the message says why. Raised before the server listens."""


def _window_in_use(cfg) -> int | None:
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None  # Qwen2-style configs carry a window that no layer uses
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    return int(window)


def adapt_for_tree_verification(model, requested_context: int = 0, context_ceiling: int = 32768) -> int:
    """Check the model, switch off a sliding window that cannot matter, and return the context the server may
    promise (prompt + generation of one session, after any window cap).

    requested_context: the operator's --max-model-len (0 = as long as the model allows).
    """
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    arch = type(model).__name__
    if getattr(cfg, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{arch} is an encoder-decoder model; edgespec verifies decoder-only causal LMs")
    layer_types = getattr(cfg, "layer_types", None)
    odd = sorted(set(layer_types or ()) - ATTENTION_LAYER_TYPES)
    if odd:
        raise UnsupportedModelError(
            f"{arch} has layers of type {', '.join(odd)}: their cached state is not one KV row per token, so a "
            f"draft tree's rejected rows cannot be dropped; edgespec verifies models whose layers are all "
            f"attention (full or sliding-window)")
    max_positions = int(getattr(cfg, "max_position_embeddings", None) or context_ceiling)
    context = min(requested_context or max_positions, max_positions, context_ceiling)
    window = _window_in_use(cfg)
    note = "full attention"
    if window is not None:
        if requested_context > window:
            raise UnsupportedModelError(
                f"{arch} uses a sliding attention window of {window} tokens and {requested_context} context tokens "
                f"were asked for: tree verification runs it with full attention, which equals the windowed "
                f"model only while a session fits in the window. Ask for at most {window} (--max-model-len).")
        context = min(context, window)
        cfg.sliding_window = None
        if layer_types is not None:
            cfg.layer_types = ["full_attention"] * len(layer_types)
        for module in model.modules():
            if getattr(module, "sliding_window", None) is not None and hasattr(module, "layer_type"):
                module.sliding_window = None  # per-layer copies taken at init (Gemma2)
        note = f"sliding window {window} switched off (full attention is exact within it); context capped at {window}"
    log.info("tree verification of %s: %s; max context %d tokens", arch, note, context)
    return context
