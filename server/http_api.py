"""The HTTP side: /health, /metrics, and the OpenAI-compatible plain API.

/v1/completions and /v1/chat/completions generate with the target alone (the
"API call" baseline of the experiments), streamed as server-sent events when
``stream`` is true. Handlers are plain ``def`` so FastAPI runs them on its
thread pool and the event loop never waits on the model.
"""
from __future__ import annotations

import hmac
import json
import time
import uuid
from typing import Any, Iterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from edgespec.shared.verification import SamplingConfig

from .decoder import GenerationRequest, generate
from .text_stream import TextStream


class HttpState:
    """What the HTTP side sees of the server: the core once the model is loaded."""

    def __init__(self, api_key: str | None = None):
        self.core = None  # VerifierCore, set when the model is loaded
        self.api_key = api_key


class _Common(BaseModel):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]]


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def build_http_app(state: HttpState) -> FastAPI:
    app = FastAPI(title="edgespec server", docs_url=None, redoc_url=None)

    @app.get("/health")
    def health() -> JSONResponse:
        core = state.core
        if core is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if core.draining.is_set():
            return JSONResponse({"status": "draining", "model": core.target.name}, status_code=503)
        return JSONResponse({"status": "ok", "model": core.target.name, "device": str(core.target.device),
                             "sessions": len(core.store)})

    @app.get("/metrics")
    def metrics() -> Response:
        core = state.core
        if core is None:
            return Response(b"", media_type="text/plain")
        return Response(core.metrics.render(), media_type=core.metrics.content_type)

    @app.get("/v1/models")
    def models(request: Request) -> dict:
        core = _ready(state, request)
        return {"object": "list", "data": [{"id": core.target.name, "object": "model", "owned_by": "edgespec"}]}

    @app.post("/v1/completions")
    def completions(body: CompletionRequest, request: Request):
        core = _ready(state, request)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise HTTPException(400, "only one prompt per request is supported")
            prompt = prompt[0]
        ids = list(prompt) if isinstance(prompt, list) else _encode(core, prompt)
        core.metrics.api_requests.labels(endpoint="completions").inc()
        return _respond(core, body, ids, chat=False)

    @app.post("/v1/chat/completions")
    def chat(body: ChatRequest, request: Request):
        core = _ready(state, request)
        messages = [{"role": m.role, "content": _content_text(m.content)} for m in body.messages]
        text = core.target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        core.metrics.api_requests.labels(endpoint="chat").inc()
        return _respond(core, body, _encode(core, text), chat=True)

    return app


def _ready(state: HttpState, request: Request):
    if state.api_key:
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), state.api_key.encode()):
            raise HTTPException(401, "missing or wrong API key: send 'Authorization: Bearer KEY'")
    core = state.core
    if core is None or core.draining.is_set():
        raise HTTPException(503, "the server is loading its model or shutting down; retry shortly")
    return core


def _encode(core, text: str) -> list[int]:
    return list(core.target.tokenizer(text, add_special_tokens=False)["input_ids"])


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _respond(core, body: _Common, prompt_ids: list[int], chat: bool):
    if not prompt_ids:
        raise HTTPException(400, "the prompt is empty")
    limit = core.limits.max_context_tokens
    # OpenAI's defaults: 16 tokens for completions, up to the context for chat.
    max_new = body.max_tokens or (max(1, limit - len(prompt_ids)) if chat else 16)
    if len(prompt_ids) + max_new > limit:
        if len(prompt_ids) >= limit:
            raise HTTPException(400, f"the prompt has {len(prompt_ids)} tokens; this server's context is {limit}")
        max_new = limit - len(prompt_ids)
    bad = next((t for t in prompt_ids if not 0 <= t < core.target.vocab_size), None)
    if bad is not None:
        raise HTTPException(400, f"prompt token id {bad} is outside the vocabulary [0, {core.target.vocab_size})")
    try:
        sampling = SamplingConfig(body.temperature, body.top_p, body.top_k)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    request = GenerationRequest(tuple(prompt_ids), max_new, sampling, body.seed)
    job = _Job(core, request, stop, chat, core.target.name)
    if body.stream:
        return StreamingResponse(job.sse(), media_type="text/event-stream")
    return JSONResponse(job.whole())


class _Job:
    """One API generation, rendered whole or as SSE chunks in OpenAI's shapes."""

    def __init__(self, core, request: GenerationRequest, stop: list[str], chat: bool, model: str):
        self.core, self.request, self.chat, self.model = core, request, chat, model
        self.stream = TextStream(core.target.tokenizer, stop)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.finish_reason = "length"
        self.completion_tokens = 0

    def deltas(self) -> Iterator[str]:
        for token in self.core.metrics.api_generation(generate(self.core.target, self.core.scheduler, self.request)):
            self.completion_tokens += 1
            self.core.metrics.api_tokens.inc()
            delta = self.stream.push(token)
            if delta:
                yield delta
            if self.stream.stopped:
                break
        else:
            if self.completion_tokens < self.request.max_new_tokens:
                self.finish_reason = "stop"  # the target's end of sequence
        if self.stream.stopped:
            self.finish_reason = "stop"
        rest = self.stream.finish()
        if rest:
            yield rest

    def whole(self) -> dict:
        text = "".join(self.deltas())
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = self.finish_reason
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self._usage()}

    def sse(self) -> Iterator[str]:
        if self.chat:
            yield self._chunk({"role": "assistant", "content": ""}, None)
        for delta in self.deltas():
            yield self._chunk({"content": delta} if self.chat else delta, None)
        yield self._chunk({} if self.chat else "", self.finish_reason, usage=True)
        yield "data: [DONE]\n\n"

    def _chunk(self, delta, finish_reason: str | None, usage: bool = False) -> str:
        choice = {"index": 0, "delta": delta} if self.chat else {"index": 0, "text": delta, "logprobs": None}
        choice["finish_reason"] = finish_reason
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice]}
        if usage:
            body["usage"] = self._usage()
        return f"data: {json.dumps(body)}\n\n"

    def _usage(self) -> dict:
        prompt = len(self.request.prompt_ids)
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens}
