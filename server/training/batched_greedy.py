"""Greedy answers to a batch of left-padded prompts, in one preallocated cache, with finished rows dropped.

`model.generate` is what the data step used, and on a CPU two things in it cost a batch of long answers
more than its matrix products. Its DynamicCache grows by `torch.cat`, which copies every layer's whole
cache at every step: at 256 rows over 400 tokens the copies took a third of a 1.5B's decode step. And a
row that has ended keeps its place (it is fed padding) until the longest answer ends, so the batch pays
full price for the rows still writing. Here the cache is allocated once for prompt + answer (`SlabCache`;
each step writes its column in place and the attention reads a view of the filled part), and rows that
have ended leave the batch once enough of them have, in one gather of the filled part
(``drop_share``). Per row the arithmetic is `generate`'s own: the same positions from the attention
mask, greedy on the same logits, an answer ending at its first end-of-sequence id (which it keeps).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.cache_utils import Cache, DynamicLayer

from edgespec.shared.kv import with_cache


class _SlabLayer(DynamicLayer):
    """One layer's keys and values in a slab of ``capacity`` positions; ``keys`` and ``values`` are the
    filled part, a view, so the attention and the mask sizes see only what was written."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, d = key_states.shape
        self.slab_k = key_states.new_empty(b, h, self.capacity, d)
        self.slab_v = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, t = self.length, key_states.shape[-2]
        if n + t > self.capacity:
            raise ValueError(f"the cache holds {self.capacity} positions; writing {t} after {n} overflows it")
        self.slab_k[:, :, n:n + t] = key_states
        self.slab_v[:, :, n:n + t] = value_states
        self.length = n + t
        self.keys, self.values = self.slab_k[:, :, :self.length], self.slab_v[:, :, :self.length]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def keep_rows(self, index: torch.Tensor) -> None:
        """Only the rows ``index`` (positions in the batch), in that order: the filled part is gathered into
        a new slab of the same capacity, the rest is never copied."""
        if not self.is_initialized:
            return
        for name in ("slab_k", "slab_v"):
            old = getattr(self, name)
            new = old.new_empty(len(index), old.shape[1], self.capacity, old.shape[3])
            new[:, :, :self.length] = old[index, :, :self.length]
            setattr(self, name, new)
        self.keys, self.values = self.slab_k[:, :, :self.length], self.slab_v[:, :, :self.length]


class SlabCache(Cache):
    """A transformers Cache of full-attention layers that never reallocates while it fills."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[_SlabLayer(capacity) for _ in range(num_layers)])

    def keep_rows(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            layer.keep_rows(index)


@dataclass
class GreedyBatch:
    """What `greedy_batch` did."""

    generated: list[list[int]]  # per row: its answer's ids, up to and including its first end id
    steps: list[list[int]] = field(default_factory=list)  # per forward (the prefill first): the rows it ran,
    # in batch order; what a forward hook saw at that call belongs to these rows, one per batch position


@torch.inference_mode()
def greedy_batch(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 eos_ids: set[int], pad_id: int, drop_share: float = 1 / 16,
                 on_leave: Callable[[SlabCache, list[int], list[int], list[int]], None] | None = None) -> GreedyBatch:
    """Greedy answers of ``model`` to ``input_ids`` [B, P] (left padding marked 0 in ``attention_mask``).
    Rows that have ended leave the batch once they are at least ``drop_share`` of it (0: at once; 1: never
    before the end). ``on_leave(cache, positions, rows, seen)`` is called before rows leave the cache and,
    at the end, for the rows still in it: ``positions`` are their places in the cache's batch, ``rows`` their
    indices in ``input_ids``, ``seen`` how many of each one's cache positions hold what it read (its padding,
    prompt and answer but the answer's last id, which was never fed back)."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not 0 <= drop_share <= 1:
        raise ValueError(f"drop_share is a share of the batch in [0, 1], got {drop_share}")
    b, p = input_ids.shape
    device = input_ids.device
    cache = SlabCache(model.config.get_text_config(decoder=True).num_hidden_layers, p + max_new_tokens)
    mask = attention_mask.long()
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # generate's positions for left padding
    rows = list(range(b))  # the original row of each batch position
    generated: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    eos = torch.tensor(sorted(eos_ids), device=device, dtype=torch.long)
    run = GreedyBatch(generated)
    step_ids, step_pos = input_ids, positions
    for step in range(max_new_tokens):
        run.steps.append(list(rows))
        out = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos, use_cache=True,
                    logits_to_keep=1, **with_cache(model, cache))
        nxt = out.logits[:, -1].argmax(-1)
        ended = torch.isin(nxt, eos).tolist()
        for j, (r, t) in enumerate(zip(rows, nxt.tolist())):
            if not done[r]:
                generated[r].append(t)
                done[r] = ended[j]
        if step == max_new_tokens - 1 or all(done[r] for r in rows):
            break
        gone = [j for j, r in enumerate(rows) if done[r]]
        if gone and len(gone) >= drop_share * len(rows):
            if on_leave is not None:
                on_leave(cache, gone, [rows[j] for j in gone], [p + len(generated[rows[j]]) - 1 for j in gone])
            stay = [j for j, r in enumerate(rows) if not done[r]]
            index = torch.tensor(stay, device=device)
            cache.keep_rows(index)
            rows, mask, nxt = [rows[j] for j in stay], mask[index], nxt[index]
            step_pos = step_pos[index]
        # an ended row still in the batch reads padding, as in generate; its answer takes no more ids
        still = torch.tensor([not done[r] for r in rows], device=device)
        step_ids = torch.where(still, nxt, torch.full_like(nxt, pad_id))[:, None]
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
    if on_leave is not None:
        on_leave(cache, list(range(len(rows))), rows, [p + len(generated[r]) - 1 for r in rows])
    return run


def chat_batch(tokenizer, histories: list[list[dict]], device) -> dict:
    """Chat histories in the chat template, ready for an answer: one left-padded batch (``input_ids``,
    ``attention_mask``) on ``device``."""
    texts = [tokenizer.apply_chat_template(h, tokenize=False, add_generation_prompt=True) for h in histories]
    tokenizer.padding_side = "left"
    return tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
