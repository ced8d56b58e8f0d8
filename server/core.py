"""VerifierCore: what the gRPC service does, without protobuf.

It owns the target, the model scheduler, the session store, the prefix cache,
the loaded MoA server parts and the metrics; the servicer only converts messages.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import Sequence

from edgespec.shared.drafters.moa.lsa import LayerSelfAttention
from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import decode_tree
from edgespec.shared.wire import DEFAULT_MAX_MESSAGE_BYTES, MAX_NODES, ResumePolicy

from .errors import (DrainingError, InvalidRequestError, SessionBusyError, SessionNotFoundError,
                     StaleStateError, printable)
from .engine.base import Engine
from .engine.generic import GenericEngine
from .features import lsa_part
from .load_price import LoadPrice, Totals
from .metrics import ServerMetrics
from .prefix.cache import PrefixCache
from .prefix.kv import unsupported as prefix_cache_unsupported
from .scheduler import ModelScheduler
from .session import StepResult, VerifierSession
from .session_store import SessionStore, StoreLimits
from .target import TargetModel

log = logging.getLogger("edgespec.server")


@dataclass(frozen=True)
class CoreLimits:
    max_tree_nodes: int = MAX_NODES  # most nodes in one draft tree (at most the wire's MAX_NODES)
    max_context_tokens: int = 32768  # prompt + generation of one session
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # largest gRPC message either way
    store: StoreLimits = field(default_factory=StoreLimits)  # session cap, TTL, KV memory cap
    prefix_cache_bytes: int = 0  # KV memory of finished sessions' prefixes kept for later prompts; 0 = no cache


class VerifierCore:
    def __init__(self, target: TargetModel, limits: CoreLimits,
                 lsa_parts: dict[str, LayerSelfAttention] | None = None, engine: Engine | None = None):
        self.target = target
        self.limits = limits
        self.lsa_parts = dict(lsa_parts or {})
        self.scheduler = ModelScheduler(engine or GenericEngine(target))  # every forward, batched
        self.metrics = ServerMetrics(target.name, limits.max_context_tokens)
        self.prefix_cache = self._prefix_cache(limits.prefix_cache_bytes)  # None: off
        self.store = SessionStore(limits.store, on_drop=self._dropped, on_release=self._keep_prefix)
        capacity = max(1, limits.store.max_kv_bytes)
        self.metrics.watch(target.eos_ids, lambda: len(self.store), self.scheduler.pending,  # read when scraped
                           lambda: self.store.total_kv_bytes() / capacity)
        self.metrics.watch_engine(lambda: self.scheduler.engine.times, lambda: self.scheduler.engine.preemptions)
        self.metrics.watch_scheduler(lambda: self.scheduler.stats)
        self._cost_curve = None  # verification time by tree size (cost_curve.CostCurve), once measured: Info reports it
        self.load_price = LoadPrice()  # what a tree node costs the sessions sharing the forwards: sent with Verified
        self.draining = threading.Event()
        self._closed = threading.Event()
        # Idle sessions hold KV memory: drop them on time even when no call comes to trigger it.
        self._reaper = threading.Thread(target=self._reap, name="edgespec-session-reaper", daemon=True)
        self._reaper.start()

    def open(self, settings: SessionSettings, prompt_ids: Sequence[int], tree_bytes: bytes = b"") -> StepResult:
        self._refuse_when_draining()
        tree = decode_tree(tree_bytes, self.target.vocab_size, self.limits.max_tree_nodes) if tree_bytes else None
        # Validate first, then swap: the session is built (checked and prefilled) outside the store, so a
        # refused Open never touches a live session of the same id; only a good one replaces it.
        self.store.check_room(settings.session_id)
        session = self._session(settings)
        result = session.open(prompt_ids, tree)
        self.store.add(session)
        self.store.touch(session)
        self.metrics.opened(settings.session_id, len(tree) if tree else 0, result, settings.max_new_tokens)
        # Ids and names come from the peer: printed escaped, so none can forge or flood a log line.
        s = settings.sampling
        log.info("session %s opened", printable(settings.session_id), extra={
            "session": printable(settings.session_id), "prompt_tokens": len(prompt_ids),
            "cached_tokens": result.cached_tokens,
            "drafter": printable(settings.drafter, 64) or "?", "features": settings.features.kind.name,
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
            "max_new_tokens": settings.max_new_tokens})
        return result

    def verify(self, session_id: str, step: int, committed_len: int, tree_bytes: bytes,
               decode_ahead: int = 1, queued: bool = False) -> StepResult:
        tree = decode_tree(tree_bytes, self.target.vocab_size, self.limits.max_tree_nodes)
        session = self._checkout(session_id)
        try:
            result = session.verify(step, committed_len, tree, decode_ahead, queued)
            self.store.touch(session)
        finally:
            session.lock.release()
        if not result.skipped:
            self.metrics.verified(session_id, len(tree), result)
        stats = self.scheduler.stats
        price = self.load_price.update(Totals(stats.forwards, stats.items, stats.tokens, stats.busy_ns))
        result.timings = replace(result.timings, row_cost_ns=price.row_cost_ns, sharing=price.sharing)
        return result

    @property
    def cost_curve(self):
        return self._cost_curve

    @cost_curve.setter
    def cost_curve(self, curve) -> None:
        """The curve measured at start: Info reports it, and the load price starts from it (a lone session)."""
        self._cost_curve = curve
        if curve is not None:
            self.load_price.calibrate(tuple(curve.nodes), tuple(curve.total_ns))

    def resume(self, session_id: str, confirmed_len: int, confirmed_hash: bytes, committed_ids: Sequence[int],
               provisional: Sequence[int], policy: ResumePolicy,
               reopen: SessionSettings | None) -> StepResult:
        """Restore the session (or rebuild it from committed_ids + reopen), then verify the provisional chain."""
        self._refuse_when_draining()
        if committed_ids and len(committed_ids) != confirmed_len:
            raise InvalidRequestError(f"Resume.committed_len={confirmed_len} but committed_ids holds "
                                      f"{len(committed_ids)} ids")
        session = self.store.find(session_id)
        restored = session is not None and session.matches(confirmed_len, confirmed_hash)
        if restored:
            session = self._checkout(session_id)
            try:  # resume checks everything before it changes the session
                result = session.resume(confirmed_len, confirmed_hash, provisional, policy)
                self.store.touch(session)
            finally:
                session.lock.release()
        else:
            result = self._rebuild(session_id, confirmed_len, confirmed_hash, committed_ids, provisional, policy,
                                   reopen, session)
        result.restored = restored
        kept = len(provisional) if policy is ResumePolicy.KEEP else min(result.agreed, len(provisional))
        self.metrics.resumed(session_id, restored, result, kept, (reopen.max_new_tokens if reopen else 0))
        log.info("session %s resumed", printable(session_id), extra={
            "session": printable(session_id), "restored": restored, "provisional_tokens": len(provisional),
            "agreed": result.agreed, "policy": policy.name})
        return result

    def close(self, session_id: str) -> None:
        session = self.store.pop(session_id)
        if session is not None:
            self._keep_prefix(session)
        self.metrics.closed(session_id)
        log.info("session %s closed", printable(session_id), extra={"session": printable(session_id)})

    def _rebuild(self, session_id: str, confirmed_len: int, confirmed_hash: bytes,
                 committed_ids: Sequence[int], provisional: Sequence[int], policy: ResumePolicy,
                 reopen: SessionSettings | None, old: VerifierSession | None) -> StepResult:
        """Re-prefill the session from the client's ids and verify its provisional chain on a new session;
        it replaces the old one (if any) only once both succeeded, so a refusal leaves the old one as it was."""
        if not committed_ids:
            if old is None:
                raise SessionNotFoundError(
                    f"unknown session {session_id!r} and Resume carries no committed_ids to rebuild it from; "
                    f"send committed_ids and reopen")
            raise StaleStateError(
                f"Resume for session {session_id!r}: the server's committed tokens differ from the client's "
                f"{confirmed_len} confirmed ones; send committed_ids and reopen so it can rebuild the session")
        settings = reopen or (old.settings if old is not None else None)
        if settings is None:
            raise InvalidRequestError(f"session {session_id!r} is not held here, so Resume must carry reopen "
                                      f"(the Open settings) to rebuild it")
        self.store.check_room(session_id)
        session = self._session(settings)
        session.rebuild(committed_ids, confirmed_hash)
        result = session.resume(confirmed_len, confirmed_hash, provisional, policy)
        self.store.add(session)
        self.store.touch(session)
        return result

    def _session(self, settings: SessionSettings) -> VerifierSession:
        return VerifierSession(settings, self.target, self.scheduler, self.limits.max_context_tokens,
                               self.prefix_cache, lsa_part(settings.features, self.lsa_parts))

    def _checkout(self, session_id: str) -> VerifierSession:
        session = self.store.get(session_id)
        if not session.lock.acquire(timeout=30):
            raise SessionBusyError(f"session {session_id!r} is busy with another stream; close the other stream "
                                   f"or wait for its answer")
        return session

    def _refuse_when_draining(self) -> None:
        if self.draining.is_set():
            raise DrainingError("the server is shutting down and takes no new sessions; connect to another replica "
                                "or retry after it restarts (Resume rebuilds the session)")

    def _prefix_cache(self, budget: int) -> PrefixCache | None:
        """The prefix cache, or None (logged why) when it is off or this engine's KV cannot be copied."""
        if budget <= 0:
            log.info("prefix cache: off")
            return None
        probe = self.scheduler.new_kv()
        why_not = prefix_cache_unsupported(probe)
        probe.close()
        if why_not:
            log.info("prefix cache: off (%s)", why_not)
            return None
        log.info("prefix cache: up to %.2f GiB of KV", budget / 2**30)
        cache = PrefixCache(budget, on_lookup=self._prefix_looked_up)
        reclaimers = getattr(getattr(probe, "pool", None), "reclaimers", None)
        if reclaimers is not None:  # a paged pool's blocks: cached prefixes give theirs back when sessions need them
            reclaimers.append(cache.evict_oldest)
        return cache

    def _prefix_looked_up(self, queried: int, hit: int) -> None:
        self.metrics.prefix_cache_queries.inc(queried)
        self.metrics.prefix_cache_hits.inc(hit)

    def _keep_prefix(self, session: VerifierSession) -> None:
        """A session closed or dropped: its committed KV goes to the prefix cache (a failure only loses that)."""
        try:
            session.keep_prefix()
        except Exception:  # noqa: BLE001 - the close itself must not fail for the cache
            log.exception("session %s: keeping its prefix failed", printable(session.id))

    def _dropped(self, session_id: str, why: str) -> None:
        self.metrics.dropped(session_id, why)
        log.info("session %s dropped (%s)", printable(session_id), why,
                 extra={"session": printable(session_id), "reason": why})

    def _reap(self) -> None:
        period = min(30.0, max(0.5, self.limits.store.ttl_s / 4))
        while not self._closed.wait(period):
            self.store.expire()

    def close_all(self) -> None:
        self._closed.set()
        self.scheduler.close()
