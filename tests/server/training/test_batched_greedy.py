"""The data step's own greedy loop: `generate`'s answers, row for row, whichever rows leave the batch when."""
from __future__ import annotations

import pytest
import torch

from edgespec.server.training.batched_greedy import SlabCache, greedy_batch
from edgespec.shared.kv import output_cache

PROMPTS = ["Write a function that adds two numbers.", "hi", "Explain what a context manager is, briefly.",
           "Sort a list of tuples by their second item in Python, and say why the sort is stable."]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from edgespec.shared.models import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def _batch(tok):
    tok.padding_side = "left"
    return tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)


def _generate(model, enc, n, eos):
    out = model.generate(**enc, max_new_tokens=n, do_sample=False, temperature=None, top_p=None, top_k=None,
                         pad_token_id=0, eos_token_id=sorted(eos))
    return out[:, enc["input_ids"].shape[1]:].tolist()


@pytest.mark.parametrize("drop_share", [0.0, 0.3, 1.0])
def test_answers_are_generates_row_for_row_whichever_rows_leave_when(loaded, drop_share):
    model, tok = loaded.model, loaded.tokenizer
    enc = _batch(tok)
    assert (enc["attention_mask"] == 0).any()  # the prompts differ in length: left padding is exercised
    # End ids chosen from the answers themselves, so that rows end at different steps (a random model
    # rarely writes its real end id): each row's 3rd and 7th ids, in a run without end ids.
    free = _generate(model, enc, 12, {10**6})
    eos = {free[0][2], free[2][6]}
    want = _generate(model, enc, 12, eos)
    left = []
    run = greedy_batch(model, enc["input_ids"], enc["attention_mask"], 12, eos, pad_id=0, drop_share=drop_share,
                       on_leave=lambda cache, pos, rows, seen: left.append((list(rows), list(seen))))
    for r, got in enumerate(run.generated):
        ended = next((i for i, t in enumerate(got) if t in eos), None)
        assert ended in (None, len(got) - 1)  # an answer stops at its first end id, which it keeps
        assert want[r][:len(got)] == got, r
        assert all(t == 0 for t in want[r][len(got):])  # what generate wrote after it is padding
    lengths = sorted(len(g) for g in run.generated)
    assert lengths[0] < lengths[-1]  # the chosen end ids did end some rows early
    # every row leaves once, with what it read: prompt (padded) + answer but the answer's last id
    assert sorted(r for rows, _ in left for r in rows) == list(range(len(PROMPTS)))
    p = enc["input_ids"].shape[1]
    assert all(n == p + len(run.generated[r]) - 1 for rows, seen in left for r, n in zip(rows, seen))
    # the forwards ran fewer rows once ended rows left (drop_share 0: at once; 1: never before the end)
    sizes = [len(rows) for rows in run.steps]
    assert sizes[0] == len(PROMPTS) and len(run.steps) == max(lengths)
    assert (sizes[-1] < len(PROMPTS)) == (drop_share < 1.0)
    assert (len(left) == 1) == (drop_share == 1.0)  # the end's call alone, or rows left before it


def test_a_leaving_rows_cache_holds_what_it_read(loaded):
    """The keys a row leaves with equal those of its prompt + answer run alone through the model."""
    model, tok = loaded.model, loaded.tokenizer
    enc = _batch(tok)
    free = _generate(model, enc, 8, {10**6})
    eos = {free[1][3]}
    kept = {}

    def on_leave(cache, pos, rows, seen):
        for j, r, n in zip(pos, rows, seen):
            kept[r] = (cache.layers[0].keys[j, :, :n].clone(), cache.layers[-1].values[j, :, :n].clone())

    run = greedy_batch(model, enc["input_ids"], enc["attention_mask"], 8, eos, pad_id=0, drop_share=0.0,
                       on_leave=on_leave)
    for r, got in enumerate(run.generated):
        pad = int((enc["attention_mask"][r] == 0).sum())
        ids = enc["input_ids"][r, pad:].tolist() + got[:-1]
        alone = output_cache(model(torch.tensor([ids]), use_cache=True))
        k, v = kept[r]
        torch.testing.assert_close(k[:, pad:], alone.layers[0].keys[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(v[:, pad:], alone.layers[-1].values[0], atol=1e-5, rtol=1e-5)


def test_the_cache_keeps_rows_and_refuses_to_overflow():
    cache = SlabCache(num_layers=1, capacity=4)
    k = torch.arange(3 * 2 * 3 * 2, dtype=torch.float32).view(3, 2, 3, 2)
    keys, _ = cache.update(k, -k, 0)
    assert keys.shape == (3, 2, 3, 2) and cache.get_seq_length() == 3
    cache.keep_rows(torch.tensor([2, 0]))
    assert torch.equal(cache.layers[0].keys, k[[2, 0]]) and torch.equal(cache.layers[0].values, -k[[2, 0]])
    keys, _ = cache.update(torch.ones(2, 2, 1, 2), torch.ones(2, 2, 1, 2), 0)
    assert keys.shape == (2, 2, 4, 2) and torch.equal(keys[:, :, :3], k[[2, 0]])
    with pytest.raises(ValueError, match="holds 4 positions; writing 1 after 4"):
        cache.update(torch.ones(2, 2, 1, 2), torch.ones(2, 2, 1, 2), 0)


def test_bad_arguments_are_refused(loaded):
    enc = _batch(loaded.tokenizer)
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        greedy_batch(loaded.model, enc["input_ids"], enc["attention_mask"], 0, {1}, pad_id=0)
    with pytest.raises(ValueError, match="drop_share"):
        greedy_batch(loaded.model, enc["input_ids"], enc["attention_mask"], 4, {1}, pad_id=0, drop_share=2.0)
