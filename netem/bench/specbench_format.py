"""Spec-Bench's questions and answer files, and the figures its evaluation reads from them.

Spec-Bench (Xia et al., Findings of ACL 2024; github.com/hemingkx/Spec-Bench) scores a method from
two answer files, the method's and a plain-decoding baseline's, one JSON line per question:

    {"question_id", "category", "answer_id", "model_id", "tstamp",
     "choices": [{"index": 0, "turns": [text per turn], "decoding_steps": [target calls per turn],
                  "new_tokens": [per turn], "wall_time": [seconds per turn],
                  "accept_lengths": [tokens committed per target call, over all turns]}]}

Its ``evaluation/speed.py`` reads ``category`` and the first choice's ``new_tokens``, ``wall_time``,
``accept_lengths`` (and the baseline's ``turns``, which it tokenizes again); ``evaluation/equal.py``
compares the two files' ``turns`` line by line, so both files list the questions in the same order
(by question id, as Spec-Bench's own runs leave them). The questions (480: 80 MT-Bench questions in 8
categories with two turns each, and 80 each of translation, summarization, qa, math_reasoning and rag)
ship in ``data/spec_bench/`` beside this module, unchanged, with their licence.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from edgespec.shared.errors import EdgespecError

QUESTIONS = Path(__file__).parent / "data" / "spec_bench" / "question.jsonl"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = ("translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's other five tasks


class SpecBenchFormatError(EdgespecError, ValueError):
    """A question or answer file that is not in Spec-Bench's format."""


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str  # one of MT_BENCH or TASKS
    turns: tuple[str, ...]  # the user's turns (two for MT-Bench, one for the rest)


def load_questions(path: Path = QUESTIONS, per_category: int | None = None,
                   categories: Sequence[str] = ()) -> list[Question]:
    """Spec-Bench's questions in file order; with `per_category`, the first that many of each category; with
    `categories`, only those (``mt_bench`` stands for MT-Bench's eight). A category the file lacks is an error,
    so that a misspelt name does not run an empty benchmark."""
    wanted = set(select_categories(categories)) if categories else None
    out, seen, present = [], Counter(), set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
                question = Question(int(q["question_id"]), str(q["category"]), tuple(str(t) for t in q["turns"]))
            except (ValueError, KeyError, TypeError) as err:
                raise SpecBenchFormatError(f"{path}:{number}: not a Spec-Bench question "
                                           f"(question_id, category, turns): {err}") from None
            if not question.turns:
                raise SpecBenchFormatError(f"{path}:{number}: question {question.question_id} has no turns")
            present.add(question.category)
            if wanted is not None and question.category not in wanted:
                continue
            if per_category is None or seen[question.category] < per_category:
                seen[question.category] += 1
                out.append(question)
    if wanted is not None and wanted - present:
        missing = sorted(wanted - present)
        raise SpecBenchFormatError(f"{path} has no questions of categor{'y' if len(missing) == 1 else 'ies'} "
                                   f"{', '.join(missing)}; it has {', '.join(sorted(present))} "
                                   f"(and mt_bench for MT-Bench's eight)")
    return out


def select_categories(names: Iterable[str]) -> tuple[str, ...]:
    """Category names with ``mt_bench`` (or ``mt-bench``) expanded to MT-Bench's eight, in the order given."""
    out: list[str] = []
    for name in names:
        for category in (MT_BENCH if name.replace("-", "_").lower() == "mt_bench" else (name,)):
            if category not in out:
                out.append(category)
    return tuple(out)


def accept_lengths(origins: Iterable[str]) -> list[int]:
    """Tokens committed per target decoding step (Spec-Bench's accept_lengths), from the origin of each output
    token in order: every step ends with the target's own (bonus) token after the draft tokens it accepted. A
    plain step that decoded k tokens ahead ran k forwards and gave k bonus tokens: k steps of one token. A
    last group without its bonus token is a step whose output was cut (max tokens, a stop string): it counts
    what was kept."""
    lengths, run = [], 0
    for origin in origins:
        run += 1
        if origin == "bonus":
            lengths.append(run)
            run = 0
    return lengths + ([run] if run else [])


