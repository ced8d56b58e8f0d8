"""`python -m edgespec.netem.bench.multi_turn` end to end on the tiny target: both cache settings, a server
process each, through the 5g relay; turn two's answers agree and the cache's run reports cached tokens."""
import json

import pytest

from edgespec.netem.bench.multi_turn import main, mt_bench_questions


def test_the_first_questions_are_mt_bench_ones_with_two_turns(tmp_path):
    rows = [{"question_id": 1, "category": "translation", "turns": ["a"]},
            {"question_id": 81, "category": "writing", "turns": ["x", "y"]},
            {"question_id": 82, "category": "coding", "turns": ["z", "w"]}]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [q["question_id"] for q in mt_bench_questions(path, 5)] == [81, 82]
    with pytest.raises(SystemExit, match="no Spec-Bench"):
        mt_bench_questions(tmp_path / "missing.jsonl", 1)


@pytest.mark.slow
def test_one_question_through_the_relay_with_and_without_the_cache(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "turns.jsonl"
    assert main(["--model", str(tiny_model_dir), "--systems", "plain", "--questions", "1", "--turn1-tokens", "8",
                 "--turn2-tokens", "2", "--server-threads", "1", "--out", str(out)]) == 0
    turns = [json.loads(line) for line in out.read_text().splitlines()]
    second = {t["cache"]: t for t in turns if t["turn"] == 2}
    assert second["off"]["cached_tokens"] == 0 and second["on"]["cached_tokens"] > 0
    assert second["off"]["text"] == second["on"]["text"]
    assert "equal with and without it: 1/1" in capsys.readouterr().out
