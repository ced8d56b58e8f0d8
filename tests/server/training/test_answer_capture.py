"""Features kept while the target answers: the same numbers a second pass would give, in a store the trainer reads."""
from __future__ import annotations

import json

import pytest
import torch

from edgespec.server.training.answer_capture import generate_captured
from edgespec.server.training.data import generate_chat, read_samples
from edgespec.server.training.features import FeatureStore, target_features

HISTORIES = [[{"role": "user", "content": "Write a function that adds two numbers."}],
             [{"role": "user", "content": "hi"}],
             [{"role": "user", "content": "Explain what a context manager is, briefly, with an example."}]]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from edgespec.shared.models import load_model

    return load_model(str(tiny_model_dir), device="cpu", dtype="float32")


def test_captured_features_equal_a_second_pass_over_the_same_tokens(loaded):
    model, tok = loaded.model, loaded.tokenizer
    answers = generate_captured(model, tok, HISTORIES, max_new_tokens=6, tli_depths=(0, 1), with_kv=True)
    # The answers are generate_chat's, word for word: capturing changes nothing the data set records; and
    # both are transformers' own batched greedy `generate`'s.
    assert [a.response for a in answers] == generate_chat(model, tok, HISTORIES, 6)
    texts = [tok.apply_chat_template(h, tokenize=False, add_generation_prompt=True) for h in HISTORIES]
    tok.padding_side = "left"
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, max_new_tokens=6, do_sample=False, temperature=None, top_p=None, top_k=None,
                         pad_token_id=tok.pad_token_id)
    assert [a.response for a in answers] == tok.batch_decode(out[:, enc["input_ids"].shape[1]:],
                                                             skip_special_tokens=True)
    for history, a in zip(HISTORIES, answers):
        prompt = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        assert a.ids[:len(prompt_ids)] == prompt_ids  # no left padding kept
        assert a.mask == [0] * len(prompt_ids) + [1] * (len(a.ids) - len(prompt_ids))
        # The answer's tokens as generated (ids, not the text encoded again), all but the last: the one
        # token the model never read.
        alone = model.generate(torch.tensor([prompt_ids]), max_new_tokens=6, do_sample=False,
                               pad_token_id=tok.pad_token_id)[0, len(prompt_ids):].tolist()
        assert a.ids[len(prompt_ids):] == alone[:len(a.ids) - len(prompt_ids)] and len(a.ids) - len(prompt_ids) >= 1
        # The same tokens run alone through the target: every captured feature agrees (float32).
        exact = target_features(model, a.ids, (0, 1))
        assert set(a.feats) == {"hidden", "kv", "act0", "act1"}
        for name, t in a.feats.items():
            assert t.shape == exact[name].shape, name
            torch.testing.assert_close(t, exact[name], atol=2e-4, rtol=2e-4, msg=name)


def test_hidden_only_capture_keeps_no_cache_features(loaded):
    answers = generate_captured(loaded.model, loaded.tokenizer, HISTORIES[:2], max_new_tokens=4)
    assert all(set(a.feats) == {"hidden"} for a in answers)


def test_a_bf16_capture_waits_in_bf16_and_is_stored_as_float32(tmp_path, tiny_model_dir):
    """The features of a batch wait for their shard in the model's dtype (half float32's bytes in bf16), and
    the shard is the one float32 copies of them would make: every frame says float32."""
    import numpy as np

    from edgespec.server.training.extraction import Sequence, write_shard
    from edgespec.shared.codec import decode_frame
    from edgespec.shared.models import load_model

    bf16 = load_model(str(tiny_model_dir), device="cpu", dtype="bfloat16")
    answers = generate_captured(bf16.model, bf16.tokenizer, HISTORIES[:2], max_new_tokens=4, tli_depths=(0, 1),
                                with_kv=True)
    assert {t.dtype for a in answers for t in a.feats.values()} == {torch.bfloat16}
    seqs = [Sequence(f"r{i}", "train", a.ids, a.mask) for i, a in enumerate(answers)]
    write_shard(tmp_path / "kept.npz", seqs, [a.feats for a in answers])
    write_shard(tmp_path / "float.npz", seqs, [{k: v.float() for k, v in a.feats.items()} for a in answers])
    kept, upcast = np.load(tmp_path / "kept.npz"), np.load(tmp_path / "float.npz")
    assert sorted(kept.files) == sorted(upcast.files)
    for name in kept.files:
        np.testing.assert_array_equal(kept[name], upcast[name], err_msg=name)
    frame = decode_frame(kept["s0_kv"].tobytes())
    assert frame.dtype == torch.float32 and frame.shape[0] == len(answers[0].ids)


def test_build_dataset_fills_a_store_as_it_answers_and_resumes(tmp_path, tiny_model_dir):
    from edgespec.server.training.answer_capture import capture_into
    from edgespec.server.training.data import DataConfig, build_dataset
    from edgespec.server.training.train_config import CaptureConfig

    cfg = DataConfig(n_write=0, n_explain=0, n_code=1, n_complete=2, n_chat=2, max_new_tokens=5, batch_size=2,
                     val_fraction=0.5)
    capture = capture_into(CaptureConfig(str(tmp_path / "store"), "full", (0, 1)))
    assert capture_into(CaptureConfig()) is None
    path = build_dataset(str(tiny_model_dir), tmp_path / "data", cfg, capture=capture)
    rows = {r["id"]: r for r in read_samples(path)}
    store = FeatureStore(tmp_path / "store")
    meta = json.loads((tmp_path / "store" / "store.json").read_text())
    assert meta["contents"] == "full" and meta["tli_depths"] == [0, 1] and meta["capture"] == {"first_row": 0}
    stored = {s.id: s for s in (store.load(ref, ("hidden", "kv", "act0", "act1")) for ref in store.files)}
    answered = {i for i, r in rows.items() if r["kind"] != "code"}
    assert set(stored) == answered  # every answer, once; plain code has no answer to capture
    for sid, seq in stored.items():
        assert seq.split == rows[sid]["split"] and seq.hidden.shape[0] == seq.kv.shape[0] == len(seq.tokens)
        assert 1 in seq.acts and seq.loss_mask.any()
    # A second run with more prompts answers only the new ones and adds their shard beside the first ones.
    more = DataConfig(**{**cfg.__dict__, "n_chat": 4})
    now = read_samples(build_dataset(str(tiny_model_dir), tmp_path / "data", more, capture=capture))
    ids = [s.id for s in (store.load(ref, ()) for ref in FeatureStore(tmp_path / "store").files)]
    assert len(ids) == len(set(ids)) > len(answered)
    assert set(ids) == {r["id"] for r in now if r["kind"] != "code"}
    assert json.loads((tmp_path / "store" / "store.json").read_text())["capture"] == {"first_row": 0}
    # Different contents into the same store are refused before anything is generated.
    with pytest.raises(ValueError, match="contents"):
        build_dataset(str(tiny_model_dir), tmp_path / "data", DataConfig(**{**more.__dict__, "n_chat": 5}),
                      capture=capture_into(CaptureConfig(str(tmp_path / "store"), "hidden")))
