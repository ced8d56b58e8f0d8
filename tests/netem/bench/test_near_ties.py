"""Finding where an uncut speculative answer parts from the target's own."""
from edgespec.netem.bench.near_ties import Divergence, divergences, first_difference


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # one answer goes on


def test_divergences_compare_uncut_answers_with_the_target_only():
    rows = [
        {"prompt_id": "HumanEval/0", "system": "target", "cut_after": None, "text": "return x"},
        {"prompt_id": "HumanEval/0", "system": "independent", "cut_after": None, "text": "result x"},
        {"prompt_id": "HumanEval/0", "system": "independent", "cut_after": 10, "text": "zzz"},  # a cut: offline text
        {"prompt_id": "HumanEval/1", "system": "target", "cut_after": None, "text": "same"},
        {"prompt_id": "HumanEval/1", "system": "independent", "cut_after": None, "text": "same"},
        {"prompt_id": "HumanEval/2", "system": "independent", "cut_after": None, "text": "no reference"},
    ]
    found = divergences(rows, lambda text: [ord(c) for c in text])
    assert found == [Divergence("HumanEval/0", 2, ord("t"), ord("s"))]
