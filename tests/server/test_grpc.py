"""The server over real gRPC on loopback: sessions, features, resume, concurrency."""
from __future__ import annotations

import random
import threading

import pytest

from edgespec.proto.edgespec.v1 import pb
from edgespec.shared.codec import decode_frame
from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.tree import ROOT, DraftTree, encode_tree


def open_msg(fingerprint: str, prompt: list[int], sid: str = "", **extra) -> dict:
    return {"open": pb.Open(session_id=sid, prompt_ids=prompt, tokenizer_fingerprint=fingerprint, **extra)}


def draft_msg(sid: str, step: int, committed_len: int, tree: DraftTree) -> dict:
    return {"draft": pb.Draft(session_id=sid, step=step, committed_len=committed_len, tree=encode_tree(tree))}


def run_greedy_session(stream, fingerprint, prompt, truth, sid="", n=20):
    """Open, then draft trees right for up to 2 tokens and wrong after, until n tokens are committed."""
    opened = stream.send(**open_msg(fingerprint, prompt, sid)).opened
    sid = opened.session_id
    committed = prompt + [opened.first_token]
    step = 0
    while len(committed) - len(prompt) < n:
        done = len(committed) - len(prompt)
        wrong = (truth[done + 1] + 1) % 256
        tree = DraftTree((wrong, truth[done], 99, truth[done + 1], wrong), (ROOT, ROOT, 1, 1, 3))
        step += 1
        v = stream.send(**draft_msg(sid, step, len(committed), tree)).verified
        committed += [tree.tokens[i] for i in v.accepted] + [v.bonus_token]
        assert v.committed_len == len(committed) and v.step == step
    assert stream.send(close=pb.Close(session_id=sid)).closed.session_id == sid
    return committed[len(prompt):]


def test_info_describes_the_target(stub, tiny_target):
    info = stub.Info(pb.InfoRequest())
    assert info.tokenizer_fingerprint == tiny_target.fingerprint
    assert info.vocab_size == 320 and info.num_layers == 2 and info.hidden_size == 64
    assert info.kv_size == tiny_target.kv_size == info.head_dim * info.num_kv_heads
    assert list(info.moa_server_parts) == ["random"]
    assert set(info.feature_kinds) == {pb.FEATURE_KIND_NONE, pb.FEATURE_KIND_LAST_HIDDEN, pb.FEATURE_KIND_MOA}
    assert info.limits.max_tree_nodes == 255 and info.limits.max_sessions == 64
    assert info.device == "cpu" and info.dtype == "float32"
    assert info.registry_name == ""  # a model from a folder: only registry models give their name


def test_greedy_session_commits_the_target_greedy_output(open_stream, fingerprint, greedy_reference):
    prompt = [72, 101, 108, 108, 111]
    truth = greedy_reference(prompt, 40)
    got = run_greedy_session(open_stream(), fingerprint, prompt, truth, sid="greedy-1")
    assert got == truth[:len(got)] and len(got) >= 20


def test_session_id_can_come_from_call_metadata(open_stream, fingerprint, greedy_reference):
    prompt = [1, 2, 3]
    truth = greedy_reference(prompt, 40)
    stream = open_stream(session_id="from-metadata")
    opened = stream.send(**open_msg(fingerprint, prompt)).opened
    assert opened.session_id == "from-metadata"
    v = stream.send(draft={"step": 1, "committed_len": 4, "tree": encode_tree(DraftTree.chain(truth[1:3]))}).verified
    assert v.session_id == "from-metadata" and list(v.accepted) == [0, 1] and v.bonus_token == truth[3]


