"""A local OpenAI-compatible HTTP API in front of an EdgespecClient (``edgespec client serve``).

/v1/models, /v1/completions and /v1/chat/completions (the target's chat
template), with SSE streaming and ``usage``; every answer also carries
edgespec's own per-generation metrics in an extra ``edgespec`` field, which
OpenAI clients ignore. Requests run one at a time (one drafter, one cache).

/health is for deployments (``client_health``): 200 once the client is ready,
503 while it is still loading (``ClientSlot`` loads it in the background, so the
port answers at once) or when loading failed.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any, Iterator

# FastAPI resolves handler annotations by name in this module's globals, so these are imported here
# (this module is only imported by `edgespec client serve` and its tests).
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from edgespec.shared.errors import EdgespecError

from .client_health import ClientNotReadyError, ClientSlot, LinkProbe
from .commit import ResumePolicy
from .edge_client import EdgespecClient
from .generation import GenerationConfig, GenerationResult, LinkEvent, TokenOrigin
from .text import TextStreamer

log = logging.getLogger(__name__)


class ApiRequestError(ValueError):
    """A request the API cannot serve; becomes an OpenAI-style 400 error."""


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        if len(value) > 4:
            raise ApiRequestError("`stop` takes at most 4 strings")
        return tuple(value)
    raise ApiRequestError("`stop` must be a string or a list of strings")


def generation_config(body: dict, default_max_tokens: int, policy: ResumePolicy) -> GenerationConfig:
    """OpenAI request fields -> GenerationConfig (ValueError-type errors name the field)."""
    if body.get("n", 1) != 1:
        raise ApiRequestError("only n=1 is supported")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiRequestError(f"`max_tokens` must be a positive integer, got {max_tokens!r}")
    temperature = body.get("temperature")
    top_p = body.get("top_p")
    try:
        return GenerationConfig(max_new_tokens=max_tokens, stop=_stops(body.get("stop")),
                                temperature=float(0.0 if temperature is None else temperature),
                                top_p=float(1.0 if top_p is None else top_p), seed=int(body.get("seed") or 0),
                                resume_policy=policy)
    except (TypeError, ValueError) as err:
        raise ApiRequestError(f"bad generation settings: {err}") from None


def edgespec_extra(result: GenerationResult) -> dict:
    extra = result.metrics.to_dict()
    extra.update(finish_detail=result.detail, provisional_tokens=result.provisional,
                 origins={o.value: sum(x is o for x in result.origins) for o in TokenOrigin})
    return extra


def usage(result: GenerationResult) -> dict:
    p, c = result.metrics.prompt_tokens, len(result.token_ids)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def finish_reason(result: GenerationResult) -> str:
    # OpenAI knows "stop" and "length"; a lost link ends the text early, which reads as "stop" there.
    return "length" if result.finish_reason == "length" else "stop"


def build_app(client: EdgespecClient | ClientSlot, default_max_tokens: int = 512,
              policy: ResumePolicy = ResumePolicy.ROLLBACK, api_key: str | None = None,
              probe: LinkProbe | None = None):
    """The app; `client` may be a ClientSlot still loading (requests get 503 until it is ready)."""
    slot = client if isinstance(client, ClientSlot) else ClientSlot.ready(client)
    probe = probe or LinkProbe(slot.link)
    app = FastAPI(title="edgespec local API", version="1")
    app.state.slot = slot

    def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}},
                            status_code=status)

    def check_key(request: Request) -> JSONResponse | None:
        if api_key and request.headers.get("authorization", "") != f"Bearer {api_key}":
            return error(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "authentication_error")
        return None

    async def read_body(request: Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiRequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiRequestError("the request body must be a JSON object")
        return body

    @app.exception_handler(ApiRequestError)
    async def _bad_request(request, exc: ApiRequestError):
        return error(400, str(exc))

    @app.exception_handler(ClientNotReadyError)
    async def _not_ready(request, exc: ClientNotReadyError):
        return error(503, str(exc), "service_unavailable")

    @app.exception_handler(EdgespecError)
    async def _upstream(request, exc: EdgespecError):
        return error(502, f"edgespec: {exc}", "server_error")

    @app.get("/health")
    async def health():
        link = await run_in_threadpool(probe.state, slot)
        body = slot.health(link)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/v1/models")
    def models():
        model_name = slot.get().model_name
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "edgespec"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        if (denied := check_key(request)) is not None:
            return denied
        body = await read_body(request)
        client = slot.get()
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            ids = client.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        else:
            raise ApiRequestError("`prompt` must be a non-empty string or a list of token ids (one prompt)")
        config = generation_config(body, 16, policy)
        return await respond(ids, config, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        if (denied := check_key(request)) is not None:
            return denied
        body = await read_body(request)
        client = slot.get()
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise ApiRequestError("`messages` must be a non-empty list of {role, content} objects with text content")
        ids = client.encode_chat([{"role": m["role"], "content": m["content"]} for m in messages])
        config = generation_config(body, default_max_tokens, policy)
        return await respond(ids, config, body, chat=True)

    async def respond(ids: list[int], config: GenerationConfig, body: dict, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        client = slot.get()
        model = client.model_name
        if body.get("stream"):
            return StreamingResponse(sse(stream_chunks(ids, config, rid, model, chat)), media_type="text/event-stream")
        streamer = TextStreamer(client.decode, config.stop, hold_offline=False)
        result = await run_in_threadpool(generate_tracked, ids, config, rid)
        for i, t in enumerate(result.token_ids):
            streamer.tokens.append(t)
            streamer.origins.append(result.origins[i])
        text = streamer.finish()
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(result), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model, "choices": [choice], "usage": usage(result), "edgespec": edgespec_extra(result)}

    def stream_chunks(ids, config, rid, model, chat) -> Iterator[dict]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(text: str | None, reason: str | None = None, first: bool = False) -> dict:
            if chat:
                delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
                if text:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
            else:
                choice = {"index": 0, "text": text or "", "finish_reason": reason, "logprobs": None}
            return {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}

        if chat:
            yield chunk(None, first=True)
        client = slot.get()
        streamer = TextStreamer(client.decode, config.stop, hold_offline=config.resume_policy is ResumePolicy.ROLLBACK)
        result = None
        try:
            for item in tracked(client, ids, config, rid):
                if isinstance(item, GenerationResult):
                    result = item
                    break
                delta = streamer.feed(item)
                if delta:
                    yield chunk(delta)
        except EdgespecError as exc:  # headers are sent already: the error travels in the stream
            yield {"error": {"message": f"edgespec: {exc}", "type": "server_error", "param": None, "code": None}}
            return
        rest = streamer.finish()
        if rest:
            yield chunk(rest)
        last = chunk(None, finish_reason(result))
        last["usage"] = usage(result)
        last["edgespec"] = edgespec_extra(result)
        yield last

    def tracked(client: EdgespecClient, ids, config, rid) -> Iterator:
        """client.stream, telling the slot when the link goes down and comes back (for /health)."""
        try:
            for item in client.stream(ids, config):
                if isinstance(item, LinkEvent):
                    slot.offline = not item.online
                elif isinstance(item, GenerationResult):
                    m = item.metrics
                    log.info("generation done", extra={"request_id": rid, "new_tokens": m.new_tokens,
                                                       "tokens_per_s": round(m.tokens_per_s, 3),
                                                       "calls": m.calls, "finish_reason": item.finish_reason})
                yield item
        finally:
            slot.offline = False

    def generate_tracked(ids, config, rid) -> GenerationResult:
        for item in tracked(slot.get(), ids, config, rid):
            if isinstance(item, GenerationResult):
                return item
        raise RuntimeError("the generation ended without a result")  # Generation always yields one last

    return app


def sse(chunks: Iterator[dict]) -> Iterator[str]:
    for c in chunks:
        yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
