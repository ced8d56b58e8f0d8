"""Server-sent events framing of a streamed answer: ``data: {json}`` per chunk, then ``data: [DONE]``.

Once the first chunk is out the status line is sent, so an error after it
travels as an event carrying an OpenAI error object, then the stream ends.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterator

from .errors import OpenAIError

log = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def event(body: dict[str, Any]) -> str:
    # Generated text is decoded UTF-8 (no lone surrogates), so it may travel unescaped.
    return f"data: {json.dumps(body, ensure_ascii=False, allow_nan=False)}\n\n"


def frames(chunks: Iterator[dict[str, Any]]) -> Iterator[str]:
    try:
        for chunk in chunks:
            yield event(chunk)
    except OpenAIError as err:
        yield event(err.body())
    except Exception as err:  # noqa: BLE001 - a bug mid-stream: logged, and the caller still gets an error object
        log.exception("a streamed answer failed")
        yield event(OpenAIError(500, f"internal error ({type(err).__name__}); the server log has the details").body())
    yield DONE
