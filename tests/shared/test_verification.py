"""Verification maths on hand-made logits: greedy walk, target shaping, lossless sampling.

Every test runs with the logits on each device (cpu, and cuda where there is one): the server hands
the verifier the target's logits where the model left them.
"""
from __future__ import annotations


import pytest
import torch
from support.stats import chi_square, chi_square_critical

from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.verification import Draws, greedy_verify, sample_token, sample_verify, target_probs, verify_tree

V = 6
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


def one_hot_logits(best: list[int], device: torch.device) -> torch.Tensor:
    logits = torch.zeros(len(best), V, device=device)
    logits[torch.arange(len(best)), torch.tensor(best)] = 5.0
    return logits


def test_greedy_walks_the_argmax_path_through_siblings(device):
    # root -> {0: 3, 1: 2}; node 1 -> {2: 4, 3: 1}; node 3 -> {4: 5}
    tree = DraftTree((3, 2, 4, 1, 5), (ROOT, ROOT, 1, 1, 3))
    # argmax rows: root 2, node0 0, node1 1, node2 0, node3 5, node4 0
    out = greedy_verify(tree, one_hot_logits([2, 0, 1, 0, 5, 0], device))
    assert out.accepted == (1, 3, 4)
    assert out.next_token == 0  # argmax at node 4
    assert out.acceptance_length == 4


def test_greedy_rejects_everything_and_gives_the_root_argmax(device):
    tree = DraftTree((1, 2), (ROOT, 0))
    out = greedy_verify(tree, one_hot_logits([4, 2, 3], device))
    assert out.accepted == () and out.next_token == 4


def test_greedy_with_an_empty_tree_is_one_decode_step(device):
    out = greedy_verify(DraftTree((), ()), one_hot_logits([3], device))
    assert out.accepted == () and out.next_token == 3


def test_target_probs_top_k_and_top_p(device):
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1], device=device))
    probs = target_probs(logits, SamplingSettings(1.0)).cpu()
    assert torch.allclose(probs, torch.tensor([0.5, 0.25, 0.15, 0.1]).double())
    top2 = target_probs(logits, SamplingSettings(1.0, top_k=2)).cpu()
    assert torch.allclose(top2, torch.tensor([2 / 3, 1 / 3, 0, 0]).double())
    # top_p 0.7: 0.5 alone is below 0.7, so 0.25 joins; 0.75 reaches it.
    nucleus = target_probs(logits, SamplingSettings(1.0, top_p=0.7)).cpu()
    assert torch.allclose(nucleus, torch.tensor([2 / 3, 1 / 3, 0, 0]).double())
    hot = target_probs(logits, SamplingSettings(0.0)).cpu()
    assert hot.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_sampling_config_refuses_bad_values():
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(-1.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingSettings(1.0, top_p=1.5)


def test_sampling_output_is_distributed_as_the_target(device):
    """The committed first token follows p at the root, whatever the drafts; the next follows p at that node."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(6, V, generator=gen) * 1.5).to(device)  # [1 + 5 nodes, V]
    # root children: 2, 0, 5 (tried in that order), node 0 (token 2) has children 1, 3
    tree = DraftTree((2, 0, 5, 1, 3), (ROOT, ROOT, ROOT, 0, 0))
    config = SamplingSettings(temperature=0.8)
    probs = target_probs(logits, config)
    trials = 20000
    expected = probs.cpu()
    first = torch.zeros(V)
    second_after_2 = torch.zeros(V)
    for trial in range(trials):  # a seed a trial: a draw is keyed by (seed, position)
        out = sample_verify(tree, probs, Draws(trial), 5)
        committed = [tree.tokens[i] for i in out.accepted] + [out.next_token]
        first[committed[0]] += 1
        if out.accepted[:1] == (0,):
            second_after_2[committed[1]] += 1
    stat, dof = chi_square(first, expected[0])
    assert stat < chi_square_critical(dof), (first / trials, expected[0])
    stat, dof = chi_square(second_after_2, expected[1])
    assert stat < chi_square_critical(dof), (second_after_2 / second_after_2.sum(), expected[1])


def test_sampling_with_top_k_never_leaves_the_kept_set(device):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, V, generator=gen).to(device)
    config = SamplingSettings(temperature=1.0, top_k=2)
    kept = set(torch.topk(logits[0], 2).indices.tolist())
    outside = next(t for t in range(V) if t not in kept)
    tree = DraftTree((outside,), (ROOT,))
    for seed in range(300):
        out = verify_tree(tree, logits, config, Draws(seed), 0)
        assert out.accepted == () and out.next_token in kept and out.recovered


def test_sampling_is_reproducible_with_a_seed(device):
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(2)).to(device)
    tree = DraftTree((1, 2, 3), (ROOT, 0, ROOT))
    config = SamplingSettings(temperature=1.0)
    runs = []
    for _ in range(2):
        draws = Draws(7)
        runs.append([verify_tree(tree, logits, config, draws, position) for position in range(20)])
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # the draws do vary from position to position


def test_a_draw_depends_on_the_seed_and_the_position_alone():
    """The token at a position is the same whether a tree or a plain step draws it, and whatever was drawn
    before: the root row of a tree, a one-row step and a chain all pick it with the same number."""
    probs = torch.softmax(torch.randn(3, V, generator=torch.Generator().manual_seed(4)), -1)
    draws = Draws(11)
    alone = sample_token(probs[0], draws.uniform(40))
    for _ in range(5):  # other positions drawn in between change nothing
        draws.uniform(3)
    tree = DraftTree(((alone + 1) % V, (alone + 2) % V), (ROOT, ROOT))  # neither child is the drawn token
    assert sample_verify(tree, probs, draws, 40) == sample_verify(tree, probs, Draws(11), 40)
    assert sample_verify(tree, probs, draws, 40).next_token == alone
    hit = DraftTree(((alone + 1) % V, alone), (ROOT, ROOT))
    assert sample_verify(hit, probs, draws, 40).accepted == (1,)
    assert Draws(12).uniform(40) != draws.uniform(40) and draws.uniform(41) != draws.uniform(40)


def test_sample_token_never_picks_a_token_of_probability_zero():
    probs = torch.zeros(16)
    probs[[3, 9]] = torch.tensor([0.25, 0.75])
    assert {sample_token(probs, u) for u in (0.0, 0.2499, 0.25, 0.9, 0.999999999999)} == {3, 9}
    assert sample_token(probs, 0.1) == 3 and sample_token(probs, 0.3) == 9
    assert sample_token(probs, 1.0 - 1e-17) == 9  # the top of the range stays on the last kept token
