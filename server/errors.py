"""Server-side errors; each maps to one gRPC status through ``grpc_code`` (see ``service.py``)."""
from __future__ import annotations

from edgespec.shared.errors import EdgespecError


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
