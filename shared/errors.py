"""Errors that carry a message a person can act on.

Each subclass maps to one gRPC status code (see ``grpc_code``) so the server's
single error interceptor can translate without string matching.
"""
from __future__ import annotations


class EdgespecError(Exception):
    """Base class; ``grpc_code`` names a ``grpc.StatusCode`` member, given by a subclass as a class
    keyword: ``class StaleStateError(EdgespecError, grpc_code="FAILED_PRECONDITION")``."""

    grpc_code = "INTERNAL"

    def __init_subclass__(cls, grpc_code: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if grpc_code is not None:
            cls.grpc_code = grpc_code


class InvalidTreeError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """A draft tree that cannot be verified (bad parent, too many nodes, bad token id, truncated bytes)."""


class InvalidRequestError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """A message the server cannot act on: missing fields, bad sampling settings, too long a prompt."""


class FrameError(EdgespecError, ValueError, grpc_code="INVALID_ARGUMENT"):
    """An activation codec frame that is malformed, truncated or of an unknown codec."""


class TokenizerMismatchError(EdgespecError, grpc_code="FAILED_PRECONDITION"):
    """A client whose tokenizer fingerprint is not the server's."""


class ModelPrepareError(EdgespecError, RuntimeError):
    """A model could not be prepared: missing package, checksum mismatch, too little disk, ..."""


class UnknownModelError(EdgespecError, KeyError):
    """A model name that is neither in the registry, nor a local directory, nor a hub id."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown model"
