"""Every refused input over a real gRPC connection: the right status, a message that says what was wrong,
and nothing lost (the session survives the error)."""
from __future__ import annotations

import datetime
import ipaddress

import grpc
import pytest

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.tree import ROOT, DraftTree, encode_tree
from support.servers import running_server


def refused(stream, **message) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stream.send(**message)
    return info.value


def opened(stream, fingerprint, sid, prompt=(1, 2, 3), **extra):
    return stream.send(open=pb.Open(session_id=sid, prompt_ids=list(prompt), tokenizer_fingerprint=fingerprint,
                                    **extra)).opened


def draft(sid, step, committed_len, tree_bytes) -> dict:
    return {"draft": pb.Draft(session_id=sid, step=step, committed_len=committed_len, tree=tree_bytes)}


@pytest.mark.parametrize("tree_bytes, words", [
    (b"\x01\x00\x00\xff\x02\x00", "truncated"),
    (b"\x01\x00\x00\x05", "parent 5 does not come before"),
    ((1000).to_bytes(3, "little") + b"\xff", "outside the vocabulary"),
])
def test_a_bad_tree_is_invalid_argument_and_the_session_survives(open_stream, fingerprint, tree_bytes, words):
    sid = f"badtree-{words[:5]}"
    opened(open_stream(), fingerprint, sid)
    err = refused(open_stream(), **draft(sid, 1, 4, tree_bytes))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.details()
    v = open_stream().send(**draft(sid, 1, 4, encode_tree(DraftTree((1,), (ROOT,))))).verified
    assert v.committed_len >= 5  # nothing was lost: the session goes on from where it was


