"""The HTTP side: /health, /metrics, and the OpenAI-compatible plain API.

/v1/completions and /v1/chat/completions generate with the target alone (the
"API call" baseline of the experiments). The OpenAI layer (parsing, refusals,
stop strings, usage, logprobs, streaming) is ``edgespec.shared.openai``, the
same as the client's local API; this module is the plain decoder as its
backend, and the server's own /health and /metrics.
"""
from __future__ import annotations

import threading
from typing import Iterator, Sequence

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from edgespec.shared.logprobs import token_logprobs
from edgespec.shared.metrics import SpecDecodeStats
from edgespec.shared.openai.backend import GeneratedToken, GenerationJob
from edgespec.shared.openai.errors import unavailable
from edgespec.shared.openai.routes import ApiSettings, build_openai_app

from .decoder import GenerationRequest, generate


class HttpState:
    """What the HTTP side sees of the server: the core once the model is loaded, and how the API is guarded."""

    def __init__(self, served_model_name: str | None = None, **api):
        self.core = None  # VerifierCore, set when the model is loaded
        self.served_model_name = served_model_name  # the name the API answers to; None = the target's name
        self.api = ApiSettings(**api)  # key, body limit, CORS, request log (ApiSettings' fields)
        self._backend: PlainBackend | None = None

    def backend(self) -> "PlainBackend":
        core = self.core
        if core is None or core.draining.is_set():
            raise unavailable("the server is loading its model or shutting down; retry shortly")
        if self._backend is None or self._backend.core is not core:
            self._backend = PlainBackend(core, self.served_model_name or core.target.name)
        return self._backend


class PlainBackend:
    """The target generating alone, behind the shared OpenAI layer."""

    default_chat_max_tokens = None  # chat's default: the rest of the context

    def __init__(self, core, name: str):
        self.core = core
        self.name = name
        self.tokenizer = core.target.tokenizer
        self.vocab_size = core.target.vocab_size
        self.max_context_tokens = core.limits.max_context_tokens

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def start(self, job: GenerationJob, cancel: threading.Event) -> "PlainRun":
        return PlainRun(self.core, job, cancel)

    def count_request(self, endpoint: str) -> None:
        self.core.metrics.api_requests.labels(endpoint=endpoint).inc()


class PlainRun:
    """One choice from the plain decoder; the tokens are pulled, so not pulling stops the decoding.

    Its ``edgespec`` field has the local API's ``spec_decode`` object, with no drafts: a client reads the
    same keys from both APIs."""

    extra = {"spec_decode": SpecDecodeStats().request_summary()}

    def __init__(self, core, job: GenerationJob, cancel: threading.Event | None = None):
        self.core = core
        self.top_logprobs = job.top_logprobs
        self.ignore_eos = job.ignore_eos
        request = GenerationRequest(job.prompt_ids, job.max_new_tokens, job.sampling, job.seed,
                                    stop_at_eos=not job.ignore_eos, grammar=job.grammar or "")
        self._decoding = generate(core.target, core.scheduler, request, core.prefix_cache)
        cancel = cancel or threading.Event()
        self._tokens = core.metrics.api_generation(self._decoding, len(job.prompt_ids), job.max_new_tokens,
                                                   lambda step: step.id, cancel.is_set)
        self.finish_reason = "length"
        # usage.prompt_tokens_details.cached_tokens, known with the first token; None: no prefix cache
        self.cached_tokens: int | None = None if core.prefix_cache is None else 0

    def __iter__(self) -> Iterator[GeneratedToken]:
        eos = self.core.target.eos_ids
        for step in self._tokens:
            if self.cached_tokens is not None:
                self.cached_tokens = step.cached_tokens
            if step.id in eos and not self.ignore_eos:
                self.finish_reason = "stop"
            if self.top_logprobs is None:
                yield GeneratedToken(step.id)
            else:
                (lp,) = token_logprobs(step.logits[None], [step.id], self.top_logprobs)
                yield GeneratedToken(step.id, lp.logprob, lp.top)

    def close(self) -> None:
        self._tokens.close()
        self._decoding.close()  # gives its KV slot back now, not when the garbage collector gets to it


def build_http_app(state: HttpState) -> FastAPI:
    app = build_openai_app("edgespec server", state.backend, state.api)

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

    return app
