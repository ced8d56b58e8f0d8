"""A session message larger than any session can send is refused by gRPC before it is parsed."""
from __future__ import annotations

import grpc
import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.wire import session_message_bytes


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def huge_open(prompt_ids: int) -> bytes:
    """A ClientMessage{open: Open{prompt_ids: [1] * prompt_ids}} serialized by hand: building it with protobuf
    would cost the test the memory the server must not spend."""
    packed = b"\x12" + _varint(prompt_ids) + b"\x01" * prompt_ids  # Open.prompt_ids (2), packed varints
    return b"\x0a" + _varint(len(packed)) + packed  # ClientMessage.open (1)


def test_the_bound_holds_a_resume_of_a_full_context():
    full = pb.ClientMessage(resume=pb.Resume(session_id="s" * 128, committed_ids=[2 ** 32 - 1] * 32768,
                                             provisional_ids=[2 ** 32 - 1] * 32768,
                                             reopen=pb.Open(prompt_ids=[2 ** 32 - 1] * 32768, tree=b"x" * 1020)))
    assert full.ByteSize() <= session_message_bytes(32768, 255)


def test_a_30_mb_open_is_refused_before_it_is_parsed(tiny_server):
    limit = session_message_bytes(tiny_server.core.limits.max_context_tokens, tiny_server.core.limits.max_tree_nodes)
    assert limit < 3 << 20  # the tiny server's 512-token context: 2 MiB of strings and 7.5 KiB of ids
    with grpc.insecure_channel(tiny_server.address, options=[("grpc.max_send_message_length", 64 << 20)]) as channel:
        session = channel.stream_stream("/edgespec.v1.Verifier/Session", request_serializer=lambda b: b,
                                        response_deserializer=pb.ServerMessage.FromString)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(session(iter([huge_open(30 << 20)]), timeout=30)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    assert "larger than max" in err.value.details()
