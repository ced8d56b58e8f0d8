"""Fixtures every test area may use: tiny random models, on disk and in memory, and the shared test
support (tests/support/: servers, clients, relays, Session streams, trained drafters, the CLI).

Each area keeps what only it needs in its own folder's conftest.py (tests/server, tests/client, ...).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# tests/support is imported as `support` by the conftests and tests (pytest runs in importlib mode, which
# puts no test folder on sys.path).
sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ["support.clients", "support.drafters", "support.cli"]

# Two cores on CI: one intra-op thread per test process keeps runs predictable
# when several processes (server, client, relay) share the machine.
torch.set_num_threads(max(1, int(os.environ.get("EDGESPEC_TEST_THREADS", "1"))))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 model + tokenizer saved as a Hugging Face directory (seed 0)."""
    from edgespec.shared.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-target"))


@pytest.fixture(scope="session")
def tiny_drafter_dir(tmp_path_factory):
    """A second tiny model of the same tokenizer, different weights (seed 1): a small drafter."""
    from edgespec.shared.models.tiny import TinyConfig, save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-drafter"), TinyConfig(seed=1))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from edgespec.shared.models.tiny import tiny_tokenizer as make

    return make()


@pytest.fixture(scope="session")
def tiny_model():
    from edgespec.shared.models.tiny import tiny_model as make

    return make()


def pytest_collection_modifyitems(config, items):
    """Tests marked `models` need prepared real models; skip them with the reason when absent."""
    from edgespec.shared.models.prepare import is_prepared
    from edgespec.shared.models.registry import REGISTRY

    missing = [name for name in REGISTRY if not is_prepared(name)]
    if not missing:
        return
    skip = pytest.mark.skip(reason=f"real models not prepared ({', '.join(missing)}): run "
                                   f"`edgespec models prepare {' '.join(missing)}`")
    for item in items:
        if "models" in item.keywords:
            item.add_marker(skip)
