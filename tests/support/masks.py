"""Reference attention masks the tests compare the package's own against."""
from __future__ import annotations

import torch

from edgespec.shared.tree import DraftTree, tree_attention_mask


def full_attention_mask(tree: DraftTree, past_len: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive 4-D mask [1, 1, 1 + N, past_len + 1 + N] for a Hugging Face forward pass.

    past_len is the number of cached tokens before the root (every query sees them all).
    Allowed entries are 0, forbidden ones the dtype's most negative value.
    """
    tree_mask = tree_attention_mask(tree)
    allowed = torch.cat([torch.ones(len(tree) + 1, past_len, dtype=torch.bool), tree_mask], dim=1)
    out = torch.zeros(allowed.shape, dtype=dtype)
    out.masked_fill_(~allowed, torch.finfo(dtype).min)
    return out[None, None]
