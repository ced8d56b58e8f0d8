"""edgespec: client-server speculative decoding for edge devices.

This file is the ``edgespec`` package itself: the fixed layout has no
``edgespec/`` folder, so pyproject maps the name here, and each top-level
folder installs as its sub-package (``edgespec.client``, ``edgespec.server``,
...). It gives the text-level Python client at the top, loaded on first use so
that importing any sub-package stays light:

    import edgespec
    with edgespec.Client(server="gpu-box:50051", drafter="ngram") as client:
        print(client.chat([{"role": "user", "content": "Write quicksort in Python"}]))
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgespec.client.python_client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]


def lazy_client(module: str, name: str):
    """``Client`` or ``AsyncClient``, imported on first use: the module ``__getattr__`` of ``edgespec`` and of
    ``edgespec.client``."""
    if name in __all__:
        from edgespec.client import python_client

        return getattr(python_client, name)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name: str):
    return lazy_client(__name__, name)
