"""PrefixIndex, the prefix cache's radix tree over token ids, on its own: longest match to the token, entries
only at leaves (a stored prefix of a longer entry is replaced by it), removal that keeps the tree compact."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.server.prefix.index import PrefixIndex


def test_longest_match_is_to_the_token_and_stops_inside_an_edge():
    index = PrefixIndex()
    index.add([1, 2, 3, 4, 5], "a")
    index.add([1, 2, 9], "b")
    assert index.longest([1, 2, 3, 4, 5, 6]) == ("a", 5)
    assert index.longest([1, 2, 3, 7]) == ("a", 3)  # ends inside a's edge
    assert index.longest([1, 2, 9, 9]) == ("b", 3)
    value, n = index.longest([1, 2, 8])
    assert n == 2 and value in ("a", "b")  # both cover [1, 2]
    assert index.longest([7, 1, 2]) == (None, 0)
    assert index.longest([]) == (None, 0)


def test_a_longer_entry_replaces_its_stored_prefix_and_a_prefix_adds_nothing():
    index = PrefixIndex()
    assert index.add([1, 2, 3], "turn 1") == []
    assert index.add([1, 2, 3, 4, 5], "turn 2") == ["turn 1"]  # its rows start with turn 1's
    assert len(index) == 1
    assert index.covering([1, 2, 3]) == "turn 2"
    assert index.covering([1, 2, 3, 4, 5]) == "turn 2"
    assert index.covering([1, 2, 3, 4, 5, 6]) is None
    with pytest.raises(ValueError, match="prefix of stored"):
        index.add([1, 2], "shorter")
    with pytest.raises(KeyError):
        index.remove([1, 2, 3])  # replaced: no longer stored


def test_remove_merges_what_is_left_and_matching_goes_on_working():
    index = PrefixIndex()
    index.add([1, 2, 3], "a")
    index.add([1, 2, 4], "b")
    index.add([1, 5], "c")
    assert index.remove([1, 2, 3]) == "a"
    assert index.longest([1, 2, 3]) == ("b", 2)
    assert index.remove([1, 2, 4]) == "b"
    assert index.longest([1, 2]) == ("c", 1)
    assert index.remove([1, 5]) == "c"
    assert len(index) == 0 and index.longest([1, 5]) == (None, 0)
    index.add([1, 2], "d")  # an emptied tree takes entries again
    assert index.longest([1, 2, 3]) == ("d", 2)


def _model_longest(stored: dict[tuple, str], ids: list[int]) -> int:
    def common(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n
    return max((common(k, ids) for k in stored), default=0)


ids_st = st.lists(st.integers(0, 3), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove"]), ids_st), max_size=30), st.lists(ids_st, max_size=10))
def test_matches_a_plain_list_of_stored_sequences(ops, queries):
    """Against a model: the stored sequences, none a prefix of another; longest = the longest common prefix."""
    index, stored = PrefixIndex(), {}
    for op, ids in ops:
        key = tuple(ids)
        if op == "add":
            if any(k[:len(key)] == key for k in stored):  # a prefix of a stored one (or equal): nothing to add
                assert index.covering(ids) is not None
                continue
            replaced = index.add(ids, key)
            expected = [k for k in stored if key[:len(k)] == k]
            assert replaced == expected
            for k in expected:
                del stored[k]
            stored[key] = key
        elif key in stored:
            assert index.remove(ids) == key
            del stored[key]
        assert len(index) == len(stored)
    for ids in queries:
        value, n = index.longest(ids)
        assert n == _model_longest(stored, ids)
        if n:
            assert value in stored and value[:n] == tuple(ids[:n])
