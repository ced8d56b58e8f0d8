"""Each experiment runs end to end on tiny models with a small limit, writes
well-formed JSON lines (metrics + environment) and a report with plots."""
from __future__ import annotations

import json
import re

import pytest

from edgespec.netem.bench.experiments import BenchConfig, run, start_server_log
from edgespec.netem.bench.report import write_report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def one_thread_servers():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


def _config(experiment, out, tiny_model_dir, tiny_drafter_dir, **kw):
    return BenchConfig(experiment, out, model=str(tiny_model_dir), drafter_model=str(tiny_drafter_dir),
                       limit=1, max_new_tokens=12, progress=False, **kw)


def _lines(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        assert r["env"]["commit"] and r["env"]["machine"]["cores"] >= 1
        assert r["env"]["settings"]["experiment"] in ("speed", "link", "disconnect", "codec")
    return rows


def test_speed_and_link(tmp_path, tiny_model_dir, tiny_drafter_dir):
    run(_config("speed", tmp_path, tiny_model_dir, tiny_drafter_dir))
    speed = _lines(tmp_path / "speed.jsonl")
    assert {r["system"] for r in speed} == {"plain-api", "ngram", "independent"}
    assert len(speed) == 2 * 3  # 1 HumanEval + 1 MT-Bench prompt, 3 systems
    for r in speed:
        assert r["new_tokens"] > 0 and r["wall_s"] > 0
    plain = {r["prompt_id"]: r for r in speed if r["system"] == "plain-api"}
    for r in speed:
        if r["system"] != "plain-api":
            # Lossless: the same greedy text as the server generating alone.
            assert r["text"] == plain[r["prompt_id"]]["text"]
            assert r["calls"] >= 1 and r["acceptance_length"] >= 1
    # Each system prefills the prompt itself: none reuses the KV of the system that answered it before.
    opened = re.findall(r"cached_tokens=(\d+)", (tmp_path / "speed-server.log").read_text())
    assert opened and set(opened) == {"0"}, opened

    run(_config("link", tmp_path, tiny_model_dir, tiny_drafter_dir, profiles=("5g",), drafters=("ngram",)))
    link = _lines(tmp_path / "link.jsonl")
    assert {(r["profile"], r["system"]) for r in link} == {("none", "local-only"), ("5g", "plain-api"), ("5g", "ngram")}
    for r in link:
        if r["profile"] == "5g":
            assert r["bytes_up"] > 0 and r["bytes_down"] > 0

    report = write_report(tmp_path).read_text()
    assert "## Speed on an ideal link" in report and "## Under emulated networks" in report
    assert "| 5g | ngram |" in report
    assert "humaneval: tokens/s (acceptance length)" in report and "mtbench: tokens/s" in report
    for png in ("tokens_per_s.png", "calls_per_100_tokens.png", "bytes_per_token.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_disconnect(tmp_path, tiny_model_dir, tiny_drafter_dir):
    run(_config("disconnect", tmp_path, tiny_model_dir, tiny_drafter_dir, drafters=("independent",),
                cut_after=(3, None), cut_mode="reset"))
    rows = _lines(tmp_path / "disconnect.jsonl")
    # prompt by prompt: the target's own answer, then the drafter at B = never, then the cuts
    assert [(r["system"], r["cut_after"]) for r in rows] == [("target", None), ("independent", None),
                                                             ("independent", 3)]
    target, never, cut = rows
    # lossless: without a cut the drafter's answer is the target's own (stopped at the same code fence)
    assert never["text"] == target["text"] and never["passed"] == target["passed"]
    assert cut["disconnects"] >= 1 and cut["offline_tokens"] > 0
    assert never["disconnects"] == 0 and never["offline_tokens"] == 0
    for r in rows:
        assert isinstance(r["passed"], bool) and isinstance(r["passed_stop_at_cut"], bool)
    report = write_report(tmp_path).read_text()
    assert "## Disconnection success" in report and "| independent | never |" in report
    assert "| target alone" in report
    never_line = next(line for line in report.splitlines() if line.startswith("| independent | never |"))
    assert never_line.endswith("| 1/1 |")  # its answer is the target's own, word for word
    assert (tmp_path / "disconnect_success.png").exists()
    # a second run with the same settings finds every generation done and adds nothing
    run(_config("disconnect", tmp_path, tiny_model_dir, tiny_drafter_dir, drafters=("independent",),
                cut_after=(3, None), cut_mode="reset"))
    assert len(_lines(tmp_path / "disconnect.jsonl")) == 3


def test_codec(tmp_path, tiny_model_dir, tiny_drafter_dir):
    run(_config("codec", tmp_path, tiny_model_dir, tiny_drafter_dir))
    rows = _lines(tmp_path / "codec.jsonl")
    assert {r["tensor"] for r in rows} == {"hidden", "kv"}
    fp16 = [r for r in rows if r["codec"] == "fp16" and r["zstd"] == 0]
    # fp16 holds bf16 activations exactly and float32 ones (the default dtype on CPUs without native
    # bf16) within its rounding
    assert all(r["share_of_fp16"] == 1.0 and r["rel_error"] < 1e-3 for r in fp16)
    assert all(0 < r["rel_error"] < 0.05 for r in rows if r["codec"] != "fp16")
    assert "## Activation codec" in write_report(tmp_path).read_text()


def test_unknown_experiment(tmp_path):
    with pytest.raises(ValueError, match="unknown experiment"):
        run(BenchConfig("nope", tmp_path))


def test_a_fresh_run_empties_the_server_log_and_a_resumed_one_marks_where_it_goes_on(tmp_path):
    log = tmp_path / "specbench-server.log"
    log.write_text("the last run's server\n")
    assert start_server_log(log, 0, "edgespec bench specbench OUT --fresh") == log and not log.exists()
    log.write_text("first part\n")
    start_server_log(log, 12, "edgespec bench specbench OUT")
    first, marker = log.read_text().splitlines()
    assert first == "first part"
    assert re.fullmatch(r"--- resumed \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ with 12 generations done: "
                        r"edgespec bench specbench OUT", marker)
