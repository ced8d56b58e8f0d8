"""Response bodies in OpenAI's shapes: whole answers, stream chunks, usage, logprobs.

Streams end each choice with a chunk that carries its finish_reason; the last
choice's also carries ``usage`` (an addition OpenAI clients ignore, which lets
a plain SSE reader count tokens). With ``stream_options.include_usage`` a last
chunk with no choices and the usage follows, as OpenAI sends it.
A backend's extra (the client's per-generation metrics) travels in an
``edgespec`` field: on a whole answer one object for n=1 and a list for n>1,
on a stream with each choice's last chunk.
"""
from __future__ import annotations

import functools
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

from .backend import GeneratedToken
from .generate import Choice, ChoiceEnd, TextPiece
from .tool_calls import parse_tool_calls

LOGPROB_FLOOR = -9999.0  # as vLLM: -inf (a masked token) is no JSON number


@dataclass(frozen=True)
class Shape:
    """What every body of one answer shares."""

    chat: bool
    id: str
    created: int
    model: str
    parse_tools: bool = False  # chat with tools: tool calls are parsed out of each choice's text

    @classmethod
    def new(cls, chat: bool, model: str, parse_tools: bool = False) -> "Shape":
        return cls(chat, ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()), model,
                   parse_tools)

    def head(self, chunk: bool) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """A byte-level BPE vocabulary's characters -> the bytes they stand for: GPT-2's map, inverted once."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {c: b for b, c in bytes_to_unicode().items()}


class TokenTexts:
    """A token's text and exact bytes, for logprobs (a byte token may be half a character)."""

    def __init__(self, tokenizer, as_ids: bool = False):
        self.tokenizer = tokenizer
        self.as_ids = as_ids  # vLLM's return_tokens_as_token_ids: "token_id:{id}" in place of the token's text
        backend = getattr(tokenizer, "backend_tokenizer", None)
        byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"
        self.byte_of_char = _byte_of_char() if byte_level else {}
        self.special = set(getattr(tokenizer, "all_special_ids", ()))
        self.piece = functools.cache(self._piece)  # one answer asks for the same tokens again and again

    def _piece(self, token: int) -> tuple[str, list[int]]:
        if self.as_ids:
            text = f"token_id:{token}"
            return text, list(text.encode("ascii"))
        name = self.tokenizer.convert_ids_to_tokens(token)
        if isinstance(name, str) and self.byte_of_char and token not in self.special \
                and all(c in self.byte_of_char for c in name):
            raw = bytes(self.byte_of_char[c] for c in name)
            return raw.decode("utf-8", errors="replace"), list(raw)
        text = self.tokenizer.decode([token]) if token not in self.special else str(name)
        return text, list(text.encode("utf-8"))


def _lp(value: float | None) -> float | None:
    """None stays null: a token the target never scored (drafted offline, the link never came back)."""
    if value is None:
        return None
    return max(LOGPROB_FLOOR, float(value)) if value == value else LOGPROB_FLOOR


def chat_logprobs(tokens: list[GeneratedToken], texts: TokenTexts) -> dict[str, Any]:
    def entry(token: int, logprob: float | None) -> dict[str, Any]:
        text, raw = texts.piece(token)
        return {"token": text, "logprob": _lp(logprob), "bytes": raw}

    return {"content": [{**entry(t.id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top_logprobs]}
                        for t in tokens], "refusal": None}


