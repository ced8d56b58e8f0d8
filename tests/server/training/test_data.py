"""Data set building blocks: prompts from local sources, splits, tokenisation, the feature store."""
from __future__ import annotations

import json

import pytest
import torch

from edgespec.server.training.data import DataResumeError, batched_by_length, read_samples
from edgespec.server.training.features import CODEC, target_features, tokenize_sample
from edgespec.server.training.prompts import Sample, derive_samples, source_files, split_of

MODULE = '''
def area(width, height):
    """Return the area of a rectangle given its width and height in metres."""
    w = width
    h = height
    product = w * h
    return product


def human_eval_check(x):
    """Checks a candidate solution against the HumanEval tests for the problem."""
    return x
'''


def fake_root(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "geometry.py").write_text(MODULE)
    clean = MODULE.split("def human_eval_check")[0]
    (tmp_path / "pkg" / "more.py").write_text(clean.replace("area", "volume") * 3)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_x.py").write_text(MODULE)
    return tmp_path


def test_samples_are_reproducible_and_never_mention_test_sets(tmp_path):
    root = fake_root(tmp_path)
    assert all("test" not in p.parts for p in source_files(root))
    a = derive_samples(0, 5, 5, 2, code_chars=200, root=root)
    b = derive_samples(0, 5, 5, 2, code_chars=200, root=root)
    assert a == b
    kinds = {s.kind for s in a}
    assert kinds == {"write", "explain", "code"}
    assert not any("humaneval" in s.prompt.lower() for s in a)
    assert any("area of a rectangle" in s.prompt for s in a if s.kind == "write")
    assert len({s.id for s in a}) == len(a)


def test_split_is_stable_and_near_the_fraction():
    ids = [f"write:mod:f{i}" for i in range(2000)]
    splits = [split_of(i, 0.1) for i in ids]
    assert splits == [split_of(i, 0.1) for i in ids]
    assert 120 < splits.count("val") < 280


def test_interrupted_jsonl_keeps_whole_lines(tmp_path):
    p = tmp_path / "samples.jsonl"
    p.write_text(json.dumps({"id": "a"}) + "\n" + json.dumps({"id": "b"}) + "\n" + '{"id": "c", "pro')
    assert [r["id"] for r in read_samples(p)] == ["a", "b"]


def test_loss_mask_covers_the_response_only(tiny_tokenizer):
    row = {"kind": "write", "prompt": "add two numbers", "response": "def add(a, b): return a + b"}
    ids, mask = tokenize_sample(tiny_tokenizer, row, 1000)
    text = tiny_tokenizer.decode([i for i, m in zip(ids, mask) if m])
    assert text == row["response"] + "<|im_end|>"
    code_ids, code_mask = tokenize_sample(tiny_tokenizer, {"kind": "code", "prompt": "x = 1\n"}, 1000)
    assert all(code_mask) and len(code_ids) == 6


