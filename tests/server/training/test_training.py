"""The trainer on tiny models: a few steps lower the loss, resume continues exactly, validation logs."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from support.drafters import train_config
from edgespec.server.training.fit import build_recipe, write_card
from edgespec.server.training.trainer import Trainer, sequence_bytes

pytestmark = pytest.mark.slow  # trains drafters


def recipe(kind, target, store, tli=0, vocab=0, unroll=1):
    return build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, vocab=vocab, special_ids=(258,),
                        unroll=unroll)


def val_loss(trainer: Trainer) -> float:
    return trainer.validate()["val/loss"]


@pytest.mark.parametrize("kind,tli,unroll", [("eagle", 0, 1), ("eagle", 0, 3), ("moa", 0, 1), ("moa", 1, 1)])
def test_a_few_steps_lower_the_loss(kind, tli, unroll, target, store, tmp_path):
    trainer = Trainer(recipe(kind, target, store, tli, unroll=unroll), store, tmp_path, train_config())
    before = val_loss(trainer)
    trainer.fit()
    after = val_loss(trainer)
    assert after < 0.9 * before, (before, after)
    train = [r["loss"] for r in trainer.history]
    assert sum(train[-5:]) / 5 < sum(train[:5]) / 5


def test_resume_continues_exactly(target, store, tmp_path):
    straight = Trainer(recipe("eagle", target, store), store, tmp_path / "a", train_config(steps=6))
    straight.fit()
    # A run of 6 steps stopped after its checkpoint at step 3 (as a kill would leave it) ...
    first = Trainer(recipe("eagle", target, store), store, tmp_path / "b", train_config(steps=6, save_every=3))
    for _ in range(3):
        first.train_step()
    first.save_checkpoint()
    again = Trainer(recipe("eagle", target, store), store, tmp_path / "b", train_config(steps=6, save_every=3))
    again.fit()  # ... resumes at step 3 from checkpoint.pt
    assert again.history[0]["step"] == 4
    assert [r["loss"] for r in again.history] == [r["loss"] for r in straight.history[3:]]
    a = straight.recipe.trainable()["head"].state_dict()
    b = again.recipe.trainable()["head"].state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k])


class CountingTrainer(Trainer):
    """A Trainer that records, after every step, the bytes its training cache holds, and which training
    sequences it decoded."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.held, self.decoded = [], []

    def _load(self, path, validation=False):
        if not validation and self._cache.get(path) is None:
            self.decoded.append(path)
        return super()._load(path, validation)

    def train_step(self):
        out = super().train_step()
        self.held.append(sum(sequence_bytes(s) for s, _ in self._cache._seqs.values()))
        return out


def test_the_trainer_holds_at_most_its_cache_budget(target, store, tmp_path):
    """Training sequences are decoded into a cache bounded in bytes (--cache-mb): a store larger than the
    budget streams through it, and the losses are those of a cache that keeps everything."""
    rec = lambda: recipe("moa", target, store, tli=1)  # noqa: E731 - the largest features: hidden, kv, act1
    sizes = [sequence_bytes(Trainer(rec(), store, tmp_path / "probe", train_config())._load(f))
             for f in store.split("train")]
    budget = sorted(sizes)[-1] + sorted(sizes)[-2]  # any two sequences fit, never all of them
    assert budget < sum(sizes)
    small = CountingTrainer(rec(), store, tmp_path / "small", train_config(steps=12, cache_mb=budget / 2**20))
    small.fit()
    whole = CountingTrainer(rec(), store, tmp_path / "whole", train_config(steps=12))
    whole.fit()
    assert max(small.held) <= budget
    assert small._cache.held == small.held[-1] and max(whole.held) == sum(sizes)
    assert len(small.decoded) > len(set(small.decoded)), "nothing was evicted and decoded again"
    assert len(set(whole.decoded)) == len(whole.decoded) == len(sizes)  # unbounded: each decoded once
    assert [r["loss"] for r in small.history] == [r["loss"] for r in whole.history]
    # the loss-mask cache every process keeps holds masks only, no features
    assert all(m.dtype == torch.bool and m.dim() == 1 for m in small._light.values())


