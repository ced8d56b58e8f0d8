"""Learned drafters in the real system: a tiny target behind a real gRPC server, the client's
EAGLE, MoA and Beagle drafters (trained a little by the real trainer on the target's own outputs;
Beagle in both its stages), greedy output token-exact with the target's, offline continuation and
resume through a real relay, and the refusals a user can meet (wrong tokenizer, server part
missing, another kind's checkpoint)."""
from __future__ import annotations

import json

import pytest
from support.clients import edge_client
from support.drafters import learned_options
from support.estimates import TreesNeverPay
from support.relays import drive, relay_to
from support.servers import running_server

pytestmark = pytest.mark.slow  # module fixtures train four drafters; end to end through a server and a relay

PROMPT = "Write a function that adds two numbers."
KINDS = [("eagle", 0), ("moa", 0), ("moa", 1), ("beagle", 0)]


@pytest.fixture(scope="module")
def checkpoints(train_drafter):
    """kind-tli -> checkpoint path. EAGLE and MoA: 120 steps each (enough to accept some drafts). Beagle: 100
    early steps (inverse block attention), 30 late steps (simulated drafting); width 64: the tiny target's
    text is nearly random, and a narrower drafter rarely guesses it."""
    out = {f"{kind}-tli{tli}": train_drafter(kind, steps=120, tli=tli) for kind, tli in KINDS if kind != "beagle"}
    early = train_drafter("beagle", steps=100, width=64, options={"block": "3"})
    out["beagle-tli0"] = train_drafter("beagle", steps=30, width=64, options={"block": "3", "stage": "late"},
                                       init=early)
    return out


@pytest.fixture(scope="module")
def server(target_dir, checkpoints):
    parts = {name: str(path) for name, path in checkpoints.items() if name.startswith("moa")}
    with running_server(target_dir, http_port=None, moa_server_parts=parts) as handle:
        yield handle


def learned_client(address, target_dir, checkpoint, kind):
    return edge_client(address, learned_options(kind, checkpoint, target_dir), target_dir, min_deadline_s=0.5)


@pytest.mark.parametrize("kind,tli", KINDS)
def test_drafted_generation_equals_the_targets_greedy_output(target_greedy, kind, tli, server, target, target_dir, checkpoints):
    from edgespec.client.loop.generation import GenerationConfig

    client = learned_client(server.address, target_dir, checkpoints[f"{kind}-tli{tli}"], kind)
    try:
        assert client.drafter.name == (f"moa-tli{tli}" if kind == "moa" else kind)
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        m = result.metrics
        assert m.num_accepted_tokens > 0, "a trained drafter should get some drafts accepted"
        assert m.calls < 48  # fewer target calls than tokens: the drafts paid
        assert 0 < m.feature_bytes <= m.bytes_down and m.feature_raw_bytes > 0
    finally:
        client.close()


@pytest.mark.parametrize("kind,tli", [("eagle", 0), ("moa", 1)])
def test_with_prompt_lookup_merged_the_output_is_still_the_targets(target_greedy, kind, tli, server, target, target_dir,
                                                                   checkpoints):
    """NAME+ngram: the lookup's paths hang onto the learned drafter's trees, whose runtime still follows the
    committed text whichever drafter's nodes the target accepted."""
    import dataclasses

    from edgespec.client.loop.generation import GenerationConfig

    options = learned_options(kind, checkpoints[f"{kind}-tli{tli}"], target_dir)
    client = edge_client(server.address, dataclasses.replace(options, name=f"{kind}+ngram"), target_dir,
                         min_deadline_s=0.5)
    try:
        assert client.drafter.name == (f"moa-tli{tli}+ngram" if kind == "moa" else "eagle+ngram")
        prompt = "Repeat: one two three four, one two three four, one two three four, one two"
        ids = client.encode(prompt)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        assert client.drafter.base.rt.tokens == [*ids, *result.token_ids]
    finally:
        client.close()


@pytest.mark.parametrize("kind,tli", [("eagle", 0), ("moa", 1)])
def test_with_no_dtype_asked_a_learned_drafter_runs_in_the_cpus_fast_precision(target_greedy, kind, tli, server,
                                                                             target, target_dir, checkpoints):
    """The client's default: the drafter's own layers and MoA's TLI layer in bf16 where the CPU computes it
    natively (float32 where it would emulate it), the LM head in int8, log-probabilities in float32 (bf16 logits
    would tie a tree's candidates); the output is still the target's, token for token."""
    import torch

    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.loop.generation import GenerationConfig
    from edgespec.shared.device import default_dtype

    options = DrafterOptions(name=kind, checkpoint=str(checkpoints[f"{kind}-tli{tli}"]), target=str(target_dir))
    client = edge_client(server.address, options, target_dir, min_deadline_s=0.5)
    try:
        rt = client.drafter.rt
        want = default_dtype("cpu")
        assert rt.parts.dtype == want and rt.parts._int8 is not None
        assert next((rt.client if kind == "moa" else rt.head).parameters()).dtype == want
        if tli:
            assert next(rt.parts.layers.parameters()).dtype == want
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=32, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 32)
        assert result.metrics.num_accepted_tokens > 0
        assert rt.root_logprobs().dtype == torch.float32
    finally:
        client.close()


