"""PrefixCache: the KV of finished sessions and plain-API generations, kept for the prompts that start
with the same tokens (a chat's next turn, a shared system prompt).

vLLM calls this automatic prefix caching, SGLang RadixAttention, llama.cpp ``cache_prompt``. Here:

- ``store(kv, ids)``: when a session closes (or is dropped) or a plain-API generation ends, the KV of
  its committed ids (what the target verified: the KV holds all committed ids but the last) is kept,
  under those ids, in a ``PrefixIndex`` (a radix tree over token ids; why not hashed blocks: see there).
- ``restore(kv, ids, limit)``: on Open (and a plain-API request, and a Resume that rebuilds a
  session) the longest cached prefix of the prompt, at most ``limit`` ids, is put into the new
  session's empty KV, so only the rest of the prompt is prefilled. Callers pass len(prompt) - 1: the
  last prompt token is always fed, since its logits choose the first token.
  On a paged pool the prefix's full blocks are shared, not copied (``kv``), and the pool asks the
  cache to give prefixes back (``evict_oldest``) when sessions need their blocks.
- a byte budget (``--prefix-cache-gb``; 0 turns the cache off): past it the least recently used
  prefixes go first. A stored prefix that extends a cached one replaces it (a chat's turn 2 holds
  turn 1's rows), so one conversation keeps one copy.

The KV of a token sequence depends on the ids alone (positions start at 0), never on sampling or on
which session computed it, so a restored prefix gives the same logits as a prefill, up to the
floating-point rounding that tree verification already shows (greedy output stays the target's:
tests/server/prefix/test_cache.py).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from edgespec.server.errors import SessionCapError
from edgespec.shared.kv import SessionKV

from .index import PrefixIndex
from .kv import BlockSnapshot, KVSnapshot, restore_snapshot, take_snapshot


@dataclass
class _Entry:
    ids: tuple[int, ...]  # the token ids whose KV the snapshot holds
    snapshot: KVSnapshot | BlockSnapshot


@dataclass
class PrefixCacheStats:
    """Counts since start, in tokens as vLLM counts them."""

    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of them, restored from the cache
    stored: int = 0  # prefixes stored
    evicted: int = 0  # prefixes dropped for the byte budget or for a paged pool's sessions


class PrefixCache:
    """Thread-safe: sessions close and open on many threads at once."""

    def __init__(self, max_bytes: int, on_lookup: Callable[[int, int], None] | None = None):
        if max_bytes <= 0:
            raise ValueError("a prefix cache needs a byte budget above 0 (0 means no cache: make none)")
        self.max_bytes = max_bytes  # KV memory of every cached prefix together
        self._on_lookup = on_lookup or (lambda queried, hit: None)  # (tokens looked up, tokens hit), for metrics
        self.stats = PrefixCacheStats()
        self._index: PrefixIndex[_Entry] = PrefixIndex()
        self._lru: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._mutex = threading.Lock()

    def __len__(self) -> int:
        with self._mutex:
            return len(self._lru)

    @property
    def nbytes(self) -> int:
        with self._mutex:
            return self._bytes

    def restore(self, kv: SessionKV, ids: Sequence[int], limit: int) -> int:
        """Copy the KV of the longest cached prefix of ids[:limit] into the empty kv; how many ids it covers."""
        with self._mutex:
            entry, n = self._index.longest(ids[:max(0, limit)])
            if entry is not None:
                self._lru.move_to_end(entry.ids)
            self.stats.queries += len(ids)
            self.stats.hits += n
        self._on_lookup(len(ids), n)
        if n:
            # Outside the lock: a copy of many MB must not hold up other sessions' look-ups. The entry may be
            # evicted meanwhile; the snapshot lives on while this reference holds it.
            restore_snapshot(kv, entry.snapshot, n)
        return n

    def store(self, kv: SessionKV, ids: Sequence[int]) -> bool:
        """Keep the KV of ids, which kv's first len(ids) positions hold; False when nothing new was kept
        (ids empty, already covered by a cached prefix, or bigger than the whole budget)."""
        ids = tuple(ids)
        if not ids:
            return False
        with self._mutex:
            covering = self._index.covering(ids)
            if covering is not None:  # a longer cached prefix holds these rows already
                self._lru.move_to_end(covering.ids)
                return False
        try:
            snapshot = take_snapshot(kv, len(ids))  # outside the lock: a copy takes time
        except SessionCapError:  # a paged pool without a free block for the partial last block: keep nothing
            return False
        if snapshot.nbytes > self.max_bytes:
            return False
        with self._mutex:
            if self._index.covering(ids) is not None:  # stored by another thread meanwhile
                return False
            entry = _Entry(ids, snapshot)
            for old in self._index.add(ids, entry):
                self._drop_locked(old)
            self._lru[ids] = entry
            self._bytes += snapshot.nbytes
            self.stats.stored += 1
            while self._bytes > self.max_bytes:
                oldest = next(iter(self._lru.values()))
                self._index.remove(oldest.ids)
                self._drop_locked(oldest)
                self.stats.evicted += 1
        return True

    def evict_oldest(self) -> bool:
        """Drop the least recently used prefix (a paged pool short of blocks asks: its blocks go back once no
        restore in flight holds them); False when the cache is empty."""
        with self._mutex:
            if not self._lru:
                return False
            oldest = next(iter(self._lru.values()))
            self._index.remove(oldest.ids)
            self._drop_locked(oldest)
            self.stats.evicted += 1
        return True

    def _drop_locked(self, entry: _Entry) -> None:
        del self._lru[entry.ids]
        self._bytes -= entry.snapshot.nbytes
