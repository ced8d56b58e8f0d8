"""A local OpenAI-compatible HTTP API in front of an EdgespecClient (``edgespec client serve``).

The OpenAI layer (parsing, refusals, stop strings, usage, streaming) is
``edgespec.shared.openai``, the same as the server's plain API, so a request
means the same on both; this module is the speculative generation loop as its
backend. Every answer also carries edgespec's own per-generation metrics in an
extra ``edgespec`` field, which OpenAI clients ignore. Generations run one at a
time (one drafter, one cache). Logprobs are the target's, sent by the server
with each verification: a token drafted offline is held back until a Resume
has scored it, and one the target never saw (the link did not come back) goes
out with ``"logprob": null``.

/health is for deployments (``http_health``): 200 once the client is ready, 503 while it is still loading
or when loading failed. /metrics is served when a metrics page is given (``metrics``).
"""
from __future__ import annotations

import logging
import threading
from typing import Iterator, Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from edgespec.shared.errors import EdgespecError
from edgespec.shared.openai.backend import GeneratedToken, GenerationJob
from edgespec.shared.openai.errors import OpenAIError
from edgespec.shared.openai.gate import DEFAULT_MAX_BODY_BYTES
from edgespec.shared.openai.routes import ApiSettings, build_openai_app
from edgespec.shared.wire import ResumePolicy

from .edge_client import EdgespecClient
from .http_health import ClientNotReadyError, ClientSlot, LinkProbe
from .loop.generation import GenerationConfig, GenerationResult, LinkEvent, TokenEvent, TokenOrigin
from .metrics import ClientMetrics
from .text import SettledTokens

log = logging.getLogger(__name__)


def edgespec_extra(result: GenerationResult) -> dict:
    """The generation's metrics, and its speculative figures in vLLM's and SGLang's words (``spec_decode``, the
    same object the server's plain API answers with)."""
    extra = result.metrics.to_dict()
    extra.update(finish_detail=result.detail, provisional_tokens=result.provisional,
                 origins={o.value: sum(x is o for x in result.origins) for o in TokenOrigin},
                 spec_decode=result.metrics.request_summary())
    return extra


def openai_error(err: EdgespecError) -> OpenAIError:
    """What a caller of the local API is told when the generation could not run."""
    if isinstance(err, ClientNotReadyError):
        return OpenAIError(503, str(err), code="service_unavailable")
    if err.grpc_code == "RESOURCE_EXHAUSTED":
        return OpenAIError(429, f"the edgespec server is at capacity: {err}", code="server_busy")
    if err.grpc_code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
        return OpenAIError(503, f"the edgespec server cannot be reached: {err}", code="server_unreachable")
    return OpenAIError(502, f"edgespec: {err}", code="upstream_error")


class SpeculativeBackend:
    """The EdgespecClient's generation loop behind the shared OpenAI layer."""

    def __init__(self, slot: ClientSlot, client: EdgespecClient, name: str, policy: ResumePolicy,
                 default_chat_max_tokens: int | None, offline_wait_s: float = 30.0):
        self.slot, self.client, self.name, self.policy = slot, client, name, policy
        self.offline_wait_s = offline_wait_s
        self.default_chat_max_tokens = default_chat_max_tokens
        self.tokenizer = client.tokenizer
        self.vocab_size = client.info.vocab_size
        self.max_context_tokens = client.info.limits.max_context_tokens or 32768  # 0: a server too old to say

    def decode(self, ids: Sequence[int]) -> str:
        return self.client.decode(ids)

    def start(self, job: GenerationJob, cancel: threading.Event) -> "SpeculativeRun":
        # The stops go to the loop too, so it ends (and stops drafting) where the shared layer cuts the text.
        config = GenerationConfig(max_new_tokens=job.max_new_tokens, stop=job.stop, sampling=job.sampling,
                                  seed=job.seed, resume_policy=self.policy, offline_wait_s=self.offline_wait_s,
                                  logprobs=job.top_logprobs, ignore_eos=job.ignore_eos, grammar=job.grammar or "")
        return SpeculativeRun(self.slot, self.client, job.prompt_ids, config, cancel)

    def count_request(self, endpoint: str) -> None:
        pass  # the client's metrics count generations themselves (EdgespecClient.metrics)


