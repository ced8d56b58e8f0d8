"""Beagle in the real system: trained a little in both stages by the real trainer on the tiny
target's own outputs, then drafting through a real gRPC server and client on loopback: greedy
output token-exact with the target's, offline continuation after the link is cut (a real
relay), and a rollback resume that ends exactly on the target's text."""
from __future__ import annotations

import pytest
from support.clients import edge_client
from support.drafters import learned_options
from support.relays import drive, relay_to
from support.servers import running_server

pytestmark = pytest.mark.slow  # module fixtures train a drafter in two stages; end to end

PROMPT = "Write a function that adds two numbers."


@pytest.fixture(scope="module")
def checkpoint(train_drafter):
    """A Beagle drafter: 100 early steps (inverse block attention), 30 late steps (simulated drafting).
    Width 64: the tiny target's text is nearly random, and a narrower drafter rarely guesses it."""
    early = train_drafter("beagle", steps=100, width=64, options={"block": "3"})
    return train_drafter("beagle", steps=30, width=64, options={"block": "3", "stage": "late"}, init=early)


@pytest.fixture(scope="module")
def server(target_dir):
    with running_server(target_dir, http_port=None) as handle:
        yield handle


def learned_client(address, target_dir, checkpoint):
    return edge_client(address, learned_options("beagle", checkpoint, target_dir), target_dir, min_deadline_s=0.5)


def test_drafted_generation_equals_the_targets_greedy_output(target_greedy, server, target, target_dir, checkpoint):
    from edgespec.client.generation import GenerationConfig

    client = learned_client(server.address, target_dir, checkpoint)
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


@pytest.fixture
def relay(server):
    with relay_to(server) as r:
        yield r


def test_cut_link_completes_offline_and_rollback_resume_is_exact(target_greedy, server, relay, target, target_dir, checkpoint):
    from edgespec.client.commit import ResumePolicy
    from edgespec.client.generation import GenerationConfig, TokenOrigin

    client = learned_client(relay.target, target_dir, checkpoint)
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
    client = learned_client(relay.target, target_dir, checkpoint)
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
