"""`edgespec bench drafting`: its own learned drafters (NAME=PATH[:no-router][:float32]), the tree shape and what a
run records of its arguments, the summary table."""
import pytest

from edgespec.netem.bench.drafting import parse_learned


def test_learned_pairs_parse_with_the_router_switch_and_a_dtype():
    got = parse_learned(["eagle-hass=runs/fit8/eagle-hass", "eagle-router-off=runs/fit8/r:no-router",
                         "f32=runs/a:b/e:float32", "both=runs/e:bfloat16:no-router"])
    assert got == {"eagle-hass": ("runs/fit8/eagle-hass", True, None), "eagle-router-off": ("runs/fit8/r", False, None),
                   "f32": ("runs/a:b/e", True, "float32"), "both": ("runs/e", False, "bfloat16")}


@pytest.mark.parametrize("bad", ["nopath", "=x", "target=runs/x", "a=x,a=y", "a=x:float32:bfloat16"])
def test_bad_learned_pairs_are_refused(bad):
    with pytest.raises(ValueError, match="--learned"):
        parse_learned(bad.split(","))


def _run(method, tokens, seconds, forwards, accepted=()):
    from edgespec.netem.bench.drafting import Run
    from edgespec.shared.metrics import GenerationMetrics

    if not accepted:
        return Run(method, "p0", tokens, seconds, forwards, True)
    metrics = GenerationMetrics(draft_s=0.2, verify_s=0.4, bytes_up=100, bytes_down=20, draft_ahead_s=0.15,
                                saved_s=0.05)
    for n in accepted:  # one verified tree of 8 nodes, n of them accepted
        metrics.observe_draft(8, n)
    return Run(method, "p0", tokens, seconds, forwards, True, metrics)


def test_summary_keeps_learned_drafters_and_reports_per_position_acceptance():
    from edgespec.netem.bench.drafting import summarize, table

    runs = [_run("eagle-hass", 10, 2.0, 5, (2, 2, 1, 1)),
            _run("target", 10, 5.0, 10),
            _run("eagle-hass", 10, 2.0, 5, (3, 1, 1, 0))]
    s = summarize(runs)
    assert list(s) == ["target", "eagle-hass"]
    row = s["eagle-hass"]
    assert row["speedup"] == 2.5
    assert row["accept_at"] == [0.875, 0.375, 0.125]  # accepted at depth k over 8 trees
    assert row["draft_ms_per_tree"] == 50.0
    assert row["own_draft_ms_per_tree"] == 25.0  # (0.4 s - 0.3 s ahead + 0.1 s of it for hits) over 8 trees
    assert "accept_at" not in s["target"]
    text = table(s)
    assert "| eagle-hass | 5.00 | 2.50x |" in text and "0.88 / 0.38 / 0.12 | 25 / 50 |" in text


def test_the_tree_shape_defaults_to_the_clients_and_a_run_records_the_shape_it_used():
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.netem.bench.drafting import recorded, tree_shape
    from edgespec.cli import build_parser

    args = build_parser().parse_args(["bench", "drafting", "--tree-min-prob", "0.35", "--methods", "target"])
    assert tree_shape(args) == TreeShape(min_prob=0.35)
    kept = recorded(args)
    assert kept["tree_min_prob"] == 0.35 and kept["tree_branch"] == TreeShape().branch
    assert kept["methods"] == "target" and "func" not in kept and "parser" not in kept


