"""`edgespec bench specbench`: Spec-Bench's questions through the client and through the plain API.

Each question is asked of every system under each network profile, one after the other (the baseline
first), over the same relayed links:
- `plain-api`: the baseline, the target alone, streamed by the server's completion endpoint;
- one system per drafter: the edgespec client, drafting against the server.
A question's turns are one conversation in the target's chat template: turn 2 carries turn 1's question
and the system's own turn-1 answer, as Spec-Bench builds it. Greedy decoding, so each drafter's answers
should be the baseline's word for word.

Results: one JSON line per (question, profile, system) in OUT/specbench.jsonl (every turn's text, token
count, time, tokens per target call and the client's metrics), and Spec-Bench answer files written from
it, OUT/specbench/PROFILE/MODEL_ID.jsonl, which Spec-Bench's own evaluation/speed.py and equal.py read.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from .loopback import relayed
from .records import JsonLines, cell, markdown_table
from .specbench_format import (MT_BENCH, QUESTIONS, TASKS, Answer, Question, accept_lengths, load_questions,
                               speed_figures, write_answers)
from .systems import ProgressBar, drafter_client, plain_api

BASELINE = "plain-api"


@dataclass
class TurnAnswer:
    """One turn of one system's answer."""

    text: str  # the answer as Spec-Bench keeps it: special tokens dropped, whitespace stripped
    new_tokens: int
    wall_s: float  # request to last token, the link included
    accept_lengths: list[int]  # tokens committed per target decoding step (specbench_format.accept_lengths)
    finish_reason: str
    metrics: dict  # the client's metrics of the turn (every field), or the plain API's figures


def model_id(model: str, system: str, profile: str) -> str:
    """The answer file's model_id (and file name): the target, the system and the profile."""
    return f"{Path(model).name}-{system}-{profile}"


def _client_turn(client, ids: list[int], max_new_tokens: int) -> TurnAnswer:
    from edgespec.client import GenerationConfig

    start = time.perf_counter()
    result = client.generate(ids, GenerationConfig(max_new_tokens=max_new_tokens))
    wall = time.perf_counter() - start
    return TurnAnswer(client.decode(result.token_ids).strip(), result.metrics.new_tokens, wall,
                      accept_lengths(o.value for o in result.origins), result.finish_reason,
                      result.metrics.to_dict())


def _baseline_turn(http_address: str, relay, ids: list[int], config) -> TurnAnswer:
    plain = plain_api(http_address, ids, config, relay=relay)
    text = plain.pop("text")
    n = plain["new_tokens"]
    # Plain decoding commits one token per target forward, as Spec-Bench's own baseline records it.
    return TurnAnswer(text.strip(), n, plain["wall_s"], [1] * n, "", plain)


def _ask(question: Question, tokenizer, answer_turn) -> list[TurnAnswer]:
    """Every turn of a question as one conversation: each turn's prompt holds the earlier turns'
    questions and this system's own answers to them."""
    from edgespec.client import chat_prompt_ids

    messages, answers = [], []
    for turn in question.turns:
        messages.append({"role": "user", "content": turn})
        answer = answer_turn(chat_prompt_ids(tokenizer, messages))
        messages.append({"role": "assistant", "content": answer.text})
        answers.append(answer)
    return answers


def _record(question: Question, profile: str, system: str, model: str, turns: list[TurnAnswer]) -> dict:
    return {"experiment": "specbench", "set": "specbench", "prompt_id": question.question_id,
            "category": question.category, "profile": profile, "system": system,
            "model_id": model_id(model, system, profile), "turns": [t.text for t in turns],
            "new_tokens": [t.new_tokens for t in turns], "wall_time": [round(t.wall_s, 6) for t in turns],
            "accept_lengths": [n for t in turns for n in t.accept_lengths],
            "decoding_steps": [len(t.accept_lengths) for t in turns],
            "finish_reasons": [t.finish_reason for t in turns], "turn_metrics": [t.metrics for t in turns]}


def questions_of(config) -> list[Question]:
    """The questions a run's settings (BenchConfig's questions, per_category, categories) ask."""
    return load_questions(Path(config.questions) if config.questions else QUESTIONS, config.per_category,
                          config.categories)


def run_specbench(config, server, sink: JsonLines, links: list[tuple[str, str]] | None = None) -> None:
    """Every question of the run, per link: the baseline, then each drafter (experiments.run calls it). `links`:
    (the profile the records name, the local relay's profile) each; by default each of config.profiles."""
    from edgespec.client import load_tokenizer

    questions = questions_of(config)
    tokenizer = load_tokenizer(config.model)  # the target's own chat template
    links = links or [(p, p) for p in config.profiles]
    bar = ProgressBar(len(questions) * len(links) * (len(config.drafters) + 1), config.progress, "specbench")
    drafters: dict = {}  # one loaded drafter per name, shared by the profiles
    for profile, relay_profile in links:
        with relayed(server.grpc_address, relay_profile, config.seed) as (grpc_address, _), \
                relayed(server.http_address, relay_profile, config.seed + 1) as (http_address, http_relay), \
                contextlib.ExitStack() as stack:
            clients = {}
            for name in config.drafters:
                clients[name] = stack.enter_context(drafter_client(grpc_address, name, config, tokenizer=tokenizer,
                                                                   instance=drafters.get(name)))
                drafters[name] = clients[name].drafter
            for q in questions:
                for system in (BASELINE, *config.drafters):
                    key = ("specbench", q.question_id, profile, system, None)
                    if key not in sink.done:
                        if system == BASELINE:
                            turn = lambda ids: _baseline_turn(http_address, http_relay, ids, config)  # noqa: E731
                        else:
                            turn = lambda ids, c=clients[system]: _client_turn(c, ids, config.max_new_tokens)  # noqa: E731
                        sink.write(_record(q, profile, system, config.model, _ask(q, tokenizer, turn)))
                    bar.step(f"{profile} {system} {q.category}")
    bar.close()


