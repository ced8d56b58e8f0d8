"""One request's choices: backend tokens in, text pieces and endings out.

Every choice runs the same steps on both APIs:
  1. the backend generates token by token (EOS included when it ends the output);
  2. each token is counted (usage counts every token generated, EOS and the
     token that completes a stop string included) and its logprobs kept;
  3. ``TextStream`` turns the ids into text that never needs taking back, and
     ends the choice at a stop string (the stop itself is not in the text);
  4. the choice ends with why: "stop" (EOS or a stop string) or "length".
Choices run one after another; choice i samples with seed + i, so a request
with a seed is reproducible, and one without draws a fresh seed per choice.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Iterator

from edgespec.shared import defaults
from edgespec.shared.text_stream import TextStream

from .backend import Backend, GeneratedToken, GenerationJob
from .errors import Cancelled
from .requests import Settings

SEED_MODULUS = defaults.SEED_MODULUS  # seeds travel as uint64; a negative OpenAI seed wraps around


@dataclass(frozen=True)
class Plan:
    """A validated request, ready to generate."""

    chat: bool  # chat.completion shapes (else text_completion)
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    settings: Settings


@dataclass
class TextPiece:
    index: int  # the choice
    text: str  # new text ('' when only logprobs are new)
    tokens: list[GeneratedToken]  # the tokens behind it (their logprobs, when asked)


@dataclass
class ChoiceEnd:
    index: int
    finish_reason: str  # "stop" or "length"
    completion_tokens: int
    extra: dict | None  # the backend's additions (edgespec's metrics on the client)
    cached_tokens: int | None = None  # prompt tokens read from the backend's prefix cache (None: not reported)


@dataclass
class Choice:
    """A finished choice, for a whole (non-streamed) answer."""

    index: int
    text: str = ""
    tokens: list[GeneratedToken] = field(default_factory=list)
    finish_reason: str = "length"
    completion_tokens: int = 0
    extra: dict | None = None
    cached_tokens: int | None = None


def jobs(plan: Plan) -> list[GenerationJob]:
    s = plan.settings
    seeds = [defaults.fresh_seed() if s.seed is None else (s.seed + i) % SEED_MODULUS for i in range(s.n)]
    return [GenerationJob(plan.prompt_ids, plan.max_new_tokens, s.sampling, seed, s.stop, s.top_logprobs, s.grammar,
                          s.ignore_eos) for seed in seeds]


def choice_events(backend: Backend, job: GenerationJob, index: int,
                  cancel: threading.Event) -> Iterator[TextPiece | ChoiceEnd]:
    """One choice as it is generated: text pieces, then its end."""
    # vLLM's min_tokens: no stop string or stop id ends the output before it (EOS is masked by the backend)
    min_tokens, stop_ids = job.sampling.min_tokens, set(job.sampling.stop_token_ids)
    text = TextStream(backend.decode, job.stop, min_tokens=min_tokens)
    run = backend.start(job, cancel)
    count, pending, stopped = 0, [], False
    try:
        for token in run:
            if cancel.is_set():
                raise Cancelled()
            count += 1
            pending.append(token)
            delta = text.push(token.id)
            stopped = text.stopped or (token.id in stop_ids and count >= min_tokens)
            if delta or job.top_logprobs is not None:  # with logprobs every token is reported as it comes
                yield TextPiece(index, delta, pending)
                pending = []
            if stopped:
                break
    finally:
        run.close()
    rest = text.finish()
    if rest or pending:
        yield TextPiece(index, rest, pending)
    yield ChoiceEnd(index, "stop" if stopped else run.finish_reason, count, run.extra,
                    getattr(run, "cached_tokens", None))


def events(backend: Backend, plan: Plan, cancel: threading.Event) -> Iterator[TextPiece | ChoiceEnd]:
    """Every choice's events, choice after choice."""
    for index, job in enumerate(jobs(plan)):
        yield from choice_events(backend, job, index, cancel)


def whole(backend: Backend, plan: Plan, cancel: threading.Event) -> list[Choice]:
    """Every choice, finished."""
    choices = [Choice(i) for i in range(plan.settings.n)]
    texts: list[list[str]] = [[] for _ in choices]
    for event in events(backend, plan, cancel):
        choice = choices[event.index]
        if isinstance(event, TextPiece):
            texts[event.index].append(event.text)
            choice.tokens.extend(event.tokens)
        else:
            choice.finish_reason, choice.completion_tokens, choice.extra, choice.cached_tokens = (
                event.finish_reason, event.completion_tokens, event.extra, event.cached_tokens)
    for choice, parts in zip(choices, texts):
        choice.text = "".join(parts)
    return choices
