"""Reduced draft vocabulary: the most frequent tokens of the training data.

A laptop CPU pays for the LM head on every drafted node (151936 x E for Qwen);
drafting over the N most frequent tokens cuts that by 151936 / N. The map
``ids[draft_id] = target_id`` goes back to the target's ids; verification always
uses the full vocabulary, so a token outside the reduced set can still be
accepted as the bonus token, it just cannot be drafted.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


def most_frequent_ids(token_streams: Iterable[torch.Tensor], size: int, vocab_size: int,
                      always: Iterable[int] = ()) -> torch.Tensor:
    """The ``size`` most frequent target ids (ties by lower id), ``always`` included, sorted ascending."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"reduced vocabulary size {size} must be in 1..{vocab_size}")
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in token_streams:
        counts += torch.bincount(ids.reshape(-1).long(), minlength=vocab_size)[:vocab_size].double()
    counts[torch.tensor(sorted(set(always)), dtype=torch.long)] = float("inf")  # none: an empty index, a no-op
    order = torch.argsort(-counts, stable=True)  # stable: ties go to the lower id
    return order[:size].sort().values
