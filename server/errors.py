"""Server-side errors; each maps to one gRPC status through ``grpc_code`` (see ``service.py``).

``printable`` is how a peer-given string (a session id, a drafter name, an
error message that quotes one) appears in a log line.
"""
from __future__ import annotations

from edgespec.shared.errors import EdgespecError


def printable(text: str, limit: int = 300) -> str:
    """text with control and other non-printable characters escaped (a newline cannot forge a log line),
    cut to `limit` characters (a megabyte of name cannot flood the log)."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + (f"... ({len(text)} characters)" if len(text) > limit else "")


class InvalidRequestError(EdgespecError, ValueError):
    """A message the server cannot act on: missing fields, bad sampling settings, too long a prompt."""

    grpc_code = "INVALID_ARGUMENT"


class SessionNotFoundError(EdgespecError, KeyError):
    """A session id this server does not hold (never opened, closed, expired or evicted)."""

    grpc_code = "NOT_FOUND"

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown session"


class StaleStateError(EdgespecError):
    """The client's view (committed length, hash) disagrees with the server's."""

    grpc_code = "FAILED_PRECONDITION"


class SessionCapError(EdgespecError):
    """The server holds as many sessions as it may."""

    grpc_code = "RESOURCE_EXHAUSTED"


class SessionBusyError(EdgespecError):
    """Another stream is using this session right now."""

    grpc_code = "ABORTED"


class UnauthenticatedError(EdgespecError):
    """A missing or wrong API key."""

    grpc_code = "UNAUTHENTICATED"


class DrainingError(EdgespecError):
    """The server is shutting down and takes no new sessions."""

    grpc_code = "UNAVAILABLE"


class AdmissionTimeoutError(EdgespecError):
    """A Session stream that sent no first message in time (it held the server while saying nothing)."""

    grpc_code = "DEADLINE_EXCEEDED"
