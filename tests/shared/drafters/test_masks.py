"""The drafters' masks as pure functions."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.shared.drafters.blocks import bounded_mask, causal_mask, mixed_kv_mask, step_bounds, unrolled_mask


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 80), T=st.integers(1, 16), offset=st.integers(0, 20))
def test_step_bound_keeps_every_query_between_1_and_T_tokens_past_its_features(n, T, offset):
    b = step_bounds(n, T, offset)
    i = torch.arange(n)
    after = i >= offset
    lag = i - b
    assert (lag[after] >= 1).all() and (lag[after] <= T).all()
    assert (b[~after] == -1).all()
    # Queries of one segment share their bound, and the first of each segment sees up to i - 1.
    starts = i[after & ((i - offset) % T == 0)]
    assert (b[starts] == starts - 1).all()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 60), T=st.integers(5, 15), offset=st.integers(0, 15))
def test_cross_attention_never_sees_past_its_bound(n, T, offset):
    b = step_bounds(n, T, offset)
    m = bounded_mask(b, n)
    for i in range(n):
        visible = torch.nonzero(m[i]).flatten()
        assert visible.numel() == b[i] + 1
        assert (visible <= b[i]).all() and (visible < i).all()


def test_mixed_kv_mask_splits_target_and_own_keys_at_the_bound():
    b = step_bounds(10, 4, 1)
    m = mixed_kv_mask(b)
    assert m.shape == (10, 20)
    for i in range(10):
        true_vis = torch.nonzero(m[i, :10]).flatten().tolist()
        own_vis = torch.nonzero(m[i, 10:]).flatten().tolist()
        assert true_vis == list(range(b[i] + 1))
        assert own_vis == list(range(b[i] + 1, i + 1))  # each position once: target's or own


def test_unrolled_mask_sees_teacher_prefix_and_own_chain():
    m = unrolled_mask(5, 3)
    assert m.shape == (5, 15)
    assert torch.equal(m[:, :5], causal_mask(5))
    assert torch.equal(m[:, 5:10], torch.eye(5, dtype=torch.bool))
    assert torch.equal(m[:, 10:], torch.eye(5, dtype=torch.bool))
    with pytest.raises(ValueError):
        unrolled_mask(5, 1)

