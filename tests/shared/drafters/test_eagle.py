"""EAGLE head: the drafting runtime computes what training computes; trees, rollback, offline."""
from __future__ import annotations

import pytest
import torch

from edgespec.server.training.eagle_recipe import unrolled_steps
from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead, load_eagle, save_eagle
from edgespec.client.drafters.learned.eagle_runtime import EagleRuntime
from edgespec.client.drafters.learned.runtime import DrafterStateError
from edgespec.shared.drafters.blocks import causal_mask
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.tree import ROOT


@pytest.fixture(scope="module")
def parts(target):
    return TargetParts(target.model, tli=0, dtype=torch.float32)


@pytest.fixture(scope="module")
def head():
    torch.manual_seed(3)
    h = EagleHead(EagleConfig(64, width=32, heads=4, mlp_hidden=64))
    for p in h.parameters():  # larger weights than init: outputs must differ clearly between paths
        p.data.normal_(0, 0.3)
    return h.eval()


def committed(head, parts, seq, n: int) -> EagleRuntime:
    """A runtime that has committed the first n tokens of seq with their n - 1 features."""
    d = EagleRuntime(head, parts)
    d.commit(seq.tokens[:n].tolist(), seq.hidden[:n - 1])
    return d


@torch.no_grad()
def training_steps(head, parts, seq, n: int, steps: int):
    """The trainer's unrolled steps over the first n tokens of seq."""
    return unrolled_steps(head, parts, seq.tokens[:n], seq.hidden[:n - 1], torch.arange(n), steps)


def test_root_prediction_equals_teacher_forced_row(head, parts, seqs):
    seq = seqs[0]
    n = 30
    d = committed(head, parts, seq, n)
    with torch.no_grad():
        pred, _ = head(parts.embed(seq.tokens[1:n]), seq.hidden[:n - 1], torch.arange(n - 1), causal_mask(n - 1))
    expected = torch.log_softmax(parts.logits(pred[-1:]), -1)[0]
    torch.testing.assert_close(d.root_logprobs(), expected, atol=1e-5, rtol=1e-5)


def test_chain_drafting_equals_unrolled_training_steps(head, parts, seqs):
    seq, n = seqs[1], 25
    d = committed(head, parts, seq, n)
    steps = training_steps(head, parts, seq, n, 4)
    tok = int(d.root_logprobs().argmax())
    assert tok == int(steps[0][1][-1])
    for s in range(1, 4):
        lp = d.expand([tok], [ROOT if s == 1 else s - 2])[0]
        expected = torch.log_softmax(parts.logits(steps[s][0][-1:]), -1)[0]
        torch.testing.assert_close(lp, expected, atol=1e-4, rtol=1e-4)
        tok = int(lp.argmax())


def test_tree_siblings_do_not_see_each_other(head, parts, seqs):
    seq, n = seqs[0], 20
    d = committed(head, parts, seq, n)
    tree = d.expand([65, 66, 67], [ROOT, ROOT, 0])  # two children of the root, one grandchild under node 0
    alone = committed(head, parts, seq, n)
    b = alone.expand([66], [ROOT])
    alone.clear_draft()
    a, c = alone.expand([65, 67], [ROOT, 0])
    torch.testing.assert_close(tree[1], b[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(tree[2], c, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(tree[0], tree[1])


def test_rollback_then_recommit_is_identical(head, parts, seqs):
    seq, n = seqs[2], 24
    d = committed(head, parts, seq, n)
    before = d.root_logprobs().clone()
    d.commit(seq.tokens[n:n + 3].tolist(), seq.hidden[n - 1:n + 2])
    d.rollback(n)
    torch.testing.assert_close(d.root_logprobs(), before)
    with pytest.raises(DrafterStateError, match="expected features of 3"):
        d.commit(seq.tokens[n:n + 3].tolist(), seq.hidden[n - 1:n + 1])


def test_offline_generation_feeds_on_own_features(head, parts, seqs):
    seq, n = seqs[0], 16
    d = committed(head, parts, seq, n)
    steps = training_steps(head, parts, seq, n, 5)
    out = []
    for _ in range(5):  # offline: commit each drafted token with no features
        tok = int(d.root_logprobs().argmax())
        out.append(tok)
        d.commit([tok], None)
    assert out == [int(s[1][-1]) for s in steps]
    assert d.length == n + 5


def test_save_and_load_round_trip(head, parts, seqs, tmp_path):
    path = save_eagle(head, tmp_path / "eagle.safetensors", dtype=torch.float32)
    loaded, vocab = load_eagle(path)
    assert vocab is None and loaded.config == head.config
    seq, n = seqs[0], 12
    a, b = EagleRuntime(head, parts), EagleRuntime(loaded, parts)
    for d in (a, b):
        d.commit(seq.tokens[:n].tolist(), seq.hidden[:n - 1])
    torch.testing.assert_close(a.root_logprobs(), b.root_logprobs())


def test_reduced_vocabulary_maps_back_to_target_ids(head, target, seqs):
    ids = torch.tensor([10, 32, 101, 258])
    parts = TargetParts(target.model, vocab_ids=ids, dtype=torch.float32)
    d = EagleRuntime(head, parts)
    seq = seqs[0]
    d.commit(seq.tokens[:10].tolist(), seq.hidden[:9])
    lp = d.root_logprobs()
    assert lp.shape == (4,) and torch.isclose(lp.exp().sum(), torch.tensor(1.0))
    assert int(parts.to_target_ids(lp.argmax())) in ids.tolist()


def test_parts_from_files_equal_parts_from_the_model(target, target_dir, seqs):
    from edgespec.shared.drafters.blocks import causal_mask as cm
    from edgespec.shared.drafters.target_parts import load_target_parts

    full = TargetParts(target.model, tli=3, dtype=torch.float32)
    small = load_target_parts(str(target_dir), tli=3)
    x = seqs[0].acts[3][:12]
    pos = torch.arange(12)
    with torch.no_grad():
        a, _ = full.run_layers(x, pos, cm(12))
        b, _ = small.run_layers(x, pos, cm(12))
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(small.logits(small.norm(b)), full.logits(full.norm(a)))
    # The TLI layers reproduce the target: from act3 they give the target's final hidden state.
    torch.testing.assert_close(small.norm(b), seqs[0].hidden[:12], atol=0.1, rtol=0.05)


def test_resume_replaces_rows_made_offline(head, parts, seqs):
    seq = seqs[1]
    online = EagleRuntime(head, parts)
    online.commit(seq.tokens[:15].tolist(), seq.hidden[:14])
    d = EagleRuntime(head, parts)
    d.commit(seq.tokens[:10].tolist(), seq.hidden[:9])
    d.commit(seq.tokens[10:14].tolist(), None)  # offline: rows from the head's own features
    d.commit(seq.tokens[14:15].tolist(), seq.hidden[9:14], features_from=9)
    torch.testing.assert_close(d.root_logprobs(), online.root_logprobs(), atol=1e-5, rtol=1e-5)
    with pytest.raises(DrafterStateError, match="do not fit"):
        d.commit([1], seq.hidden[:1], features_from=20)


def test_out_of_vocabulary_tokens_are_refused(head, parts, seqs):
    from edgespec.shared.errors import InvalidTreeError

    d = EagleRuntime(head, parts)
    d.commit(seqs[0].tokens[:8].tolist(), seqs[0].hidden[:7])
    with pytest.raises(InvalidTreeError, match="0..319"):
        d.expand([5000], [ROOT])
    assert d.length == 8 and len(d.draft) == 0