def test_a_resumed_run_with_more_steps_keeps_the_planned_schedule(target, store, tmp_path, caplog):
    """--steps raised on resume adds steps at the schedule's floor; it does not re-stretch the cosine
    under the steps already planned (their learning rates would change mid-run)."""
    from edgespec.server.training.trainer import lr_at

    cfg4, cfg8 = train_config(steps=4, warmup=1), train_config(steps=8, warmup=1)
    first = Trainer(recipe("eagle", target, store), store, tmp_path, cfg4)
    first.fit()
    assert [r["lr"] for r in first.history] == [lr_at(s, cfg4) for s in range(4)]
    assert torch.load(first.checkpoint_path, weights_only=False)["schedule_steps"] == 4
    with caplog.at_level("INFO", logger="edgespec.server.training.trainer"):
        again = Trainer(recipe("eagle", target, store), store, tmp_path, cfg8)
        again.fit()
    assert [r["step"] for r in again.history] == [5, 6, 7, 8]
    floor = cfg8.lr / 10
    assert [r["lr"] for r in again.history] == pytest.approx([floor] * 4)
    assert lr_at(4, cfg8) > 2 * floor  # what a re-stretched schedule would have used
    assert "now goes to 8 steps on the learning-rate schedule planned for 4" in caplog.text
    assert torch.load(again.checkpoint_path, weights_only=False)["schedule_steps"] == 4


def test_a_cooldown_branch_decays_to_zero_and_leaves_the_steady_run_as_it_was(target, store, tmp_path):
    """`train fit --branch-from RUN --cooldown N`: the branch starts where RUN's checkpoint stands (same weights,
    optimizer and data order), its learning rate falls linearly from the schedule's rate there to 0 over N
    steps, then it stops; RUN's files are untouched. A cooldown stopped midway resumes on the same rates."""
    from edgespec.server.training.fit import branch_run
    from edgespec.server.training.trainer import lr_at

    steady_cfg = train_config(steps=40, warmup=1)
    steady = Trainer(recipe("eagle", target, store), store, tmp_path / "steady", steady_cfg)
    for _ in range(5):
        steady.train_step()
    steady.save_checkpoint()
    before = steady.checkpoint_path.read_bytes()

    with pytest.raises(ValueError, match="no checkpoint.pt"):
        branch_run(tmp_path / "nowhere", tmp_path / "cool")
    with pytest.raises(ValueError, match="its own --out"):
        branch_run(tmp_path / "steady", tmp_path / "steady")
    assert branch_run(tmp_path / "steady", tmp_path / "cool")
    cool_cfg = train_config(steps=40, warmup=1, cooldown=4, snapshot_tokens=10)
    cool = Trainer(recipe("eagle", target, store), store, tmp_path / "cool", cool_cfg)
    cool.fit()
    assert [r["step"] for r in cool.history] == [6, 7, 8, 9]
    start = lr_at(5, steady_cfg)  # where the steady schedule stood
    assert start > 0.5 * steady_cfg.lr
    assert [r["lr"] for r in cool.history] == pytest.approx([start, 0.75 * start, 0.5 * start, 0.25 * start])
    assert not (tmp_path / "cool" / "snapshots").exists()  # a cooled drafter is no point of the steady curve
    assert steady.checkpoint_path.read_bytes() == before
    # The branch went on with the steady run's weights and data: its first loss is the steady run's next one.
    assert cool.history[0]["loss"] == pytest.approx(steady.train_step()["loss"], rel=1e-6)

    # Stopped after two cooling steps (a kill after a checkpoint) and started again: the same rates follow.
    assert branch_run(tmp_path / "steady", tmp_path / "cool2")
    half = Trainer(recipe("eagle", target, store), store, tmp_path / "cool2", cool_cfg)
    half.resume()
    assert half.end_step() == 9
    for _ in range(2):
        half.train_step()
    half.save_checkpoint()
    again = Trainer(recipe("eagle", target, store), store, tmp_path / "cool2", cool_cfg)
    again.fit()
    assert [r["step"] for r in again.history] == [8, 9]
    assert [r["lr"] for r in again.history] == pytest.approx([r["lr"] for r in cool.history[2:]])
    assert not branch_run(tmp_path / "steady", tmp_path / "cool2")  # a branch under way is left alone
    with pytest.raises(ValueError, match="is a cooldown that began at step 5"):
        Trainer(recipe("eagle", target, store), store, tmp_path / "cool2", steady_cfg).fit()


