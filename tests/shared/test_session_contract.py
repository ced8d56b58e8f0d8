"""The session contract (``shared.session_contract``): sampling settings refused where they are built, with
a message naming the field and the value; and each concept of the contract defined once in the package
(checked on the source: one class each, the wire's numbers written out only where they are named)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import edgespec.client
import edgespec.netem
import edgespec.server
import edgespec.shared
from edgespec.client.loop.generation import GenerationConfig
from edgespec.shared.openai.requests import CompletionRequest
from edgespec.shared.session_contract import SamplingSettings, ServerTimings

PACKAGES = [Path(p.__file__).parent for p in (edgespec.client, edgespec.server, edgespec.shared, edgespec.netem)]
SOURCES = {path: ast.parse(path.read_text(), str(path)) for root in PACKAGES for path in sorted(root.rglob("*.py"))}


@pytest.mark.parametrize("field,value,says", [
    ("temperature", -0.5, "temperature must be >= 0 (0 = greedy), got -0.5"),
    ("temperature", "0.7", "temperature must be a number, got '0.7'"),
    ("top_p", 2, "top_p must be in [0, 1], got 2"),
    ("top_p", float("nan"), "top_p must be a number, got nan"),
    ("top_k", -1, "top_k must be >= 0 (0 = off), got -1"),
    ("top_k", 2.5, "top_k must be a whole number, got 2.5"),
    ("min_p", 1.5, "min_p must be in [0, 1], got 1.5"),
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3"),
    ("repetition_penalty", 0, "repetition_penalty must be > 0 (1 = off), got 0"),
    ("logit_bias", ((-4, 1.0),), "logit_bias keys must be token ids (whole numbers >= 0), got -4"),
])
def test_a_bad_setting_is_refused_naming_the_field_and_the_value(field, value, says):
    with pytest.raises(ValueError) as err:
        SamplingSettings(**{field: value})
    assert str(err.value) == says
    with pytest.raises(ValueError, match=field):  # the client's config cannot hold one either
        GenerationConfig(sampling=SamplingSettings(**{field: value}))


def test_a_seed_the_wire_cannot_carry_is_refused_on_the_client():
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        GenerationConfig(seed=-1)


def test_logit_bias_is_clamped_and_sorted_and_the_defaults_are_greedy_with_nothing_applied():
    s = SamplingSettings(temperature=0.5, logit_bias=((9, -300.0), (2, 0.5)))
    assert s.logit_bias == ((2, 0.5), (9, -100.0)) and s.penalized and not s.greedy
    assert SamplingSettings().greedy and not SamplingSettings().penalized
    with pytest.raises(ValueError, match=r"logit_bias names token id 9, outside the vocabulary \[0, 8\)"):
        s.check_vocab(8)


def test_the_openai_layer_builds_the_same_settings():
    """OpenAI's defaults (temperature 1) and clamp (logit_bias to +-100), in the one type."""
    body = CompletionRequest(prompt="x", top_p=0.5, top_k=-1, logit_bias={"7": 300.0}, presence_penalty=1.0)
    assert body.settings().sampling == SamplingSettings(1.0, 0.5, 0, presence_penalty=1.0, logit_bias=((7, 100.0),))


def test_server_timings_read_from_anything_with_their_fields():
    class Message:  # the wire's Timings has the same fields
        queue_ns, forward_ns, verify_ns, encode_ns, total_ns, row_cost_ns, sharing = 1, 2, 3, 4, 10, 5, 2.5

    assert ServerTimings.of(Message()) == ServerTimings(1, 2, 3, 4, 10, 5, 2.5)
    from edgespec.proto.edgespec.v1 import pb

    assert ServerTimings.of(pb.Timings(total_ns=7, sharing=3.0)) == ServerTimings(total_ns=7, sharing=3.0)


