"""The bench report's bar plots: grouped by network profile, the tables' aggregates, n and a bootstrap interval."""
from __future__ import annotations

import json

import pytest

from edgespec.netem.bench.plots import bars, grouped_bars
from edgespec.netem.bench.report import write_report

ENV = {"commit": "abc1234", "time": "2026-01-01T00:00:00", "machine": {"cpu": "test cpu", "cores": 2, "gpu": None},
       "settings": {"prompt_sets": ["humaneval"], "limit": 3, "model": "t", "drafter_model": "d",
                    "max_new_tokens": 8}}


def row(profile: str, system: str, tokens: int, wall: float, calls: int = 0, up: int = 0, down: int = 0) -> dict:
    return {"experiment": "link", "set": "humaneval", "prompt_id": f"p{tokens}{wall}", "profile": profile,
            "system": system, "new_tokens": tokens, "wall_s": wall, "calls": calls, "bytes_up": up,
            "bytes_down": down, "env": ENV}


ROWS = ([row("none", "local-only", 10, 1.0), row("none", "local-only", 10, 1.0)]
        + [row("5g", "ngram", t, w, calls=c, up=100, down=50) for t, w, c in ((10, 1.0, 4), (30, 2.0, 6), (5, 2.5, 5))]
        + [row("5g", "plain-api", 10, 2.0, calls=1, up=200, down=900) for _ in range(4)]
        + [row("4g", "ngram", 12, 3.0, calls=3, up=90, down=40)])


def test_bars_are_the_tables_aggregates_with_an_interval_and_n():
    got = {(b.profile, b.system): b for b in bars(ROWS, "tokens_per_s")}
    assert list(dict.fromkeys(p for p, _ in got)) == ["none", "5g", "4g"]  # the order the experiment ran
    ngram = got[("5g", "ngram")]
    assert ngram.value == pytest.approx(45 / 5.5)  # total tokens over total time, as in the tables
    assert ngram.n == 3 and ngram.low < ngram.value < ngram.high  # generations differ: a real interval
    same = got[("5g", "plain-api")]
    assert (same.low, same.value, same.high, same.n) == (5.0, 5.0, 5.0, 4)  # identical generations: no spread
    assert got[("4g", "ngram")].n == 1
    calls = {(b.profile, b.system): b for b in bars(ROWS, "calls_per_100_tokens")}
    assert calls[("5g", "ngram")].value == pytest.approx(100 * 15 / 45)
    per_token = {(b.profile, b.system): b for b in bars(ROWS, "bytes_per_token")}
    assert per_token[("5g", "plain-api")].value == pytest.approx(1100 / 10)
    assert bars(ROWS, "tokens_per_s") == bars(ROWS, "tokens_per_s")  # seeded: the same figure every time


def test_grouped_bars_draw_profiles_error_bars_and_n():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = bars(ROWS, "tokens_per_s")
    fig, ax = plt.subplots()
    grouped_bars(ax, data, "tokens/s")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["none", "5g", "4g"]
    assert len(ax.patches) == len(data) == 4
    assert len(ax.containers) == 2 * len(data)  # each bar comes with its error bar
    assert sorted(t.get_text() for t in ax.texts) == sorted(f"n={b.n}" for b in data)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["local-only", "ngram", "plain-api"]
    plt.close(fig)


def test_report_writes_the_grouped_plots(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "link.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    report = write_report(tmp_path).read_text()
    for png in ("tokens_per_s.png", "calls_per_100_tokens.png", "bytes_per_token.png"):
        assert (tmp_path / png).stat().st_size > 1000 and f"![{png}]({png})" in report


def test_the_link_table_gives_the_share_of_calls_that_were_plain_steps():
    from edgespec.netem.bench.report import link_section

    mixed = [{**row("satellite", "independent", 64, 20.0, calls=20), "plain_steps": 5},
             {**row("satellite", "independent", 64, 20.0, calls=20), "plain_steps": 10},
             row("satellite", "plain-api", 128, 50.0, calls=1)]
    table = link_section(mixed).split("\n\n")[0]
    assert "plain steps / calls" in table.splitlines()[0]
    cells = {line.split(" | ")[1]: line.split(" | ")[-1].rstrip(" |") for line in table.splitlines()[2:]}
    assert cells == {"independent": "0.38", "plain-api": "–"}  # 15 of 40 calls; the plain API has no steps