@pytest.fixture(scope="module")
def greedy_store(target, target_dir, target_greedy, tmp_path_factory):
    """A store, written as extraction writes one, whose sequences are the tiny target's own greedy
    continuations token for token (the shared store's re-tokenized responses seldom are): drafts the
    target accepts exist, so a figure of accepted drafts can be checked against another count."""
    from support.drafters import CODE, PROMPTS
    from edgespec.server.training.features import (FeatureStore, save_npz, seq_file, sequence_arrays, store_meta,
                                                   target_features)

    out = tmp_path_factory.mktemp("greedy-store")
    (out / "seq").mkdir()
    (out / "store.json").write_text(json.dumps(store_meta(str(target_dir), target, (0, 1, 3), 160)))
    for i, text in enumerate(PROMPTS + CODE):
        prompt = target.tokenizer.encode(text, add_special_tokens=False)[:40]
        ids = prompt + target_greedy(target.model, prompt, 60)
        feats = target_features(target.model, ids, (0, 1, 3))
        mask = [0] * len(prompt) + [1] * 60
        save_npz(seq_file(out, f"g:{i}"), sequence_arrays("", f"g:{i}", "train", ids, mask, feats))
        if i % 4 == 3:  # validation on copies of training sequences: accepted drafts after a few steps
            save_npz(seq_file(out, f"v:{i}"), sequence_arrays("", f"v:{i}", "val", ids, mask, feats))
    return FeatureStore(out)


def served_chains(rec, seq, depth: int) -> list[int]:
    """Accepted lengths of the chains the MoA drafting runtime drafts greedily from every start validation
    cuts (s = 1, 1 + depth, ...; those whose next token is one to learn), each given the features of the
    tokens before s as the server sends them: the serving path, computed apart from the trainer's."""
    from edgespec.client.drafters.learned.moa_runtime import MoARuntime
    from edgespec.shared.drafters.moa.lsa import as_received
    from edgespec.shared.tree import ROOT

    parts, n, e_kv = rec.parts, seq.tokens.shape[0], rec.parts.shape.kv_size
    kv = seq.kv.float()
    with torch.no_grad():
        lsa = as_received(rec.model.lsa(kv), rec.config.wire)
        greedy = parts.to_target_ids(parts.logits(seq.hidden).argmax(-1))  # the target's own next tokens
    tli = range(parts.shape.num_layers - parts.tli, parts.shape.num_layers)
    out = []
    for s in range(1, n - depth, depth):
        if not seq.loss_mask[s + 1]:
            continue
        d = MoARuntime(rec.model.client, parts)
        d.commit(seq.tokens[:s + 1].tolist(), {"lsa": lsa[:s], "tli_k": torch.stack([kv[:s, l, :e_kv] for l in tli]),
                                               "tli_v": torch.stack([kv[:s, l, e_kv:] for l in tli])})
        logp, parent, accepted = d.root_logprobs(), ROOT, 0
        while accepted < depth:
            want = int(seq.tokens[s + accepted + 1])
            if int(parts.to_target_ids(logp.argmax())) != want or int(greedy[s + accepted]) != want:
                break
            logp, parent, accepted = d.expand([want], [parent])[0], accepted, accepted + 1
        out.append(accepted)
    return out


def test_validation_logs_per_position_acceptance_and_card(target, greedy_store, tmp_path):
    """Validation's accept@k is the share of the drafted chains whose first k drafts the target accepts:
    the same figures as chains drafted by the client's runtime over the validation sequences."""
    store = greedy_store
    rec = recipe("moa", target, store, tli=1, vocab=64)
    # enough steps for chains of several accepted drafts (on the copies of training sequences)
    trainer = Trainer(rec, store, tmp_path, train_config(steps=200, lr=1e-2, eval_every=200, save_every=200))
    trainer.fit()
    row, depth = trainer.history[-1], trainer.config.eval_depth
    chains = [a for f in trainer.val_files for a in served_chains(rec, store.load(f, rec.feature_names), depth)]
    assert row["val/chains"] == len(chains) > 0
    want = [sum(a >= k for a in chains) / len(chains) for k in range(1, depth + 1)]
    assert [row[f"val/accept@{k}"] for k in range(1, depth + 1)] == pytest.approx(want)
    assert row["val/mean_accepted"] == pytest.approx(sum(chains) / len(chains))
    assert want[1] > 0, "no chain of two accepted drafts: the check above would hold for a drafter that drafts nothing"
    files = rec.save_drafter(tmp_path)
    card = json.loads(write_card(tmp_path, rec, store, trainer, files, 1.0).read_text())
    assert card["training"]["steps"] == 200 and card["data"]["train_tokens"] == store.tokens("train")
    assert set(card["files"]) == {"moa-tli1/server.safetensors", "moa-tli1/client.safetensors"}
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 201)) and logged[-1]["val/chains"] == len(chains)