def test_each_method_names_its_drafter_for_the_factory(tmp_path):
    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.netem.bench.drafting import method_options
    from edgespec.shared.drafters.checkpoint import resolve_checkpoint

    tree, moa = TreeShape(), str(resolve_checkpoint("moa-tli1"))
    got = {m: method_options(m, "target", "small", tree, None, {"mine": (moa, False, "float32")})
           for m in ("independent", "eagle", "moa-tli0", "mine")}
    assert (got["independent"].model, got["independent"].checkpoint, got["independent"].tree) == ("small", None, tree)
    assert (got["eagle"].checkpoint, got["eagle"].target, got["eagle"].moa_server_part) == ("eagle", "target", None)
    assert (got["moa-tli0"].name, got["moa-tli0"].moa_server_part) == ("moa-tli0", "moa-tli0")  # the server part's name
    assert (got["mine"].name, got["mine"].checkpoint, got["mine"].router, got["mine"].moa_server_part) == \
        ("moa", moa, False, "mine")  # a --learned one: its kind, its path, its router switch, its own name
    assert got["mine"].dtype == "float32" and got["eagle"].dtype is None  # None: the client's default
    assert method_options("eagle", "t", "s", tree, str(tmp_path), {}).checkpoint == str(tmp_path / "eagle")


def test_a_systems_tree_shape_rides_in_its_name():
    """`bench link --drafters independent:2x6x8@0.1@pipelined,independent`: fixed shapes beside --tree auto."""
    import argparse

    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.netem.bench.systems import drafter_shape

    assert drafter_shape("independent:2x6x8@0.1") == {"name": "independent",
                                                       "tree": TreeShape(2, 6, 8, 0.1)}
    assert drafter_shape("independent") == {"name": "independent"}
    with pytest.raises(argparse.ArgumentTypeError, match="BxDxM"):
        drafter_shape("independent:big")


def test_a_systems_drafter_weights_ride_in_its_name():
    """`--drafters independent+int8@serial,independent`: the int8 drafter beside the default one."""
    import argparse

    from edgespec.client.drafters.tree_builder import TreeShape
    from edgespec.netem.bench.loop_modes import loop_mode
    from edgespec.netem.bench.systems import drafter_shape

    name, _ = loop_mode("independent+int8:2x6x8@0.1@serial")
    assert drafter_shape(name) == {"name": "independent", "weights": "int8", "tree": TreeShape(2, 6, 8, 0.1)}
    assert drafter_shape("independent+int4-mlp") == {"name": "independent", "weights": "int4-mlp"}
    with pytest.raises(argparse.ArgumentTypeError, match="int4-mlp, int8, float"):
        drafter_shape("independent+int3")


def test_prompt_lookup_merged_in_rides_in_a_systems_name_beside_its_weights():
    """`--drafters eagle+ngram,independent+int8+ngram`: NAME+ngram is the factory's name; weights stay apart."""
    import argparse

    from edgespec.netem.bench.systems import drafter_shape

    assert drafter_shape("eagle+ngram") == {"name": "eagle+ngram"}
    assert drafter_shape("independent+int8+ngram") == drafter_shape("independent+ngram+int8") == {
        "name": "independent+ngram", "weights": "int8"}
    with pytest.raises(argparse.ArgumentTypeError, match="unknown weights 'int8\\+float'"):
        drafter_shape("independent+int8+float")


def test_a_systems_draft_vocabulary_rides_in_its_name():
    """`--drafters independent,independent~64k`: the drafter over the 65,536 most frequent ids beside the default."""
    import argparse

    from edgespec.netem.bench.systems import drafter_shape

    assert drafter_shape("independent~64k") == {"name": "independent", "draft_vocab": 65536}
    assert drafter_shape("independent+int8~full:2x6x8")["draft_vocab"] == 0
    assert drafter_shape("independent~32768")["draft_vocab"] == 32768
    assert "draft_vocab" not in drafter_shape("independent+int8")
    for bad in ("independent~", "independent~6x", "independent~-5"):
        with pytest.raises(argparse.ArgumentTypeError, match="not a count, 64k or full"):
            drafter_shape(bad)
    assert drafter_shape("independent+int8~64k+ctx") == {"name": "independent", "weights": "int8",
                                                         "draft_vocab": 65536, "context_vocab": True}
    assert drafter_shape("independent~64k+noctx")["context_vocab"] is False
    assert "context_vocab" not in drafter_shape("independent~64k")
    with pytest.raises(argparse.ArgumentTypeError, match="only \\+ctx .* or \\+noctx"):
        drafter_shape("independent~64k+prompt")
