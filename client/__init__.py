"""edgespec.client: the laptop's side. ``Client`` and ``AsyncClient`` are the text-level Python API
(also at the top: ``edgespec.Client``).

    from edgespec.client import Client
    with Client(server="gpu-box:50051", drafter="ngram") as client:
        print(client.chat([{"role": "user", "content": "Write quicksort in Python"}]))

They are loaded on first use, so `import edgespec.client.cli` (and `edgespec --help`) stays light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from edgespec import lazy_client

if TYPE_CHECKING:
    from .python_client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str):
    return lazy_client(__name__, name)