# --------------------------------------------------------------------------- one home each, on the source
def dataclass_fields(tree: ast.Module) -> dict[str, set[str]]:
    """Each @dataclass in a module: its name -> the names of the fields it declares."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                              and isinstance(s.target, ast.Name)}
    return out


def definitions(sources: dict[Path, ast.Module], marks: set[str]) -> list[str]:
    """The dataclasses that declare two or more of `marks` as fields, as module:Class (one alone can be another
    concept's: an InfoNCE temperature, a cost curve's total_ns)."""
    return [f"{path.parent.name}/{path.name}:{name}" for path, tree in sources.items()
            for name, fields in dataclass_fields(tree).items() if len(fields & marks) >= 2]


SAMPLING_MARKS = {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "logit_bias"}
TIMING_MARKS = {"verify_ns", "encode_ns", "total_ns"}  # a forward's own output carries queue_ns and forward_ns
SESSION_MARKS = {"session_id", "sampling", "features", "tokenizer_fingerprint", "prompt_len"}


@pytest.mark.parametrize("marks,home", [(SAMPLING_MARKS, "shared/session_contract.py:SamplingSettings"),
                                        (TIMING_MARKS, "shared/session_contract.py:ServerTimings"),
                                        (SESSION_MARKS, "shared/session_settings.py:SessionSettings")],
                         ids=["sampling settings", "server timings", "session settings"])
def test_each_concept_has_one_class(marks, home):
    assert definitions(SOURCES, marks) == [home]


def literal_places(sources: dict[Path, ast.Module], wanted) -> list[str]:
    return sorted(f"{path.parent.name}/{path.name}:{node.lineno}" for path, tree in sources.items()
                  for node in ast.walk(tree) if wanted(node))


def is_255(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == 255


def is_64_mib(node: ast.AST) -> bool:
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.LShift)
            and [ast.unparse(node.left), ast.unparse(node.right)] == ["64", "20"])


def test_the_wires_numbers_are_written_out_only_where_they_are_named():
    assert [p.split(":")[0] for p in literal_places(SOURCES, is_255)] == ["shared/wire.py"]  # ROOT
    assert [p.split(":")[0] for p in literal_places(SOURCES, is_64_mib)] == ["shared/wire.py"]


WIRE_LIMITS = {"ROOT", "MAX_NODES", "NODE_BYTES", "MAX_TOKEN_ID", "MAX_ELEMENTS", "MAX_SESSION_ID_CHARS",
               "MAX_DETAILS_BYTES", "ID_BYTES", "MESSAGE_SLACK_BYTES", "MAX_TOP_LOGPROBS", "MAX_DECODE_AHEAD",
               "DEFAULT_MAX_MESSAGE_BYTES", "DEFAULT_MAX_BODY_BYTES"}


def assigns_a_limit(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in WIRE_LIMITS for t in node.targets)


def test_every_wire_limit_is_set_in_one_module():
    assert {p.split(":")[0] for p in literal_places(SOURCES, assigns_a_limit)} == {"shared/wire.py"}


def test_the_checks_see_copies():
    """The scans find what they look for: a second settings class and the literals, as the tree had them."""
    copy = ast.parse("from dataclasses import dataclass\n@dataclass(frozen=True)\nclass Sampling:\n"
                     "    temperature: float = 1.0\n    top_p: float = 1.0\n"
                     "@dataclass\nclass Timings:\n    verify_ns: int = 0\n    total_ns: int = 0\n"
                     "MAX = min(n, 255)\nLIMIT = 64 << 20\n")
    sources = {Path("server/copy.py"): copy}
    assert definitions(sources, SAMPLING_MARKS) == ["server/copy.py:Sampling"]
    assert definitions(sources, TIMING_MARKS) == ["server/copy.py:Timings"]
    assert literal_places(sources, is_255) == ["server/copy.py:10"]
    assert literal_places(sources, is_64_mib) == ["server/copy.py:11"]
    assert literal_places({Path("server/copy.py"): ast.parse("MAX_NODES = 255\n")}, assigns_a_limit) == \
        ["server/copy.py:1"]
