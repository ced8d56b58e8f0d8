"""The target's own greedy continuation: the reference every token-exact (lossless) check compares against.

Three ways to it, each kept because tests lean on how it is computed:

- `greedy_continuation(model, ids, max_new, eos)`: the package's own (netem's bench): a KV cache, one token
  per step, ending at the first token of `eos` (included).
- `recomputed_greedy(model, ids, n)`: exactly n tokens, a full forward of the whole sequence each step (on
  the model's device): no cache at all, so it shares nothing with the KV bookkeeping under test.
- `generated_greedy(model, ids, n)`: exactly n tokens by transformers' `generate` (EOS held off by
  min_new_tokens): what the learned drafters' generations must equal.
"""
from __future__ import annotations

import torch

from edgespec.netem.bench.independent import greedy_continuation

__all__ = ["generated_greedy", "greedy_continuation", "recomputed_greedy"]


@torch.inference_mode()
def recomputed_greedy(model, ids: list[int], n: int) -> list[int]:
    """The n tokens after ids, each the argmax of a fresh forward over everything so far."""
    out = list(ids)
    for _ in range(n):
        out.append(int(model(input_ids=torch.tensor([out], device=model.device)).logits[0, -1].argmax()))
    return out[len(ids):]


@torch.inference_mode()
def generated_greedy(model, ids: list[int], n: int) -> list[int]:
    """The n tokens after ids by `model.generate` (greedy, the tiny tokenizer's pad 256)."""
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                         temperature=None, top_p=None, top_k=None, pad_token_id=256)
    return out[0, len(ids):].tolist()