@dataclass
class Answer:
    """One question's answer by one system: a line of a Spec-Bench answer file."""

    question_id: int
    category: str
    model_id: str  # names the system (target, method, profile)
    turns: list[str]  # the answer text of each turn
    new_tokens: list[int]  # tokens generated in each turn
    wall_time: list[float]  # seconds each turn took, request to last token
    accept_lengths: list[int]  # tokens committed per target call, over all turns
    decoding_steps: list[int]  # target calls of each turn

    def to_json(self) -> dict:
        choice = {"index": 0, "turns": self.turns, "decoding_steps": self.decoding_steps,
                  "new_tokens": self.new_tokens, "wall_time": self.wall_time, "accept_lengths": self.accept_lengths}
        return {"question_id": self.question_id, "category": self.category, "answer_id": uuid.uuid4().hex,
                "model_id": self.model_id, "choices": [choice], "tstamp": time.time()}


def write_answers(path: Path, answers: Sequence[Answer]) -> Path:
    """An answer file: one line per question, by question id (the last answer of an id wins)."""
    by_id = {a.question_id: a for a in answers}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for qid in sorted(by_id):
            f.write(json.dumps(by_id[qid].to_json()) + "\n")
    return path


def _field(obj: dict, key: str, kind: type, where: str):
    value = obj.get(key)
    items = value if isinstance(value, list) else [value]
    ok = (isinstance(value, list) if kind is list else isinstance(value, kind)) and all(
        not isinstance(x, bool) for x in items)
    if not ok:
        raise SpecBenchFormatError(f"{where}: {key!r} should be {kind.__name__}, got {value!r:.80}")
    return value


def read_answers(path: Path) -> list[Answer]:
    """An answer file read the way Spec-Bench's speed.py and equal.py read it: every field they use must
    be there with its type, or the error names the line and the field."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            obj = json.loads(line)
            choices = _field(obj, "choices", list, where)
            if not choices or not isinstance(choices[0], dict):
                raise SpecBenchFormatError(f"{where}: 'choices' needs one choice")
            c = choices[0]
            lists = {k: _field(c, k, list, where) for k in
                     ("turns", "new_tokens", "wall_time", "accept_lengths", "decoding_steps")}
            for key, kind in (("turns", str), ("new_tokens", int), ("wall_time", (int, float)),
                              ("accept_lengths", int), ("decoding_steps", int)):
                if not all(isinstance(x, kind) and not isinstance(x, bool) for x in lists[key]):
                    raise SpecBenchFormatError(f"{where}: every item of {key!r} should be a number"
                                               if key != "turns" else f"{where}: every turn should be text")
            turns = len(lists["turns"])
            if len(lists["new_tokens"]) != turns or len(lists["wall_time"]) != turns:
                raise SpecBenchFormatError(f"{where}: 'new_tokens' and 'wall_time' need one item per turn")
            out.append(Answer(_field(obj, "question_id", int, where), _field(obj, "category", str, where),
                              _field(obj, "model_id", str, where), **lists))
    return out


@dataclass(frozen=True)
class SpeedFigures:
    """What Spec-Bench's speed.py reports for one task, and equal.py's verdict, from two answer sets."""

    questions: int
    mean_accepted_tokens: float | None  # mean of every accept_lengths item (None: no answers)
    tokens_per_s: float  # mean over questions of (new tokens / wall time), turns summed
    baseline_tokens_per_s: float
    speedup: float | None  # tokens_per_s / baseline_tokens_per_s
    equal: int  # questions whose turns are the baseline's, text for text
    compared: int  # questions the baseline answered too


def in_task(category: str, task: str) -> bool:
    """speed.py's groups: a category, "mt_bench" (its 8 categories) or "overall" (everything)."""
    return task == "overall" or (task == "mt_bench" and category in MT_BENCH) or category == task


def _mean_speed(answers: Sequence[Answer]) -> float:
    speeds = [sum(a.new_tokens) / sum(a.wall_time) for a in answers if sum(a.wall_time) > 0]
    return sum(speeds) / len(speeds) if speeds else 0.0


def speed_figures(answers: Sequence[Answer], baseline: Sequence[Answer], task: str) -> SpeedFigures:
    """speed.py's figures for `task`, with one difference: the baseline's tokens are its recorded
    new_tokens (speed.py counts them again by tokenizing its text, less one token for a BOS that
    Qwen's tokenizer does not add)."""
    mine = [a for a in answers if in_task(a.category, task)]
    base = [a for a in baseline if in_task(a.category, task)]
    lengths = [n for a in mine for n in a.accept_lengths]
    speed, base_speed = _mean_speed(mine), _mean_speed(base)
    base_turns = {a.question_id: a.turns for a in base}
    compared = [a for a in mine if a.question_id in base_turns]
    return SpeedFigures(len(mine), sum(lengths) / len(lengths) if lengths else None, speed, base_speed,
                        speed / base_speed if base_speed else None,
                        sum(a.turns == base_turns[a.question_id] for a in compared), len(compared))
