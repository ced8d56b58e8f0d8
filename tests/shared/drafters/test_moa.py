"""MoA: drafting runtime == training forward, T-step bounded memory, TLI 0/1/3, offline, checkpoints."""
from __future__ import annotations

import pytest
import torch

from edgespec.server.training.moa_recipe import moa_window
from edgespec.shared.drafters.moa.client_part import MoAConfig
from edgespec.shared.drafters.moa.model import load_moa, new_moa, save_moa
from edgespec.client.drafters.learned.moa_runtime import MoARuntime
from edgespec.client.drafters.learned.runtime import DrafterStateError
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.tree import ROOT


def make(target, tli: int, seed: int = 5):
    torch.manual_seed(seed)
    model = new_moa(MoAConfig(64, 32, 4, tli=tli, width=32, heads=4, mlp_hidden=64, lsa_heads=4))
    for m in (model.lsa, model.client):
        for p in m.parameters():
            p.data.normal_(0, 0.3)
        m.eval()
    return model, TargetParts(target.model, tli=tli, dtype=torch.float32)


def features(model, parts, seq, a: int, b: int) -> dict:
    """What the server sends for tokens a..b-1: LSA output and, for TLI, the last layers' K/V."""
    kv = seq.kv[a:b]
    with torch.no_grad():
        out = {"lsa": model.lsa(kv)}
    if parts.tli:
        e_kv, L = parts.shape.kv_size, parts.shape.num_layers
        layers = range(L - parts.tli, L)
        out["tli_k"] = torch.stack([kv[:, l, :e_kv] for l in layers])
        out["tli_v"] = torch.stack([kv[:, l, e_kv:] for l in layers])
    return out


def window_logprobs(model, parts, seq, tokens, verified: int):
    n = len(tokens)
    bounds = torch.minimum(torch.arange(n) - 1, torch.tensor(verified - 1))
    kv = torch.cat([seq.kv[:verified], torch.zeros(n - verified, *seq.kv.shape[1:])])
    with torch.no_grad():
        _, logits = moa_window(model, parts, torch.tensor(tokens), kv, torch.arange(n), bounds)
    return torch.log_softmax(logits, -1)


def committed(model, parts, seq, n: int) -> MoARuntime:
    """A runtime that has committed the first n tokens of seq with the server's features of n - 1."""
    d = MoARuntime(model.client, parts)
    d.commit(seq.tokens[:n].tolist(), features(model, parts, seq, 0, n - 1))
    return d


@pytest.mark.parametrize("tli", [0, 1, 3])
def test_drafting_equals_training_forward(target, seqs, tli):
    model, parts = make(target, tli)
    seq, n = seqs[0], 28
    d = committed(model, parts, seq, n)
    tokens = seq.tokens[:n].tolist()
    torch.testing.assert_close(d.root_logprobs(), window_logprobs(model, parts, seq, tokens, n - 1)[-1],
                               atol=1e-4, rtol=1e-4)
    parent = ROOT
    for s in range(3):  # a chain of drafted tokens: memory stays at the verified prefix
        tok = 70 + s
        lp = d.expand([tok], [parent])[0]
        tokens.append(tok)
        torch.testing.assert_close(lp, window_logprobs(model, parts, seq, tokens, n - 1)[-1], atol=1e-4, rtol=1e-4)
        parent = s


@pytest.mark.parametrize("tli", [0, 1, 3])
def test_incremental_commits_equal_one_commit(target, seqs, tli):
    model, parts = make(target, tli)
    seq, n = seqs[1], 30
    one = committed(model, parts, seq, n)
    inc = committed(model, parts, seq, 10)
    inc.commit(seq.tokens[10:12].tolist(), None)  # offline tokens, later verified
    inc.commit(seq.tokens[12:n].tolist(), features(model, parts, seq, 9, n - 1), features_from=9)
    torch.testing.assert_close(inc.root_logprobs(), one.root_logprobs(), atol=1e-4, rtol=1e-4)
    inc.rollback(20)
    ref = committed(model, parts, seq, 20)
    torch.testing.assert_close(inc.root_logprobs(), ref.root_logprobs(), atol=1e-4, rtol=1e-4)


