"""`edgespec bench capacity`: the oracle drafter gets the acceptance it is asked for through a real server, and
the bench's sessions and plain-API streams share one server, all starting together (tiny float32 target)."""
from __future__ import annotations

import argparse
import random

import pytest
from support.servers import running_server

from edgespec.client.drafters.factory import DrafterOptions
from edgespec.client.edge_client import ClientConfig, EdgespecClient, load_tokenizer
from edgespec.client.loop.generation import GenerationConfig
from edgespec.netem.bench import capacity
from edgespec.netem.bench.oracle_drafter import AcceptHistogram, OracleDrafter, histogram, load_histograms, oracle_tree
from edgespec.netem.bench.loopback import patient_link
from edgespec.shared.tree import ROOT

PROMPT = (104, 105, 32, 116, 101)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with running_server(tiny_model_dir) as handle:
        yield handle


@pytest.fixture(scope="module")
def continuation(server):
    return capacity.greedy_ids(server.http_url.removeprefix("http://"), PROMPT, 40)


def test_an_oracle_tree_holds_the_truth_then_only_wrong_tokens():
    tree = oracle_tree([5, 6, 7, 8], accept=2, nodes=8, depth=4, vocab_size=100)
    assert len(tree) == 8 and tree.tokens[:2] == (5, 6) and tree.parents[:4] == (ROOT, 0, 1, 2)
    truth_at = {0: 5, 1: 6, 2: 7, 3: 8}
    level = {}
    for i, p in enumerate(tree.parents):
        level[i] = 0 if p == ROOT else level[p] + 1
    right = [i for i in range(len(tree)) if tree.tokens[i] == truth_at[level[i]]]
    assert right == [0, 1]  # only the chain's first two nodes carry the target's tokens
    siblings = {}
    for i, p in enumerate(tree.parents):
        siblings.setdefault(p, []).append(tree.tokens[i])
    assert all(len(s) == len(set(s)) for s in siblings.values())  # no repeated sibling
    assert oracle_tree([5], accept=3, nodes=4, depth=4, vocab_size=100).tokens[0] == 5  # truth runs out: clamped


@pytest.mark.parametrize("accept", [0, 2, 5])
def test_the_target_accepts_exactly_what_the_oracle_was_asked(server, tiny_model_dir, continuation, accept):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    drafter = OracleDrafter(PROMPT, continuation, AcceptHistogram.fixed(accept), server.core.target.vocab_size,
                            nodes=8, depth=6)
    client = EdgespecClient(ClientConfig(patient_link(server.address), DrafterOptions("ngram")), tokenizer=tokenizer,
                            drafter=drafter)
    result = client.generate(list(PROMPT), GenerationConfig(max_new_tokens=40, ignore_eos=True))
    client.close()
    assert result.token_ids == list(continuation) and drafter.diverged == 0
    m = result.metrics
    # every tree but the last (cut by the tokens left) was asked `accept`; the target accepted just that
    assert drafter.asked[:-1] == [accept] * (len(drafter.asked) - 1) and drafter.asked[-1] <= accept
    assert m.num_drafts == len(drafter.asked) and m.num_accepted_tokens == sum(drafter.asked)


def test_histograms_draw_their_own_mean_and_bad_names_are_refused():
    shipped = load_histograms()
    assert {"independent-0.5b", "ngram"} <= set(shipped)
    assert shipped["independent-0.5b"].mean() > shipped["ngram"].mean()  # the 0.5B drafts further than n-grams
    rng = random.Random(0)
    h = shipped["independent-0.5b"]
    assert sum(h.draw(rng) for _ in range(20000)) / 20000 == pytest.approx(h.mean(), rel=0.05)
    with pytest.raises(ValueError, match="no accepted-length histogram 'eagle'"):
        histogram("eagle")
    with pytest.raises(ValueError, match="positive total"):
        AcceptHistogram("empty", {})


def test_sessions_and_streams_share_the_server_and_keep_the_text(server, tiny_model_dir):
    args = argparse.Namespace(target=str(tiny_model_dir), humaneval=0, mtbench=2, max_tokens=24, profile="none",
                              accept="fixed2", nodes=6, depth=4, client_processes=1, no_plain=False, rate=1.0,
                              check_with=None, drafter_model=None, budget_s=0.0)
    rows = capacity.measure(server, str(tiny_model_dir), args, [1, 3])
    assert [(r["sessions"], r["system"]) for r in rows] == [(1, "speculative"), (1, "plain-api"),
                                                             (3, "speculative"), (3, "plain-api")]
    for r in rows:
        assert r["tokens"] == 24 * r["sessions"] and r["engine_steps"] > 0 and r["diverged"] == 0
    spec3 = rows[2]
    assert spec3["accepted_per_tree"] == pytest.approx(spec3["asked_per_tree"]) and spec3["tau"] > 2.5
    assert rows[3]["engine_steps"] >= 24  # a stream is one step a token, however the streams batch
    assert all(1.0 <= r["mean_batch"] <= r["sessions"] for r in rows)
    text = capacity.report(rows, rate=1.0)
    assert "capacity at >= 1 tokens/s a session: speculative 3, plain API 3" in text


def test_the_check_with_a_real_drafter_replays_its_acceptance(server, tiny_model_dir):
    args = argparse.Namespace(target=str(tiny_model_dir), humaneval=0, mtbench=2, max_tokens=24, profile="none",
                              accept="fixed2", nodes=6, depth=4, client_processes=1, no_plain=True, rate=1.0,
                              check_with="ngram", drafter_model=None, budget_s=0.0)
    rows = capacity.measure(server, str(tiny_model_dir), args, [2])
    assert [r["system"] for r in rows] == ["ngram", "oracle~ngram", "speculative"]
    real, replay = rows[0], rows[1]
    assert real["tokens"] == replay["tokens"] == 48 and replay["diverged"] == 0
    assert "drafts_by_accepted" not in real
    assert abs(real["accepted_per_tree"] - replay["accepted_per_tree"]) <= 1.0


def test_the_command_writes_its_report_and_plot_and_keeps_its_budget(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "edgespec", "bench", "capacity", "--target", str(tiny_model_dir),
                           "--device", "cpu", "--dtype", "float32", "--sessions", "1,2,64", "--profile", "5g",
                           "--humaneval", "0", "--mtbench", "1", "--max-tokens", "8", "--budget-s", "0.001",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "N=2 and above not started" in done.stderr
    lines = (out / "capacity.jsonl").read_text().splitlines()
    assert len(lines) == 2 and (out / "tokens_per_s.png").stat().st_size > 0
    assert "| 1 | speculative |" in (out / "report.md").read_text()
