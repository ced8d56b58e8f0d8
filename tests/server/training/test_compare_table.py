"""The recipe comparison table: stages summed, each recipe against its base, a router against its drafter."""
import json

import pytest

from edgespec.server.training.compare_table import load_entry, row_of, table


def _card(folder, recipe, steps, mean, at1):
    folder.mkdir(parents=True)
    card = {"kind": recipe.split("+")[0], "recipe": recipe,
            "training": {"steps": steps, "config": {"batch_tokens": 1024}},
            "validation": {"val/chains": 100, "val/mean_accepted": mean, "val/accept@1": at1}}
    (folder / "card.json").write_text(json.dumps(card))
    return str(folder)


def test_table_sums_stages_and_compares_with_the_right_base(tmp_path):
    eagle = _card(tmp_path / "eagle", "eagle", 300, 0.5, 0.4)
    s1 = _card(tmp_path / "hass-s1", "eagle+hass", 240, 0.4, 0.3)
    s2 = _card(tmp_path / "hass", "eagle+hass", 60, 0.62, 0.45)
    router = _card(tmp_path / "hass-router", "eagle+router", 100, 0.5876, 0.44)
    rows = [row_of(*load_entry(e)) for e in
            (f"eagle={eagle}", f"eagle+hass={s1}+{s2}", f"eagle+hass+router={s2}+{router}")]
    assert rows[1]["steps"] == 300 and rows[1]["tokens"] == 300 * 1024
    assert rows[1]["recipe"] == "eagle+hass -> eagle+hass"
    text = table(rows)
    assert "| eagle+hass | eagle+hass -> eagle+hass | 300 | 307,200 | 1.620 | +8.0 % |" in text
    assert "| eagle+hass+router |" in text and "| -2.0 % |" in text  # 1.5876 against eagle+hass's 1.62


def test_an_unfinished_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="has the run"):
        load_entry(f"eagle={tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="NAME=RUN"):
        load_entry("eagle")
