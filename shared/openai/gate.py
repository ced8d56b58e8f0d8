"""What every request passes before a handler sees it, and how a handler watches its caller.

``ApiGate`` is ASGI middleware so it runs before FastAPI reads or validates a
body: an unauthenticated caller learns nothing about the request schema, and
a body declared too big is refused before it is read. A body sent without a
length is counted as it is read (``read_body``).

``until_done_or_gone`` cancels a generation whose caller disconnects instead of
running it to its end.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable, TypeVar

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.concurrency import run_in_threadpool

from edgespec.shared.auth import api_key_problem
from edgespec.shared.wire import DEFAULT_MAX_BODY_BYTES  # noqa: F401 - the routes' default, named here too

from .errors import Cancelled, OpenAIError

T = TypeVar("T")


def too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, f"the request body is larger than this server's limit of {limit} bytes", None,
                       "request_too_large")


class ApiGate:
    """The API key first (on every path but `open_paths`), then the declared body size."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int, open_paths: frozenset[str]):
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.open_paths = open_paths

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            refusal = None
            if scope["path"] not in self.open_paths:
                problem = api_key_problem(headers, self.api_key)
                if problem is not None:
                    refusal = OpenAIError(401, problem, None, "invalid_api_key")
            length = headers.get("content-length", "")
            if refusal is None and length.isdigit() and int(length) > self.max_body_bytes:
                refusal = too_large(self.max_body_bytes)
            if refusal is not None:
                await refusal.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        raise OpenAIError(400, "the request body was cut short: the connection closed") from None
    return b"".join(chunks)


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_done_or_gone(request: Request, work: Callable[[threading.Event], T]) -> T:
    """Run work(cancel) on a worker thread; if the caller disconnects first, set cancel and raise Cancelled."""
    cancel = threading.Event()
    done = asyncio.ensure_future(run_in_threadpool(work, cancel))
    gone = asyncio.ensure_future(_disconnected(request))
    await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    if done.done():
        gone.cancel()
        return done.result()
    cancel.set()  # the worker sees it at its next token and stops generating
    done.add_done_callback(lambda f: f.exception())  # its Cancelled is expected: do not log it as unretrieved
    raise Cancelled()
