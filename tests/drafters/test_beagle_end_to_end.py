"""Beagle in the real system: trained a little in both stages by the real trainer on the tiny
target's own outputs, then drafting through a real gRPC server and client on loopback: greedy
output token-exact with the target's, offline continuation after the link is cut (a real
relay), and a rollback resume that ends exactly on the target's text."""
from __future__ import annotations

import json
import time

import pytest

from edgespec.server.training.fit import build_recipe
from edgespec.server.training.trainer import TrainConfig, Trainer

PROMPT = "Write a function that adds two numbers."


@pytest.fixture(scope="module")
def checkpoint(target, store, tmp_path_factory):
    """A Beagle drafter: 100 early steps (inverse block attention), 30 late steps (simulated drafting).
    Width 64: the tiny target's text is nearly random, and a narrower drafter rarely guesses it."""
    early = tmp_path_factory.mktemp("beagle-early")
    late = tmp_path_factory.mktemp("beagle-late")
    base = dict(lr=3e-3, warmup=5, batch_tokens=256, window=96, eval_every=10_000, eval_depth=4,
                save_every=10_000, seed=0)
    for run, steps, opts, init in ((early, 100, {"block": "3"}, None),
                                   (late, 30, {"block": "3", "stage": "late"}, early)):
        rec = build_recipe("beagle", target.model, store, width=64, heads=4, special_ids=(258,), options=opts,
                           init=init)
        Trainer(rec, store, run, TrainConfig(steps=steps, **base)).fit()
    path = rec.save_drafter(late)[0]
    (late / "card.json").write_text(json.dumps({"kind": "beagle", "target": store.meta["target"],
                                                "tokenizer_fingerprint": store.meta["fingerprint"]}))
    return path


@pytest.fixture(scope="module")
def server(target_dir):
    from edgespec.server.app import ServerConfig, start_server

    handle = start_server(ServerConfig(model=str(target_dir), http_port=None, device="cpu", dtype="float32"))
    yield handle
    handle.stop(grace=1.0)


def make_client(address, target_dir, checkpoint, **link):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link import LinkConfig

    link = {"min_deadline_s": 0.5, "connect_timeout_s": 0.5, "backoff_initial_s": 0.02, "backoff_max_s": 0.2,
            **link}
    options = DrafterOptions(name="beagle", checkpoint=str(checkpoint), target=str(target_dir), dtype="float32")
    return EdgespecClient(ClientConfig(LinkConfig(address, **link), options, tokenizer=str(target_dir)))


def test_drafted_generation_equals_the_targets_greedy_output(target_greedy, server, target, target_dir, checkpoint):
    from edgespec.client.generation import GenerationConfig

    client = make_client(server.address, target_dir, checkpoint)
    try:
        assert client.drafter.name == "beagle"
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        m = result.metrics
        assert m.num_accepted_tokens > 0, "a trained drafter should get some drafts accepted"
        assert m.calls < 48  # fewer target calls than tokens: the drafts paid
        assert 0 < m.feature_bytes <= m.bytes_down
    finally:
        client.close()


def drive(gen, relay, cut_at: int, restore_after: int | None):
    """Consume a generation; cut the relay after `cut_at` tokens, restore it after `restore_after`
    offline tokens (None: never)."""
    from edgespec.client.generation import TokenEvent, TokenOrigin

    offline = 0
    for e in gen:
        if isinstance(e, TokenEvent):
            if e.index + 1 == cut_at and e.origin is not TokenOrigin.OFFLINE and relay.state == "up":
                relay.cut("blackhole")
            if e.origin is TokenOrigin.OFFLINE:
                offline += 1
                time.sleep(0.02)
                if restore_after is not None and offline >= restore_after:
                    relay.restore()
    return gen.result


@pytest.fixture
def relay(server):
    from edgespec.netem.profile import load_profile
    from edgespec.netem.relay_thread import RelayThread

    with RelayThread(load_profile("ideal"), upstream=("127.0.0.1", server.port), seed=0) as r:
        yield r


def test_cut_link_completes_offline_and_rollback_resume_is_exact(target_greedy, server, relay, target, target_dir, checkpoint):
    from edgespec.client.commit import ResumePolicy
    from edgespec.client.generation import GenerationConfig, TokenOrigin

    client = make_client(relay.target, target_dir, checkpoint)
    try:
        ids = client.encode(PROMPT)
        keep = GenerationConfig(max_new_tokens=40, ignore_eos=True, resume_policy=ResumePolicy.KEEP)
        r = drive(client.generation(ids, keep), relay, cut_at=6, restore_after=None)
        assert len(r.token_ids) == 40 and r.metrics.offline_tokens > 0
        k = r.origins.index(TokenOrigin.OFFLINE)
        assert k >= 6 and all(o is TokenOrigin.OFFLINE for o in r.origins[k:])
        assert r.token_ids[:k] == target_greedy(target.model, ids, k)
    finally:
        client.close()
    relay.restore()
    client = make_client(relay.target, target_dir, checkpoint)
    try:
        rollback = GenerationConfig(max_new_tokens=40, ignore_eos=True, resume_policy=ResumePolicy.ROLLBACK)
        r = drive(client.generation(ids, rollback), relay, cut_at=5, restore_after=4)
        assert r.metrics.resumes >= 1
        assert r.token_ids == target_greedy(target.model, ids, 40)
    finally:
        client.close()


def test_the_factory_lists_beagle_and_refuses_another_kinds_checkpoint(checkpoint, target_dir, tmp_path):
    import shutil

    from edgespec.client.drafters.factory import DrafterOptions, available_drafters, make_drafter
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
    from edgespec.shared.drafters.eagle import EagleConfig, EagleHead, save_eagle

    assert "beagle" in available_drafters()
    save_eagle(EagleHead(EagleConfig(64, width=32, heads=4, mlp_hidden=64)), tmp_path / "eagle.safetensors")
    with pytest.raises(DrafterCheckpointError, match="holds a eagle drafter, not beagle"):
        make_drafter(DrafterOptions(name="beagle", checkpoint=str(tmp_path), target=str(target_dir)))
    renamed = tmp_path / "mine.safetensors"  # a Beagle file under another name is still known by its metadata
    shutil.copy(checkpoint, renamed)
    drafter = make_drafter(DrafterOptions(name="beagle", checkpoint=str(renamed), target=str(target_dir)))
    assert drafter.name == "beagle" and drafter.feature_request().kind == 1  # the target's last hidden states
