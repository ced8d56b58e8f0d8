"""SessionStore: TTL, session cap, LRU eviction by KV memory (a fake clock, no model)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from edgespec.server.errors import SessionCapError, SessionNotFoundError
from edgespec.server.session_store import SessionStore, StoreLimits


@dataclass
class FakeSession:
    id: str
    kv_bytes: int = 0
    last_used: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_sessions_expire_after_the_ttl():
    clock, dropped = Clock(), []
    store = SessionStore(StoreLimits(max_sessions=4, ttl_s=10), clock, on_drop=lambda s, why: dropped.append((s, why)))
    store.add(FakeSession("a"))
    clock.now = 5
    store.add(FakeSession("b"))
    clock.now = 12
    assert store.get("b").id == "b"  # 7 s idle: kept, and touched
    with pytest.raises(SessionNotFoundError, match="'a'"):
        store.get("a")
    assert dropped == [("a", "expired")]


def test_a_session_in_use_does_not_expire():
    clock = Clock()
    store = SessionStore(StoreLimits(ttl_s=1), clock)
    busy = FakeSession("busy")
    store.add(busy)
    with busy.lock:
        clock.now = 100
        assert store.expire() == 0
    assert store.expire() == 1


def test_the_session_cap_refuses_new_sessions():
    store = SessionStore(StoreLimits(max_sessions=2, ttl_s=100), Clock())
    store.add(FakeSession("a"))
    store.add(FakeSession("b"))
    with pytest.raises(SessionCapError, match="max_sessions=2"):
        store.add(FakeSession("c"))
    store.add(FakeSession("a"))  # replacing an id does not count twice
    assert store.remove("b")
    store.add(FakeSession("c"))
    assert len(store) == 2


def test_memory_cap_evicts_least_recently_used_first():
    clock, dropped = Clock(), []
    store = SessionStore(StoreLimits(max_sessions=10, ttl_s=1000, max_kv_bytes=100), clock,
                         on_drop=lambda s, why: dropped.append((s, why)))
    sessions = {name: FakeSession(name, kv_bytes=30) for name in "abc"}
    for i, name in enumerate("abc"):
        clock.now = i
        store.add(sessions[name])
    clock.now = 5
    store.get("a")  # now b is the least recently used
    grown = FakeSession("d", kv_bytes=30)
    store.add(grown)
    store.touch(grown)  # 120 bytes > 100: b goes
    assert dropped == [("b", "evicted")]
    assert "b" not in store and all(n in store for n in "acd")
    assert store.total_kv_bytes() == 90