def completion_logprobs(tokens: list[GeneratedToken], texts: TokenTexts, offset: int) -> dict[str, Any]:
    """The legacy shape; text_offset counts from `offset`, the characters of this choice already sent."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for t in tokens:
        text, _ = texts.piece(t.id)
        out["tokens"].append(text)
        out["token_logprobs"].append(_lp(t.logprob))
        out["top_logprobs"].append({texts.piece(i)[0]: _lp(lp) for i, lp in t.top_logprobs})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """cached_tokens: the prompt tokens a prefix cache served (the first choice's; later ones reuse its prompt),
    as vLLM reports them in prompt_tokens_details; None leaves the details out."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                           "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return out


def whole_body(shape: Shape, choices: list[Choice], prompt_tokens: int, texts: TokenTexts | None) -> dict[str, Any]:
    """The answer of a non-streamed request; `texts` when logprobs were asked for."""
    out = []
    for c in choices:
        finish_reason = c.finish_reason
        if shape.chat:
            content, calls = parse_tool_calls(c.text) if shape.parse_tools else (c.text, [])
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:  # parsed out of the text: its content is what is left (None when nothing is)
                message["tool_calls"], finish_reason = calls, "tool_calls"
            choice: dict[str, Any] = {"index": c.index, "message": message,
                                      "logprobs": chat_logprobs(c.tokens, texts) if texts else None}
        else:
            choice = {"index": c.index, "text": c.text,
                      "logprobs": completion_logprobs(c.tokens, texts, 0) if texts else None}
        choice["finish_reason"] = finish_reason
        out.append(choice)
    body = {**shape.head(chunk=False), "choices": out,
            "usage": usage(prompt_tokens, sum(c.completion_tokens for c in choices), choices[0].cached_tokens)}
    extras = [c.extra for c in choices]
    if any(e is not None for e in extras):
        body["edgespec"] = extras[0] if len(extras) == 1 else extras
    return body


def _chunk(shape: Shape, index: int, delta: dict[str, Any] | str, finish_reason: str | None = None,
           logprobs: dict | None = None) -> dict[str, Any]:
    return {**shape.head(chunk=True), "choices": [{"index": index, "delta" if shape.chat else "text": delta,
                                                   "logprobs": logprobs, "finish_reason": finish_reason}]}


def stream_chunks(shape: Shape, events: Iterator[TextPiece | ChoiceEnd], prompt_tokens: int, n: int,
                  texts: TokenTexts | None, include_usage: bool) -> Iterator[dict[str, Any]]:
    """Chunks of a streamed answer, as the events come. With tools, a choice's text is held until it ends and
    then sent as one delta: its content, or its tool calls (whose text is not known to be a call until its
    end)."""
    if shape.parse_tools:
        events = _held(events)
    started: set[int] = set()
    sent_chars = [0] * n  # per choice, for the legacy text_offset
    completion_tokens = 0
    cached_tokens: int | None = None
    for event in events:
        if shape.chat and event.index not in started:
            started.add(event.index)
            yield _chunk(shape, event.index, {"role": "assistant", "content": ""})
        if isinstance(event, TextPiece):
            logprobs = None
            if texts is not None:
                logprobs = (chat_logprobs(event.tokens, texts) if shape.chat
                            else completion_logprobs(event.tokens, texts, sent_chars[event.index]))
            sent_chars[event.index] += len(event.text)
            yield _chunk(shape, event.index, {"content": event.text} if shape.chat else event.text,
                         logprobs=logprobs)
            continue
        completion_tokens += event.completion_tokens
        if event.index == 0:
            cached_tokens = event.cached_tokens
        if isinstance(event, _ToolsEnd) and event.calls:
            deltas = [{"index": i, **call} for i, call in enumerate(event.calls)]
            yield _chunk(shape, event.index, {"tool_calls": deltas})
        last = _chunk(shape, event.index, {} if shape.chat else "", event.finish_reason)
        if event.index == n - 1:
            last["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        if event.extra is not None:
            last["edgespec"] = event.extra
        yield last
    if include_usage:
        yield {**shape.head(chunk=True), "choices": [], "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


@dataclass
class _ToolsEnd(ChoiceEnd):
    calls: list[dict[str, Any]] | None = None  # parsed out of the choice's text (finish_reason "tool_calls")


def _held(events: Iterator[TextPiece | ChoiceEnd]) -> Iterator[TextPiece | ChoiceEnd]:
    """Each choice's pieces held to its end: one piece with its content (outside the calls), then its end with
    the calls parsed."""
    held: dict[int, list[TextPiece]] = {}
    for event in events:
        if isinstance(event, TextPiece):
            held.setdefault(event.index, []).append(event)
            continue
        pieces = held.pop(event.index, [])
        text = "".join(p.text for p in pieces)
        content, calls = parse_tool_calls(text)
        tokens = [t for p in pieces for t in p.tokens]
        if content or tokens:
            yield TextPiece(event.index, content or "", tokens)
        yield _ToolsEnd(event.index, "tool_calls" if calls else event.finish_reason, event.completion_tokens,
                        event.extra, cached_tokens=event.cached_tokens, calls=calls)
