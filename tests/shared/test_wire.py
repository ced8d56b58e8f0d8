"""Every wire name and number the code writes (``shared.wire``) equals the ``.proto``'s."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared import wire
from edgespec.shared.auth import api_key_problem
from edgespec.shared.codec import Codec

PROTO = (Path(pb.__file__).parent / "edgespec.proto").read_text()


@pytest.mark.parametrize("enum, wire_enum, prefix", [
    (wire.ResumePolicy, pb.ResumePolicy, "RESUME_POLICY_"),
    (wire.FeatureKind, pb.FeatureKind, "FEATURE_KIND_"),
    (Codec, pb.Codec, "CODEC_"),
])
def test_enums_have_the_protos_names_and_numbers(enum, wire_enum, prefix):
    ours = {prefix + member.name: member.value for member in enum}
    theirs = dict(wire_enum.items())
    theirs.pop("CODEC_UNSPECIFIED", None)  # proto3's zero default, which no codec is
    assert ours == theirs


def test_feature_names_are_the_ones_the_proto_lists():
    comment = re.search(r'/// What the tensor is: (.*)\n\s*string name = 1;', PROTO).group(1)
    assert tuple(re.findall(r'"(\w+)"', comment)) == wire.FEATURE_NAMES
    assert (wire.HIDDEN, wire.LSA, wire.TLI_K, wire.TLI_V) == wire.FEATURE_NAMES


def test_session_metadata_key_is_the_protos():
    assert f'call metadata "{wire.SESSION_METADATA_KEY}"' in PROTO


def test_the_api_key_metadata_key_is_what_the_server_reads():
    assert api_key_problem({wire.API_KEY_METADATA_KEY: "Bearer k"}, "k") is None
    assert api_key_problem({wire.API_KEY_METADATA_KEY: "Bearer other"}, "k") is not None


def test_the_logprob_limit_is_the_protos():
    comment = re.search(r'/// How many of the most likely tokens .*?at most (\d+)\.\n\s*uint32 top = 1;', PROTO).group(1)
    assert int(comment) == wire.MAX_TOP_LOGPROBS
