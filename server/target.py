"""TargetModel: the target LLM's forward passes on a per-session KV cache.

Cache convention (``shared.tree``): with committed tokens c_0..c_{n-1} the cache
holds KV for c_0..c_{n-2}; the last committed token is fed again as the tree
root. A tree forward appends [root] + nodes; afterwards ``keep_rows`` drops
every row but the root and the accepted path (crop + gather), so the cache then
holds the new committed tokens except the new last one (the bonus).

No model code is copied: Hugging Face causal LMs take a 4-D additive mask and
explicit ``position_ids`` with a ``DynamicCache``. The model is called through
its decoder (``get_decoder()``) so the final-norm output (EAGLE's feature) comes
out without collecting every layer's hidden states, then its LM head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.shared.models.loading import LoadedModel
from edgespec.shared.tree import DraftTree, full_attention_mask, tree_position_ids


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # [T, E]: the final norm's output (the LM head's input)
    logits: torch.Tensor  # [T, V] float32 (or [1, V]: the last row only)


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
        self._head = self.model.get_output_embeddings()
        self.eos_ids: frozenset[int] = frozenset(_eos_ids(self.model, self.tokenizer))

    # ------------------------------------------------------------------ caches
    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def cache_len(cache) -> int:
        return int(cache.get_seq_length())

    @staticmethod
    def cache_bytes(cache) -> int:
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers
                   if getattr(layer, "keys", None) is not None and layer.keys.numel())

    @staticmethod
    def crop(cache, length: int) -> None:
        """Keep the first `length` cached tokens.

        Sliced here rather than with ``DynamicCache.crop``, whose argument changed meaning across
        transformers versions (absolute length, then tokens to remove).
        """
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > length:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]

    @classmethod
    def keep_rows(cls, cache, past_len: int, rows: Sequence[int]) -> None:
        """After a tree forward, keep the cached past plus the given rows of [root] + nodes, in order."""
        if list(rows) == list(range(len(rows))):
            cls.crop(cache, past_len + len(rows))  # a prefix of the new rows: the crop is enough
            return
        index = torch.tensor([past_len + r for r in rows], dtype=torch.long)
        for layer in cache.layers:
            index_dev = index.to(layer.keys.device)
            # keys/values: [B, H_kv, S, D]
            layer.keys = torch.cat([layer.keys[:, :, :past_len], layer.keys.index_select(2, index_dev)], dim=2)
            layer.values = torch.cat([layer.values[:, :, :past_len], layer.values.index_select(2, index_dev)], dim=2)

    def layer_kv(self, cache, start: int, end: int) -> torch.Tensor:
        """Per-token K|V of every layer for cached tokens [start, end): [T, L, 2*E_kv] (keys after RoPE)."""
        rows = []
        for layer in cache.layers:
            k = layer.keys[0, :, start:end]  # [H_kv, T, D]
            v = layer.values[0, :, start:end]
            t = k.shape[1]
            rows.append(torch.cat([k.transpose(0, 1).reshape(t, -1), v.transpose(0, 1).reshape(t, -1)], dim=-1))
        return torch.stack(rows, dim=1)

    # ---------------------------------------------------------------- forwards
    @torch.inference_mode()
    def forward(self, cache, input_ids: Sequence[int], position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, last_logits_only: bool = False) -> ForwardOutput:
        """Append input_ids to the cache. position_ids: [T]; attention_mask: [1, 1, T, past + T] additive or None.

        last_logits_only runs the LM head on the last row only: a long prompt's other rows would cost
        T x E x V multiply-adds for nothing.
        """
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=self.device)
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device)
        out = self._decoder(input_ids=ids, position_ids=position_ids[None].to(self.device),
                            past_key_values=cache, use_cache=True, **kwargs)
        hidden = out.last_hidden_state[0]  # [T, E]
        return ForwardOutput(hidden, self._head(hidden[-1:] if last_logits_only else hidden).float())

    def prefill(self, cache, ids: Sequence[int]) -> ForwardOutput:
        """Run ids after what the cache holds (a causal chunk); logits of the last row only: [1, V]."""
        start = self.cache_len(cache)
        positions = torch.arange(start, start + len(ids), dtype=torch.long)
        return self.forward(cache, ids, positions, last_logits_only=True)

    @torch.inference_mode()
    def prefill_tree(self, cache, ids: Sequence[int], tree: DraftTree) -> ForwardOutput:
        """ids (a causal chunk after the cache) and a tree hung from ids[-1], in one forward pass.
        hidden: every row [len(ids) + N]; logits: the rows of [ids[-1]] + nodes only [1 + N]."""
        past = self.cache_len(cache)
        p = len(ids)
        allowed = torch.ones(p - 1, past + p - 1, dtype=torch.bool).tril(past)  # the chunk is causal
        chunk = torch.full((p - 1, past + p + len(tree)), torch.finfo(self.dtype).min, dtype=self.dtype)
        chunk[:, :past + p - 1].masked_fill_(allowed, 0.0)
        mask = torch.cat([chunk[None, None], full_attention_mask(tree, past + p - 1, self.dtype)], dim=2)
        positions = torch.cat([torch.arange(past, past + p - 1, dtype=torch.long),
                               tree_position_ids(tree, past + p)])
        ids_t = torch.tensor([[*ids, *tree.tokens]], dtype=torch.long, device=self.device)
        try:
            out = self._decoder(input_ids=ids_t, position_ids=positions[None].to(self.device),
                                attention_mask=mask.to(self.device), past_key_values=cache, use_cache=True)
        except BaseException:
            self.crop(cache, past)
            raise
        hidden = out.last_hidden_state[0]
        return ForwardOutput(hidden, self._head(hidden[p - 1:]).float())

    def forward_tree(self, cache, root_token: int, tree: DraftTree) -> ForwardOutput:
        """[root] + nodes after the cached past (the committed tokens but the last). Rows: [1 + N]."""
        past = self.cache_len(cache)
        mask = full_attention_mask(tree, past, self.dtype)
        positions = tree_position_ids(tree, past + 1)
        try:
            return self.forward(cache, [root_token, *tree.tokens], positions, mask)
        except BaseException:
            self.crop(cache, past)  # a failed pass must not leave half a tree in some layers
            raise


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
