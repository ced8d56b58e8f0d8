"""edgespec: client-server speculative decoding for edge devices.

This file is the ``edgespec`` package itself: the fixed layout has no
``edgespec/`` folder, so pyproject maps the name here, and each top-level
folder installs as its sub-package (``edgespec.client``, ``edgespec.server``,
...). It gives the text-level Python client at the top (``edgespec.Client``; its use:
``edgespec.client.python_client``), loaded on first use so that importing any sub-package stays light.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgespec.client.python_client import AsyncClient, Client

from edgespec.shared import __version__  # the one version string (pyproject's, checked by a test)

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str):
    if name in __all__:  # the client's own module __getattr__ loads it on first use
        import edgespec.client

        return getattr(edgespec.client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