class SpeculativeRun:
    """One choice from the speculative loop: settled tokens, then the loop's result."""

    def __init__(self, slot: ClientSlot, client: EdgespecClient, prompt_ids: Sequence[int], config: GenerationConfig,
                 cancel: threading.Event):
        self.cancel = cancel
        # Under `rollback` a Resume may drop offline tokens; with logprobs they wait for the target's scores.
        self.hold_offline = config.resume_policy is ResumePolicy.ROLLBACK or config.logprobs is not None
        self._items = _tracked(slot, client.stream(list(prompt_ids), config))
        self.result: GenerationResult | None = None
        self.finish_reason = "length"
        self.extra: dict | None = None

    def __iter__(self) -> Iterator[GeneratedToken]:
        settled = SettledTokens(self.hold_offline)
        try:
            for item in self._items:
                if isinstance(item, GenerationResult):
                    self._take(item)
                    break
                yield from map(_generated, settled.feed(item))
        except EdgespecError as err:
            raise openai_error(err) from None
        yield from map(_generated, settled.finish())

    def _take(self, result: GenerationResult) -> None:
        self.result = result
        # OpenAI knows "stop" and "length"; a lost link ends the text early, which reads as "stop" there.
        self.finish_reason = "length" if result.finish_reason == "length" else "stop"
        self.extra = edgespec_extra(result)

    def close(self) -> None:
        # After a stop string the loop ends by itself (it has the same stops): run it out for its metrics.
        # If the caller left, stop it now: closing ends the session on the server.
        try:
            if self.result is None and not self.cancel.is_set():
                for item in self._items:
                    if isinstance(item, GenerationResult):
                        self._take(item)
        except EdgespecError:
            pass  # the text is complete; only the metrics are lost
        finally:
            self._items.close()


def _generated(event: TokenEvent) -> GeneratedToken:
    lp = event.logprob
    return GeneratedToken(event.token) if lp is None else GeneratedToken(event.token, lp.logprob, lp.top)


def _tracked(slot: ClientSlot, items: Iterator) -> Iterator:
    """client.stream, telling the slot when the link goes down and comes back (for /health)."""
    try:
        for item in items:
            if isinstance(item, LinkEvent):
                slot.offline = not item.online
            elif isinstance(item, GenerationResult):
                m = item.metrics
                log.info("generation done", extra={"new_tokens": m.new_tokens, "tokens_per_s": round(m.tokens_per_s, 3),
                                                   "calls": m.calls, "finish_reason": item.finish_reason})
            yield item
    finally:
        slot.offline = False
        items.close()


def build_app(client: EdgespecClient | ClientSlot, default_max_tokens: int | None = None,
              policy: ResumePolicy = ResumePolicy.ROLLBACK, api_key: str | None = None, probe: LinkProbe | None = None,
              max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, metrics_need_key: bool = False, metrics=None,
              offline_wait_s: float = 30.0, allowed_origins: tuple[str, ...] = (),
              log_requests: bool = False) -> FastAPI:
    """The app; `client` may be a ClientSlot still loading (requests get 503 until it is ready).

    default_max_tokens: chat's max_tokens when a request has none (None: ``edgespec.shared.defaults.MAX_TOKENS``, as
    the server's plain API); the API answers to the server's model name.
    metrics: what /metrics shows: a ``ClientMetrics`` or any prometheus_client collector (a CollectorRegistry);
    None = no /metrics. offline_wait_s: how long a generation waits for a lost link once its drafter cannot go
    on alone (``GenerationConfig.offline_wait_s``).
    allowed_origins: CORS origins browser pages may call from ("*": any). log_requests: log every request.
    """
    slot = client if isinstance(client, ClientSlot) else ClientSlot.ready(client)
    probe = probe or LinkProbe(slot.link)
    backends: dict[int, SpeculativeBackend] = {}

    def backend() -> SpeculativeBackend:
        try:
            edge = slot.get()
        except ClientNotReadyError as err:
            raise openai_error(err) from None
        if id(edge) not in backends:
            backends.clear()
            backends[id(edge)] = SpeculativeBackend(slot, edge, edge.model_name, policy, default_max_tokens,
                                                    offline_wait_s)
        return backends[id(edge)]

    app = build_openai_app("edgespec local API", backend, ApiSettings(
        api_key, max_body_bytes, metrics_need_key, tuple(allowed_origins), log_requests))
    app.state.slot = slot

    @app.get("/health")
    async def health():
        body = slot.health(await run_in_threadpool(probe.state, slot))
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    if metrics is not None:
        @app.get("/metrics")
        def metrics_endpoint() -> Response:
            if isinstance(metrics, ClientMetrics):  # the link's state as /health would give it now
                metrics.set_link_state(probe.state(slot))
            return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    return app
