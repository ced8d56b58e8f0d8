"""server/training/drafter_job.sh, every step on the tiny target: the long run's commands work as written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edgespec.server.training.features import FeatureStore

pytestmark = pytest.mark.slow  # four edgespec processes, each loading the tiny target

JOB = Path(__file__).resolve().parents[3] / "server" / "training" / "drafter_job.sh"


def test_every_step_runs_and_resumes(target_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n\n" * 40)
    env = {**os.environ, "TARGET": str(target_dir), "OUT": str(tmp_path / "out"), "TEXT": str(src),
           "TEXT_TOKENS": "4000", "MAX_LEN": "64", "N_COMPLETE": "2", "N_CHAT": "3", "N_WRITE": "1", "N_EXPLAIN": "1",
           "MAX_NEW": "8", "BATCH": "4", "WIDTH": "32", "HEADS": "4", "VOCAB": "0", "STEPS": "3", "BATCH_TOKENS": "128",
           "EVAL_EVERY": "2", "EVAL_SEQUENCES": "1", "SAVE_EVERY": "1", "DTYPE": "float32", "AMP": "off", "SEED": "3"}

    def run(*step, **more):
        done = subprocess.run(["bash", str(JOB), *step], env={**env, **more}, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]

    run("text")
    # Answers written before features were kept with them (a run of an older release): the answers step
    # keeps the features of the new ones, and the features steps extract just the earlier rows.
    run("answers", N_CHAT="1", N_COMPLETE="1")
    shutil.rmtree(tmp_path / "out" / "store-answers-live")
    early = [json.loads(line)["id"] for line in (tmp_path / "out" / "data-answers" / "samples.jsonl").open()]
    run("answers")
    rows = [json.loads(line) for line in (tmp_path / "out" / "data-answers" / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["kind"] for r in rows}) == ["chat", "complete", "explain", "write"] and len(rows) > len(early)
    assert json.loads((tmp_path / "out" / "data-answers" / "data_config.json").read_text())["seed"] == 3
    live = FeatureStore(tmp_path / "out" / "store-answers-live")
    assert live.meta["capture"] == {"first_row": len(early)}
    assert sorted(FeatureStore.load(f, ()).id for f in live.files) == sorted(r["id"] for r in rows[len(early):])
    run("answers", ANSWERS="answers-b", SEED="4", N_CHAT="1", N_COMPLETE="1")  # a second set, beside the first
    second = json.loads((tmp_path / "out" / "data-answers-b" / "data_config.json").read_text())
    assert second["seed"] == 4 and FeatureStore(tmp_path / "out" / "store-answers-b-live").files
    run("answers-features")
    hidden = FeatureStore(tmp_path / "out" / "store-answers-hidden")
    assert sorted(FeatureStore.load(f, ()).id for f in hidden.files) == sorted(early)
    run("eagle")
    card = json.loads((tmp_path / "out" / "fit" / "eagle-w32" / "card.json").read_text())
    stores = card["data"]["feature_store"].split(",")
    assert card["training"]["steps"] == 3 and [Path(s).name for s in stores] == [
        "store-answers-hidden", "store-answers-b-live", "store-answers-live", "store-text-hidden"]
    # a warm start from EAGLE's run, on the stores named
    live = f"{tmp_path}/out/store-answers-live {tmp_path}/out/store-answers-b-live"
    run("eagle-hass", STEPS="2", INIT=str(tmp_path / "out" / "fit" / "eagle-w32"), STORES=live)
    card = json.loads((tmp_path / "out" / "fit" / "eagle-hass-w32" / "card.json").read_text())
    assert card["recipe"] == "eagle+hass" and card["training"]["steps"] == 2
    assert card["data"]["feature_store"].split(",") == live.split()
    assert card["init"] == str(tmp_path / "out" / "fit" / "eagle-w32")
    # HASS's second stage from that run, in a folder of its own: the recipe's settings pass through OPTS
    run("eagle-hass", STEPS="1", INIT=str(tmp_path / "out" / "fit" / "eagle-hass-w32"), STORES=live, OPTS="stage=2",
        RUN="eagle-hass-s2-w32")
    card = json.loads((tmp_path / "out" / "fit" / "eagle-hass-s2-w32" / "card.json").read_text())
    assert card["recipe"] == "eagle+hass" and card["options"] == {"stage": "2"} and card["training"]["steps"] == 1
    run("answers-full")
    run("moa", "1")
    card = json.loads((tmp_path / "out" / "fit" / "moa-tli1-w32" / "card.json").read_text())
    assert [Path(s).name for s in card["data"]["feature_store"].split(",")] == [
        "store-answers-full", "store-answers-b-live", "store-answers-live"]
    run("eagle", STEPS="5")  # resumes: two more steps on the schedule the first run planned
    card = json.loads((tmp_path / "out" / "fit" / "eagle-w32" / "card.json").read_text())
    assert card["training"]["steps"] == 5
    steady = (tmp_path / "out" / "fit" / "eagle-w32" / "checkpoint.pt").read_bytes()
    run("cool", "2", "eagle")  # a cooldown branch from step 5: two steps more in its own folder
    card = json.loads((tmp_path / "out" / "fit" / "eagle-w32-cool2-from5" / "card.json").read_text())
    assert card["training"]["steps"] == 7 and card["training"]["config"]["cooldown"] == 2
    assert (tmp_path / "out" / "fit" / "eagle-w32" / "checkpoint.pt").read_bytes() == steady
    assert card["branch_from"] == str(tmp_path / "out" / "fit" / "eagle-w32") and card["init"] is None
    run("cool", "1", "eagle-hass")  # a branch of a warm-started run keeps that run's --init in its card
    card = json.loads((tmp_path / "out" / "fit" / "eagle-hass-w32-cool1-from2" / "card.json").read_text())
    assert card["recipe"] == "eagle+hass" and card["init"] == str(tmp_path / "out" / "fit" / "eagle-w32")
    run("cool", "1", "eagle", COOL_KIND="eagle+hass")  # the same head cooled under HASS's unrolled steps
    card = json.loads((tmp_path / "out" / "fit" / "eagle-w32-cool1-from5-eagle-hass" / "card.json").read_text())
    assert card["recipe"] == "eagle+hass" and card["training"]["steps"] == 6
    run("cool", "1", "moa", "1")
    assert (tmp_path / "out" / "fit" / "moa-tli1-w32-cool1-from3" / "card.json").is_file()
    run("moa-hass", "1", STEPS="2", INIT=str(tmp_path / "out" / "fit" / "moa-tli1-w32"))  # MoA's A/B under HASS
    card = json.loads((tmp_path / "out" / "fit" / "moa-hass-tli1-w32" / "card.json").read_text())
    assert card["recipe"] == "moa+hass" and card["training"]["steps"] == 2
    assert card["init"] == str(tmp_path / "out" / "fit" / "moa-tli1-w32")
    run("cool", "1", "moa-hass", "1")
    card = json.loads((tmp_path / "out" / "fit" / "moa-hass-tli1-w32-cool1-from2" / "card.json").read_text())
    assert card["recipe"] == "moa+hass" and card["training"]["steps"] == 3
    bad = subprocess.run(["bash", str(JOB), "nonsense"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "answers-features" in bad.stdout and "COOL_KIND" in bad.stdout
