"""token_logprobs: the chosen tokens' log-probabilities and the most likely ones, from the rows they came from."""
from __future__ import annotations

import math

import pytest
import torch

from edgespec.shared.logprobs import token_logprobs


def test_each_token_is_read_from_its_own_row():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    a, b = token_logprobs(logits, [2, 1], top=2)
    z0, z1 = math.log(1 + math.e + math.e ** 2), math.log(math.e ** 3 + 2)
    assert a.logprob == pytest.approx(2 - z0) and b.logprob == pytest.approx(0 - z1)
    assert [t for t, _ in a.top] == [2, 1] and a.top[0][1] == pytest.approx(a.logprob)
    assert b.top[0] == (0, pytest.approx(3 - z1))


def test_no_alternatives_when_top_is_zero_and_at_most_the_vocabulary():
    logits = torch.randn(4, 5)
    assert all(t.top == () for t in token_logprobs(logits, [0, 1, 2, 3], top=0))
    assert all(len(t.top) == 5 for t in token_logprobs(logits, [0, 1, 2, 3], top=20))


def test_low_precision_rows_are_scored_in_float32():
    logits = torch.randn(3, 50, dtype=torch.float64)
    want = torch.log_softmax(logits.float(), -1)
    got = token_logprobs(logits.bfloat16(), [7, 8, 9], top=0)
    assert [g.logprob for g in got] == pytest.approx([float(want[i, t]) for i, t in enumerate([7, 8, 9])], abs=0.1)


def test_rows_and_tokens_must_pair_up():
    with pytest.raises(ValueError, match="2 rows of logits for 3 tokens"):
        token_logprobs(torch.zeros(2, 4), [0, 1, 2], top=1)
    assert token_logprobs(torch.zeros(0, 4), [], top=1) == ()
