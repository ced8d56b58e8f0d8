"""`edgespec bench drafting` and `edgespec bench tree-sweep` end to end at tiny scale: a random model as both
target and drafter, a real server on loopback, HumanEval's first prompt. Every method's output must equal the
target's own greedy output, and the tables must carry the summed figures."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch

    from edgespec.shared.models.random_model import Shape, save_random_model

    shape = Shape(64, 2, 4, 2, 128, 320, tie_word_embeddings=True, max_positions=2048)
    return str(save_random_model(tmp_path_factory.mktemp("bench") / "m", "tiny", shape, torch.float32, seed=1))


def bench(*argv: str) -> None:
    from edgespec.cli import build_parser

    args = build_parser().parse_args(["bench", *argv])
    assert args.func(args) == 0


def test_drafting_bench_is_lossless_for_every_method_and_sums_the_clients_metrics(model_dir, tmp_path, capsys):
    out = tmp_path / "drafting.json"
    bench("drafting", "--target", model_dir, "--drafter-model", model_dir, "--methods", "target,hf-lookup,ngram,independent",
          "--humaneval", "1", "--mtbench", "1", "--max-tokens", "12", "--out", str(out))
    summary = json.loads(out.read_text())["summary"]
    assert list(summary) == ["target", "hf-lookup", "ngram", "independent"]
    assert all(row["exact"] == "2/2" for row in summary.values())
    runs = json.loads(out.read_text())["runs"]
    mine = [r for r in runs if r["method"] == "independent"]
    drafts = sum(r["metrics"]["num_drafts"] for r in mine)
    assert drafts > 0 and summary["independent"]["draft_ms_per_tree"] > 0
    per_position = [sum(x) for x in zip(*(r["metrics"]["accepted_per_position"] or [0] for r in mine))]
    assert summary["independent"]["accept_at"][:1] == [round(per_position[0] / drafts, 3)]
    assert "| independent |" in capsys.readouterr().out
    # The same run projected against a GPU server: a row per client drafter, tau as the client counted it.
    bench("gpu-projection", str(out), "--profiles", "5g,4g")
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    assert {"ngram", "independent", "plain API, streamed"} <= set(rows) and "target" not in rows
    steps = sum(r["metrics"]["num_verifications"] for r in mine)
    tau = (sum(r["metrics"]["num_accepted_tokens"] for r in mine) + steps) / steps
    assert rows["independent"].split("|")[2].strip() == f"{tau:.2f}"


def test_tree_sweep_prints_a_row_per_shape(model_dir, capsys):
    bench("tree-sweep", "--target", model_dir, "--drafter-model", model_dir, "--shapes", "2x3x6@0.02,1x4x4",
          "--humaneval", "1", "--mtbench", "0", "--max-tokens", "12")
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [r.split(" | ")[:3] for r in rows] == [["| 2", "3", "6"], ["| 1", "4", "4"]]
    assert all(float(r.split(" | ")[5]) >= 1.0 for r in rows)  # tokens per call: at least the bonus token
