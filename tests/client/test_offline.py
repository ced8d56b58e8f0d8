"""The link cut mid-generation (blackhole and reset), through netem's relay in front of a real server.

Every test replays the event stream (tokens in, retractions out) and checks it
equals the final output: no token lost or duplicated.
"""
from __future__ import annotations

import time

import pytest

from edgespec.shared.wire import ResumePolicy
from edgespec.client.loop.generation import GenerationConfig, LinkEvent, RetractEvent, TokenEvent, TokenOrigin

PROMPT = "def add(a, b):\n    return a + b\n"


def replay(events) -> list[int]:
    """Apply the events as a streaming caller would; checks indices on the way."""
    out: list[int] = []
    for e in events:
        if isinstance(e, TokenEvent):
            assert e.index == len(out), f"token event at index {e.index} but {len(out)} tokens are out"
            out.append(e.token)
        elif isinstance(e, RetractEvent):
            assert e.index == len(out) - e.count
            del out[e.index:]
    return out


def drive(gen, cuts, relay, restore_after: int | None = 3, slow_offline_s: float = 0.01):
    """Consume gen; at each output length in `cuts` apply the cut ("blackhole"/"reset"); restore the link
    once `restore_after` offline tokens came (None: never). A cut whose length was reached offline
    waits for an online token at that length or later. Returns the events."""
    events, pending = [], dict(cuts)
    offline_seen = 0
    for e in gen:
        events.append(e)
        if isinstance(e, LinkEvent) and not e.online and restore_after == 0:
            relay.restore()
        if isinstance(e, TokenEvent):
            n = e.index + 1
            due = [k for k in pending if k <= n]
            if due and e.origin is not TokenOrigin.OFFLINE:
                n = min(due)
            if n in pending and e.origin is not TokenOrigin.OFFLINE:  # cut an online stretch
                relay.cut(pending.pop(n))
            if e.origin is TokenOrigin.OFFLINE:
                offline_seen += 1
                time.sleep(slow_offline_s)  # let the reconnector work while offline tokens come
                if restore_after is not None and offline_seen >= restore_after and relay.state != "up":
                    relay.restore()
    return events


def reset_until(gen, relay, cut_at: int, restore_when) -> list:
    """Consume gen; reset the link at output index `cut_at`, restore it at the first event for which
    `restore_when(event)` holds. Returns the events."""
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == cut_at:
            relay.cut("reset")
        if restore_when(e):
            relay.restore()
    return events


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_cut_for_good_completes_offline(tiny_server, relay, make_client, tiny_target_f32, tiny_drafter_f32, greedy,
                                        cut):
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True, resume_policy=ResumePolicy.KEEP)
    t0 = time.perf_counter()
    gen = client.generation(ids, config)
    events = drive(gen, {6: cut}, relay, restore_after=None, slow_offline_s=0)
    r = gen.result
    assert time.perf_counter() - t0 < 10  # the dead link was noticed in about a deadline, not minutes
    assert replay(events) == r.token_ids and len(r.token_ids) == 40
    assert any(isinstance(e, LinkEvent) and not e.online for e in events)
    # online part: the target's greedy; offline part: the drafter's own greedy continuation of it
    k = r.origins.index(TokenOrigin.OFFLINE)
    assert k >= 6 and all(o is TokenOrigin.OFFLINE for o in r.origins[k:])
    assert r.token_ids[:k] == greedy(tiny_target_f32, ids, k, set())
    assert r.token_ids[k:] == greedy(tiny_drafter_f32, ids + r.token_ids[:k], 40 - k, set())
    assert r.metrics.offline_tokens == 40 - k and r.metrics.disconnects == 1 and r.provisional == 40 - k
    assert r.finish_reason == "length"


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_resume_rollback_gives_exactly_the_targets_output(tiny_server, relay, make_client, tiny_target_f32, greedy,
                                                          cut):
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=50, ignore_eos=True,
                                                  resume_policy=ResumePolicy.ROLLBACK))
    events = drive(gen, {5: cut}, relay)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 50, set())
    assert replay(events) == r.token_ids
    assert r.metrics.resumes >= 1 and r.metrics.disconnects >= 1
    assert any(isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE for e in events)
    assert r.metrics.offline_tokens == 0 and r.provisional == 0


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_resume_keep_keeps_the_offline_text(tiny_server, relay, make_client, tiny_target_f32, greedy, cut):
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=50, ignore_eos=True,
                                                  resume_policy=ResumePolicy.KEEP))
    events = drive(gen, {5: cut}, relay, restore_after=0, slow_offline_s=0.03)
    r = gen.result
    offline = [e for e in events if isinstance(e, TokenEvent) and e.origin is TokenOrigin.OFFLINE]
    assert offline and not any(isinstance(e, RetractEvent) for e in events)
    assert replay(events) == r.token_ids and len(r.token_ids) == 50
    for e in offline:  # every offline token stands where it was emitted
        assert r.token_ids[e.index] == e.token
    k = offline[-1].index + 1
    assert r.token_ids[:5] == greedy(tiny_target_f32, ids, 5, set())
    # after the kept offline text the target takes over from exactly that text
    assert r.token_ids[k:] == greedy(tiny_target_f32, ids + r.token_ids[:k], 50 - k, set())
    assert r.metrics.resumes == 1


