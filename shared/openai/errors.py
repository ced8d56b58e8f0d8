"""OpenAI error objects: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a caller can cause becomes one of these with a 4xx status, and
the message says what was wrong. Bodies are rendered with ``json.dumps``'s
defaults (ASCII, no NaN) so that no value a caller sent (a NaN, a lone
surrogate) can break the rendering of its own error.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from starlette.responses import Response

log = logging.getLogger(__name__)

# Types follow OpenAI's where it has one for the status; any other is an invalid_request_error.
_TYPES = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 502: "server_error",
          503: "service_unavailable", 504: "server_error"}


class Cancelled(Exception):
    """The caller went away: its generation stopped and nothing is sent."""


class OpenAIError(Exception):
    """A failure to answer with an OpenAI error object."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return json_response(self.body(), self.status)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code)


def unsupported(param: str, why: str) -> OpenAIError:
    """A field this API does not implement, named, with what it does accept."""
    return OpenAIError(400, f"'{param}' is not supported: {why}", param, "unsupported_parameter")


def model_not_found(name: str, served: str) -> OpenAIError:
    return OpenAIError(404, f"The model '{name}' does not exist: this API serves '{served}' only.", "model",
                       "model_not_found")


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, message, code="service_unavailable")


def json_response(body: Any, status: int = 200) -> Response:
    """JSON with the standard library's safe defaults (ASCII escapes, NaN refused)."""
    return Response(json.dumps(body, allow_nan=False).encode(), status_code=status, media_type="application/json")


def install_error_handlers(app) -> None:
    """Make every error of a FastAPI app an OpenAI error object."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(OpenAIError)
    async def _openai(request, exc: OpenAIError):
        return exc.response()

    @app.exception_handler(Cancelled)
    async def _cancelled(request, exc: Cancelled):
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it, the access log does

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):  # unknown routes, wrong methods
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            message = f"no such endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        return OpenAIError(exc.status_code, message).response()

    @app.exception_handler(RequestValidationError)
    async def _validation(request, exc: RequestValidationError):  # path/query parameters; bodies are ours
        first = next(iter(exc.errors()), {})
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return bad_request(f"invalid request: {first.get('msg', 'malformed')}", param).response()

    @app.exception_handler(Exception)
    async def _bug(request, exc: Exception):
        log.exception("unexpected error answering %s %s", request.method, request.url.path)
        return OpenAIError(500, f"internal error ({type(exc).__name__}); the server log has the details").response()
