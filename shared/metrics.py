"""Metrics types, apart from any sink (logs, Prometheus, reports): spec-decode stats, link traffic, and
one generation's counters, which hold both.

Words, as vLLM uses them:
- a *verification* is one tree sent to the target (with Open or Draft), empty trees included;
- a *draft* is a verification whose tree has at least one node (vLLM: a step with draft tokens); an
  empty tree asks for the target's next token alone and is no draft;
- *draft tokens* are a draft's tree nodes, every branch counted (a tree of 16 nodes and depth 5 is 16
  draft tokens, of which at most 5 can be accepted);
- *accepted tokens* are draft tokens the target agreed with (one path, root to leaf);
- the *bonus token* is the target's own token after the last accepted one
  (every verification yields exactly one);
- *mean acceptance length* (vLLM's, chain-equivalent) = 1 + accepted tokens / drafts: tokens a draft
  commits, bonus included, whatever the tree's width; SGLang's ``spec_accept_length`` is the same;
- *acceptance length* tau = tokens committed per verification, bonus included:
  (accepted tokens + verifications) / verifications. Plain decoding has tau = 1; it equals the mean
  acceptance length when no tree was empty.
- *calls* are requests answered by the server: the prefill (Open), every
  verification (Draft) and every Resume.
- *bytes up/down* are serialized message sizes, both directions, every message.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from itertools import zip_longest


@dataclass
class SpecDecodeStats:
    """vLLM's spec-decode stats (``SpecDecodingStats``): the drafts verified and how deep each was accepted.

    The one place that counts acceptance per position; the generation loop and the server's
    metrics observe drafts here, and the Prometheus sink (``edgespec.shared.prom``) reads it."""

    num_drafts: int = 0  # verified trees with at least one node (vLLM: steps with draft tokens)
    num_draft_tokens: int = 0  # nodes in those trees, every branch counted
    num_accepted_tokens: int = 0  # nodes the target accepted
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: drafts accepted to depth i+1 or deeper
    num_verifications: int = 0  # trees verified, empty ones included (tau's denominator)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One verified tree of num_draft_tokens nodes whose accepted path is num_accepted_tokens long
        (an empty tree is a verification, not a draft)."""
        self.num_verifications += 1
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        per_pos = self.accepted_per_position
        per_pos.extend([0] * (num_accepted_tokens - len(per_pos)))
        for position in range(num_accepted_tokens):
            per_pos[position] += 1

    @property
    def acceptance_length(self) -> float:
        """tau: tokens committed per verification, bonus included (0 when nothing was verified). A plain step
        counts one token however many the target decoded ahead in it: tau measures the drafter; calls per
        100 tokens shows what decoding ahead saves."""
        n = self.num_verifications
        return (self.num_accepted_tokens + n) / n if n else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted tokens per draft (0 when there was no draft)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    def drafts_by_accepted(self) -> list[int]:
        """[k]: drafts whose accepted path is exactly k tokens long (from the per-position counts)."""
        reached = [self.num_drafts, *self.accepted_per_position, 0]
        return [reached[k] - reached[k + 1] for k in range(len(reached) - 1)]

    def request_summary(self) -> dict:
        """One request's speculative figures in vLLM's words and SGLang's (``meta_info``) at once (the module
        doc defines them). SGLang's spec_accept_rate is accepted / draft tokens, tree nodes counted, so a wide
        tree's rate is low while its spec_accept_length (the mean acceptance length) is high."""
        length = self.mean_acceptance_length
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "num_accepted_tokens_per_pos": list(self.accepted_per_position),
                "mean_acceptance_length": round(length, 4),
                "spec_verify_ct": self.num_verifications, "spec_accept_length": round(length, 4),
                "spec_accept_rate": round(self.num_accepted_tokens / self.num_draft_tokens, 4)
                if self.num_draft_tokens else 0.0,
                "spec_accept_token_num": self.num_accepted_tokens, "spec_draft_token_num": self.num_draft_tokens}


@dataclass
class LinkTraffic:
    """What one session's messages cost on the link, as the client's verifier counts them."""

    calls: int = 0  # prefill + verifications + resumes
    bytes_up: int = 0  # client -> server, serialized messages
    bytes_down: int = 0  # server -> client, serialized messages
    feature_bytes: int = 0  # of bytes_down: the encoded activation frames
    feature_raw_bytes: int = 0  # the same activations as plain float16 (what they would cost unencoded)
    round_trips_s: list[float] = field(default_factory=list)  # request-to-answer time of every call but queued
    # plain steps (Draft.queued: their wait runs behind the step before, no round trip of the link's)


