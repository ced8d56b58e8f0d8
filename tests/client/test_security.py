"""TLS and API key between client and server (a real tiny server with both turned on)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from edgespec.client.drafters.factory import DrafterOptions
from edgespec.client.edge_client import ClientConfig, EdgespecClient
from edgespec.client.link.grpc_transport import LinkConfig, LinkDownError, ServerRefusedError
from edgespec.client.loop.generation import GenerationConfig
from support.servers import running_server


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian package `openssl`); needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(scope="module")
def secure_server(tiny_model_dir, certificate):
    cert, key = certificate
    with running_server(tiny_model_dir, http_port=None, tls_cert=str(cert), tls_key=str(key),
                        api_key="s3cret") as handle:
        yield handle


def _client(server, tiny_model_dir, **link):
    link.setdefault("connect_timeout_s", 2.0)
    return EdgespecClient(ClientConfig(LinkConfig(server.address, **link),
                                       DrafterOptions("ngram"), tokenizer=str(tiny_model_dir)))


def test_tls_and_key_work(secure_server, certificate, tiny_model_dir, tiny_target_f32, greedy):
    with _client(secure_server, tiny_model_dir, tls=True, root_certificates=str(certificate[0]),
                 api_key="s3cret") as client:
        ids = client.encode("hello")
        result = client.generate(ids, GenerationConfig(max_new_tokens=10))
        assert result.token_ids == greedy(tiny_target_f32, ids, 10, client.tokens.eos_ids)


def test_missing_key_is_refused_with_a_clear_message(secure_server, certificate, tiny_model_dir):
    with pytest.raises(ServerRefusedError, match="API key") as err:
        _client(secure_server, tiny_model_dir, tls=True, root_certificates=str(certificate[0]))
    assert err.value.grpc_code == "UNAUTHENTICATED"


def test_plaintext_to_a_tls_server_fails_as_unreachable(secure_server, tiny_model_dir):
    with pytest.raises(LinkDownError, match="cannot reach"):
        _client(secure_server, tiny_model_dir, api_key="s3cret", connect_timeout_s=0.5)


def test_the_key_is_read_from_any_case_of_bearer_and_from_x_api_key(secure_server, certificate):
    """The gRPC side reads the key with the same helper as both HTTP APIs (shared.auth)."""
    import grpc

    from edgespec.proto.edgespec.v1 import pb, pb_grpc

    creds = grpc.ssl_channel_credentials(certificate[0].read_bytes())
    with grpc.secure_channel(secure_server.address, creds) as channel:
        stub = pb_grpc.VerifierStub(channel)
        for metadata in ((("authorization", "bearer s3cret"),), (("authorization", "BEARER s3cret"),),
                         (("x-api-key", "s3cret"),)):
            assert stub.Info(pb.InfoRequest(), metadata=metadata, timeout=10).vocab_size > 0, metadata
        with pytest.raises(grpc.RpcError) as err:
            stub.Info(pb.InfoRequest(), metadata=(("authorization", "Bearer wrong"),), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED and "not this server's" in err.value.details()
        # The right bearer does not carry a wrong x-api-key through (nor the other way round).
        for metadata in ((("authorization", "Bearer s3cret"), ("x-api-key", "wrong")),
                         (("authorization", "Bearer wrong"), ("x-api-key", "s3cret"))):
            with pytest.raises(grpc.RpcError) as err:
                stub.Info(pb.InfoRequest(), metadata=metadata, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
