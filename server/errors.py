"""Server-side errors; each maps to one gRPC status through ``grpc_code`` (see ``rpc/service.py``).

``printable`` is how a peer-given string (a session id, a drafter name, an
error message that quotes one) appears in a log line.
"""
from __future__ import annotations

# InvalidRequestError is the session contract's refusal (``shared.session_settings``); the server raises it too.
from edgespec.shared.errors import EdgespecError, InvalidRequestError  # noqa: F401


def printable(text: str, limit: int = 300) -> str:
    """text with control and other non-printable characters escaped (a newline cannot forge a log line),
    cut to `limit` characters (a megabyte of name cannot flood the log)."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + (f"... ({len(text)} characters)" if len(text) > limit else "")


class SessionNotFoundError(EdgespecError, KeyError, grpc_code="NOT_FOUND"):
    """A session id this server does not hold (never opened, closed, expired or evicted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown session"


class StaleStateError(EdgespecError, grpc_code="FAILED_PRECONDITION"):
    """The client's view (committed length, hash) disagrees with the server's."""


class SessionCapError(EdgespecError, grpc_code="RESOURCE_EXHAUSTED"):
    """The server holds as many sessions as it may."""


class SessionBusyError(EdgespecError, grpc_code="ABORTED"):
    """Another stream is using this session right now."""


class UnauthenticatedError(EdgespecError, grpc_code="UNAUTHENTICATED"):
    """A missing or wrong API key."""


class DrainingError(EdgespecError, grpc_code="UNAVAILABLE"):
    """The server is shutting down and takes no new sessions."""


class AdmissionTimeoutError(EdgespecError, grpc_code="DEADLINE_EXCEEDED"):
    """A Session stream that sent no first message in time (it held the server while saying nothing)."""
