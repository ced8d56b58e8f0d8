"""The drafting benchmark's own learned drafters: NAME=PATH[:no-router]."""
import pytest

from edgespec.client.bench import parse_learned


def test_learned_pairs_parse_with_the_router_switch():
    got = parse_learned(["eagle-hass=runs/fit8/eagle-hass", "eagle-router-off=runs/fit8/r:no-router"])
    assert got == {"eagle-hass": ("runs/fit8/eagle-hass", True), "eagle-router-off": ("runs/fit8/r", False)}


@pytest.mark.parametrize("bad", ["nopath", "=x", "target=runs/x", "a=x,a=y"])
def test_bad_learned_pairs_are_refused(bad):
    with pytest.raises(ValueError, match="--learned"):
        parse_learned(bad.split(","))
