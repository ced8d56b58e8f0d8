"""What a hostile or broken peer sends: over-long and non-printable session ids, peer strings in the log,
bytes that are not a message, a prompt far past the context, the API key's scheme in any case."""
from __future__ import annotations

import logging

import grpc
import pytest

from edgespec.proto.edgespec.v1 import pb, pb_grpc
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.tree import DraftTree, encode_tree
from support.servers import running_server


def refused(stream, **message) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        stream.send(**message)
    return info.value


@pytest.fixture
def server_log(caplog):
    """The server's log records (the server runs in this process, on its own threads)."""
    caplog.set_level(logging.INFO)
    return caplog


def _lines(caplog) -> list[str]:
    """The records as the server's text log shows them: the message and its fields (key=value)."""
    from edgespec.shared.logging_setup import TextFormatter

    return [TextFormatter().format(r) for r in caplog.records]


# ------------------------------------------------------------------ session ids
def test_a_session_id_over_128_characters_is_refused_with_a_short_message(open_stream, fingerprint):
    huge = "x" * (256 << 10)
    messages = {
        "open": pb.Open(session_id=huge, prompt_ids=[1], tokenizer_fingerprint=fingerprint),
        "draft": pb.Draft(session_id=huge, step=1, committed_len=2, tree=encode_tree(DraftTree.chain([1]))),
        "resume": pb.Resume(session_id=huge, committed_len=1, committed_hash=committed_hash([1])),
        "close": pb.Close(session_id=huge),
    }
    for kind, message in messages.items():
        err = refused(open_stream(), **{kind: message})
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (kind, err.code())
        assert "262144 characters" in err.details() and "at most 128" in err.details()
        assert len(err.details()) < 300  # the id is not echoed back
    at_limit = "y" * 128
    opened = open_stream().send(open=pb.Open(session_id=at_limit, prompt_ids=[1],
                                             tokenizer_fingerprint=fingerprint)).opened
    assert opened.session_id == at_limit


def test_a_session_id_with_a_newline_is_refused_and_forges_no_log_line(open_stream, fingerprint, server_log):
    forged = "s1\nINFO edgespec.server session admin opened"
    err = refused(open_stream(), open=pb.Open(session_id=forged, prompt_ids=[1], tokenizer_fingerprint=fingerprint))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "non-printable" in err.details()
    assert "\\n at index 2" in err.details()
    assert not any("\n" in line for line in _lines(server_log))


def test_peer_strings_are_escaped_and_cut_in_the_log(open_stream, fingerprint, server_log):
    names = {"evil\nERROR forged line\x1b[31m": "evil\\nERROR forged line\\x1b[31m", "d" * 100_000: "100000 characters"}
    for i, (drafter, shown) in enumerate(names.items()):
        open_stream().send(open=pb.Open(session_id=f"named-{i}", prompt_ids=[1], tokenizer_fingerprint=fingerprint,
                                        drafter=drafter))
        line = next(line for line in _lines(server_log) if f"session named-{i} opened" in line)
        assert shown in line and "\n" not in line and "\x1b" not in line and len(line) < 1000


def test_an_error_quoting_a_huge_peer_string_is_still_delivered(open_stream, fingerprint):
    """The refusal names the unknown MoA part it was sent; with a megabyte of name it is cut, not lost."""
    err = refused(open_stream(), open=pb.Open(
        session_id="moa-name", prompt_ids=[1], tokenizer_fingerprint=fingerprint,
        features=pb.FeatureRequest(kind=pb.FEATURE_KIND_MOA, moa_server_part="p" * (1 << 20))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown MoA server part" in err.details() and "cut from" in err.details()


# ------------------------------------------------------------- garbage bytes
def test_bytes_that_are_not_a_message_are_invalid_argument_with_one_log_line(tiny_server, server_log):
    with grpc.insecure_channel(tiny_server.address) as channel:
        # The raw methods send bytes as they are: a peer speaking something else on the same path.
        session = channel.stream_stream("/edgespec.v1.Verifier/Session")
        info = channel.unary_unary("/edgespec.v1.Verifier/Info")
        for call, what in ((lambda: list(session(iter([b"\xff\xfe garbage \x00"] * 3))), "ClientMessage"),
                           (lambda: info(b"\xff\xff\xff"), "InfoRequest")):
            before = len(server_log.records)
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"not an edgespec.v1.{what}" in err.value.details()
            records = server_log.records[before:]
            about = [r for r in records if what in r.getMessage() or "deserializ" in r.getMessage().lower()]
            assert len(about) == 1 and all(r.exc_info is None for r in records), [r.getMessage() for r in records]


# ---------------------------------------------------------------- huge lists
@pytest.mark.parametrize("kind", ["open", "resume-committed", "resume-provisional"])
def test_a_list_past_the_context_is_refused_by_its_length_before_any_per_id_work(open_stream, fingerprint, kind):
    """The last id is outside the vocabulary: a per-id check run first would name it instead of the length."""
    too_long = [1] * 600 + [999]  # the tiny server allows 512 tokens
    reopen = pb.Open(prompt_ids=[1], tokenizer_fingerprint=fingerprint)
    message = {
        "open": {"open": pb.Open(session_id="long", prompt_ids=too_long, tokenizer_fingerprint=fingerprint)},
        "resume-committed": {"resume": pb.Resume(session_id="long", committed_len=len(too_long),
                                                 committed_hash=committed_hash(too_long), committed_ids=too_long,
                                                 reopen=reopen)},
        "resume-provisional": {"resume": pb.Resume(session_id="long", committed_len=2,
                                                   committed_hash=committed_hash([1, 2]), committed_ids=[1, 2],
                                                   provisional_ids=too_long, reopen=reopen)},
    }[kind]
    err = refused(open_stream(), **message)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_context_tokens" in err.details() and "vocabulary" not in err.details()


# ------------------------------------------------------------------- API key
@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir):
    with running_server(tiny_model_dir, http_port=None, api_key="k3y") as handle:
        yield handle


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(keyed_server, scheme):
    with grpc.insecure_channel(keyed_server.address) as channel:
        stub = pb_grpc.VerifierStub(channel)
        assert stub.Info(pb.InfoRequest(), metadata=(("authorization", f"{scheme} k3y"),), timeout=10).vocab_size
        with pytest.raises(grpc.RpcError) as err:
            stub.Info(pb.InfoRequest(), metadata=(("authorization", f"{scheme} wrong"),), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
