"""The drafting-cost micro-benchmark runs end to end (tiny sizes; its figures are what it prints, not asserted)."""
from __future__ import annotations

import pytest

from edgespec.netem.bench.drafter_cost import main


def test_a_level_is_timed_for_every_size_and_dtype(tiny_model_dir, capsys):
    assert main(["--small", str(tiny_model_dir), "--small-dtype", "float32", "--hidden", "64", "--widths", "64",
                 "--vocabs", "300", "--rows", "1,2", "--context", "16", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == [f"small LM {tiny_model_dir} (float32) k=1",
                                                     f"small LM {tiny_model_dir} (float32) k=2",
                                                     "eagle W=64 V=300 k=1", "eagle W=64 V=300 k=2"]
    assert all(all(f"{kind} head" in line for kind in ("float32", "bfloat16", "int_mm", "int8pack")) for line in out[2:])
    with pytest.raises(SystemExit):  # an unknown head is refused, with the list
        main(["--small", "", "--heads", "int4"])
    assert "unknown heads ['int4']; choose from float32,bfloat16,int_mm,int8pack" in capsys.readouterr().err



def test_the_small_lm_is_timed_packed_beside_plain_when_asked(tiny_model_dir, capsys):
    assert main(["--small", str(tiny_model_dir), "--small-dtype", "float32", "--small-packed", "--widths", "",
                 "--rows", "1,4", "--context", "16", "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all("; packed " in line and "x)" in line for line in out)