def test_chain_acceptance_stops_at_the_first_miss():
    from edgespec.server.training.losses import Acceptance, chain_accepted

    m = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    accepted = chain_accepted(m)
    assert accepted.tolist() == [2, 0, 4]
    acc = Acceptance.of(accepted, 4)
    assert acc.rates() == [2 / 3, 2 / 3, 1 / 3, 1 / 3] and acc.mean_length() == 2.0


def test_cli_end_to_end(target_dir, store, tmp_path):
    env_cmd = [sys.executable, "-m", "edgespec", "train", "fit", "--kind", "eagle", "--target",
               str(target_dir), "--features", str(store.path), "--out", str(tmp_path / "run"), "--width", "32",
               "--heads", "4", "--steps", "3", "--batch-tokens", "128", "--eval-every", "3", "--threads", "1"]
    done = subprocess.run(env_cmd, capture_output=True, text=True, timeout=240,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "eagle.safetensors").is_file()
    assert "val/accept@1" in (tmp_path / "run" / "log.txt").read_text()


def test_a_trained_drafter_opens_for_drafting(target, store, seqs, tmp_path):
    from edgespec.client.drafters.learned.eagle_runtime import EagleRuntime
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.client.drafters.learned.moa_runtime import MoARuntime
    from edgespec.shared.drafters.moa.lsa import open_moa_server_part

    rec = recipe("moa", target, store, tli=1, vocab=64)
    rec.save_drafter(tmp_path)
    d = open_runtime(tmp_path, target.model)
    lsa = open_moa_server_part(tmp_path).float()
    assert isinstance(d, MoARuntime) and d.parts.draft_vocab_size == 64
    seq, n = seqs[0], 10
    e_kv = 32
    with torch.no_grad():
        feats = {"lsa": lsa(seq.kv[:n - 1]), "tli_k": seq.kv[None, :n - 1, 3, :e_kv],
                 "tli_v": seq.kv[None, :n - 1, 3, e_kv:]}
    d.commit(seq.tokens[:n].tolist(), feats)
    top = d.parts.to_target_ids(d.root_logprobs().topk(3).indices)
    assert top.shape == (3,) and bool((top < 320).all())
    eagle = recipe("eagle", target, store)
    eagle.save_drafter(tmp_path / "e")
    assert isinstance(open_runtime(tmp_path / "e", target.model), EagleRuntime)


def test_reduced_vocabulary_is_kept_for_resumed_runs(store, tmp_path):
    from edgespec.server.training.fit import reduced_vocab

    ids = reduced_vocab(store, 40, (258,), tmp_path)
    assert len(ids) == 40 and 258 in ids.tolist() and ids.tolist() == sorted(ids.tolist())
    torch.save(torch.arange(40), tmp_path / "vocab_ids.pt")  # what an earlier run chose
    assert reduced_vocab(store, 40, (258,), tmp_path).tolist() == list(range(40))


def test_open_by_target_name_reads_only_the_parts(target, target_dir, store, seqs, tmp_path):
    from edgespec.client.drafters.learned.loading import open_runtime

    recipe("eagle", target, store, vocab=64).save_drafter(tmp_path)
    by_model = open_runtime(tmp_path, target.model)
    by_files = open_runtime(tmp_path, str(target_dir))
    seq = seqs[0]
    for d in (by_model, by_files):
        d.commit(seq.tokens[:12].tolist(), {"hidden": seq.hidden[:11]})
    torch.testing.assert_close(by_model.root_logprobs(), by_files.root_logprobs())


def test_a_drafter_for_another_target_is_refused(target, store, tmp_path):
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError
    from edgespec.client.drafters.learned.loading import open_runtime
    from edgespec.shared.models.tiny import TinyConfig, tiny_model

    recipe("moa", target, store, tli=1).save_drafter(tmp_path)
    other = tiny_model(TinyConfig(num_layers=2))
    with pytest.raises(DrafterCheckpointError, match="num_layers"):
        open_runtime(tmp_path, other)


