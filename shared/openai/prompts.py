"""Prompts to token ids, refusing one that cannot fit before paying to tokenize it.

Tokenizing costs time and memory in proportion to the text (a 4 MiB prompt
took seconds and hundreds of MB), so a prompt is measured in characters first:

1. No token decodes to more than ``max_token_chars`` characters (the longest
   entry of the vocabulary, measured once), so a text needs at least
   len / max_token_chars tokens. Tokenizer normalisers may compose characters
   (NFC: up to about 3 to 1), hence the safety factor. Past that: refused
   without tokenizing.
2. Otherwise the first ``PROBE_CHARS_PER_TOKEN`` x context characters are
   tokenized: if they alone overflow the context, the prompt is refused.
3. Otherwise the whole text is tokenized (at most context x max_token_chars x
   the safety factor characters) and counted exactly.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

from .errors import OpenAIError, bad_request

NORMALISER_FACTOR = 4  # characters a normaliser may fold into one (with room to spare)
PROBE_CHARS_PER_TOKEN = 8  # ordinary text runs 3-5 characters a token
PROBE_SLACK_TOKENS = 16  # a prefix may end inside a word: its tokens can exceed the full text's by a few


def context_exceeded(size: str, limit: int, param: str) -> OpenAIError:
    """`size`: how big the prompt is, e.g. "600 tokens"."""
    return bad_request(f"This model's maximum context length is {limit} tokens, and the prompt has {size}, "
                       f"which leaves no room for a completion; shorten the prompt.", param,
                       "context_length_exceeded")


def max_token_chars(tokenizer) -> int:
    """Characters of the longest token (an upper bound on what one token decodes to), cached on the tokenizer."""
    cached = getattr(tokenizer, "_edgespec_max_token_chars", None)
    if cached is None:
        cached = max(map(len, tokenizer.get_vocab()), default=1)
        with contextlib.suppress(AttributeError):  # a tokenizer that takes no new attributes: measure again next time
            tokenizer._edgespec_max_token_chars = cached
    return max(1, cached)


def check_chars(chars: int, tokenizer, limit: int, param: str) -> None:
    """Refuse text of `chars` characters that needs more tokens than the context holds, without tokenizing."""
    at_least = chars // (max_token_chars(tokenizer) * NORMALISER_FACTOR)
    if at_least >= limit:
        raise context_exceeded(f"at least {at_least} tokens ({chars} characters)", limit, param)


def encode_text(text: str, tokenizer, limit: int, param: str) -> list[int]:
    """Token ids of text (no special tokens added), or a 400 when they cannot fit in `limit` tokens."""
    check_chars(len(text), tokenizer, limit, param)
    probe = PROBE_CHARS_PER_TOKEN * limit
    if len(text) > probe:
        head = len(_encode(tokenizer, text[:probe]))
        if head >= limit + PROBE_SLACK_TOKENS:
            raise context_exceeded(f"{head} tokens in its first {probe} characters alone", limit, param)
    ids = _encode(tokenizer, text)
    if not ids:
        raise bad_request("the prompt is empty once tokenized", param)
    if len(ids) >= limit:
        raise context_exceeded(f"{len(ids)} tokens", limit, param)
    return ids


def check_ids(ids: Sequence[int], vocab_size: int, limit: int, param: str) -> list[int]:
    """Token ids given by the caller, checked against the vocabulary and the context."""
    if len(ids) >= limit:
        raise context_exceeded(f"{len(ids)} tokens", limit, param)
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise bad_request(f"token id {bad} is outside the vocabulary [0, {vocab_size})", param, "invalid_value")
    return list(ids)


def chat_text(tokenizer, messages: list[dict], limit: int, tools: Sequence[dict] | None = None,
              add_generation_prompt: bool = True, template_kwargs: dict | None = None) -> str:
    """The chat template applied to messages (and the tools, which the template renders), ready for the
    assistant's turn unless `add_generation_prompt` is False (a 400 if the template refuses).
    `template_kwargs` (vLLM's chat_template_kwargs) are more template variables, and win over these."""
    check_chars(sum(len(m["content"]) for m in messages), tokenizer, limit, "messages")
    variables = {"tools": list(tools) if tools else None, "add_generation_prompt": add_generation_prompt,
                 **(template_kwargs or {})}
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **variables)
    except Exception as err:  # noqa: BLE001 - jinja's TemplateError or a template's raise_exception: the caller's
        raise bad_request(f"the model's chat template refused the messages: {err}", "messages") from None


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
