"""The gRPC side of the server, one of the two protobuf adapters (the client's is ``client/link/verifier.py``):
``service`` (VerifierServicer: protobuf in, calls on ``VerifierCore``, protobuf out; errors become statuses
there) and ``grpc_server`` (the grpc.aio server that runs it). The plain HTTP API is not here: it speaks no
protobuf, and sits beside the app that starts both (``http_api``, ``decoder``)."""
