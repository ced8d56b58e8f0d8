"""No deprecated transformers argument on any path that hands a model its KV cache.

transformers 5.24 warns (through its logger, once per process, and the warning reaches the
JSON logs) on ``past_key_values=`` and removes it in 5.40. Each path runs here with Python
warnings as errors and transformers' once-only log cache cleared, so a warning fails the test
whichever test ran first.
"""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.server.engine.choice import build_engine
from edgespec.server.scheduler import ModelScheduler
from edgespec.server.session import VerifierSession
from edgespec.shared.session_settings import SessionSettings
from edgespec.server.target import TargetModel
from edgespec.shared.drafters.blocks import causal_mask
from edgespec.shared.drafters.target_parts import TargetParts
from edgespec.shared.models.cache_arg import cache_kwarg, output_cache
from edgespec.shared.models.loading import load_model
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import ROOT, DraftTree


@pytest.fixture
def strict(caplog):
    """Warnings raise; transformers' log records are collected (its warning_once cache cleared first)."""
    logging.Logger.warning_once.cache_clear()  # transformers adds this cached method to every Logger
    caplog.set_level(logging.WARNING, logger="transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield caplog
    deprecated = [r.getMessage() for r in caplog.records if "deprecat" in r.getMessage().lower()]
    assert not deprecated, deprecated


@pytest.fixture(scope="module")
def target(tiny_model_dir) -> TargetModel:
    return TargetModel(load_model(str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.mark.parametrize("engine", ["generic", "batched"])
def test_a_verification_uses_no_deprecated_argument(strict, target, engine):
    scheduler = ModelScheduler(build_engine(target, engine))
    session = VerifierSession(SessionSettings("s", SamplingSettings(), 0), target, scheduler, max_context_tokens=128)
    session.open([1, 2, 3, 4, 5], None)
    session.verify(1, len(session.committed), DraftTree((7, 8, 9), (ROOT, 0, 0)))
    assert len(session.committed) >= 7


def test_the_independent_drafter_uses_no_deprecated_argument(strict, tiny_model):
    drafter = IndependentDrafter.from_model(tiny_model, IndependentConfig(int8_weights=False))
    tree = drafter.propose(DraftRequest(committed=[1, 2, 3, 4], max_nodes=8, max_depth=4))
    assert len(tree) > 0


def test_target_layers_and_the_returned_cache_use_no_deprecated_argument(strict, target):
    parts = TargetParts(target.model, tli=2, dtype=torch.float32)
    x = torch.randn(6, target.hidden_size)
    out, kv = parts.run_layers(x, torch.arange(6), causal_mask(6))
    assert out.shape == (6, target.hidden_size) and len(kv) == 2
    with torch.no_grad():
        returned = output_cache(target.model.model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True))
    assert returned.get_seq_length() == 3


def test_the_cache_argument_is_the_name_the_installed_transformers_takes(target):
    import inspect

    params = inspect.signature(type(target.model.model).forward).parameters
    assert cache_kwarg(target.model.model) in params
