"""The session's settings on the wire (``shared.session_settings``): what the client writes into Open the server
reads back unchanged, proto3's zeros read as the defaults, and a bad Open is refused with a message naming
what was wrong."""
from __future__ import annotations

import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.codec import ActivationCodec, Codec
from edgespec.shared.errors import FrameError, InvalidRequestError
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.session_settings import FeatureRequest, SessionSettings, open_fields, settings_of
from edgespec.shared.wire import FeatureKind


def through_the_wire(settings: SessionSettings, prompt=(1, 2, 3)) -> SessionSettings:
    """Written, serialized, parsed and read (numbers the wire holds as float32 are chosen exact in it)."""
    sent = pb.Open(**open_fields(settings, prompt, b"\x05\x00\x00\xff"))
    return settings_of(pb.Open.FromString(sent.SerializeToString()), settings.session_id)


def test_what_the_client_sends_the_server_reads_back():
    settings = SessionSettings(
        "s1", SamplingSettings(0.75, 0.875, 40, 0.0625, 0.5, -0.5, 1.25, ((3, 2.0),), 4, (7, 9)), seed=2**64 - 1,
        features=FeatureRequest(FeatureKind.MOA, "part", 2), max_new_tokens=64, drafter="eagle", logprobs=0,
        grammar="start: /a+/", codec=ActivationCodec(Codec.FP16, 5, 8), tokenizer_fingerprint="f" * 64)
    assert through_the_wire(settings, prompt=(1, 2, 3)) == SessionSettings(**{**vars(settings), "prompt_len": 3})


def test_the_defaults_survive_the_wire():
    assert through_the_wire(SessionSettings("s"), prompt=(4,)) == SessionSettings("s", prompt_len=1)


def test_proto3_zeros_read_as_the_defaults():
    """An Open that sets nothing: top_p and repetition_penalty 0 are off, no CodecChoice is the default frame,
    and a CodecChoice of zeros is int8 with the default outlier channels (zstd 0 is a real choice: off)."""
    read = settings_of(pb.Open(prompt_ids=[1]), "s")
    assert read == SessionSettings("s", prompt_len=1) and read.sampling.top_p == 1.0
    assert read.sampling.repetition_penalty == 1.0 and read.logprobs is None
    assert settings_of(pb.Open(codec=pb.CodecChoice()), "s").codec == ActivationCodec(Codec.INT8_OUTLIER, 0)


@pytest.mark.parametrize("open_message,error,says", [
    (pb.Open(sampling=pb.SamplingParams(temperature=-1)), InvalidRequestError, "bad sampling parameters: temperature"),
    (pb.Open(features=pb.FeatureRequest(kind=9)), InvalidRequestError, "unknown feature kind 9"),
    (pb.Open(codec=pb.CodecChoice(zstd_level=40)), FrameError, "bad codec choice: zstd_level"),
    (pb.Open(logprobs=pb.LogprobRequest(top=21)), InvalidRequestError, "Open.logprobs.top is 21; at most 20"),
], ids=["sampling", "feature kind", "codec", "logprobs"])
def test_a_bad_open_is_refused_naming_what_is_wrong(open_message, error, says):
    with pytest.raises(error, match=says):
        settings_of(open_message, "s")
