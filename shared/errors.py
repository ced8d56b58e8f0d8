"""Errors that carry a message a person can act on.

Each subclass maps to one gRPC status code (see ``grpc_code``) so the server's
single error interceptor can translate without string matching.
"""
from __future__ import annotations


class EdgespecError(Exception):
    """Base class; ``grpc_code`` names a ``grpc.StatusCode`` member."""

    grpc_code = "INTERNAL"


class InvalidTreeError(EdgespecError, ValueError):
    """A draft tree that cannot be verified (bad parent, too many nodes, bad token id, truncated bytes)."""

    grpc_code = "INVALID_ARGUMENT"


class FrameError(EdgespecError, ValueError):
    """An activation codec frame that is malformed, truncated or of an unknown codec."""

    grpc_code = "INVALID_ARGUMENT"


class TokenizerMismatchError(EdgespecError):
    """A client whose tokenizer fingerprint is not the server's."""

    grpc_code = "FAILED_PRECONDITION"


class ModelPrepareError(EdgespecError, RuntimeError):
    """A model could not be prepared: missing package, checksum mismatch, too little disk, ..."""


class UnknownModelError(EdgespecError, KeyError):
    """A model name that is neither in the registry, nor a local directory, nor a hub id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown model"
