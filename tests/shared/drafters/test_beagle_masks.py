"""Beagle's masks on a short sequence, written out by hand (the cases the paper draws):
the diagonal-masked cross-attention, the early stage's inverse block attention, the late
stage's simulated drafting (keys [target ; previous step]) and its weights beta = k - i + 1."""
from __future__ import annotations

import pytest
import torch

from edgespec.shared.drafters.beagle.masks import (block_starts, chain_mask, cross_mask, inverse_block_mask,
                                                   late_step_weights, simulated_mask)


def rows(*lines: str) -> torch.Tensor:
    return torch.tensor([[c == "1" for c in line.replace(" ", "").replace("|", "")] for line in lines])


def test_cross_attention_masks_the_diagonal():
    # query t (token c_t) predicts h_t: it sees the states of positions before it, never its own
    assert torch.equal(cross_mask(5), rows("00000",
                                           "10000",
                                           "11000",
                                           "11100",
                                           "11110"))


def test_block_starts_cut_blocks_of_k_at_the_offset():
    assert block_starts(8, 3, 0).tolist() == [0, 0, 0, 3, 3, 3, 6, 6]
    assert block_starts(8, 3, 1).tolist() == [0, 1, 1, 1, 4, 4, 4, 7]
    assert block_starts(8, 3, 2).tolist() == [0, 0, 2, 2, 2, 5, 5, 5]


def test_inverse_block_attention_hides_each_blocks_own_keys():
    # k = 3, offset 1: blocks [0], [1 2 3], [4 5]. Queries 1, 2, 3 all see only h_0 and predict
    # h_1, h_2, h_3: one, two and three tokens past the last visible state.
    assert torch.equal(inverse_block_mask(6, 3, 1), rows("000000",
                                                         "100000",
                                                         "100000",
                                                         "100000",
                                                         "111100",
                                                         "111100"))
    # k = 2, offset 0: blocks [0 1], [2 3], [4 5]
    assert torch.equal(inverse_block_mask(6, 2, 0), rows("000000",
                                                         "000000",
                                                         "110000",
                                                         "110000",
                                                         "111100",
                                                         "111100"))


def test_block_of_one_is_plain_cross_attention():
    assert torch.equal(inverse_block_mask(7, 1, 0), cross_mask(7))


def test_simulated_step_sees_its_blocks_predicted_states_before_itself():
    # keys: [target h_0..h_5 | previous step's predictions p_0..p_5]; k = 3, offset 1
    assert torch.equal(simulated_mask(6, 3, 1), rows("000000 | 000000",
                                                     "100000 | 000000",
                                                     "100000 | 010000",
                                                     "100000 | 011000",
                                                     "111100 | 000000",
                                                     "111100 | 000010"))


def test_simulated_mask_sees_every_earlier_position_exactly_once_and_never_the_diagonal():
    for n, k, off in [(9, 4, 0), (9, 4, 3), (10, 3, 2), (5, 1, 0)]:
        m = simulated_mask(n, k, off)
        target, own = m[:, :n].int(), m[:, n:].int()
        assert torch.equal(target + own, cross_mask(n).int())  # each j < t once: the target's or a prediction


def test_late_weights_are_k_minus_i_plus_1_on_positions_new_at_step_i():
    # k = 3, offset 1: place in block j = [1, 1, 2, 3, 1, 2]
    assert late_step_weights(6, 3, 1, 1).tolist() == [3, 3, 3, 3, 3, 3]
    assert late_step_weights(6, 3, 1, 2).tolist() == [0, 0, 2, 2, 0, 2]
    assert late_step_weights(6, 3, 1, 3).tolist() == [0, 0, 0, 1, 0, 0]


def test_chain_mask_sees_the_targets_states_before_the_root_and_its_own_chain():
    # keys: [target h_0..h_3 | step-1 predictions | step-2 predictions]; chain rooted at r, step 3
    assert torch.equal(chain_mask(4, 3), rows("0000 | 1000 | 1000",
                                              "1000 | 0100 | 0100",
                                              "1100 | 0010 | 0010",
                                              "1110 | 0001 | 0001"))
    assert torch.equal(chain_mask(4, 1), cross_mask(4))


@pytest.mark.parametrize("call", [lambda: block_starts(4, 0, 0), lambda: inverse_block_mask(4, 3, 3),
                                  lambda: late_step_weights(4, 3, 0, 4), lambda: chain_mask(4, 0)])
def test_bad_arguments_are_refused(call):
    with pytest.raises(ValueError):
        call()
