"""One Session stream to a server, message by message, for the tests of the server's side of the wire.

It is the client's own SessionStream (client/link/grpc_transport.py): the same stream, call metadata and answer
handling as a real client's. Where the client turns a refusal into its own error, this gives back the
grpc.RpcError the server ended the stream with, so a test reads the status code and details it sent.
"""
from __future__ import annotations

import grpc

from edgespec.client.link.grpc_transport import LinkConfig, SessionStream
from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.errors import EdgespecError

ANSWER_TIMEOUT_S = 60.0  # a verification of the tiny target on a busy 2-core machine still takes under a second


class ServerStream:
    """send(**kind) -> the server's answer to ClientMessage(**kind); a refusal raises its grpc.RpcError."""

    def __init__(self, channel: grpc.Channel, session_id: str | None = None, api_key: str | None = None):
        # Of the LinkConfig only what makes the call metadata counts here (the API key; session_id goes in as
        # x-edgespec-session): the channel is the test's, so its address is never dialled.
        self._stream = SessionStream(channel, LinkConfig("channel-given:0", api_key=api_key), session_id)

    def send(self, **kind) -> pb.ServerMessage:
        try:
            return self._stream.request(pb.ClientMessage(**kind), ANSWER_TIMEOUT_S)
        except EdgespecError as err:
            if isinstance(err.__cause__, grpc.RpcError):
                raise err.__cause__ from None
            raise

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "ServerStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
