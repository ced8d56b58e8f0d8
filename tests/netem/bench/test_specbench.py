"""`edgespec bench specbench` on tiny models: Spec-Bench's answer files, both turns of MT-Bench, greedy
answers equal to the plain API's, and the report's table."""
from __future__ import annotations

import json
import os

import pytest

from edgespec.netem.bench.experiments import BenchConfig, run
from edgespec.netem.bench.report import markers, splice_readme, write_report
from edgespec.netem.bench.specbench import model_id
from edgespec.netem.bench.specbench_format import (MT_BENCH, SpecBenchFormatError, accept_lengths,
                                                   load_questions, read_answers, select_categories, speed_figures)


def test_the_shipped_questions_are_spec_bench():
    questions = load_questions()
    assert len(questions) == 480
    counts = {}
    for q in questions:
        counts[q.category] = counts.get(q.category, 0) + 1
        assert len(q.turns) == (2 if q.category in ("writing", "roleplay", "reasoning", "math", "coding",
                                                      "extraction", "stem", "humanities") else 1)
    assert len(counts) == 13 and counts["translation"] == counts["rag"] == 80 and counts["coding"] == 10
    firsts = load_questions(per_category=2)
    assert len(firsts) == 26 and [q.question_id for q in firsts[:2]] == [81, 82]


def test_categories_pick_the_questions_and_a_misspelt_one_is_refused():
    mt_bench = load_questions(categories=("mt_bench",))
    assert len(mt_bench) == 80 and {q.category for q in mt_bench} == set(MT_BENCH)
    two = load_questions(per_category=2, categories=("qa", "writing"))
    assert [q.category for q in two] == ["writing", "writing", "qa", "qa"]  # file order, not the order given
    assert select_categories(["MT-Bench", "writing", "rag"]) == (*MT_BENCH, "rag")
    with pytest.raises(SpecBenchFormatError, match=r"no questions of category summarisation; it has .*summarization"):
        load_questions(categories=("summarisation",))


def test_a_question_file_of_its_own_is_read_and_its_categories_checked(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [f"q{i}"]}) + "\n"
                            for i in (7, 8, 9)), encoding="utf-8")
    assert [q.question_id for q in load_questions(path, per_category=2)] == [7, 8]
    assert load_questions(path, categories=("qa",))[2].turns == ("q9",)
    with pytest.raises(SpecBenchFormatError, match=r"no questions of categories coding, .*, writing; it has qa"):
        load_questions(path, categories=("mt_bench",))


def test_accept_lengths_are_tokens_per_target_call():
    assert accept_lengths(["bonus", "accepted", "accepted", "bonus", "bonus"]) == [1, 3, 1]
    assert accept_lengths(["accepted", "bonus", "accepted"]) == [2, 1]  # the last call's output was cut
    assert accept_lengths([]) == []


def test_a_malformed_answer_file_names_the_line_and_field(tmp_path):
    path = tmp_path / "a.jsonl"
    good = {"question_id": 1, "category": "qa", "model_id": "m", "choices": [
        {"index": 0, "turns": ["x"], "new_tokens": [3], "wall_time": [0.5], "accept_lengths": [1, 2],
         "decoding_steps": [2]}]}
    path.write_text(json.dumps(good) + "\n")
    (answer,) = read_answers(path)
    assert answer.turns == ["x"] and answer.accept_lengths == [1, 2]
    bad = dict(good, choices=[dict(good["choices"][0], wall_time="0.5")])
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(SpecBenchFormatError, match=r"a.jsonl:2: 'wall_time' should be list"):
        read_answers(path)


