"""`edgespec ...` in the test's own process."""
from __future__ import annotations

import pytest


@pytest.fixture
def edgespec_in_process():
    """edgespec_in_process(argv) -> exit status of `edgespec *argv` run in this process; the log handlers the
    command adds to the root logger are taken off again afterwards."""
    import logging

    from edgespec.cli import main

    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield main
    for h in set(root.handlers) - set(before):
        root.removeHandler(h)
        h.close()
    root.setLevel(level)
