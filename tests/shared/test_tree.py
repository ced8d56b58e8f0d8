"""Draft trees: wire round trip, refusals, masks, positions, paths."""
from __future__ import annotations

import tracemalloc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.shared.errors import InvalidTreeError
from support.masks import full_attention_mask

from edgespec.shared.tree import MAX_NODES, ROOT, DraftTree, decode_tree, encode_tree, tree_attention_mask


@st.composite
def trees(draw, max_nodes=MAX_NODES, max_token=(1 << 24) - 1):
    n = draw(st.integers(0, max_nodes))
    tokens = draw(st.lists(st.integers(0, max_token), min_size=n, max_size=n))
    parents = [draw(st.sampled_from([ROOT] + list(range(i)))) for i in range(n)]
    return DraftTree(tuple(tokens), tuple(parents))


@given(trees())
@settings(max_examples=200, deadline=None)
def test_encode_decode_round_trip(tree):
    data = encode_tree(tree)
    assert len(data) == 4 * len(tree)
    assert decode_tree(data) == tree


@given(trees(max_nodes=40))
@settings(max_examples=100, deadline=None)
def test_mask_is_ancestor_relation(tree):
    mask = tree_attention_mask(tree)
    for i in range(len(tree)):
        visible = {j - 1 for j in range(1, len(tree) + 1) if mask[i + 1, j]}
        assert visible == set(tree.ancestors(i))
        assert mask[i + 1, 0]  # every node sees the root
    assert mask[0].tolist() == [True] + [False] * len(tree)


def test_worked_example():
    #        root
    #       /    \
    #     n0(5)  n1(6)
    #     |  \
    #   n2(7) n3(8)
    #     |
    #   n4(9)
    tree = DraftTree((5, 6, 7, 8, 9), (ROOT, ROOT, 0, 0, 2))
    assert encode_tree(tree) == bytes([5, 0, 0, 255, 6, 0, 0, 255, 7, 0, 0, 0, 8, 0, 0, 0, 9, 0, 0, 2])
    assert tree.depths() == [1, 1, 2, 2, 3]
    assert tree.paths() == [[1], [0, 3], [0, 2, 4]]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree_attention_mask(tree), expected)
    full = full_attention_mask(tree, past_len=3)
    assert full.shape == (1, 1, 6, 9)
    assert (full[0, 0, :, :3] == 0).all()
    assert ((full[0, 0, :, 3:] == 0) == expected).all()


def test_chain():
    tree = DraftTree.chain([4, 5, 6])
    assert tree.parents == (ROOT, 0, 1)
    assert tree.paths() == [[0, 1, 2]]
    assert len(DraftTree.chain([])) == 0


def test_big_token_ids_use_three_bytes():
    tree = DraftTree((151_935, (1 << 24) - 1), (ROOT, 0))
    assert decode_tree(encode_tree(tree)) == tree


@pytest.mark.parametrize("data, message", [
    (b"\x01\x00\x00", "truncated"),
    (b"\x01\x00\x00\xff\x02\x00\x00\x01", "parent 1 does not come before"),
    (b"\x01\x00\x00\x00", "parent 0 does not come before"),
    (bytes(4) * 256, "256 nodes; the limit is 255"),
    (b"\x40\x01\x00\xff", "token id 320 is outside the vocabulary"),
])
def test_refused_wire_inputs(data, message):
    with pytest.raises(InvalidTreeError, match=message):
        decode_tree(data, vocab_size=320)


def test_refused_trees():
    with pytest.raises(InvalidTreeError, match="3 tokens but 2 parents"):
        DraftTree((1, 2, 3), (ROOT, 0)).validate()
    with pytest.raises(InvalidTreeError, match="the limit is 16"):
        DraftTree.chain(range(17)).validate(max_nodes=16)
    with pytest.raises(InvalidTreeError, match="outside the vocabulary"):
        encode_tree(DraftTree((1 << 24,), (ROOT,)))
    with pytest.raises(InvalidTreeError, match="outside the vocabulary"):
        DraftTree((-1,), (ROOT,)).validate()


def test_a_huge_input_is_refused_by_its_length_before_any_node_is_parsed():
    data = bytes(4) * (1 << 24)  # 64 MiB: 16M nodes claimed
    tracemalloc.start()
    try:
        with pytest.raises(InvalidTreeError, match="16777216 nodes; the limit is 255"):
            decode_tree(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10  # no per-node list was built
