"""The README's results come from a report: the splice and the per-set limits."""
import argparse

import pytest

from edgespec.netem.bench.cli import _limits
from edgespec.netem.bench.report import BEGIN, END, splice_readme


def test_splice_replaces_only_the_marked_section_and_links_plots(tmp_path):
    out = tmp_path / "runs" / "bench"
    out.mkdir(parents=True)
    report = out / "report.md"
    report.write_text("# edgespec bench report\n\n## Under emulated networks\n\n`edgespec bench link`\n\n"
                      "| a | b |\n|---|---|\n| 1 | 2 |\n\n## Plots\n\n![tok_s.png](tok_s.png)\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Project\n\nbefore\n{BEGIN}\nold figures\n{END}\nafter\n")
    splice_readme(report, readme)
    text = readme.read_text()
    assert "old figures" not in text and text.startswith("# Project\n\nbefore\n") and text.endswith(f"{END}\nafter\n")
    assert "### Under emulated networks" in text and "| 1 | 2 |" in text and "`edgespec bench link`" in text
    assert "![tok_s.png](runs/bench/tok_s.png)" in text and "# edgespec bench report" not in text
    splice_readme(report, readme)  # again: the same text, not a second copy
    assert readme.read_text() == text


def test_markers_quoted_in_a_sentence_are_not_markers(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# r\n\n## Section\n\nnew figures\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# Project\n\n| `--readme` | between `{BEGIN}` and `{END}` |\n\n{BEGIN}\nold\n{END}\nafter\n")
    splice_readme(report, readme)
    text = readme.read_text()
    assert text.startswith(f"# Project\n\n| `--readme` | between `{BEGIN}` and `{END}` |\n\n{BEGIN}\n")
    assert "new figures" in text and "old" not in text and text.endswith(f"{END}\nafter\n")


def test_splice_refuses_a_readme_without_markers(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("# r\n")
    readme = tmp_path / "README.md"
    readme.write_text("# Project\n")
    with pytest.raises(ValueError, match="edgespec-bench:begin"):
        splice_readme(report, readme)


def test_limits_per_set():
    assert _limits("20") == (20, {})
    assert _limits("humaneval=40,mtbench=20") == (40, {"humaneval": 40, "mtbench": 20})
    with pytest.raises(argparse.ArgumentTypeError, match="SET=N"):
        _limits("humaneval=many")