def test_concurrent_sessions_each_get_their_own_greedy_output(open_stream, fingerprint, greedy_reference):
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(2, 9))] for _ in range(4)]
    truths = [greedy_reference(p, 40) for p in prompts]
    streams = [open_stream() for _ in prompts]
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            results[i] = run_greedy_session(streams[i], fingerprint, prompts[i], truths[i], sid=f"conc-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for i, truth in enumerate(truths):
        assert results[i] == truth[:len(results[i])]


def test_features_travel_as_codec_frames(open_stream, fingerprint, tiny_target):
    stream = open_stream()
    opened = stream.send(**open_msg(fingerprint, [5, 6, 7], "moa-1", features=pb.FeatureRequest(
        kind=pb.FEATURE_KIND_MOA, moa_server_part="random", tli_layers=2),
        codec=pb.CodecChoice(codec=pb.CODEC_FP16, zstd_level=1))).opened
    frames = {f.name: decode_frame(f.frame) for f in opened.features}
    e_kv = tiny_target.kv_size
    assert frames["lsa"].shape == (3, 2 * e_kv)
    assert frames["tli_k"].shape == (2, 3, e_kv) and frames["tli_v"].shape == (2, 3, e_kv)
    v = stream.send(**draft_msg("moa-1", 1, 4, DraftTree((1,), (ROOT,)))).verified
    n = 1 + len(v.accepted)
    assert {f.name: tuple(decode_frame(f.frame).shape) for f in v.features} == {
        "lsa": (n, 2 * e_kv), "tli_k": (2, n, e_kv), "tli_v": (2, n, e_kv)}
    hidden = open_stream().send(**open_msg(fingerprint, [5, 6, 7], "hid-1", features=pb.FeatureRequest(
        kind=pb.FEATURE_KIND_LAST_HIDDEN))).opened
    assert [(f.name, tuple(decode_frame(f.frame).shape)) for f in hidden.features] == [("hidden", (3, 64))]


def test_sampling_sessions_are_reproducible_by_seed(open_stream, fingerprint):
    def run(seed: int) -> list[int]:
        stream = open_stream()
        sampling = pb.SamplingParams(temperature=1.0, top_p=0.9, seed=seed)
        opened = stream.send(**open_msg(fingerprint, [40, 41], f"samp-{seed}-{random.random()}",
                                        sampling=sampling)).opened
        out, sid = [opened.first_token], opened.session_id
        for step in range(1, 8):
            v = stream.send(**draft_msg(sid, step, 2 + len(out), DraftTree((out[-1], 7), (ROOT, 0)))).verified
            out += [(out[-1], 7)[i] for i in v.accepted] + [v.bonus_token]
        return out

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_a_repeated_step_is_answered_again_without_verifying_twice(open_stream, fingerprint):
    stream = open_stream()
    stream.send(**open_msg(fingerprint, [9, 9, 9], "repeat-1"))
    first = stream.send(**draft_msg("repeat-1", 1, 4, DraftTree((3, 4), (ROOT, 0)))).verified
    again = stream.send(**draft_msg("repeat-1", 1, 4, DraftTree((3, 4), (ROOT, 0)))).verified
    assert again == first


@pytest.mark.parametrize("policy", [pb.RESUME_POLICY_KEEP, pb.RESUME_POLICY_ROLLBACK])
def test_resume_restores_the_session_and_counts_agreement(open_stream, fingerprint, greedy_reference, policy):
    prompt = [50, 51, 52]
    truth = greedy_reference(prompt, 12)
    sid = f"resume-{policy}"
    stream = open_stream()
    stream.send(**open_msg(fingerprint, prompt, sid))
    stream.close()  # the link drops; the client goes on offline
    confirmed = prompt + truth[:1]
    provisional = truth[1:4] + [(truth[4] + 1) % 256]
    resumed = open_stream().send(resume=pb.Resume(
        session_id=sid, committed_len=len(confirmed), committed_hash=committed_hash(confirmed),
        provisional_ids=provisional, policy=policy, step=1)).resumed
    assert resumed.restored and resumed.agreed == 3
    if policy == pb.RESUME_POLICY_ROLLBACK:
        assert resumed.bonus_token == truth[4] and resumed.committed_len == len(confirmed) + 4
    else:
        assert resumed.committed_len == len(confirmed) + len(provisional) + 1


def test_resume_of_an_unknown_session_re_prefills_from_reopen(open_stream, fingerprint, greedy_reference):
    prompt = [60, 61, 62, 63]
    truth = greedy_reference(prompt, 12)
    confirmed = prompt + truth[:3]
    stream = open_stream()
    resumed = stream.send(resume=pb.Resume(
        session_id="never-seen", committed_len=len(confirmed), committed_hash=committed_hash(confirmed),
        committed_ids=confirmed, provisional_ids=truth[3:6], policy=pb.RESUME_POLICY_ROLLBACK,
        reopen=pb.Open(session_id="never-seen", prompt_ids=prompt, tokenizer_fingerprint=fingerprint,
                       features=pb.FeatureRequest(kind=pb.FEATURE_KIND_LAST_HIDDEN)))).resumed
    assert not resumed.restored and resumed.agreed == 3 and resumed.bonus_token == truth[6]
    # features: the root (last confirmed token) and the 3 kept provisional tokens
    assert [tuple(decode_frame(f.frame).shape) for f in resumed.features] == [(4, 64)]
    committed = confirmed + truth[3:7]
    v = stream.send(**draft_msg("never-seen", 2, len(committed), DraftTree.chain(truth[7:9]))).verified
    assert list(v.accepted) == [0, 1] and v.bonus_token == truth[9]


@pytest.mark.slow
def test_clients_may_ping_every_second_on_an_idle_stream(tiny_server, fingerprint, open_stream):
    """With the gRPC default (pings at most every 5 minutes) the server would answer these pings with
    GOAWAY too_many_pings and the stream would die; a client noticing dead links needs them."""
    import time

    import grpc

    options = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 2000),
               ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
    with grpc.insecure_channel(tiny_server.address, options=options) as channel:
        stream = open_stream(on=channel)
        stream.send(**open_msg(fingerprint, [1, 2], "pinger"))
        time.sleep(6)  # idle: only pings cross the link
        v = stream.send(**draft_msg("pinger", 1, 3, DraftTree((1,), (ROOT,)))).verified
        assert v.committed_len >= 4


def test_a_second_server_on_a_busy_port_is_refused(tiny_server, tiny_model_dir):
    from support.servers import running_server

    port = int(tiny_server.address.rsplit(":", 1)[1])
    with pytest.raises(OSError, match="port in use"):
        with running_server(tiny_model_dir, port=port, http_port=None):
            pass
