"""Fixtures of the drafter tests: a 4-layer tiny target (so TLI 3 fits), a feature store made by
the real pipeline (target responses -> samples.jsonl -> extract_features), target parts."""
from __future__ import annotations

import json

import pytest

from edgespec.shared.models.tiny import TinyConfig, save_tiny_model

TARGET = TinyConfig(num_layers=4, seed=0)
PROMPTS = ["Write a function that adds two numbers.", "Explain what a list is.", "Sort a list of words.",
           "Write a loop that prints 1 to 10.", "What does zip do?", "Reverse a string in Python.",
           "Count words in a text.", "Explain recursion briefly.", "Parse an integer from text.",
           "Merge two dictionaries."]
CODE = ["def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 3, "for i in range(10):\n    print(i * i)\n" * 4]


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-target4"), TARGET)


@pytest.fixture(scope="session")
def target(target_dir):
    from edgespec.shared.models import load_model

    return load_model(str(target_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def store(target, target_dir, tmp_path_factory):
    from edgespec.server.training.data import generate_batch
    from edgespec.server.training.features import FeatureStore, extract_features

    data = tmp_path_factory.mktemp("data")
    responses = generate_batch(target.model, target.tokenizer, PROMPTS, max_new_tokens=40)
    rows = [{"id": f"write:{i}", "kind": "write", "split": "val" if i % 4 == 3 else "train", "prompt": p,
             "response": r} for i, (p, r) in enumerate(zip(PROMPTS, responses))]
    rows += [{"id": f"code:{i}", "kind": "code", "split": "train", "prompt": c, "response": ""}
             for i, c in enumerate(CODE)]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path_factory.mktemp("features")
    extract_features(str(target_dir), data, out, max_len=160, tli_depths=(0, 1, 3), device="cpu", dtype="float32")
    return FeatureStore(out)


@pytest.fixture(scope="session")
def target_greedy():
    """target_greedy(model, ids, n): the target's own greedy continuation, exactly n tokens (the reference
    every drafted generation must equal)."""
    return _target_greedy


def _target_greedy(model, ids: list[int], n: int) -> list[int]:
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             temperature=None, top_p=None, top_k=None, pad_token_id=256)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="session")
def seqs(store):
    names = ("hidden", "kv", "act0", "act1", "act3")
    return [store.load(f, names) for f in store.files]
