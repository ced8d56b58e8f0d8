"""`edgespec bench drafter-curve`: a run's snapshots scored on the target's own answers, the evaluation set made
once and reused (tiny target, tiny EAGLE and MoA runs)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.drafters import train_config
from edgespec.netem.bench.drafter_curve import Scorer, curve_points, eval_store
from edgespec.netem.bench.prompt_sets import humaneval_prompts, mtbench_first_turns
from edgespec.server.training.fit import build_recipe
from edgespec.server.training.trainer import Trainer

pytestmark = pytest.mark.slow  # trains two tiny drafters and makes an evaluation store


@pytest.fixture(scope="module")
def evaluation(target_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    prompts = humaneval_prompts(1) + mtbench_first_turns(1)
    return folder, eval_store(str(target_dir), folder, prompts, max_new_tokens=12, batch_size=2, dtype="float32")


def test_the_evaluation_set_is_the_targets_answers_and_is_made_once(target, target_dir, evaluation):
    import torch

    folder, store = evaluation
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert [r["id"].split(":")[0] for r in rows] == ["humaneval", "mtbench"] and {r["split"] for r in rows} == {"val"}
    seqs = [store.load(ref, ("hidden", "kv", "act1")) for ref in store.split("val")]
    assert len(seqs) == 2 and all(s.kv is not None and 1 in s.acts for s in seqs)
    for s, r in zip(sorted(seqs, key=lambda s: s.id), sorted(rows, key=lambda r: r["id"])):
        first = int(s.loss_mask.nonzero()[0])
        answer, prompt = s.tokens[s.loss_mask], s.tokens[:first]
        with torch.inference_mode():  # the answer is the target's greedy continuation of the prompt
            greedy = target.model.generate(prompt[None], max_new_tokens=len(answer) - 1, do_sample=False)[0, len(prompt):]
        assert greedy.tolist() == answer[:len(greedy)].tolist()
    again = eval_store(str(target_dir), folder, humaneval_prompts(1) + mtbench_first_turns(1), 12, 2, "float32")
    assert (folder / "samples.jsonl").read_text().count("\n") == 2 and len(again.split("val")) == 2


def test_every_snapshot_is_a_point_and_each_is_scored(target, target_dir, store, evaluation, tmp_path):
    _, estore = evaluation
    for kind, tli in (("eagle", 0), ("moa", 1)):
        run = tmp_path / kind
        rec = build_recipe(kind, target.model, store, tli=tli, width=32, heads=4, vocab=0, special_ids=(258,))
        cfg = train_config(steps=4, snapshot_tokens=train_config().batch_tokens)
        Trainer(rec, store, run, cfg).fit()
        rec.save_drafter(run)
        (run / "card.json").write_text(json.dumps({"training": {"tokens_seen": 10 ** 9}}))
        points = curve_points(run)
        seen = [p["tokens_seen"] for p in points]
        assert seen == sorted(seen) and len(points) >= 3 and {p["kind"] for p in points} == {kind}
        alone = curve_points(points[0]["path"].parent)  # the snapshot folder, given by itself
        assert [(p["path"], p["tokens_seen"]) for p in alone] == [(points[0]["path"], seen[0])]  # a snapshot alone
        scorer = Scorer(str(target_dir), estore, draft_vocab=0, depth=3)
        scores = scorer.score(points[-1]["path"])
        assert set(scores) == {"humaneval", "mtbench"}
        answer_positions = sum(int(s.loss_mask.sum()) for s in scorer.seqs)
        assert 0 < sum(a.chains for a in scores.values()) <= answer_positions


def test_the_command_prints_one_row_a_point(target, target_dir, store, evaluation, tmp_path):
    folder, _ = evaluation
    run = tmp_path / "run"
    rec = build_recipe("eagle", target.model, store, width=32, heads=4, vocab=0, special_ids=(258,))
    rec.save_drafter(run)
    command = [sys.executable, "-m", "edgespec", "bench", "drafter-curve", "--target", str(target_dir), "--eval-dir",
               str(folder), "--humaneval", "1", "--mtbench", "1", "--max-tokens", "12", "--draft-vocab", "0",
               "--dtype", "float32"]
    done = subprocess.run([*command, str(run)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| run | eagle |")]
    assert len(rows) == 1 and rows[0].startswith("| run | eagle | 0 | - | ")
    (run / "card.json").write_text(json.dumps({"training": {"steps": 30, "config": {"batch_tokens": 100}}}))
    assert curve_points(run)[-1]["tokens_seen"] == 3000  # an older card: steps x tokens a step
    empty = subprocess.run([*command, str(tmp_path / "empty")], capture_output=True, text=True, timeout=300)
    assert empty.returncode != 0 and "expected one drafter checkpoint" in empty.stderr