def test_memory_past_the_bound_is_invisible(target, seqs):
    """The T-step bound is real: changing target activations past a query's bound changes nothing."""
    model, parts = make(target, 1)
    seq = seqs[0]
    n = 40
    from edgespec.shared.drafters.blocks import step_bounds

    bounds = step_bounds(n, 7, 3)
    kv = seq.kv[:n].clone()
    with torch.no_grad():
        _, base = moa_window(model, parts, seq.tokens[:n], kv, torch.arange(n), bounds)
        kv2 = kv.clone()
        kv2[20:] += torch.randn_like(kv2[20:]) * 5  # rows 20.. differ
        _, moved = moa_window(model, parts, seq.tokens[:n], kv2, torch.arange(n), bounds)
    blind = bounds < 20  # queries whose bound is before row 20
    assert blind.sum() > 0 and (~blind).sum() > 0
    torch.testing.assert_close(base[blind], moved[blind])
    assert not torch.allclose(base[~blind], moved[~blind])


@pytest.mark.parametrize("tli", [0, 3])
def test_offline_continuation(target, seqs, tli):
    model, parts = make(target, tli)
    seq, n = seqs[0], 12
    d = committed(model, parts, seq, n)
    generated = []
    for _ in range(8):
        tok = int(d.root_logprobs().argmax())
        generated.append(tok)
        d.commit([tok], None)
    assert d.length == n + 8 and d.covered == n - 1
    # The same text drafted as one chain gives the same tokens: offline rows == draft rows.
    chain = committed(model, parts, seq, n)
    tok, parent, drafted = int(chain.root_logprobs().argmax()), ROOT, []
    for i in range(8):
        drafted.append(tok)
        tok = int(chain.expand([tok], [parent])[0].argmax())
        parent = i
    assert drafted == generated


def test_bad_features_are_refused(target, seqs):
    model, parts = make(target, 1)
    d = MoARuntime(model.client, parts)
    seq = seqs[0]
    with pytest.raises(DrafterStateError, match="lag one"):
        d.commit(seq.tokens[:5].tolist(), features(model, parts, seq, 0, 5))
    with pytest.raises(DrafterStateError, match="tli_k"):
        d.commit(seq.tokens[5:6].tolist(), {"lsa": torch.zeros(1, 64)})


def test_checkpoint_has_server_and_client_parts(target, seqs, tmp_path):
    model, parts = make(target, 1)
    out = save_moa(model, tmp_path / "moa", dtype=torch.float32)
    assert (out / "server.safetensors").is_file() and (out / "client.safetensors").is_file()
    back = load_moa(out)
    seq, n = seqs[0], 15
    a, b = MoARuntime(model.client, parts), MoARuntime(back.client, parts)
    a.commit(seq.tokens[:n].tolist(), features(model, parts, seq, 0, n - 1))
    b.commit(seq.tokens[:n].tolist(), features(back, parts, seq, 0, n - 1))
    torch.testing.assert_close(a.root_logprobs(), b.root_logprobs())


@pytest.mark.parametrize("tli", [0, 1])
def test_resume_covers_offline_tokens(target, seqs, tli):
    """Offline tokens later confirmed by the server: covering them gives the all-online state."""
    model, parts = make(target, tli)
    seq = seqs[1]
    online = committed(model, parts, seq, 15)
    d = committed(model, parts, seq, 10)
    d.commit(seq.tokens[10:14].tolist(), None)  # offline
    d.commit(seq.tokens[14:15].tolist(), features(model, parts, seq, 9, 14), features_from=9)
    torch.testing.assert_close(d.root_logprobs(), online.root_logprobs(), atol=1e-4, rtol=1e-4)
    # A resume that covers only a later span leaves a gap of own rows; drafting and verification go on.
    g = committed(model, parts, seq, 10)
    g.commit(seq.tokens[10:14].tolist(), None)
    g.commit([], features(model, parts, seq, 11, 13), features_from=11)
    assert g.covered == 11 and g.own_pos == [9, 10, 13]
    g.commit(seq.tokens[14:16].tolist(), features(model, parts, seq, 13, 15))  # default: from the old root
    assert g.covered == 13 and g.own_pos == [9, 10, 15]
    assert torch.isclose(g.expand([70, 71], [ROOT, 0]).exp().sum(-1), torch.ones(2)).all()
    with pytest.raises(DrafterStateError, match="do not fit"):
        g.commit([], features(model, parts, seq, 11, 12), features_from=11)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_both_parts_are_saved_in_the_dtype_asked(target, tmp_path, dtype):
    """The server part was written in float32 whatever dtype was asked: twice the bytes of a bf16 one."""
    from safetensors.torch import load_file

    model, _ = make(target, 1)
    out = save_moa(model, tmp_path / "moa", dtype=dtype)
    for part in ("server", "client"):
        floats = {k: v.dtype for k, v in load_file(str(out / f"{part}.safetensors")).items() if v.is_floating_point()}
        assert floats and set(floats.values()) == {dtype}, (part, floats)
    back = load_moa(out)  # read back in float32, equal to the saved weights rounded to the dtype
    for k, v in model.lsa.state_dict().items():
        assert torch.equal(back.lsa.state_dict()[k], v.to(dtype).float())


