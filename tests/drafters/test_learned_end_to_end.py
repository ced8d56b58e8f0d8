"""Learned drafters in the real system: a tiny target behind a real gRPC server, the client's
EAGLE and MoA drafters (trained a little by the real trainer on the target's own outputs),
greedy output token-exact with the target's, offline continuation and resume through a
real relay, and the refusals a user can meet (wrong tokenizer, server part missing)."""
from __future__ import annotations

import json
import time

import pytest

from edgespec.server.training.fit import build_recipe
from edgespec.server.training.trainer import TrainConfig, Trainer

PROMPT = "Write a function that adds two numbers."
KINDS = [("eagle", 0), ("moa", 0), ("moa", 1)]


@pytest.fixture(scope="module")
def checkpoints(target, store, tmp_path_factory):
    """kind-tli -> checkpoint path, each trained 120 steps (enough to accept some drafts)."""
    out = {}
    for kind, tli in KINDS:
        run = tmp_path_factory.mktemp(f"{kind}{tli}")
        rec = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, vocab=0, special_ids=(258,))
        cfg = TrainConfig(steps=120, lr=3e-3, warmup=5, batch_tokens=256, window=96, eval_every=10_000,
                          eval_depth=4, save_every=10_000, seed=0)
        Trainer(rec, store, run, cfg).fit()
        files = rec.save_drafter(run)
        (run / "card.json").write_text(json.dumps({"kind": kind, "target": store.meta["target"],
                                                   "tokenizer_fingerprint": store.meta["fingerprint"]}))
        out[f"{kind}-tli{tli}"] = files[0] if kind == "eagle" else files[0].parent
    return out


@pytest.fixture(scope="module")
def server(target_dir, checkpoints):
    from edgespec.server.app import ServerConfig, start_server

    parts = {name: str(path) for name, path in checkpoints.items() if name.startswith("moa")}
    handle = start_server(ServerConfig(model=str(target_dir), http_port=None, device="cpu", dtype="float32",
                                       moa_server_parts=parts))
    yield handle
    handle.stop(grace=1.0)


def make_client(address, target_dir, checkpoint, kind, **link):
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link import LinkConfig

    link = {"min_deadline_s": 0.5, "connect_timeout_s": 0.5, "backoff_initial_s": 0.02, "backoff_max_s": 0.2,
            **link}
    options = DrafterOptions(name=kind, checkpoint=str(checkpoint), target=str(target_dir), dtype="float32")
    return EdgespecClient(ClientConfig(LinkConfig(address, **link), options, tokenizer=str(target_dir)))


@pytest.mark.parametrize("kind,tli", KINDS)
def test_drafted_generation_equals_the_targets_greedy_output(target_greedy, kind, tli, server, target, target_dir, checkpoints):
    from edgespec.client.generation import GenerationConfig

    client = make_client(server.address, target_dir, checkpoints[f"{kind}-tli{tli}"], kind)
    try:
        assert client.drafter.name == ("eagle" if kind == "eagle" else f"moa-tli{tli}")
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        m = result.metrics
        assert m.num_accepted_tokens > 0, "a trained drafter should get some drafts accepted"
        assert m.calls < 48  # fewer target calls than tokens: the drafts paid
        assert 0 < m.feature_bytes <= m.bytes_down and m.feature_raw_bytes > 0
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


@pytest.mark.parametrize("kind,tli", KINDS)
def test_cut_link_completes_offline_and_rollback_resume_is_exact(target_greedy, kind, tli, server, relay, target, target_dir,
                                                                 checkpoints):
    from edgespec.client.commit import ResumePolicy
    from edgespec.client.generation import GenerationConfig, TokenOrigin

    ckpt = checkpoints[f"{kind}-tli{tli}"]
    client = make_client(relay.target, target_dir, ckpt, kind)
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
    client = make_client(relay.target, target_dir, ckpt, kind)
    try:
        rollback = GenerationConfig(max_new_tokens=40, ignore_eos=True, resume_policy=ResumePolicy.ROLLBACK)
        r = drive(client.generation(ids, rollback), relay, cut_at=5, restore_after=4)
        assert r.metrics.resumes >= 1
        assert r.token_ids == target_greedy(target.model, ids, 40)
    finally:
        client.close()


def test_a_drafter_of_another_tokenizer_is_refused(server, target_dir, checkpoints, tmp_path):
    import shutil

    from edgespec.shared.errors import TokenizerMismatchError

    moved = tmp_path / "eagle"
    moved.mkdir()
    shutil.copy(checkpoints["eagle-tli0"], moved / "eagle.safetensors")
    (moved / "card.json").write_text(json.dumps({"kind": "eagle", "tokenizer_fingerprint": "0" * 64}))
    with pytest.raises(TokenizerMismatchError, match="trained for a target with tokenizer"):
        make_client(server.address, target_dir, moved, "eagle")


def test_moa_without_its_server_part_is_refused_with_the_fix(server, target_dir, checkpoints, tmp_path):
    import shutil

    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError

    other = tmp_path / "moa-other"
    shutil.copytree(checkpoints["moa-tli0"], other)
    with pytest.raises(DrafterCheckpointError, match="--moa-server-part moa-other"):
        make_client(server.address, target_dir, other, "moa")


def test_unknown_checkpoint_names_the_shipped_ones():
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
    from edgespec.shared.drafters.shipped import resolve_checkpoint, shipped_names

    with pytest.raises(DrafterCheckpointError, match="shipped"):
        resolve_checkpoint("no-such-drafter")
    for name in shipped_names():
        assert resolve_checkpoint(name).is_dir()


def test_ship_copies_parts_apart_writes_the_card_and_enforces_the_size_limit(checkpoints, tmp_path):
    from edgespec.server.training import ship as shipping
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
    from edgespec.shared.drafters.shipped import checkpoint_kind, read_card

    run = checkpoints["moa-tli1"].parent
    dest = shipping.ship(run, "moa-tli1", command="edgespec train fit ...", measured={"tau": 1.5},
                         dest_root=tmp_path)
    assert sorted(p.name for p in dest.iterdir()) == ["CARD.md", "card.json", "client.safetensors",
                                                      "server.safetensors"]
    assert checkpoint_kind(dest) == "moa" and read_card(dest)["measured"] == {"tau": 1.5}
    assert "moa-tli1" in (dest / "CARD.md").read_text()
    small = shipping.MAX_BYTES
    try:
        shipping.MAX_BYTES = 10
        with pytest.raises(DrafterCheckpointError, match="MB"):
            shipping.ship(checkpoints["eagle-tli0"].parent, "eagle", dest_root=tmp_path)
    finally:
        shipping.MAX_BYTES = small