def test_a_bad_codec_choice_is_invalid_argument(open_stream, fingerprint):
    err = refused(open_stream(), open=pb.Open(session_id="codec", prompt_ids=[1], tokenizer_fingerprint=fingerprint,
                                              codec=pb.CodecChoice(codec=9)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "codec" in err.details()


def test_a_foreign_tokenizer_is_failed_precondition(open_stream):
    err = refused(open_stream(), open=pb.Open(session_id="fp", prompt_ids=[1], tokenizer_fingerprint="ab" * 32))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "tokenizer fingerprint" in err.details()


def test_an_unknown_session_is_not_found(open_stream):
    err = refused(open_stream(), **draft("nobody", 1, 4, b""))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "'nobody'" in err.details()
    err = refused(open_stream(), resume=pb.Resume(session_id="nobody", committed_len=2,
                                                  committed_hash=committed_hash([1, 2])))
    assert err.code() == grpc.StatusCode.NOT_FOUND and "committed_ids" in err.details()


def test_a_stale_committed_len_is_failed_precondition(open_stream, fingerprint):
    opened(open_stream(), fingerprint, "stale")
    err = refused(open_stream(), **draft("stale", 1, 9, encode_tree(DraftTree((1,), (ROOT,)))))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "Resume" in err.details()


def test_bad_open_settings_are_invalid_argument(open_stream, fingerprint):
    cases = [
        (pb.Open(session_id="e1", prompt_ids=[], tokenizer_fingerprint=fingerprint), "empty"),
        (pb.Open(session_id="e2", prompt_ids=[1] * 600, tokenizer_fingerprint=fingerprint), "max_context_tokens"),
        (pb.Open(session_id="e3", prompt_ids=[999], tokenizer_fingerprint=fingerprint), "outside the vocabulary"),
        (pb.Open(session_id="e4", prompt_ids=[1], tokenizer_fingerprint=fingerprint,
                 features=pb.FeatureRequest(kind=pb.FEATURE_KIND_MOA, moa_server_part="nope")), "'nope'"),
        (pb.Open(session_id="e5", prompt_ids=[1], tokenizer_fingerprint=fingerprint,
                 sampling=pb.SamplingParams(temperature=1.0, top_p=2.0)), "top_p"),
    ]
    for message, words in cases:
        err = refused(open_stream(), open=message)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.details(), (words, err.details())


def test_a_resume_whose_hash_does_not_match_its_ids_is_invalid_argument(open_stream, fingerprint):
    err = refused(open_stream(), resume=pb.Resume(
        session_id="hash", committed_len=3, committed_hash=committed_hash([1, 2, 4]), committed_ids=[1, 2, 3],
        reopen=pb.Open(prompt_ids=[1, 2], tokenizer_fingerprint=fingerprint)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "committed_hash" in err.details()


@pytest.fixture(scope="module")
def guarded_server(tiny_model_dir):
    """A server with an API key and room for two sessions."""
    with running_server(tiny_model_dir, max_sessions=2, api_key="s3cret", max_message_bytes=8192) as handle:
        yield handle


@pytest.fixture
def guarded_channel(guarded_server):
    with grpc.insecure_channel(guarded_server.address) as channel:
        yield channel


def test_a_missing_or_wrong_api_key_is_unauthenticated(guarded_channel, open_stream, fingerprint):
    guarded_stub = pb_grpc.VerifierStub(guarded_channel)
    with pytest.raises(grpc.RpcError) as info:
        guarded_stub.Info(pb.InfoRequest())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "API key" in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        guarded_stub.Info(pb.InfoRequest(), metadata=(("authorization", "Bearer wrong"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    err = refused(open_stream(on=guarded_channel), open=pb.Open(prompt_ids=[1], tokenizer_fingerprint=fingerprint))
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert guarded_stub.Info(pb.InfoRequest(), metadata=(("authorization", "Bearer s3cret"),)).model_name


def test_the_session_cap_is_resource_exhausted(guarded_channel, open_stream, fingerprint):
    def keyed():
        return open_stream(api_key="s3cret", on=guarded_channel)

    for i in range(2):
        opened(keyed(), fingerprint, f"cap-{i}")
    err = refused(keyed(), open=pb.Open(session_id="cap-2", prompt_ids=[1], tokenizer_fingerprint=fingerprint))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_sessions=2" in err.details()
    assert keyed().send(close=pb.Close(session_id="cap-0")).HasField("closed")
    assert opened(keyed(), fingerprint, "cap-2").committed_len == 4


def test_a_message_over_the_size_limit_is_refused(guarded_channel, open_stream, fingerprint):
    err = refused(open_stream(api_key="s3cret", on=guarded_channel),
                  open=pb.Open(session_id="huge", prompt_ids=[200] * 5000, tokenizer_fingerprint=fingerprint))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_http_api_wants_the_key_too(guarded_server):
    import httpx

    url = f"http://{guarded_server.config.host}:{guarded_server.http_port}"
    assert httpx.get(f"{url}/health").status_code == 200  # probes need no key
    body = {"prompt": [1, 2], "max_tokens": 2, "temperature": 0}
    reply = httpx.post(f"{url}/v1/completions", json=body)
    assert reply.status_code == 401 and "API key" in reply.json()["error"]["message"]
    reply = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
    assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] == 2


def test_a_draining_server_refuses_new_sessions_but_finishes_open_ones(tiny_model_dir, fingerprint):
    import httpx

    with running_server(tiny_model_dir) as handle, grpc.insecure_channel(handle.address) as channel:
        stub = pb_grpc.VerifierStub(channel)
        handle.core.draining.set()
        assert httpx.get(f"{handle.http_url}/health").status_code == 503
        requests = iter([pb.ClientMessage(open=pb.Open(session_id="late", prompt_ids=[1],
                                                       tokenizer_fingerprint=fingerprint))])
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Session(requests))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "shutting down" in info.value.details()


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_serves_grpc_and_refuses_plaintext(tiny_model_dir, tmp_path):
    pytest.importorskip("cryptography", reason="the cryptography package makes the test certificate")
    cert, key = _self_signed(tmp_path)
    with running_server(tiny_model_dir, http_port=None, tls_cert=str(cert), tls_key=str(key)) as handle:
        creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        with grpc.secure_channel(handle.address, creds) as channel:
            assert pb_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=10).vocab_size == 320
        with grpc.insecure_channel(handle.address) as channel:
            with pytest.raises(grpc.RpcError):
                pb_grpc.VerifierStub(channel).Info(pb.InfoRequest(), timeout=3)


def test_an_expired_session_is_not_found_and_resume_rebuilds_it(tiny_model_dir, fingerprint, open_stream,
                                                                 greedy_reference):
    import time

    with running_server(tiny_model_dir, http_port=None, session_ttl_s=0.5) as handle, \
            grpc.insecure_channel(handle.address) as channel:
        prompt = [7, 7, 7]
        first = opened(open_stream(on=channel), fingerprint, "short-lived", prompt).first_token
        time.sleep(1.5)  # the reaper drops it without any call coming in
        assert len(handle.core.store) == 0
        err = refused(open_stream(on=channel), **draft("short-lived", 1, 4, encode_tree(DraftTree((1,), (ROOT,)))))
        assert err.code() == grpc.StatusCode.NOT_FOUND and "expired" in err.details()
        confirmed = prompt + [first]
        truth = greedy_reference(prompt, 4)
        resumed = open_stream(on=channel).send(resume=pb.Resume(
            session_id="short-lived", committed_len=4, committed_hash=committed_hash(confirmed),
            committed_ids=confirmed, provisional_ids=truth[1:3], policy=pb.RESUME_POLICY_ROLLBACK,
            reopen=pb.Open(prompt_ids=prompt, tokenizer_fingerprint=fingerprint))).resumed
        assert not resumed.restored and resumed.agreed == 2 and resumed.bonus_token == truth[3]


def test_a_resume_that_disagrees_with_the_server_without_ids_is_failed_precondition(open_stream, fingerprint):
    opened(open_stream(), fingerprint, "diverged", (4, 5, 6))
    err = refused(open_stream(), resume=pb.Resume(session_id="diverged", committed_len=3,
                                                  committed_hash=committed_hash([4, 5, 9])))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "committed_ids" in err.details()
