"""CPU sets: the server and the client of one box on disjoint cores, as two machines would be."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from edgespec.netem.cpus import (NOT_PINNED, CpuSetError, CpuSplit, available_cpus, check_cpus, choose_split,
                                 format_cpus, parse_cpus, pinned, spawning_on)


def test_cpu_lists_parse_as_taskset_writes_them():
    assert parse_cpus("0") == {0}
    assert parse_cpus("0-1") == {0, 1}
    assert parse_cpus("2,3") == {2, 3}
    assert parse_cpus(" 0-2, 5 ") == {0, 1, 2, 5}
    for bad in ("", "a", "1-", "3-1", "0,,1", "-1"):
        with pytest.raises(CpuSetError, match="bad CPU list"):
            parse_cpus(bad)


def test_format_gives_the_shortest_list():
    assert format_cpus(frozenset({0})) == "0"
    assert format_cpus(frozenset({0, 1, 2, 5})) == "0-2,5"
    assert format_cpus(frozenset({3, 1})) == "1,3"
    for text in ("0", "0-3", "1,3-4,9"):
        assert format_cpus(parse_cpus(text)) == text


def test_a_cpu_that_does_not_exist_is_named():
    with pytest.raises(CpuSetError, match="--server-cpus: CPU 7 does not exist here.*available: 0-1"):
        check_cpus(parse_cpus("1,7-8"), "--server-cpus", frozenset({0, 1}))
    with pytest.raises(CpuSetError, match="CPU 4 does not exist"):
        choose_split("4", "0", available=frozenset({0, 1}))


def test_the_default_puts_the_server_on_the_upper_half():
    assert choose_split(available=frozenset({0, 1})) == CpuSplit(frozenset({1}), frozenset({0}))
    assert choose_split(available=frozenset({0, 1, 2, 3})) == CpuSplit(frozenset({2, 3}), frozenset({0, 1}))
    assert choose_split(available=frozenset({0, 1, 2})) == CpuSplit(frozenset({1, 2}), frozenset({0}))
    assert choose_split(available=frozenset({0})) == NOT_PINNED  # one core: nothing to split
    assert choose_split(default_pinned=False, available=frozenset({0, 1})) == NOT_PINNED


def test_one_side_given_leaves_the_rest_to_the_other():
    four = frozenset({0, 1, 2, 3})
    assert choose_split(server="3", available=four) == CpuSplit(frozenset({3}), frozenset({0, 1, 2}))
    assert choose_split(client="0-1", available=four) == CpuSplit(frozenset({2, 3}), frozenset({0, 1}))
    with pytest.raises(CpuSetError, match="leaves no core"):
        choose_split(server="0-3", available=four)


def test_overlapping_sides_are_refused():
    with pytest.raises(CpuSetError, match="share CPU 1"):
        choose_split("1", "0-1", available=frozenset({0, 1}))


def test_the_split_says_where_each_side_runs():
    split = CpuSplit(frozenset({1}), frozenset({0}))
    assert split.describe() == "server on CPU 1 (1 torch threads), client on CPU 0 (1 torch threads)"
    assert split.to_dict() == {"pinned": True, "server": "1", "client": "0", "server_threads": 1,
                               "client_threads": 1}
    assert NOT_PINNED.to_dict() == {"pinned": False} and "not pinned" in NOT_PINNED.describe()


needs_two = pytest.mark.skipif(len(available_cpus()) < 2, reason="needs 2 cores to pin apart")


@needs_two
def test_pinned_moves_every_thread_and_torch_then_puts_them_back():
    import torch

    first = min(available_cpus())
    before, threads = available_cpus(), torch.get_num_threads()
    seen: dict[str, frozenset] = {}
    release = threading.Event()
    ready = threading.Event()

    def older_thread():  # started before the block: it is moved too
        ready.set()
        release.wait()
        seen["older"] = frozenset(os.sched_getaffinity(0))

    t = threading.Thread(target=older_thread)
    t.start()
    ready.wait()
    with pinned(frozenset({first})):
        assert os.sched_getaffinity(0) == {first}
        assert torch.get_num_threads() == 1
        release.set()
        t.join()
    assert seen["older"] == {first}
    assert available_cpus() == before and torch.get_num_threads() == threads


@needs_two
def test_a_process_spawned_on_cores_runs_there_and_the_caller_keeps_its_own():
    last = max(available_cpus())
    before = available_cpus()
    with spawning_on(frozenset({last})):
        proc = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                              capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == f"[{last}]"
    assert available_cpus() == before


def test_none_changes_nothing():
    before = available_cpus()
    with pinned(None), spawning_on(None):
        assert available_cpus() == before
