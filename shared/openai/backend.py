"""What an API side provides to the shared OpenAI layer: a tokenizer and a way to generate.

The server's plain decoder and the client's speculative loop are two
``Backend``s. Everything else (parsing, prompts, stop strings, text, usage,
logprobs, response shapes) is the shared layer's, so both APIs answer alike.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

from edgespec.shared.session_contract import SamplingSettings


@dataclass(frozen=True)
class GenerationJob:
    """One choice to generate."""

    prompt_ids: tuple[int, ...]  # tokenized prompt (chat template applied)
    max_new_tokens: int  # most tokens generated (fits the context)
    sampling: SamplingSettings
    seed: int  # this choice's sampling seed, in [0, 2**64)
    stop: tuple[str, ...]  # stop strings; the backend may use them to end early, the shared layer cuts the text
    top_logprobs: int | None  # None: no logprobs wanted; k: the chosen token's and the k most likely
    grammar: str | None = None  # llguidance grammar the output is constrained to (shared.grammar); None: free
    ignore_eos: bool = False  # keep generating past EOS (vLLM's; for fixed-length benchmarks)


@dataclass(frozen=True)
class GeneratedToken:
    id: int
    logprob: float | None = None  # the chosen token's log-probability under the target (when asked)
    top_logprobs: tuple[tuple[int, float], ...] = ()  # the k most likely (id, log-probability), best first


class TokenRun(Protocol):
    """One choice's tokens, EOS included when it ends the output."""

    finish_reason: str  # "stop" (EOS, stop string) or "length"; read once iteration ended
    extra: dict | None  # what the backend adds to the answer (edgespec's per-generation metrics), if anything
    # A run may also have ``cached_tokens`` (read once iteration ended): prompt tokens whose KV came from a prefix
    # cache, for usage.prompt_tokens_details (vLLM's); a run without it reports no details.

    def __iter__(self) -> Iterator[GeneratedToken]: ...

    def close(self) -> None:
        """No more tokens are needed (a stop string was reached, or the caller left): stop generating."""


class Backend(Protocol):
    name: str  # the model name served
    tokenizer: object  # the target's Hugging Face tokenizer
    vocab_size: int
    max_context_tokens: int  # prompt + completion
    default_chat_max_tokens: int | None  # chat's max_tokens when the request has none; None = the rest of the context

    def decode(self, ids: Sequence[int]) -> str: ...

    def start(self, job: GenerationJob, cancel: threading.Event) -> TokenRun:
        """Begin generating; `cancel` is set when the caller has gone."""

    def count_request(self, endpoint: str) -> None:
        """A request for `endpoint` ("completions" or "chat") was accepted (for metrics)."""