@dataclass
class GenerationMetrics(SpecDecodeStats, LinkTraffic):
    """Counters of one generation: its drafts (``SpecDecodeStats``), its messages (``LinkTraffic``) and the
    rest. Times are seconds of wall clock on the client."""

    drafter: str = ""  # drafter name ("ngram", "independent", ...)
    prompt_tokens: int = 0  # length of the prompt in tokens
    new_tokens: int = 0  # tokens in the final output (after stop/EOS/max truncation and rollbacks)
    online_tokens: int = 0  # output tokens that the target verified or produced
    offline_tokens: int = 0  # output tokens generated offline and kept unverified (provisional or `keep`)
    draft_s: float = 0.0  # time the drafter spent proposing trees
    verify_s: float = 0.0  # server's own time on verifications (Timings.total_ns), summed
    offline_s: float = 0.0  # time spent generating offline
    prefill_s: float = 0.0  # Open round trip (time to first token)
    wall_s: float = 0.0  # whole generation, Open to last token
    disconnects: int = 0  # times the link was found dead
    resumes: int = 0  # successful Resumes
    rolled_back_tokens: int = 0  # provisional tokens dropped by `rollback`
    # The pipelined loop (client/loop/generation.py: drafting while a verification is out) and the tree planner:
    guesses: int = 0  # verdicts a tree had been drafted ahead for (guessed) before they came
    guess_hits: int = 0  # of them, the verdicts a guess matched: its tree went out at once
    stopped_ahead: int = 0  # trees drafted ahead whose drafting stopped early: their verdict came and ruled them
    # out (LoopConfig.stop_missed), so the next tree was drafted without waiting for them
    draft_ahead_s: float = 0.0  # of draft_s: drafting ahead while a verification was out (hits and misses)
    saved_s: float = 0.0  # the hits' drafting, done while the verification was out: what the serial loop
    # would have spent after the verdict
    idle_s: float = 0.0  # the client waiting for a verdict with nothing left to draft
    plain_steps: int = 0  # Drafts sent without a tree (plain decode steps: the planner found trees lose)
    queued_steps: int = 0  # of them, those sent before the answer to the one before came (Draft.queued)
    copy_steps: int = 0  # Drafts whose tree was a lookup's copy sent in place of a plain step (+ngram drafters)

    def add(self, other: SpecDecodeStats | LinkTraffic) -> None:
        """Sum other's counters into these: a session's traffic into its generation, or generations into a
        benchmark's totals. Per-position counts add position by position; the drafter's name stays."""
        for f in fields(other):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if f.name == "accepted_per_position":
                setattr(self, f.name, [a + b for a, b in zip_longest(mine, theirs, fillvalue=0)])
            elif not isinstance(mine, str):
                setattr(self, f.name, mine + theirs)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def mean_round_trip_s(self) -> float:
        return sum(self.round_trips_s) / len(self.round_trips_s) if self.round_trips_s else 0.0

    @property
    def calls_per_100_tokens(self) -> float:
        return 100.0 * self.calls / self.new_tokens if self.new_tokens else 0.0

    @property
    def bytes_per_token(self) -> float:
        return (self.bytes_up + self.bytes_down) / self.new_tokens if self.new_tokens else 0.0

    @property
    def guess_hit_rate(self) -> float:
        return self.guess_hits / self.guesses if self.guesses else 0.0

    @property
    def own_draft_s(self) -> float:
        """The drafting of the trees that went out: draft_s less the trees drafted ahead for guesses that missed
        (draft_ahead_s - saved_s), which the pipelined loop drafts while the client waits on a verdict."""
        return self.draft_s - self.draft_ahead_s + self.saved_s

    @property
    def saved_per_step_s(self) -> float:
        """Drafting time the pipelined loop saved per verification."""
        return self.saved_s / self.num_drafts if self.num_drafts else 0.0

    def to_dict(self) -> dict:
        """Plain values for JSON, derived figures included."""
        out = asdict(self)
        out.pop("round_trips_s")
        digits = {"acceptance_length": 4, "mean_acceptance_length": 4, "tokens_per_s": 4, "mean_round_trip_s": 6,
                  "calls_per_100_tokens": 3, "bytes_per_token": 2, "guess_hit_rate": 4, "saved_per_step_s": 6,
                  **dict.fromkeys(("draft_s", "verify_s", "offline_s", "prefill_s", "wall_s", "draft_ahead_s",
                                   "saved_s", "idle_s"), 6)}
        out.update({name: round(getattr(self, name), d) for name, d in digits.items()})
        return out

    def summary(self) -> str:
        """One line for a person."""
        line = (f"{self.new_tokens} tokens in {self.wall_s:.2f}s ({self.tokens_per_s:.1f} tok/s), "
                f"tau {self.acceptance_length:.2f}, {self.calls} calls, "
                f"{self.bytes_up / 1024:.1f} KiB up / {self.bytes_down / 1024:.1f} KiB down")
        if self.guesses:
            line += (f", guesses hit {self.guess_hits}/{self.guesses}, {1000 * self.saved_per_step_s:.0f} ms saved "
                     f"a step, {self.idle_s:.2f}s idle")
        if self.plain_steps:
            line += f", {self.plain_steps} plain steps ({self.queued_steps} queued)"
        if self.copy_steps:
            line += f", {self.copy_steps} copies"
        if self.offline_tokens or self.disconnects:
            line += (f", {self.offline_tokens} offline, {self.disconnects} disconnects, {self.resumes} resumes, "
                     f"{self.rolled_back_tokens} rolled back")
        return line