@pytest.mark.parametrize("tli", [0, 1])
def test_training_rounds_the_lsa_output_as_the_server_sends_it(target, seqs, tli):
    """The server runs the LSA on exact K/V and encodes its output with the session's codec; the client
    drafts from the decoded rows. Training (the recipe's forward, with its default wire codec) rounds the
    same tensor at the same place: its prediction equals the runtime's fed through the real wire."""
    from edgespec.server.features import FeatureSpec, export_features
    from edgespec.server.training.moa_recipe import MoARecipeConfig
    from edgespec.shared.codec import ActivationCodec, decode_frame
    from edgespec.shared.wire import LSA, FeatureKind

    model, parts = make(target, tli)
    seq, n = seqs[0], 24
    kv = seq.kv[:n]
    spec = FeatureSpec(FeatureKind.MOA, ActivationCodec(), model.lsa)  # what a session asks by default
    frames = dict(export_features(spec, seq.hidden[:n], kv))
    served = decode_frame(frames[LSA])
    with torch.no_grad():
        exact = model.lsa(kv)
    assert not torch.equal(served, exact)  # the wire rounds: this test can tell the two apart
    feats = features(model, parts, seq, 0, n - 1)
    feats["lsa"] = served[:n - 1]  # the runtime's memory: the decoded rows of verified tokens
    d = MoARuntime(model.client, parts)
    d.commit(seq.tokens[:n].tolist(), feats)
    bounds = torch.minimum(torch.arange(n) - 1, torch.tensor(n - 2))
    wire = MoARecipeConfig().wire
    with torch.no_grad():
        _, trained = moa_window(model, parts, seq.tokens[:n], kv, torch.arange(n), bounds, wire=wire)
        _, unrounded = moa_window(model, parts, seq.tokens[:n], kv, torch.arange(n), bounds)
    root = torch.log_softmax(trained, -1)[-1]
    torch.testing.assert_close(d.root_logprobs(), root, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(d.root_logprobs(), torch.log_softmax(unrounded, -1)[-1], atol=1e-5, rtol=1e-5)


def test_an_unknown_wire_codec_is_refused():
    from edgespec.server.training.moa_recipe import MoARecipeConfig

    with pytest.raises(ValueError, match="wire_codec must be one of int8_outlier, int8, fp16, none"):
        MoARecipeConfig(wire_codec="int4")
    assert MoARecipeConfig(wire_codec="none").wire is None


def test_the_rounding_passes_the_gradient_through(target, seqs):
    """Straight through: the LSA still learns (its gradient is the unrounded one)."""
    from edgespec.shared.codec import ActivationCodec
    from edgespec.shared.drafters.moa.lsa import as_received

    model, _ = make(target, 0)
    x = model.lsa(seqs[0].kv[:10])
    y = as_received(x, ActivationCodec())
    assert not torch.equal(y, x)
    (g,) = torch.autograd.grad((y * torch.arange(x.numel()).view_as(x)).sum(), x)
    assert torch.equal(g, torch.arange(x.numel()).view_as(x).float())
