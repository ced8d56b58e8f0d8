"""The OpenAI-compatible app both APIs serve: /v1/models, /v1/completions, /v1/chat/completions, and
vLLM's /tokenize, /detokenize and /version.

A request goes through the same steps on both sides:
  1. ``ApiGate``: the API key, then the declared body size (before any parsing);
  2. the body is read (counted against the limit) and validated (400 naming the field);
  3. the backend is asked for (503 while it loads), the model name checked (404);
  4. the prompt is measured, then tokenized, against the context (400);
  5. the choices are generated: whole on a worker thread, cancelled if the
     caller disconnects, or streamed as server-sent events.
The app returned has no /health or /metrics: each side adds its own.

CORS (``allowed_origins``) wraps everything, so a browser's preflight is answered before the key is
asked for (a preflight carries none) and refusals carry the headers a page needs to read them. With
``log_requests`` every generation request is logged as it is accepted (vLLM's --enable-log-requests):
its id, endpoint, sizes and sampling settings as fields, never the prompt's text.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware

from edgespec.shared import __version__, defaults

from .backend import Backend
from .errors import bad_request, install_error_handlers, json_response, model_not_found
from .gate import DEFAULT_MAX_BODY_BYTES, ApiGate, read_body, until_done_or_gone
from .generate import Plan, events, whole
from .prompts import chat_text, check_ids, encode_text
from .requests import ChatCompletionRequest, CompletionRequest, Settings, parse_request
from .responses import Shape, TokenTexts, stream_chunks, whole_body
from .sse import frames
from .tokenize import DetokenizeRequest, TokenizeRequest, detokenize, parse, tokenize

log = logging.getLogger("edgespec.requests")

DEFAULT_MAX_TOKENS = defaults.MAX_TOKENS  # both endpoints, as on every surface (capped by the context left)


@dataclass(frozen=True)
class ApiSettings:
    """How an API guards itself."""

    api_key: str | None = None  # when set, every path but /health (and /metrics unless protected) needs it
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # larger request bodies get 413
    metrics_need_key: bool = False  # /metrics asks for the key too (off: scrapers usually have none)
    allowed_origins: tuple[str, ...] = ()  # CORS: origins a browser page may call from ("*": any); () = none
    log_requests: bool = False  # log every generation request as it is accepted (vLLM's --enable-log-requests)


def build_openai_app(title: str, get_backend: Callable[[], Backend], settings: ApiSettings = ApiSettings()
                     ) -> FastAPI:
    """The /v1 app; `get_backend` returns the backend or raises an OpenAIError (503 while loading)."""
    app = FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    open_paths = {"/health"} if settings.metrics_need_key else {"/health", "/metrics"}
    app.add_middleware(ApiGate, api_key=settings.api_key, max_body_bytes=settings.max_body_bytes,
                       open_paths=frozenset(open_paths))
    if settings.allowed_origins:  # added last, so it runs first: preflights never meet the key check
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], allow_credentials=False)
    created = int(time.time())

    def card(backend: Backend) -> dict:
        return {"id": backend.name, "object": "model", "created": created, "owned_by": "edgespec",
                "max_model_len": backend.max_context_tokens}

    @app.get("/v1/models")
    async def models():
        return json_response({"object": "list", "data": [card(get_backend())]})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        backend = get_backend()
        if model_id != backend.name:
            raise model_not_found(model_id, backend.name)
        return json_response(card(backend))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _answer(request, CompletionRequest, get_backend, settings)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await _answer(request, ChatCompletionRequest, get_backend, settings)

    @app.get("/version")
    async def version():
        return json_response({"version": __version__})

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        body = parse(await read_body(request, settings.max_body_bytes), TokenizeRequest)
        backend = _named(get_backend(), body.model)
        return json_response(await run_in_threadpool(tokenize, backend, body))

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        body = parse(await read_body(request, settings.max_body_bytes), DetokenizeRequest)
        backend = _named(get_backend(), body.model)
        return json_response(await run_in_threadpool(detokenize, backend, body))

    return app


def _named(backend: Backend, model: str | None) -> Backend:
    if model is not None and model != backend.name:
        raise model_not_found(model, backend.name)
    return backend


async def _answer(request: Request, kind, get_backend: Callable[[], Backend], api: ApiSettings):
    chat = kind is ChatCompletionRequest
    body = parse_request(await read_body(request, api.max_body_bytes), kind)
    settings = body.settings()
    backend = _named(get_backend(), body.model)
    plan = await run_in_threadpool(_plan, backend, body, chat, settings)
    backend.count_request("chat" if chat else "completions")
    shape = Shape.new(chat, backend.name, parse_tools=settings.tools is not None and settings.tools.parse)
    if api.log_requests:
        s = settings.sampling
        log.info("request %s received", shape.id, extra={
            "request_id": shape.id, "endpoint": "chat" if chat else "completions", "model": backend.name,
            "prompt_tokens": len(plan.prompt_ids), "max_tokens": plan.max_new_tokens, "n": settings.n,
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": settings.seed,
            "stop_strings": len(settings.stop), "logprobs": settings.top_logprobs, "stream": settings.stream})
    texts = (TokenTexts(backend.tokenizer, settings.token_ids_as_text) if settings.top_logprobs is not None
             else None)
    if settings.stream:
        return await _stream(backend, plan, shape, texts)
    choices = await until_done_or_gone(request, lambda cancel: whole(backend, plan, cancel))
    return json_response(whole_body(shape, choices, len(plan.prompt_ids), texts))


def _plan(backend: Backend, body, chat: bool, settings: Settings) -> Plan:
    limit = backend.max_context_tokens
    if chat:
        tools = settings.tools.tools if settings.tools is not None else None
        text = chat_text(backend.tokenizer, [m.template_message() for m in body.messages], limit, tools,
                         template_kwargs=body.chat_template_kwargs)
        ids = encode_text(text, backend.tokenizer, limit, "messages")
    elif isinstance(body.prompt, str):
        ids = encode_text(body.prompt, backend.tokenizer, limit, "prompt")
    else:
        ids = check_ids(body.prompt, backend.vocab_size, limit, "prompt")
    bad = next((t for t, _ in settings.sampling.logit_bias if t >= backend.vocab_size), None)
    if bad is not None:
        raise bad_request(f"Invalid value for 'logit_bias': token id {bad} is outside the vocabulary "
                          f"[0, {backend.vocab_size})", "logit_bias", "invalid_value")
    bad = next((t for t in settings.sampling.stop_token_ids if t >= backend.vocab_size), None)
    if bad is not None:
        raise bad_request(f"Invalid value for 'stop_token_ids': token id {bad} is outside the vocabulary "
                          f"[0, {backend.vocab_size})", "stop_token_ids", "invalid_value")
    if settings.tools is not None and settings.tools.grammar:
        settings = replace(settings, grammar=settings.tools.grammar_for(backend.tokenizer))
    room = limit - len(ids)  # >= 1: a prompt that fills the context was refused
    default = (backend.default_chat_max_tokens or DEFAULT_MAX_TOKENS) if chat else DEFAULT_MAX_TOKENS
    return Plan(chat, tuple(ids), min(settings.max_tokens or default, room), settings)


async def _stream(backend: Backend, plan: Plan, shape: Shape, texts: TokenTexts | None) -> StreamingResponse:
    cancel = threading.Event()
    chunks = stream_chunks(shape, events(backend, plan, cancel), len(plan.prompt_ids), plan.settings.n, texts,
                           plan.settings.include_usage)
    # The first chunk comes after the prefill: a failure before it still gets its own status code.
    first = await run_in_threadpool(next, chunks, None)
    sse = frames(itertools.chain([] if first is None else [first], chunks))

    async def body():
        try:
            while (frame := await run_in_threadpool(next, sse, None)) is not None:
                yield frame
        finally:
            # Done, or the caller left: stop generating. Closing the generator gives back what it holds
            # (a KV slot, the client's generation and its server session), which may block on the
            # network, so not on the event loop.
            cancel.set()
            threading.Thread(target=sse.close, name="edgespec-sse-close", daemon=True).start()

    return StreamingResponse(body(), media_type="text/event-stream")
