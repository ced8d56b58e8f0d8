"""The learned drafters' tests: a 4-layer tiny target (so TLI 3 fits), a feature store made by the real
pipeline (target responses -> samples.jsonl -> extract_features), and drafters trained on it by recipe."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.shared.models.tiny import TinyConfig

TARGET = TinyConfig(num_layers=4, seed=0)
PROMPTS = ["Write a function that adds two numbers.", "Explain what a list is.", "Sort a list of words.",
           "Write a loop that prints 1 to 10.", "What does zip do?", "Reverse a string in Python.",
           "Count words in a text.", "Explain recursion briefly.", "Parse an integer from text.",
           "Merge two dictionaries."]
CODE = ["def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 3, "for i in range(10):\n    print(i * i)\n" * 4]
SPECIAL_IDS = (258,)  # the tiny tokenizer's end of text: drafted like any token


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    from edgespec.shared.models.tiny import save_tiny_model

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
    every drafted generation must equal): transformers' generate (support/greedy.py)."""
    from support.greedy import generated_greedy

    return generated_greedy


@pytest.fixture(scope="session")
def seqs(store):
    names = ("hidden", "kv", "act0", "act1", "act3")
    return [store.load(f, names) for f in store.files]


@pytest.fixture(scope="session")
def train_drafter(target, store, tmp_path_factory):
    """train_drafter(recipe, steps, tli=0, width=32, options=None, init=None) -> the checkpoint of a drafter
    trained by `recipe` ("eagle", "moa+hass", "beagle", "eagle+router", ...) on the tiny target's store, as
    `edgespec train fit` leaves it with its card: the .safetensors file of an EAGLE or Beagle drafter, the
    folder of a MoA drafter. `init`: a checkpoint this fixture made before, whose run the recipe starts from
    (a later stage). A few hundred steps at most: enough for drafts to be accepted, not more."""
    from edgespec.server.training.fit import build_recipe
    from edgespec.server.training.trainer import TrainConfig, Trainer

    runs: dict[Path, Path] = {}  # checkpoint -> the run folder it was saved in

    def train(recipe: str, steps: int, tli: int = 0, width: int = 32, options: dict | None = None,
              init: Path | None = None) -> Path:
        run = tmp_path_factory.mktemp(recipe.replace("+", "-"))
        rec = build_recipe(recipe, target.model, store, tli=tli, width=width, heads=4, vocab=0, special_ids=SPECIAL_IDS,
                           run_dir=run, options=options, init=None if init is None else runs[init])
        config = TrainConfig(steps=steps, lr=3e-3, warmup=5, batch_tokens=256, window=96, eval_every=10_000,
                             eval_depth=4, save_every=10_000, seed=0)
        Trainer(rec, store, run, config).fit()
        files = rec.save_drafter(run)
        (run / "card.json").write_text(json.dumps({"kind": rec.kind, "target": store.meta["target"],
                                                   "tokenizer_fingerprint": store.meta["fingerprint"]}))
        checkpoint = files[0] if rec.kind != "moa" else files[0].parent
        runs[checkpoint] = run
        return checkpoint

    return train


def train_config(**overrides):
    """A TrainConfig for a few dozen steps on the tiny store (no evaluation or saving in between);
    overrides replace any field."""
    from edgespec.server.training.trainer import TrainConfig

    base = dict(steps=30, lr=3e-3, warmup=2, batch_tokens=200, window=96, eval_every=1000, eval_depth=4,
                save_every=1000, seed=0)
    return TrainConfig(**{**base, **overrides})


def learned_options(kind: str, checkpoint: Path, target_dir, **more):
    """DrafterOptions of a learned drafter (`kind`: eagle, moa, beagle) from `checkpoint` for the tiny target."""
    from edgespec.client.drafters.factory import DrafterOptions

    return DrafterOptions(name=kind, checkpoint=str(checkpoint), target=str(target_dir), dtype="float32", **more)