def answers_by_system(rows: list[dict]) -> dict[tuple[str, str], list[Answer]]:
    """(profile, system) -> its answers, as Spec-Bench's answer files hold them (a later record of a
    question replaces an earlier one)."""
    out: dict[tuple[str, str], dict[int, Answer]] = defaultdict(dict)
    for r in rows:
        out[(r["profile"], r["system"])][r["prompt_id"]] = Answer(
            r["prompt_id"], r["category"], r["model_id"], r["turns"], r["new_tokens"], r["wall_time"],
            r["accept_lengths"], r["decoding_steps"])
    return {k: [v[q] for q in sorted(v)] for k, v in out.items()}


def write_answer_files(out: Path, rows: list[dict]) -> list[Path]:
    """OUT/specbench/PROFILE/MODEL_ID.jsonl for every system: Spec-Bench's answer files."""
    return [write_answers(out / "specbench" / profile / f"{answers[0].model_id}.jsonl", answers)
            for (profile, _), answers in answers_by_system(rows).items()]


def _tasks(rows: list[dict]) -> list[str]:
    """The table's rows: each category present (MT-Bench's first, Spec-Bench's order), then MT-Bench's
    eight together, then everything."""
    present = {r["category"] for r in rows}
    order = [c for c in (*MT_BENCH, *TASKS) if c in present] + sorted(present - set(MT_BENCH) - set(TASKS))
    return order + (["mt_bench"] if present & set(MT_BENCH) else []) + ["overall"]


def speed_table(rows: list[dict]) -> str:
    """Per profile and task: the baseline's tokens/s, then each drafter's mean accepted tokens, tokens/s,
    speed-up and answers equal to the baseline's."""
    answers = answers_by_system(rows)
    parts = []
    for profile in dict.fromkeys(r["profile"] for r in rows):
        base = answers.get((profile, BASELINE), [])
        drafters = [s for (p, s) in answers if p == profile and s != BASELINE]
        header = ["task", "questions", "plain API tokens/s"]
        for d in drafters:
            header += [f"{d}: mean accepted tokens", f"{d}: tokens/s", f"{d}: speed-up", f"{d}: = plain API"]
        lines = []
        for task in _tasks([r for r in rows if r["profile"] == profile]):
            line = [f"**{task.replace('_', ' ')}**" if task in ("mt_bench", "overall") else task, None, None]
            for d in drafters:
                f = speed_figures(answers[(profile, d)], base, task)
                line[1], line[2] = f.questions, cell(f.baseline_tokens_per_s)
                line += [cell(f.mean_accepted_tokens), cell(f.tokens_per_s), cell(f.speedup, suffix="x"),
                         f"{f.equal}/{f.compared}"]
            if not drafters:
                f = speed_figures(base, base, task)
                line[1], line[2] = f.questions, cell(f.tokens_per_s)
            lines.append(line)
        parts.append(f"Profile `{profile}`:\n\n" + markdown_table(header, lines))
    return "\n\n".join(parts)


def metrics_table(rows: list[dict]) -> str:
    """Every numeric field of the client's metrics, mean per turn, one column per profile and drafter:
    whatever the client counts shows here without a change to this table."""
    columns = {(r["profile"], r["system"]): [] for r in rows if r["system"] != BASELINE}
    for r in rows:
        if r["system"] != BASELINE:
            columns[(r["profile"], r["system"])] += [{k: v for k, v in m.items() if isinstance(v, (int, float))
                                                      and not isinstance(v, bool)} for m in r["turn_metrics"]]
    if not columns:
        return ""
    fields = list(dict.fromkeys(k for turns in columns.values() for m in turns for k in m))
    lines = []
    for name in fields:
        line = [f"`{name}`"]
        for turns in columns.values():
            values = [m[name] for m in turns if name in m]
            line.append(f"{sum(values) / len(values):.4g}" if values else "–")
        lines.append(line)
    return markdown_table(["client metric (mean per turn)", *(f"{s} ({p})" for p, s in columns)], lines)


def specbench_section(rows: list[dict]) -> str:
    metrics = metrics_table(rows)
    return speed_table(rows) + ("\n\n" + metrics if metrics else "")


def prompts_note(settings: dict, rows: list[dict]) -> str:
    """The report's line on what was asked."""
    per = settings.get("per_category")
    asked = len({r["prompt_id"] for r in rows})
    chosen = settings.get("categories") or ()
    which = f"of {', '.join(chosen)}" if chosen else "of each category"
    return (f"Spec-Bench questions: {'all' if per is None else f'the first {per}'} {which} "
            f"({asked} questions, both turns of MT-Bench's), profiles {', '.join(settings['profiles'])}; "
            f"tokens/s is Spec-Bench's (the mean over questions of new tokens over wall time, turns summed; "
            f"wall time includes the emulated link), speed-up against the plain API in the same run")
