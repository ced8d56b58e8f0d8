"""A refused request never changes a live session: every refusal path (Open, Draft, Resume, Close) is sent
with bad input against the id of a live session, and the live session then goes on token-exact."""
from __future__ import annotations

import grpc
import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.tree import DraftTree, encode_tree

LIVE = "live-session"
PROMPT = [11, 12, 13, 14]


class LiveSession:
    """A session driven with the target's own greedy tokens: each step must accept the whole chain."""

    def __init__(self, stream, fingerprint, truth):
        self.stream, self.truth = stream, truth
        opened = stream.send(open=pb.Open(session_id=LIVE, prompt_ids=PROMPT, tokenizer_fingerprint=fingerprint))
        assert opened.opened.first_token == truth[0]
        self.committed = PROMPT + [opened.opened.first_token]
        self.step = 0

    @property
    def done(self) -> int:
        return len(self.committed) - len(PROMPT)

    def advance(self) -> None:
        """Draft the next two true tokens; the server must accept both and add the true bonus token."""
        chain = self.truth[self.done: self.done + 2]
        self.step += 1
        v = self.stream.send(draft=pb.Draft(session_id=LIVE, step=self.step, committed_len=len(self.committed),
                                            tree=encode_tree(DraftTree.chain(chain)))).verified
        assert list(v.accepted) == [0, 1] and v.bonus_token == self.truth[self.done + 2]
        self.committed += chain + [v.bonus_token]
        assert v.committed_len == len(self.committed)


def _refused(stream, code: grpc.StatusCode, words: str, **message) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stream.send(**message)
    assert info.value.code() == code, info.value.details()
    assert words in info.value.details(), info.value.details()


def _tree(tokens) -> bytes:
    return encode_tree(DraftTree.chain(list(tokens)))


def _bad_requests(fingerprint, live: LiveSession) -> list[tuple[str, grpc.StatusCode, str, dict, str | None]]:
    """(what, expected code, words in the message, message, session id in the call metadata) against the
    live id."""
    invalid, stale = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION
    committed = live.committed if live else PROMPT
    n = len(committed)
    other = [1, 2, 3, 4, 5]  # a history that is not the live session's: Resume must rebuild for it
    reopen = pb.Open(prompt_ids=PROMPT, tokenizer_fingerprint=fingerprint)

    def open_(**kw) -> dict:
        kw.setdefault("prompt_ids", PROMPT)
        return {"open": pb.Open(session_id=LIVE, tokenizer_fingerprint=kw.pop("fp", fingerprint), **kw)}

    def resume(ids, confirmed_len=None, hash_of=None, **kw) -> dict:
        return {"resume": pb.Resume(session_id=LIVE, committed_len=len(ids) if confirmed_len is None else confirmed_len,
                                    committed_hash=committed_hash(ids if hash_of is None else hash_of),
                                    committed_ids=ids, reopen=reopen, **kw)}

    return [
        ("Open: empty prompt", invalid, "empty", open_(prompt_ids=[]), None),
        ("Open: id outside the vocabulary", invalid, "outside the vocabulary", open_(prompt_ids=[1, 999]), None),
        ("Open: prompt too long", invalid, "max_context_tokens", open_(prompt_ids=[1] * 600), None),
        ("Open: bad tree", invalid, "truncated", open_(tree=b"\x01\x00"), None),
        ("Open: foreign tokenizer", stale, "tokenizer fingerprint", open_(fp="ab" * 32), None),
        ("Open: bad sampling", invalid, "top_p", open_(sampling=pb.SamplingParams(temperature=1, top_p=3)), None),
        ("Open: ids differ", invalid, "differs", open_(), "someone-else"),
        ("Draft: bad tree", invalid, "outside the vocabulary",
         {"draft": pb.Draft(session_id=LIVE, step=99, committed_len=n, tree=_tree([999]))}, None),
        ("Draft: stale committed_len", stale, "Resume",
         {"draft": pb.Draft(session_id=LIVE, step=99, committed_len=n + 3, tree=_tree([1]))}, None),
        ("Resume: rebuild from ids outside the vocabulary", invalid, "outside the vocabulary",
         resume(other + [999]), None),
        ("Resume: rebuild, then provisional ids outside the vocabulary", invalid, "outside the vocabulary",
         resume(other, provisional_ids=[999]), None),
        ("Resume: rebuild, then too many provisional ids", invalid, "max_context_tokens",
         resume(other, provisional_ids=[1] * 600), None),
        ("Resume: hash not of the ids", invalid, "committed_hash", resume(other, hash_of=[9, 9]), None),
        ("Resume: committed_len not the ids'", invalid, "committed_ids", resume(other, confirmed_len=3), None),
        ("Resume: unknown policy", invalid, "policy", resume(committed, policy=7), None),
        ("Resume: own history, bad provisional ids", invalid, "outside the vocabulary",
         resume(committed, provisional_ids=[5, 999]), None),
        ("Resume: rebuild with a foreign reopen", stale, "tokenizer fingerprint",
         {"resume": pb.Resume(session_id=LIVE, committed_len=3, committed_hash=committed_hash(other[:3]),
                              committed_ids=other[:3], reopen=pb.Open(prompt_ids=[1], tokenizer_fingerprint="x"))},
         None),
        ("Close: ids differ", invalid, "differs",
         {"close": pb.Close(session_id="someone-else")}, LIVE),
        ("Close: no id", invalid, "no session id", {"close": pb.Close()}, None),
    ]


CASES = [case[0] for case in _bad_requests("", None)]


@pytest.mark.parametrize("case", CASES)
def test_a_refusal_does_not_change_the_live_session(case, open_stream, fingerprint, greedy_reference, tiny_server):
    truth = greedy_reference(PROMPT, 12)
    tiny_server.core.close(LIVE)  # a fresh live session for each case
    live = LiveSession(open_stream(), fingerprint, truth)
    live.advance()
    _, code, words, message, session_id = next(c for c in _bad_requests(fingerprint, live) if c[0] == case)
    _refused(open_stream(session_id), code, words, **message)
    assert LIVE in tiny_server.core.store, "the live session is gone"
    live.advance()  # the live session goes on from exactly where it was, on its own stream
    live.advance()
    assert live.committed[len(PROMPT):] == truth[:live.done]


def test_a_good_open_or_rebuild_of_the_same_id_still_replaces_the_session(open_stream, fingerprint,
                                                                           greedy_reference):
    """Validate first, then swap: the swap itself still happens for a request that is not refused."""
    other = [21, 22, 23]
    first = open_stream().send(open=pb.Open(session_id="replaced", prompt_ids=PROMPT,
                                            tokenizer_fingerprint=fingerprint)).opened
    again = open_stream().send(open=pb.Open(session_id="replaced", prompt_ids=other,
                                            tokenizer_fingerprint=fingerprint)).opened
    assert again.first_token == greedy_reference(other, 1)[0] and again.committed_len == len(other) + 1
    ids = PROMPT + [first.first_token]
    resumed = open_stream().send(resume=pb.Resume(
        session_id="replaced", committed_len=len(ids), committed_hash=committed_hash(ids), committed_ids=ids,
        reopen=pb.Open(prompt_ids=PROMPT, tokenizer_fingerprint=fingerprint))).resumed
    assert not resumed.restored and resumed.bonus_token == greedy_reference(ids, 1)[0]
