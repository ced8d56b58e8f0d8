"""TargetModel: the loaded target, its shapes, and its two halves (decoder, LM head).

Cache convention (``shared.tree``): with committed tokens c_0..c_{n-1} the KV
holds c_0..c_{n-2}; the last committed token is fed again as the tree root. A
tree forward appends [root] + nodes; afterwards ``keep_rows`` drops every row
but the root and the accepted path, so the KV then holds the new committed
tokens except the new last one (the bonus).

No model code is copied: Hugging Face causal LMs take a 4-D additive mask and
explicit ``position_ids`` with any ``Cache``. The model is called through its
decoder (``get_decoder()``) so the final-norm output (EAGLE's feature) comes out
without collecting every layer's hidden states, then its LM head on the rows
that are read. Which cache, mask and batch a forward uses is the engine's
business (``engine/``).
"""
from __future__ import annotations

import torch

from edgespec.shared.kv import cache_kwarg
from edgespec.shared.models.loading import LoadedModel, model_eos_ids


class TargetModel:
    """One loaded target. Not thread-safe: callers serialise forward passes (see ``ModelScheduler``)."""

    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        cfg = self.model.config
        self.name: str = loaded.name
        self.device: torch.device = loaded.device
        self.dtype: torch.dtype = loaded.dtype
        self.fingerprint: str = loaded.fingerprint
        self.vocab_size: int = int(self.model.get_output_embeddings().weight.shape[0])
        self.hidden_size: int = int(cfg.hidden_size)
        self.num_layers: int = int(cfg.num_hidden_layers)
        self.num_kv_heads: int = int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        self.head_dim: int = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.kv_size: int = self.num_kv_heads * self.head_dim
        self.max_positions: int = int(getattr(cfg, "max_position_embeddings", 32768))
        self._decoder = self.model.get_decoder()
        self._cache_kwarg = cache_kwarg(self._decoder)  # read once, outside any traced step
        self._head = self.model.get_output_embeddings()
        # Gemma2 caps its logits with tanh inside ForCausalLM.forward, which the server does not call.
        softcap = getattr(cfg, "final_logit_softcapping", None)
        self.logit_softcap: float | None = float(softcap) if softcap else None
        self.eos_ids: frozenset[int] = frozenset(model_eos_ids(self.model, self.tokenizer))

    @torch.no_grad()  # not inference_mode: the batched engine's step may be compiled, and aot_autograd refuses
    # inference tensors
    def decode(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache) -> torch.Tensor:
        """The decoder over ids [B, T] at positions [B, T] after what `cache` holds; hidden [B, T, E].

        mask: additive [B, 1, T, keys] (keys = what the cache's update returns), the pool attention's
        ``BlockMask`` (``engine.attention``), or None for a causal chunk, which transformers masks itself.
        """
        kwargs = {} if mask is None else {"attention_mask": mask}
        out = self._decoder(input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache},
                            **kwargs)
        return out.last_hidden_state

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The LM head on the rows that are read only: [R, E] -> [R, V] float32.

        out: a float32 [R, V] buffer to write them into (a captured step's logits live in one buffer shared by
        every graph, not one per graph); the dtype conversion is then the copy itself."""
        logits = self._head(hidden)
        logits = logits.float() if out is None else out.copy_(logits)
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
            if out is not None:
                logits = out.copy_(logits)
        return logits


