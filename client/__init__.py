"""edgespec.client: the laptop's side. ``Client`` and ``AsyncClient`` are the text-level Python API (also at the
top: ``edgespec.Client``; ``python_client`` shows their use). They are loaded on first use, so
`import edgespec.client.cli` (and `edgespec --help`) stays light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .python_client import AsyncClient, ChatReply, Client, ToolCall

__all__ = ["AsyncClient", "ChatReply", "Client", "ToolCall"]


def __getattr__(name: str):
    if name in __all__:
        from . import python_client

        return getattr(python_client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