@pytest.fixture
def one_thread_servers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _speed_py_reads(path):
    """What Spec-Bench's evaluation/speed.py and equal.py take from each line, read the way they read it."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        choice = obj["choices"][0]
        tokens, times = sum(choice["new_tokens"]), sum(choice["wall_time"])
        out.append((obj["question_id"], obj["category"], str(choice["turns"]), tokens / times,
                    list(choice["accept_lengths"])))
    return out


TREES = "independent@pipelined"  # the drafter's own tree every step


@pytest.mark.slow
def test_a_tiny_run_writes_spec_bench_answer_files(tmp_path, tiny_model_dir, one_thread_servers):
    # one question of four categories: two MT-Bench ones (two turns) and two single-turn tasks
    out = tmp_path / "run"
    # the independent drafter runs the target's own weights: every draft token is accepted, so a target call
    # commits several tokens and accept_lengths says so. Its own tree shape every step (@pipelined): the default
    # loop may send plain steps that decode ahead, which Spec-Bench counts one token per target forward
    config = BenchConfig("specbench", out, model=str(tiny_model_dir), drafter_model=str(tiny_model_dir),
                         drafters=("ngram", TREES), profiles=("5g",),
                         categories=("writing", "coding", "translation", "rag"),
                         per_category=1, max_new_tokens=10, progress=False)
    run(config)

    rows = [json.loads(line) for line in (out / "specbench.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 3  # 4 questions, the plain API and 2 drafters
    if len(os.sched_getaffinity(0)) >= 2:  # the default: server and client on disjoint cores, recorded
        cpus = rows[0]["env"]["cpus"]
        assert cpus["pinned"] and not set(cpus["server"].split(",")) & set(cpus["client"].split(","))

    files = {system: out / "specbench" / "5g" / f"{model_id(str(tiny_model_dir), system, '5g')}.jsonl"
             for system in ("plain-api", "ngram", TREES)}
    base = read_answers(files["plain-api"])
    assert [a.category for a in base] == ["writing", "coding", "translation", "rag"]  # by question id
    for a in base:
        assert len(a.turns) == len(a.new_tokens) == len(a.wall_time) == (2 if a.category in ("writing", "coding")
                                                                          else 1)
        assert all(t > 0 for t in a.wall_time) and a.accept_lengths == [1] * sum(a.new_tokens)
    for system in ("ngram", TREES):
        answers = read_answers(files[system])
        assert [a.question_id for a in answers] == [a.question_id for a in base]
        for mine, theirs in zip(answers, base):
            # greedy: the client's answers are the target's own, turn by turn, token counts too
            assert mine.turns == theirs.turns and mine.new_tokens == theirs.new_tokens
            assert sum(mine.accept_lengths) == sum(mine.new_tokens)
            assert len(mine.accept_lengths) == sum(mine.decoding_steps) < sum(mine.new_tokens) + len(mine.turns)
            assert mine.model_id.endswith(f"-{system}-5g")
        # equal.py compares str(turns) line by line; speed.py divides summed tokens by summed time
        reads, base_reads = _speed_py_reads(files[system]), _speed_py_reads(files["plain-api"])
        assert [r[2] for r in reads] == [r[2] for r in base_reads]
        assert all(r[3] > 0 and r[4] for r in reads)
        overall = speed_figures(answers, base, "overall")
        assert overall.equal == overall.compared == 4 and overall.mean_accepted_tokens >= 1
        if system == TREES:
            assert overall.mean_accepted_tokens > 2

    # turn 2 was asked with turn 1's question and the system's own turn-1 answer
    writing = next(r for r in rows if r["category"] == "writing" and r["system"] == TREES)
    assert writing["turn_metrics"][1]["prompt_tokens"] > writing["turn_metrics"][0]["prompt_tokens"] + \
        writing["new_tokens"][0] - 2

    report = write_report(out).read_text()
    assert "## Spec-Bench" in report and "Profile `5g`" in report
    overall_line = next(line for line in report.splitlines() if line.startswith("| **overall** |"))
    assert overall_line.count("| 4/4 |") == 2  # both drafters' answers equal the plain API's
    assert "| translation | 1 |" in report and "| **mt bench** | 2 |" in report
    assert "`num_drafts`" in report and "`acceptance_length`" in report  # the client's metrics, field by field
    assert "server on CPU" in report or len(os.sched_getaffinity(0)) < 2

    readme = tmp_path / "README.md"
    begin, end = markers("edgespec-specbench")
    readme.write_text(f"# x\n{begin}\nplaceholder\n{end}\n")
    splice_readme(out / "report.md", readme, "edgespec-specbench")
    assert "placeholder" not in readme.read_text() and "### Spec-Bench" in readme.read_text()


def test_the_command_line_reaches_the_run_settings(tmp_path, monkeypatch):
    """`edgespec bench specbench` hands its flags (and the CPU split) to the run; bad ones are refused."""
    from edgespec.netem.bench import experiments
    from edgespec.cli import main

    seen = {}

    def fake_run(config):  # the run itself is the slow test above; here only what reaches it
        seen["config"] = config
        raise SystemExit(0)

    monkeypatch.setattr(experiments, "run", fake_run)
    with pytest.raises(SystemExit):
        main(["bench", "specbench", str(tmp_path), "--limit", "2", "--profile", "4g", "--drafters", "ngram",
              "--max-new-tokens", "32", "--server-cpus", "1", "--client-cpus", "0"])
    c = seen["config"]
    assert (c.experiment, c.per_category, c.profiles, c.drafters, c.max_new_tokens) == ("specbench", 2, ("4g",),
                                                                                       ("ngram",), 32)
    assert (c.server_cpus, c.client_cpus, c.pin) == ("1", "0", True)
    assert c.command.startswith("edgespec bench specbench")
    with pytest.raises(SystemExit):
        main(["bench", "specbench", str(tmp_path), "--max-new-tokens", "8", "--no-pin"])
    assert seen["config"].per_category is None and seen["config"].max_new_tokens == 8 and not seen["config"].pin
    assert seen["config"].categories == ()
    with pytest.raises(SystemExit):
        main(["bench", "specbench", str(tmp_path), "--categories", "mt_bench,qa", "--limit", "1"])
    assert seen["config"].categories == ("mt_bench", "qa")
    with pytest.raises(SystemExit) as refused:
        main(["bench", "specbench", str(tmp_path), "--limit", "0"])
    assert refused.value.code == 2