@pytest.mark.parametrize("kind,tli", [("eagle", 0), ("moa", 1)])
def test_plain_steps_decoding_ahead_hand_the_drafter_every_tokens_features(target_greedy, kind, tli, server, target,
                                                                         target_dir, checkpoints):
    """Tokens the target decodes ahead reach a learned drafter with their features (one row each, checked by
    its runtime) as a chain it took whole: the output stays the target's and the drafter holds the text."""
    import dataclasses

    from edgespec.client.loop.generation import GenerationConfig, TokenOrigin
    from edgespec.client.loop.planner import LoopConfig

    client = learned_client(server.address, target_dir, checkpoints[f"{kind}-tli{tli}"], kind)
    try:
        client.config = dataclasses.replace(client.config, loop=LoopConfig(warmup_trees=1))
        client.estimates = TreesNeverPay()
        ids = client.encode(PROMPT)
        result = client.generate(ids, GenerationConfig(max_new_tokens=48, ignore_eos=True))
        assert result.token_ids == target_greedy(target.model, ids, 48)
        m = result.metrics
        assert m.plain_steps >= 3 and m.calls <= 2 + m.plain_steps < 48 / 3  # Open, the first tree, plain steps
        assert m.queued_steps >= 1  # sent before the features of the step before had come
        assert sum(o is TokenOrigin.BONUS for o in result.origins) > 3 * m.plain_steps
        assert client.drafter.rt.tokens == [*ids, *result.token_ids]
    finally:
        client.close()


@pytest.fixture
def relay(server):
    with relay_to(server) as r:
        yield r


@pytest.mark.parametrize("kind,tli", KINDS)
def test_cut_link_completes_offline_and_rollback_resume_is_exact(target_greedy, kind, tli, server, relay, target, target_dir,
                                                                 checkpoints):
    from edgespec.shared.wire import ResumePolicy
    from edgespec.client.loop.generation import GenerationConfig, TokenOrigin

    ckpt = checkpoints[f"{kind}-tli{tli}"]
    client = learned_client(relay.target, target_dir, ckpt, kind)
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
    client = learned_client(relay.target, target_dir, ckpt, kind)
    try:
        rollback = GenerationConfig(max_new_tokens=40, ignore_eos=True, resume_policy=ResumePolicy.ROLLBACK)
        r = drive(client.generation(ids, rollback), relay, cut_at=5, restore_after=4)
        assert r.metrics.resumes >= 1
        assert r.token_ids == target_greedy(target.model, ids, 40)
    finally:
        client.close()


def test_tree_sweep_measures_a_learned_drafters_shapes_through_its_own_server(target_dir, checkpoints, capsys,
                                                                             tmp_path):
    """`bench tree-sweep --drafter moa --checkpoint RUN`: the bench's loopback server holds the MoA server part it
    needs, one drafter serves every shape, and each shape's trees are the size it asks for."""
    from edgespec.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "tree-sweep", "--target", str(target_dir), "--drafter", "moa", "--checkpoint",
         str(checkpoints["moa-tli1"]), "--shapes", "1x3x3@0.0,3x4x12@0.0", "--humaneval", "1", "--mtbench", "0",
         "--max-tokens", "16", "--out", str(tmp_path / "sweep.json")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("moa-tli1: 1 prompts")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    assert [r[:3] for r in rows] == [["1", "3", "3"], ["3", "4", "12"]]
    chain, wide = (float(r[7]) for r in rows)  # nodes per tree
    assert 1 <= chain <= 3 < wide <= 12
    assert all(float(r[5]) >= 1.0 for r in rows)  # tau: at least the bonus token
    # Each shape is a method of its own for `bench gpu-projection`, with the trees it drafted.
    args = build_parser().parse_args(["bench", "gpu-projection", str(tmp_path / "sweep.json"), "--profiles", "5g"])
    assert args.func(args) == 0
    projected = {line.split("|")[1].strip(): line.split("|")[3].strip()
                 for line in capsys.readouterr().out.splitlines() if line.startswith("| moa")}
    assert list(projected) == ["moa-tli1:1x3x3@0.0", "moa-tli1:3x4x12@0.0"]
    runs = json.loads((tmp_path / "sweep.json").read_text())["runs"]
    for name, nodes in projected.items():  # nodes per verification, as swept
        ms = [r["metrics"] for r in runs if r["method"] == name]
        assert float(nodes) == round(sum(m["num_draft_tokens"] for m in ms) / sum(m["num_verifications"] for m in ms), 1)


def test_a_drafter_of_another_tokenizer_is_refused(server, target_dir, checkpoints, tmp_path):
    import shutil

    from edgespec.shared.errors import TokenizerMismatchError

    moved = tmp_path / "eagle"
    moved.mkdir()
    shutil.copy(checkpoints["eagle-tli0"], moved / "eagle.safetensors")
    (moved / "card.json").write_text(json.dumps({"kind": "eagle", "tokenizer_fingerprint": "0" * 64}))
    with pytest.raises(TokenizerMismatchError, match="trained for a target with tokenizer"):
        learned_client(server.address, target_dir, moved, "eagle")