def test_wall_clock_budget_stops_early_and_still_saves(target, store, tmp_path):
    trainer = Trainer(recipe("eagle", target, store), store, tmp_path, train_config(steps=50, max_wall_s=1e-9))
    trainer.fit()
    assert trainer.step == 1 and (tmp_path / trainer.checkpoint_path.name).is_file()
    assert "val/chains" in trainer.history[-1]  # the last step validated, as at a normal end


def test_snapshots_keep_the_drafter_at_each_doubling_of_the_tokens_seen(target, store, tmp_path):
    from edgespec.server.training.trainer import snapshot_due
    from edgespec.shared.drafters.eagle.model import load_eagle

    assert [snapshot_due(t, 100) for t in (0, 99, 100, 199, 200, 399, 400, 1000)] == [0, 0, 100, 100, 200, 200, 400, 800]
    cfg = train_config(steps=8)
    base = cfg.batch_tokens  # about one step's tokens: snapshots at ~1, 2, 4 steps
    trainer = Trainer(recipe("eagle", target, store), store, tmp_path, train_config(steps=8, snapshot_tokens=base))
    trainer.fit()
    folders = sorted((tmp_path / "snapshots").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    marks = [int(p.name.split("-")[1]) for p in folders]
    assert marks == [base * 2 ** k for k in range(len(marks))] and len(marks) >= 3
    seen = [json.loads((p / "snapshot.json").read_text())["tokens_seen"] for p in folders]
    assert all(s >= m for s, m in zip(seen, marks)) and seen == sorted(seen) and seen[-1] <= trainer.tokens_seen
    first, _ = load_eagle(folders[0] / "eagle.safetensors")
    last, _ = load_eagle(folders[-1] / "eagle.safetensors")
    assert any(not torch.equal(a, b) for a, b in zip(first.state_dict().values(), last.state_dict().values()))
    assert not list((tmp_path / "snapshots").glob("*.tmp"))


def test_sigterm_ends_the_segment_after_the_step_under_way(target, store, tmp_path):
    """``kill PID`` on a background segment: the step under way finishes, validates and saves as at any
    segment's end (so the card can be written), and the old SIGTERM handler is back afterwards."""
    import os
    import signal

    class SignalledAtStep2(Trainer):
        def train_step(self):
            out = super().train_step()
            if self.step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # the real signal, through the real handler
            return out

    before = signal.getsignal(signal.SIGTERM)
    trainer = SignalledAtStep2(recipe("eagle", target, store), store, tmp_path, train_config(steps=50, save_every=50))
    trainer.fit()
    assert trainer.step == 2 and "val/chains" in trainer.history[-1]
    assert torch.load(trainer.checkpoint_path, weights_only=False)["step"] == 2
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_snapshot_ships_with_its_own_figures_over_the_runs_card(target, store, tmp_path):
    from edgespec.server.training.ship import ship
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, checkpoint_kind, read_card

    cfg = train_config(steps=4)
    rec = recipe("moa", target, store, tli=1)
    run = tmp_path / "run"
    trainer = Trainer(rec, store, run, train_config(steps=4, snapshot_tokens=cfg.batch_tokens))
    trainer.fit()
    first = min((run / "snapshots").iterdir(), key=lambda p: int(p.name.split("-")[1]))
    snap = json.loads((first / "snapshot.json").read_text())
    assert snap["step"] < trainer.step  # the snapshot is not the run's end: its figures must win
    with pytest.raises(DrafterCheckpointError, match="no card.json"):
        ship(first, "moa-tli1", dest_root=tmp_path / "shipped")
    write_card(run, rec, store, trainer, rec.save_drafter(run), 1.0)
    dest = ship(first, "moa-tli1", command="drafter_job.sh moa 1", dest_root=tmp_path / "shipped")
    card = read_card(dest)
    assert checkpoint_kind(dest) == "moa" and card["command"] == "drafter_job.sh moa 1"
    assert (card["training"]["steps"], card["training"]["tokens_seen"]) == (snap["step"], snap["tokens_seen"])
    assert card["training"]["snapshot"] == first.name
    # the run's last validation is of other weights: the snapshot's own figures or none
    assert card["validation"] == ({"step": snap["step"], **{k: v for k, v in snap.items() if k.startswith("val/")}}
                                  if "val/chains" in snap else {})
    assert "val/chains" in json.loads((run / "card.json").read_text())["validation"]
    assert card["target"] == json.loads((run / "card.json").read_text())["target"]
    for part in ("client.safetensors", "server.safetensors"):
        assert (dest / part).read_bytes() == (first / "moa-tli1" / part).read_bytes()
