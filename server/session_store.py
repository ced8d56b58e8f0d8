"""SessionStore: the sessions a server holds, with an idle time-to-live and caps.

- A session idle for longer than the TTL is dropped (on the next store call).
- ``max_sessions`` caps how many are held: a new one past the cap is refused
  (RESOURCE_EXHAUSTED) after expired ones are dropped.
- ``max_kv_bytes`` caps the KV memory of all sessions: least recently used
  sessions (not in use by a stream) go first. A dropped session is not lost to
  the client: Resume with the confirmed ids rebuilds it.
- ``on_release`` gets every session dropped either way, outside the store's lock
  (the server gives its KV to the prefix cache, which may copy it).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Protocol

from .errors import SessionCapError, SessionNotFoundError


class StoredSession(Protocol):
    id: str
    lock: threading.Lock
    last_used: float
    kv_bytes: int


@dataclass(frozen=True)
class StoreLimits:
    max_sessions: int = 64  # sessions held at once; Open past it is refused
    ttl_s: float = 600.0  # idle seconds after which a session is dropped
    max_kv_bytes: int = 8 << 30  # KV memory of all sessions together; LRU eviction past it


class SessionStore:
    def __init__(self, limits: StoreLimits, clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[str, str], None] | None = None,
                 on_release: Callable[[StoredSession], None] | None = None):
        self.limits = limits
        self._clock = clock
        self._on_drop = on_drop or (lambda session_id, why: None)  # (id, "expired" | "evicted")
        self._on_release = on_release or (lambda session: None)  # each dropped session, after the lock
        self._released: list[StoredSession] = []  # dropped under the lock, handed to on_release after it
        self._sessions: OrderedDict[str, StoredSession] = OrderedDict()  # least recently used first
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        with self._mutex:
            return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        with self._mutex:
            return session_id in self._sessions

    def add(self, session: StoredSession) -> None:
        """Hold a new session (replacing one of the same id); SessionCapError when the cap is hit.

        Nothing changes when it is refused: a live session of the same id stays."""
        with self._locked():
            self._expire_locked()
            self._check_room_locked(session.id)
            self._sessions.pop(session.id, None)
            session.last_used = self._clock()
            self._sessions[session.id] = session

    def check_room(self, session_id: str) -> None:
        """SessionCapError now when adding this id would pass the cap (before the work of building it)."""
        with self._locked():
            self._expire_locked()
            self._check_room_locked(session_id)

    def _check_room_locked(self, session_id: str) -> None:
        held = len(self._sessions) - (session_id in self._sessions)  # a replaced session makes room
        if held >= self.limits.max_sessions:
            raise SessionCapError(
                f"the server holds {len(self._sessions)} sessions, its cap (max_sessions="
                f"{self.limits.max_sessions}); close finished sessions or retry later")

    def get(self, session_id: str) -> StoredSession:
        """The session, marked as just used; SessionNotFoundError when absent."""
        with self._locked():
            self._expire_locked()
            session = self._sessions.get(session_id)
            if session is None:
                raise SessionNotFoundError(
                    f"unknown session {session_id!r}: never opened here, closed, expired after "
                    f"{self.limits.ttl_s:g} s idle, or evicted; send Resume with committed_ids and reopen to "
                    f"rebuild it")
            session.last_used = self._clock()
            self._sessions.move_to_end(session_id)
            return session

    def find(self, session_id: str) -> StoredSession | None:
        try:
            return self.get(session_id)
        except SessionNotFoundError:
            return None

    def remove(self, session_id: str) -> bool:
        return self.pop(session_id) is not None

    def pop(self, session_id: str) -> StoredSession | None:
        """Take the session out of the store (a close); None when absent."""
        with self._mutex:
            return self._sessions.pop(session_id, None)

    def touch(self, session: StoredSession) -> None:
        """Mark a session used now and enforce the memory cap (call after a step grew its KV)."""
        with self._locked():
            session.last_used = self._clock()
            if session.id in self._sessions:
                self._sessions.move_to_end(session.id)
            self._evict_locked(keep=session.id)

    def expire(self) -> int:
        """Drop idle sessions now; returns how many."""
        with self._locked():
            return self._expire_locked()

    def total_kv_bytes(self) -> int:
        with self._mutex:
            return sum(s.kv_bytes for s in self._sessions.values())

    def _expire_locked(self) -> int:
        now = self._clock()
        stale = [sid for sid, s in self._sessions.items()
                 if now - s.last_used > self.limits.ttl_s and not s.lock.locked()]
        for sid in stale:
            self._released.append(self._sessions.pop(sid))
            self._on_drop(sid, "expired")
        return len(stale)

    def _evict_locked(self, keep: str) -> None:
        total = sum(s.kv_bytes for s in self._sessions.values())
        for sid in list(self._sessions):
            if total <= self.limits.max_kv_bytes:
                return
            session = self._sessions[sid]
            if sid == keep or session.lock.locked():
                continue
            total -= session.kv_bytes
            self._released.append(self._sessions.pop(sid))
            self._on_drop(sid, "evicted")

    @contextlib.contextmanager
    def _locked(self):
        """The store's lock; the sessions dropped under it go to on_release after it is let go."""
        try:
            with self._mutex:
                yield
        finally:
            if self._released:
                with self._mutex:
                    released, self._released = self._released, []
                for session in released:
                    self._on_release(session)