def test_moa_without_its_server_part_is_refused_with_the_fix(server, target_dir, checkpoints, tmp_path):
    import shutil

    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError

    other = tmp_path / "moa-other"
    shutil.copytree(checkpoints["moa-tli0"], other)
    with pytest.raises(DrafterCheckpointError, match="--moa-server-part moa-other"):
        learned_client(server.address, target_dir, other, "moa")


def test_unknown_checkpoint_names_the_shipped_ones():
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, resolve_checkpoint, shipped_names

    with pytest.raises(DrafterCheckpointError, match="shipped"):
        resolve_checkpoint("no-such-drafter")
    for name in shipped_names():
        assert resolve_checkpoint(name).is_dir()


def test_ship_copies_parts_apart_writes_the_card_and_enforces_the_size_limit(checkpoints, tmp_path):
    from edgespec.server.training import ship as shipping
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, checkpoint_kind, read_card

    run = checkpoints["moa-tli1"].parent
    dest = shipping.ship(run, "moa-tli1", command="edgespec train fit ...", measured={"tau": 1.5},
                         dest_root=tmp_path)
    assert sorted(p.name for p in dest.iterdir()) == ["CARD.md", "card.json", "client.safetensors",
                                                      "server.safetensors"]
    assert checkpoint_kind(dest) == "moa" and read_card(dest)["measured"] == {"tau": 1.5}
    assert "moa-tli1" in (dest / "CARD.md").read_text()
    # A store under the home folder is named from it: the card travels to other machines.
    import json
    from pathlib import Path

    import shutil

    run = Path(shutil.copytree(run, tmp_path / "run"))  # the fixture's run stays as it was for other tests
    card_file = run / "card.json"
    card = json.loads(card_file.read_text()) if card_file.is_file() else {}
    card.setdefault("data", {})["feature_store"] = f"{Path.home()}/stores/a,{Path.home()}/stores/b"
    card_file.write_text(json.dumps(card))
    dest = shipping.ship(run, "moa-tli1", dest_root=tmp_path)
    assert read_card(dest)["data"]["feature_store"] == "~/stores/a,~/stores/b"
    assert str(Path.home()) not in (dest / "CARD.md").read_text()
    # A warm start from a shipped drafter names it from the repository, and keeps what the drafter it replaces
    # was trained on, read before its files are overwritten; a branch's source run is named from the home folder.
    from edgespec.shared.drafters.checkpoint import CHECKPOINT_DIR

    card.update(init=str(CHECKPOINT_DIR / "moa-tli1"), branch_from=f"{Path.home()}/runs/moa")
    card_file.write_text(json.dumps(card))
    dest = shipping.ship(run, "moa-tli1", dest_root=tmp_path)
    shipped = read_card(dest)
    assert (shipped["init"], shipped["branch_from"]) == ("shared/drafters/checkpoints/moa-tli1", "~/runs/moa")
    assert shipped["init_card"]["name"] == "moa-tli1" == read_card(CHECKPOINT_DIR / "moa-tli1")["name"]
    assert "warm start from `shared/drafters/checkpoints/moa-tli1` (`moa-tli1`" in (dest / "CARD.md").read_text()
    card["training"] = {"steps": 3}
    card_file.write_text(json.dumps(card))
    dest = shipping.ship(run, "moa-tli1", dest_root=tmp_path)  # the drafter the next one replaces, 3 steps
    card.update(init=str(dest), training={"steps": 10})
    card_file.write_text(json.dumps(card))
    shipped = read_card(shipping.ship(run, "moa-tli1", dest_root=tmp_path))
    assert (shipped["init_card"]["steps"], shipped["training"]["steps"]) == (3, 10)
    small = shipping.MAX_BYTES
    try:
        shipping.MAX_BYTES = 10
        with pytest.raises(DrafterCheckpointError, match="MB"):
            shipping.ship(checkpoints["eagle-tli0"].parent, "eagle", dest_root=tmp_path)
    finally:
        shipping.MAX_BYTES = small


def test_the_factory_lists_beagle_and_refuses_another_kinds_checkpoint(checkpoints, target_dir, tmp_path):
    import shutil

    from edgespec.client.drafters.factory import DrafterOptions, available_drafters, make_drafter
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
    from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead, save_eagle

    assert "beagle" in available_drafters()
    save_eagle(EagleHead(EagleConfig(64, width=32, heads=4, mlp_hidden=64)), tmp_path / "eagle.safetensors")
    with pytest.raises(DrafterCheckpointError, match="holds a eagle drafter, not beagle"):
        make_drafter(DrafterOptions(name="beagle", checkpoint=str(tmp_path), target=str(target_dir)))
    renamed = tmp_path / "mine.safetensors"  # a Beagle file under another name is still known by its metadata
    shutil.copy(checkpoints["beagle-tli0"], renamed)
    drafter = make_drafter(DrafterOptions(name="beagle", checkpoint=str(renamed), target=str(target_dir)))
    assert drafter.name == "beagle" and drafter.feature_request().kind == 1  # the target's last hidden states
