"""VerifierSession: one generation session's state and its three operations.

- ``open``: prefill the prompt, pick the first token.
- ``verify``: append a draft tree, accept a path, keep only its KV.
- ``resume``: roll back to what the client confirmed (or re-prefill it), verify
  the client's provisional tokens as one chain, and commit under a policy.

Each operation is a job on the scheduler's model thread (``ModelScheduler.run_job``):
its forwards ride in batches with every other session's work, and acceptance
and KV bookkeeping run there too, so one thread does all the tensor work.
Feature encoding runs on the caller's thread so the model is free for other
sessions.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from edgespec.shared.fingerprint import committed_hash
from edgespec.shared.grammar import GrammarError
from edgespec.shared.logits_processors import RowProcessors
from edgespec.shared.logprobs import TokenLogprob, token_logprobs
from edgespec.shared.drafters.moa.lsa import LayerSelfAttention
from edgespec.shared.session_contract import ServerTimings
from edgespec.shared.session_settings import SessionSettings
from edgespec.shared.tree import DraftTree
from edgespec.shared.verification import Draws, VerifyOutcome, next_token, sample_verify, target_probs, verify_tree
from edgespec.shared.wire import MAX_DECODE_AHEAD, FeatureKind, ResumePolicy

from .decoder import processors
from .errors import InvalidRequestError, StaleStateError
from .features import FeatureSpec, export_features
from .prefix.cache import PrefixCache
from .scheduler import ModelScheduler
from .target import TargetModel


@dataclass
class StepResult:
    """The answer to Open, Draft or Resume, before it becomes a protobuf message."""

    next_token: int  # Opened.first_token / Verified.bonus_token / Resumed.bonus_token
    committed_len: int  # after this step, next_token included
    accepted: tuple[int, ...] = ()  # Draft: accepted node indices, root to leaf
    agreed: int = 0  # Resume: leading provisional tokens equal to the target's choice
    restored: bool = True  # Resume: False when the session was rebuilt by prefill
    features: list[tuple[str, bytes]] = field(default_factory=list)  # (name, codec frame)
    timings: ServerTimings = ServerTimings()
    logprobs: tuple[TokenLogprob, ...] = ()  # with SessionSettings.logprobs: one per token committed by this step
    cached_tokens: int = 0  # Open: prompt tokens whose KV came from the prefix cache instead of a prefill
    decoded: tuple[int, ...] = ()  # Draft with decode_ahead: the target's tokens before next_token
    skipped: bool = False  # a queued Draft past the text of a step that ended short: nothing done


@dataclass
class _ModelStep:
    """What a model job hands back to the caller's thread."""

    next_token: int
    accepted: tuple[int, ...]
    agreed: int
    hidden: torch.Tensor  # [n, E] of the tokens whose features are due
    kv: torch.Tensor | None  # [n, L, 2*E_kv] for MOA
    timings: ServerTimings  # the job's part: waiting for the forwards' batches, the forwards, the acceptance
    logprobs: tuple[TokenLogprob, ...] = ()
    decoded: tuple[int, ...] = ()  # a decode-ahead job: the tokens before next_token


_NO_TREE = DraftTree((), ())  # a plain decode step's tree


def _job_timings(out, t1: int) -> ServerTimings:
    """A model job's timings from its forward's output: the batches' wait, the forward, the acceptance since t1."""
    return ServerTimings(out.queue_ns, out.forward_ns, time.perf_counter_ns() - t1)


