"""The link to the verifier: ``verifier.py`` turns the loop's requests into protobuf messages and the answers
back into domain types; a transport carries them, over gRPC (``grpc_transport.py``: the session stream, its
deadlines and reconnection) or to a verifier in this process (``in_process.py``)."""
