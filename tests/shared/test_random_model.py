"""`edgespec models random`: a random-weight model in a known model's shapes, loadable like any other."""
from __future__ import annotations

import json

import pytest

from edgespec.shared.models.random_model import SHAPES, Shape, save_random_model, shape_of


def test_known_shapes_and_layer_override():
    seven = shape_of("qwen2.5-coder-1.5b-instruct", "7b")
    assert (seven.hidden_size, seven.num_layers, seven.num_heads, seven.num_kv_heads) == (3584, 28, 28, 4)
    assert (seven.intermediate_size, seven.vocab_size) == (18944, 152064)
    small = shape_of("qwen2.5-coder-1.5b-instruct", layers=2)
    assert small.num_layers == 2 and small.hidden_size == 1536
    with pytest.raises(ValueError, match="known"):
        shape_of("no-such-model")
    assert set(SHAPES) >= {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "7b"}


def test_a_random_model_loads_and_runs(tmp_path):
    import torch

    from edgespec.shared.models.loading import load_model

    shape = Shape(64, 2, 4, 2, 128, 320, tie_word_embeddings=True, max_positions=512)
    out = save_random_model(tmp_path / "m", "tiny", shape, torch.float32, seed=3)
    loaded = load_model(str(out), device="cpu", dtype="float32")
    cfg = loaded.model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.vocab_size) == (64, 2, 2, 320)
    assert json.loads((out / "edgespec-random.json").read_text())["shape"]["hidden_size"] == 64
    with torch.inference_mode():
        logits = loaded.model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, 320) and torch.isfinite(logits).all()


def test_a_shape_too_narrow_for_the_models_tokenizer_gets_the_byte_level_one(tmp_path):
    """`--shape small` has 32000 rows: Qwen's 151k-id tokenizer beside it would index past the embedding."""
    import torch
    from transformers import AutoTokenizer

    from edgespec.shared.models.tiny import tiny_tokenizer

    shape = Shape(64, 1, 4, 2, 128, 320, tie_word_embeddings=True, max_positions=512)
    out = save_random_model(tmp_path / "m", "qwen2.5-coder-1.5b-instruct", shape, torch.float32)
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) <= 320 and len(tok) == len(tiny_tokenizer())
    assert max(tok("def f(x): return x * 2  # ünïcode")["input_ids"]) < 320