class VerifierSession:
    def __init__(self, settings: SessionSettings, target: TargetModel, scheduler: ModelScheduler,
                 max_context_tokens: int, prefix_cache: PrefixCache | None = None,
                 lsa: LayerSelfAttention | None = None):
        self.settings = settings
        # What each answer carries back; lsa: the MoA server part the request named (``features.lsa_part``).
        self.features = FeatureSpec(settings.features.kind, settings.codec, lsa, settings.features.tli_layers)
        self.id = settings.session_id
        self.target = target
        self.scheduler = scheduler
        self.max_context_tokens = max_context_tokens
        self.committed: list[int] = []  # c_0..c_{n-1}; the KV holds all but the last
        self.kv = scheduler.new_kv()  # SessionKV: a DynamicCache or a pool slot, as the engine has it
        self.draws = Draws(settings.seed)  # sampling: each token drawn by its position, whatever trees carried it
        self.lock = threading.Lock()  # held while a stream works on the session
        self.last_used = time.monotonic()
        self.kv_bytes = 0
        self.steps = 0  # verifications done
        self._last_draft: tuple[int, int, StepResult] | None = None  # (step, committed_len, answer)
        self._ended_short = False  # the last Draft decoded fewer tokens than it asked for
        # Open and rebuild start from the longest cached prefix; close and drop give the KV back to it. Not
        # for LAST_HIDDEN sessions: Open's features cover every prompt token, and a restored prefix has no
        # hidden states.
        self._wants_hidden = settings.features.kind is FeatureKind.LAST_HIDDEN
        self.prefix_cache = None if self._wants_hidden else prefix_cache
        self.rows: RowProcessors | None = None  # the logits processors, once the prompt is known (None: none)

    def open(self, prompt_ids: Sequence[int], tree: DraftTree | None = None) -> StepResult:
        """Prefill the prompt, verifying a tree hung from its last token in the same pass when one
        comes with it; the answer carries the accepted nodes, the next token and the features."""
        if not prompt_ids:
            raise InvalidRequestError("Open.prompt_ids is empty: send at least one token")
        depth = max(tree.depths(), default=0) if tree else 0
        self._check_room(len(prompt_ids) + depth + 1)  # before the per-id check: a huge prompt is refused at once
        self._check_ids(prompt_ids, "Open.prompt_ids")
        prompt = list(prompt_ids)
        self._start_processors(prompt)
        t0 = time.perf_counter_ns()
        cached = self._restore_prefix(prompt, len(prompt) - 1)  # the last prompt token is fed: it picks the first
        restore_ns = time.perf_counter_ns() - t0
        result = self._run(self._open_job, prompt, tree if tree else None, cached)
        result.cached_tokens = cached
        result.timings = replace(result.timings, total_ns=result.timings.total_ns + restore_ns)
        return result

    def _open_job(self, prompt: list[int], tree: DraftTree | None, cached: int = 0) -> _ModelStep:
        # The KV holds prompt[:cached] (from the prefix cache); out.hidden covers the fed rows only, which is
        # all of them for the one feature kind that reads hidden rows (LAST_HIDDEN never restores).
        if tree is None:
            out = yield from self.scheduler.prefill(self.kv, prompt[cached:])
            t1 = time.perf_counter_ns()
            first = next_token(self._shaped(out.logits[-1:], prompt)[0], self.settings.sampling, self.draws,
                               len(prompt))
            self.committed = prompt + [first]
            kv = self._kv_rows(0, len(prompt))
            return _ModelStep(first, (), 0, self._hidden_rows(out.hidden, slice(None)), kv, _job_timings(out, t1),
                              self._logprobs(out.logits, [-1], [first]))
        out = yield from self.scheduler.prefill_tree(self.kv, prompt[cached:], tree)
        t1 = time.perf_counter_ns()
        outcome = verify_tree(tree, self._shaped(out.logits, prompt, tree), self.settings.sampling, self.draws,
                              len(prompt))
        past = len(prompt) - 1
        rows = [0] + [i + 1 for i in outcome.accepted]  # of [last prompt token] + nodes
        self.kv.keep_rows(past, rows)
        new = [tree.tokens[i] for i in outcome.accepted] + [outcome.next_token]
        self.committed = prompt + new
        fed_past = past - cached  # rows of out.hidden before the last prompt token's
        hidden = torch.cat([out.hidden[:fed_past], out.hidden[[fed_past + r for r in rows]]]) if self._wants_hidden \
            else out.hidden[:0]
        kv = self._kv_rows(0, past + len(rows))
        return _ModelStep(outcome.next_token, outcome.accepted, 0, hidden, kv, _job_timings(out, t1),
                          self._logprobs(out.logits, rows, new))

    def verify(self, step: int, committed_len: int, tree: DraftTree, decode_ahead: int = 1,
               queued: bool = False) -> StepResult:
        """Verify a tree hung from the last committed token; with an empty tree and decode_ahead > 1, decode up to
        that many tokens instead (``Draft.decode_ahead``). A queued Draft (``Draft.queued``) past the text of a
        step that ended short is skipped."""
        if self._last_draft and self._last_draft[:2] == (step, committed_len):
            return self._last_draft[2]  # a retry of the step just answered
        if queued and committed_len > len(self.committed) and self._ended_short:
            return StepResult(0, len(self.committed), skipped=True)
        if committed_len != len(self.committed):
            raise StaleStateError(
                f"Draft step {step} says committed_len={committed_len} but session {self.id} has "
                f"{len(self.committed)} committed tokens; send Resume to resynchronise")
        if decode_ahead > 1 and len(tree):
            raise InvalidRequestError(f"Draft.decode_ahead={decode_ahead} comes with a tree of {len(tree)} nodes: "
                                      f"the target decodes ahead only on an empty tree")
        if decode_ahead > MAX_DECODE_AHEAD:
            raise InvalidRequestError(f"Draft.decode_ahead={decode_ahead} is more than the {MAX_DECODE_AHEAD} tokens "
                                      f"one Draft may ask for")
        self._check_room(committed_len + max(tree.depths(), default=0) + 1)
        if decode_ahead > 1:  # as many as the context has room for (the check above: at least one)
            result = self._run(self._decode_job, min(decode_ahead, self.max_context_tokens - committed_len))
        else:
            result = self._run(self._verify_job, tree)
        # fewer tokens than asked (EOS, the context's end): a Draft queued behind this one hangs past the text
        self._ended_short = not len(tree) and len(result.decoded) + 1 < decode_ahead
        self.steps += 1
        self._last_draft = (step, committed_len, result)
        return result

    def _verify_job(self, tree: DraftTree) -> _ModelStep:
        past = len(self.committed) - 1
        sampling = self.settings.sampling
        # greedy without logits processors: the engine may accept on the device and keep the path's KV there
        # (out.accepted); processors (penalties, grammar) run on the host, per node
        out = yield from self.scheduler.forward_tree(self.kv, self.committed[-1], tree,
                                                   accept=sampling.greedy and self.rows is None)
        t1 = time.perf_counter_ns()
        if out.accepted is not None:
            outcome = VerifyOutcome(out.accepted, out.next_token)
        else:
            logits = self._shaped(out.logits, self.committed, tree)  # penalties and grammar, per node
            if sampling.greedy:
                outcome = verify_tree(tree, logits, sampling, self.draws, len(self.committed))
            else:
                # sampling reads its rows' distributions back once, then draws on the host (seeded runs give
                # the same tokens on every device and engine)
                outcome = sample_verify(tree, target_probs(logits, sampling).cpu(), self.draws, len(self.committed))
        rows = [0] + [i + 1 for i in outcome.accepted]
        if out.accepted is None:
            self.kv.keep_rows(past, rows)
        new = [tree.tokens[i] for i in outcome.accepted] + [outcome.next_token]
        self.committed += new
        kv = self._kv_rows(past, past + len(rows))
        return _ModelStep(outcome.next_token, outcome.accepted, 0, self._hidden_rows(out.hidden, rows), kv,
                          _job_timings(out, t1), self._logprobs(out.logits, rows, new))

    def _decode_job(self, count: int) -> _ModelStep:
        """Up to `count` plain decode steps in a row, each a forward of its own (batched with other sessions'
        work like any step), as `count` Drafts with empty trees would be, with the same draws; stops after
        EOS. The answer reads as a chain the target accepted whole."""
        steps: list[_ModelStep] = []
        while len(steps) < count:
            steps.append((yield from self._verify_job(_NO_TREE)))
            if steps[-1].next_token in self.target.eos_ids:
                break
        last = steps[-1]
        timings = ServerTimings(sum(st.timings.queue_ns for st in steps), sum(st.timings.forward_ns for st in steps),
                                sum(st.timings.verify_ns for st in steps))
        kv = None if last.kv is None else torch.cat([st.kv for st in steps])
        return _ModelStep(last.next_token, (), 0, torch.cat([st.hidden for st in steps]), kv, timings,
                          tuple(lp for st in steps for lp in st.logprobs),
                          decoded=tuple(st.next_token for st in steps[:-1]))

    def matches(self, confirmed_len: int, confirmed_hash: bytes) -> bool:
        """True when this session's committed ids start with the client's confirmed ones."""
        return (1 <= confirmed_len <= len(self.committed)
                and committed_hash(self.committed[:confirmed_len]) == confirmed_hash)

    def rebuild(self, committed_ids: Sequence[int], expected_hash: bytes | None = None) -> None:
        """Re-prefill a session from the client's confirmed ids (it expired or lived elsewhere), after checking
        them against their hash (Resume.committed_hash) when one is given."""
        if not committed_ids:
            raise InvalidRequestError("Resume.committed_ids is empty, so the session cannot be rebuilt")
        self._check_room(len(committed_ids))
        self._check_ids(committed_ids, "Resume.committed_ids")
        if expected_hash is not None and committed_hash(list(committed_ids)) != expected_hash:
            raise InvalidRequestError("Resume.committed_hash is not the sha256 of Resume.committed_ids "
                                      "(uint32 little endian); the client's state is inconsistent")

        self._start_processors(committed_ids[:self.settings.prompt_len or len(committed_ids)])
        self.kv.crop(0)
        cached = self._restore_prefix(committed_ids, len(committed_ids) - 1)  # the KV holds all ids but the last
        if cached < len(committed_ids) - 1:  # else nothing to feed: no job (one without a forward is wasted work)
            self.scheduler.run_job(self.scheduler.prefill(self.kv, list(committed_ids[cached:-1])), self.kv)
        self.committed = list(committed_ids)

    def resume(self, confirmed_len: int, confirmed_hash: bytes, provisional: Sequence[int],
               policy: ResumePolicy) -> StepResult:
        """Roll back to the confirmed ids, verify the provisional ones as a chain, commit under the policy."""
        if not self.matches(confirmed_len, confirmed_hash):
            raise StaleStateError(
                f"Resume for session {self.id}: the client's {confirmed_len} confirmed tokens do not match the "
                f"server's (it has {len(self.committed)}); send committed_ids so the server can rebuild it")
        self._check_room(confirmed_len + len(provisional) + 1)
        self._check_ids(provisional, "Resume.provisional_ids")
        self._last_draft = None
        return self._run(self._resume_job, confirmed_len, list(provisional), ResumePolicy(policy))

    def _resume_job(self, confirmed_len: int, provisional: list[int], policy: ResumePolicy) -> _ModelStep:
        self.committed = self.committed[:confirmed_len]
        past = confirmed_len - 1
        self.kv.crop(past)
        chain = DraftTree.chain(provisional)
        out = yield from self.scheduler.forward_tree(self.kv, self.committed[-1], chain)
        t1 = time.perf_counter_ns()
        logits = self._shaped(out.logits, self.committed, chain)
        outcome: VerifyOutcome = verify_tree(chain, logits, self.settings.sampling, self.draws, confirmed_len)
        agreed = len(outcome.accepted)
        if policy is ResumePolicy.KEEP:
            kept = provisional
            after = outcome.next_token if agreed == len(provisional) else next_token(
                logits[len(provisional)], self.settings.sampling, self.draws, confirmed_len + len(provisional))
        else:
            kept = provisional[:agreed]
            after = outcome.next_token
        rows = list(range(len(kept) + 1))
        self.kv.keep_rows(past, rows)
        self.committed += kept + [after]
        kv = self._kv_rows(past, past + len(rows))
        return _ModelStep(after, (), agreed, self._hidden_rows(out.hidden, rows), kv, _job_timings(out, t1),
                          self._logprobs(out.logits, rows, kept + [after]))

    def _restore_prefix(self, ids: Sequence[int], limit: int) -> int:
        """Fill the empty KV with the longest cached prefix of ids[:limit]; how many ids it covers. On the
        caller's thread: the copy touches this session's KV only (its pool slot, taken first)."""
        if self.prefix_cache is None:
            return 0
        self.kv.reserve()
        return self.prefix_cache.restore(self.kv, ids, limit)

    def keep_prefix(self) -> bool:
        """Give the committed KV to the prefix cache (the session is closing or dropped); False when there is
        no cache, the session is busy with a stream, or nothing new was kept."""
        if self.prefix_cache is None or not self.lock.acquire(blocking=False):
            return False
        try:
            held = min(len(self.kv), len(self.committed) - 1)  # a failed step may have left rows past the committed
            return held > 0 and self.prefix_cache.store(self.kv, self.committed[:held])
        finally:
            self.lock.release()

    def _start_processors(self, prompt: Sequence[int]) -> None:
        """The session's logits processors (``decoder.processors``), its sampling settings and grammar checked."""
        s = self.settings
        if not (s.sampling.processed or s.grammar):
            return
        try:
            s.sampling.check_vocab(self.target.vocab_size)
        except ValueError as err:
            raise InvalidRequestError(f"SamplingParams: {err}") from None
        try:
            self.rows = processors(self.target, s.sampling, s.grammar, prompt)
        except GrammarError as err:
            raise InvalidRequestError(f"SamplingParams.grammar is not a grammar llguidance takes: {err}") from None

    def _shaped(self, logits: torch.Tensor, committed: Sequence[int], tree: DraftTree | None = None) -> torch.Tensor:
        """logits [1 + N, V] of [root] + tree nodes hung after `committed`, each row processed from its own
        history (committed + the node's path), as a plain decoder would have at that point."""
        if self.rows is None:
            return logits
        return self.rows.tree_logits(logits, committed, tree if tree is not None else DraftTree((), ()))

    def _run(self, job, *args) -> StepResult:
        start = time.perf_counter_ns()
        step = self.scheduler.run_job(job(*args), self.kv)  # on the model thread, batched with other sessions
        t0 = time.perf_counter_ns()
        features = export_features(self.features, step.hidden, step.kv)
        encode_ns = time.perf_counter_ns() - t0
        self.kv_bytes = self.kv.nbytes
        self.last_used = time.monotonic()
        timings = replace(step.timings, encode_ns=encode_ns, total_ns=time.perf_counter_ns() - start)
        return StepResult(step.next_token, len(self.committed), step.accepted, step.agreed,
                          True, features, timings, step.logprobs, decoded=step.decoded)

    def _logprobs(self, logits: torch.Tensor, rows, tokens: list[int]) -> tuple[TokenLogprob, ...]:
        """logits[rows] [n, V]: the logits each of the n newly committed tokens was chosen from (gathered
        only when logprobs were asked: the index is an upload)."""
        if self.settings.logprobs is None:
            return ()
        return token_logprobs(logits[rows], tokens, self.settings.logprobs)

    def _hidden_rows(self, hidden: torch.Tensor, rows) -> torch.Tensor:
        """hidden[rows] (a copy: the forward's buffers are reused) when the features carry hidden states, else
        an empty tensor: no index upload, no gather."""
        return hidden[rows].clone() if self._wants_hidden else hidden[:0]

    def _kv_rows(self, start: int, end: int) -> torch.Tensor | None:
        if self.settings.features.kind is not FeatureKind.MOA:  # the one kind made from K|V rows
            return None
        return self.kv.layer_kv(start, end)

    def _check_ids(self, ids: Sequence[int], what: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.target.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(f"{what} holds token id {bad}, outside the vocabulary [0, {self.target.vocab_size})")

    def _check_room(self, needed: int) -> None:
        if needed > self.max_context_tokens:
            raise InvalidRequestError(
                f"session {self.id} would need {needed} tokens of context; this server allows "
                f"{self.max_context_tokens} (ServerLimits.max_context_tokens)")