def test_features_match_the_target_and_survive_int8(target, store, seqs):
    seq = seqs[0]
    n = seq.tokens.shape[0]
    with torch.no_grad():
        out = target.model(input_ids=seq.tokens[None], output_hidden_states=True)
    # hidden = final-norm output: the LM head on it gives the target's logits.
    logits = target.model.lm_head(seq.hidden)
    assert (logits.argmax(-1) == out.logits[0].argmax(-1)).float().mean() > 0.95
    exact = target_features(target.model, seq.tokens.tolist(), (0, 1, 3))
    for name, stored in [("hidden", seq.hidden), ("kv", seq.kv), ("act1", seq.acts[1]), ("act3", seq.acts[3])]:
        rel = (stored - exact[name]).norm() / exact[name].norm()
        assert rel < 0.02, (name, float(rel))
    # act{N} is the input of layer L-N: the HF hidden state before that layer.
    torch.testing.assert_close(exact["act1"], out.hidden_states[3][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(exact["act3"], out.hidden_states[1][0], atol=1e-4, rtol=1e-4)
    assert seq.kv.shape == (n, 4, 64) and CODEC.outlier_channels == 8


def test_build_dataset_resumes_without_duplicates(tmp_path, tiny_model_dir):
    from edgespec.server.training.data import DataConfig, build_dataset

    (tmp_path / "src").mkdir()
    root = fake_root(tmp_path / "src")
    small = DataConfig(n_write=1, n_explain=1, n_code=1, n_complete=1, n_chat=2, code_chars=200, max_new_tokens=8,
                       batch_size=2, source_root=str(root))
    path = build_dataset(str(tiny_model_dir), tmp_path / "data", small)
    first = read_samples(path)
    assert first[0]["kind"] == "code" and sorted(r["kind"] for r in first[1:]) == [
        "chat", "chat", "complete", "explain", "write"]
    assert all(r["response"] for r in first if r["kind"] != "code")
    # An interruption that cut the last sample mid-line: the rerun finishes the set, nothing twice.
    text = path.read_text()
    path.write_text(text[:text.rindex("{") + 30])
    rows = read_samples(build_dataset(str(tiny_model_dir), tmp_path / "data", small))
    assert [r["id"] for r in rows] == [r["id"] for r in first] and rows[:2] == first[:2]
    # A resume may batch differently, but another seed would choose other requests: refused, nothing written.
    import dataclasses
    rows = read_samples(build_dataset(str(tiny_model_dir), tmp_path / "data", dataclasses.replace(small, batch_size=3)))
    assert [r["id"] for r in rows] == [r["id"] for r in first]
    before = path.read_text()
    with pytest.raises(DataResumeError, match=r"made with seed=0; this run asks seed=1"):
        build_dataset(str(tiny_model_dir), tmp_path / "data", dataclasses.replace(small, seed=1))
    assert path.read_text() == before and json.loads((tmp_path / "data" / "data_config.json").read_text())["seed"] == 0


@pytest.mark.slow
@pytest.mark.models
def test_real_target_features_and_tli_layers_agree():
    """On the real 0.5B: the stored activation entering layer L-3, run through the last 3 layers
    loaded from the target's files (what a client holds), gives the target's own final hidden state."""
    from edgespec.shared.drafters.blocks import causal_mask
    from edgespec.shared.drafters.target_parts import load_target_parts
    from edgespec.shared.models import load_model

    name = "qwen2.5-coder-0.5b-instruct"
    target = load_model(name, device="cpu", dtype="float32")
    ids = target.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n")
    feats = target_features(target.model, ids, (0, 3))
    parts = load_target_parts(name, tli=3)
    n = len(ids)
    with torch.no_grad():
        out, _ = parts.run_layers(feats["act3"], torch.arange(n), causal_mask(n))
        torch.testing.assert_close(out, feats["act0"], atol=1e-2, rtol=1e-3)
        torch.testing.assert_close(parts.norm(out), feats["hidden"], atol=1e-2, rtol=1e-3)
    assert feats["kv"].shape == (n, 24, 256)


def test_batches_are_length_bands_whose_order_spreads_the_kinds():
    # Two kinds of different lengths, interleaved as client_samples interleaves them: 8 windows' worth of
    # batches of 8 (window = 8 batches), and 4 samples more for a short last batch.
    samples = [Sample(f"{k}:{i}", k, ("word " * (4 if k == "chat" else 60)) + str(i))
               for i in range(260) for k in ("chat", "complete")][:516]
    firsts = set()
    for seed in range(12):
        batches = batched_by_length(samples, 8, seed)
        assert sorted(s.id for b in batches for s in b) == sorted(s.id for s in samples)  # each once
        assert [len(b) for b in batches] == [8] * 64 + [4]
        for w in range(0, 64, 8):  # a window's batches are its length bands: one kind each, 4 of each kind
            kinds = [{s.kind for s in b} for b in batches[w:w + 8]]
            assert all(len(k) == 1 for k in kinds) and sum(k == {"chat"} for k in kinds) == 4
        firsts.add(batches[0][0].kind)
        assert batched_by_length(samples, 8, seed) == batches  # the seed decides: a resume sees the same order
    assert firsts == {"chat", "complete"}  # not always the shortest band first
