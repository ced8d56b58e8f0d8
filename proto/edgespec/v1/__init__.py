"""Generated protobuf and gRPC stubs for the edgespec.v1 wire contract.

Do not edit the *_pb2*.py files: regenerate them with
``python -m edgespec.proto.build``.
"""
from edgespec.proto.edgespec.v1 import edgespec_pb2 as pb
from edgespec.proto.edgespec.v1 import edgespec_pb2_grpc as pb_grpc

__all__ = ["pb", "pb_grpc"]