def test_many_drops_rollback_still_exact(tiny_server, relay, make_client, tiny_target_f32, greedy):
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=70, ignore_eos=True))
    events = drive(gen, {3: "reset", 20: "blackhole", 40: "reset", 55: "blackhole"}, relay, restore_after=2)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 70, set())
    assert replay(events) == r.token_ids
    assert r.metrics.disconnects >= 4


def test_offline_finish_under_rollback_waits_for_the_link(tiny_server, relay, make_client, tiny_target_f32, greedy):
    """Offline generation reaches max tokens while the link is down; rollback still gets the target's text."""
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=20, ignore_eos=True, offline_wait_s=20))
    # restored only once offline generation is complete
    events = reset_until(gen, relay, 3, lambda e: isinstance(e, TokenEvent) and e.index == 19
                         and e.origin is TokenOrigin.OFFLINE)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 20, set())
    assert replay(events) == r.token_ids


def test_rollback_without_link_keeps_offline_text_and_says_so(tiny_server, relay, make_client):
    client = make_client(relay.target, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=15, ignore_eos=True, offline_wait_s=0.5))
    events = drive(gen, {4: "reset"}, relay, restore_after=None, slow_offline_s=0)
    r = gen.result
    assert len(r.token_ids) == 15 and r.provisional > 0
    assert "unverified" in r.detail
    assert replay(events) == r.token_ids


@pytest.mark.parametrize("cut", ["blackhole", "reset"])
def test_ngram_stops_and_says_why(tiny_server, relay, make_client, tiny_target_f32, greedy, cut):
    client = make_client(relay.target, "ngram")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=40, ignore_eos=True, offline_wait_s=0.5))
    events = drive(gen, {6: cut}, relay, restore_after=None)
    r = gen.result
    assert r.finish_reason == "link_lost"
    assert "cannot generate without the server" in r.detail
    assert 6 <= len(r.token_ids) < 40
    assert r.token_ids == greedy(tiny_target_f32, ids, len(r.token_ids), set())  # nothing unverified
    assert replay(events) == r.token_ids


def test_ngram_comes_back_when_the_link_does(tiny_server, relay, make_client, tiny_target_f32, greedy):
    client = make_client(relay.target, "ngram")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=30, ignore_eos=True, offline_wait_s=10))
    reset_until(gen, relay, 5, lambda e: isinstance(e, LinkEvent) and not e.online)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 30, set())
    assert r.metrics.resumes == 1


def test_session_lost_on_the_server_is_rebuilt_by_resume(tiny_server, make_client, tiny_target_f32, greedy):
    """The server forgets the session (expired, evicted, restarted): Resume re-prefills it; nothing changes."""
    client = make_client(tiny_server.address, "independent")
    ids = client.encode(PROMPT)
    gen = client.generation(ids, GenerationConfig(max_new_tokens=40, ignore_eos=True))
    events = []
    for e in gen:
        events.append(e)
        if isinstance(e, TokenEvent) and e.index == 8 and not any(isinstance(x, LinkEvent) for x in events):
            tiny_server.core.close(gen.session_id)
    r = gen.result
    assert r.token_ids == greedy(tiny_target_f32, ids, 40, set())
    assert replay(events) == r.token_ids
    assert r.metrics.resumes == 1
    back = [e for e in events if isinstance(e, LinkEvent) and e.online]
    assert back and "re-prefilled" in back[0].detail
