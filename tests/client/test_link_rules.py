"""The link's timing rules (deadlines, backoff, error classes, its config), as pure functions."""
from __future__ import annotations

import random

import grpc
import pytest

from edgespec.client.link.grpc_transport import (LinkConfig, LinkDownError, ServerRefusedError, SessionLostError,
                                                 backoff_delay, call_metadata, classify_rpc_error, draft_deadline)


def test_draft_deadline_follows_round_trips_within_bounds():
    cfg = LinkConfig("h:1", deadline_factor=4, min_deadline_s=0.5, max_deadline_s=10, rtt_window=3)
    assert draft_deadline([0.01, 0.02], cfg) == 0.5
    assert draft_deadline([0.3, 0.2, 0.1], cfg) == pytest.approx(1.2)
    assert draft_deadline([5.0, 0.1, 0.1, 0.1], cfg) == pytest.approx(0.5)  # only the recent window counts
    assert draft_deadline([9.0], cfg) == 10
    assert draft_deadline([], cfg, fallback_s=1.0) == 4.0



def test_a_larger_tree_than_the_recent_ones_gets_a_deadline_scaled_to_its_size():
    """Plain steps (0 nodes, 0.3 s) then a 16-node tree: on a slow server its verification takes several times
    a decode step, so the deadline scales with the size instead of reading a slow answer as a dead link."""
    cfg = LinkConfig(address="h:1", deadline_factor=4.0, min_deadline_s=0.5, max_deadline_s=30.0)
    plain = [(0, 0.3)] * 8
    assert draft_deadline(plain, cfg, nodes=0) == pytest.approx(1.2)
    assert draft_deadline(plain, cfg, nodes=16) == pytest.approx(4 * 0.3 * 17)  # never sent: by node count
    seen = {0: 0.3, 16: 2.7}  # the last 16-node Draft took 2.7 s
    assert draft_deadline(plain, cfg, nodes=16, latest_by_size=seen) == pytest.approx(4 * 2.7)
    assert draft_deadline([(16, 2.7), (0, 0.5)], cfg, nodes=4, latest_by_size=seen) == pytest.approx(4 * 2.7)

def test_backoff_grows_caps_and_jitters():
    cfg = LinkConfig("h:1", backoff_initial_s=0.1, backoff_multiplier=2, backoff_max_s=1.0, backoff_jitter=0.2)
    rng = random.Random(0)
    delays = [backoff_delay(a, cfg, rng) for a in range(8)]
    for a, d in enumerate(delays):
        base = min(1.0, 0.1 * 2 ** a)
        assert 0.8 * base <= d <= 1.2 * base
    assert len({round(backoff_delay(3, cfg, rng), 6) for _ in range(10)}) > 1  # jitter


class _Err(grpc.RpcError):
    def __init__(self, code):
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "detail"


def test_errors_are_classified():
    assert type(classify_rpc_error(_Err(grpc.StatusCode.UNAVAILABLE))) is LinkDownError
    assert isinstance(classify_rpc_error(_Err(grpc.StatusCode.NOT_FOUND)), SessionLostError)
    refused = classify_rpc_error(_Err(grpc.StatusCode.FAILED_PRECONDITION))
    assert isinstance(refused, ServerRefusedError) and refused.grpc_code == "FAILED_PRECONDITION"


def test_link_config_checks_and_metadata():
    with pytest.raises(ValueError, match="HOST:PORT"):
        LinkConfig("localhost")
    md = call_metadata(LinkConfig("h:1", api_key="k"), "sid")
    assert ("x-edgespec-session", "sid") in md and ("authorization", "Bearer k") in md
