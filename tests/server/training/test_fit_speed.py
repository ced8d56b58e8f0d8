"""`edgespec bench fit-speed`: each recipe's training tokens/s, with the frozen weights cast once and per call."""
from __future__ import annotations

import re


def test_fit_speed_times_each_recipe_in_both_modes(edgespec_in_process, target_dir, store, capsys):
    argv = ["bench", "fit-speed", "--target", str(target_dir), "--features", str(store.path), "--kinds", "eagle,moa",
            "--tli", "1", "--width", "32", "--heads", "4", "--vocab", "0", "--steps", "1", "--warmup", "0",
            "--batch-tokens", "128"]
    assert edgespec_in_process(argv) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if re.match(r"\| (eagle|moa) \|", r)]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert [(c[0], c[1]) for c in cells] == [("eagle", "cast once"), ("eagle", "cast per call"),
                                              ("moa", "cast once"), ("moa", "cast per call")]
    for kind, mode, tokens, seconds, rate, ratio in cells:
        assert int(tokens) >= 128 and float(rate) > 0  # a step trains at least its batch
        assert (ratio == "1.00x") == (mode == "cast per call")


def test_fit_speed_refuses_what_it_cannot_run(edgespec_in_process, target_dir, store, capsys):
    import pytest

    given = ["--target", str(target_dir), "--features", str(store.path)]
    for argv, says in (([*given, "--kinds", ","], "--kinds names no recipe"),
                       ([*given, "--steps", "0"], "--steps must be at least 1"),
                       (["--target", str(target_dir)], "give --tiny, or --target and --features")):
        with pytest.raises(SystemExit):
            edgespec_in_process(["bench", "fit-speed", *argv])
        assert says in capsys.readouterr().err
