"""The engine's common parts: how the target runs forwards for many sessions' KV.

A forward is described by a ``Work`` (tokens to feed after what a session's KV
holds, their positions, which earlier new row each hangs from) and answered by
a ``ForwardOutput``. An ``Engine`` runs a list of (KV, Work) pairs:

- ``GenericEngine`` (``generic``): one forward per item on a transformers ``DynamicCache``
  with a 4-D mask. Any architecture Hugging Face runs; the CPU default.
- ``BatchedEngine`` (``batched``): one forward for all items, their KV
  in a pre-allocated pool, one upload and one readback per batch; it answers
  greedy acceptance itself (``Work.accept``). Full-attention decoder
  architectures only.

``choice.build_engine`` picks one by architecture and device
(``--engine auto``) and says which in the log. The ``ModelScheduler`` feeds engines their batches.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Sequence

import torch

from edgespec.server.target import TargetModel
from edgespec.shared.kv import SessionKV
from edgespec.shared.tree import ROOT, DraftTree

from .timing import StepTimes


@dataclass(frozen=True)
class Work:
    """Tokens one session feeds after what its KV holds, and what each may see.

    Row i sees the session's whole cached past, its ancestors and itself; a row's
    position is its parent's + 1 (``masks`` relies on it).
    """

    ids: tuple[int, ...]  # [T] token ids
    positions: tuple[int, ...]  # [T] RoPE positions
    parents: tuple[int, ...]  # [T] earlier row each row hangs from; -1 = the cached past only
    logits_from: int  # rows [logits_from, T) get logits; T = none
    accept: bool = False  # greedy verification of the rows after logits_from (a tree hung from row
    # logits_from): the engine may accept a path and keep only its KV (``ForwardOutput.accepted``)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def causal(self) -> bool:
        """A plain chain: every row sees all rows before it."""
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @classmethod
    def chunk(cls, ids: Sequence[int], start: int, logits: bool = True) -> "Work":
        """Causal text at positions start.. (a prefill chunk, a decode step); logits of the last row."""
        n = len(ids)
        return cls(tuple(ids), tuple(range(start, start + n)), tuple(range(-1, n - 1)), n - 1 if logits else n)

    @classmethod
    def tree(cls, root: int, tree: DraftTree, past: int, accept: bool = False) -> "Work":
        """[root] + nodes after `past` cached tokens; logits of every row. accept: verify greedily
        (``Work.accept``)."""
        return replace(cls.chunk_tree([root], tree, past), accept=accept)

    @classmethod
    def chunk_tree(cls, ids: Sequence[int], tree: DraftTree, past: int) -> "Work":
        """Causal ids after `past` cached tokens with a tree hung from ids[-1]; logits of [ids[-1]] + nodes."""
        p = len(ids)
        parents = list(range(-1, p - 1)) + [p - 1 if par == ROOT else p + par for par in tree.parents]
        positions = list(range(past, past + p)) + [past + p - 1 + d for d in tree.depths()]
        return cls((*ids, *tree.tokens), tuple(positions), tuple(parents), p - 1)


@dataclass
class ForwardOutput:
    """One item's share of a forward. hidden and logits may be views of buffers the next forward reuses
    (a replayed CUDA graph's outputs): copy what must outlive the job's next yield."""

    hidden: torch.Tensor  # [T, E]: the final norm's output (the LM head's input) of every row
    logits: torch.Tensor  # [T - logits_from, V] float32
    forward_ns: int = 0  # the forward this work rode in
    queue_ns: int = 0  # waiting for that forward to start
    best: list[int] | None = None  # [T - logits_from]: argmax of each logits row, when the engine read it back
    accepted: tuple[int, ...] | None = None  # Work.accept answered: accepted node indices, root to leaf, and
    # the KV already holds only the past, the root and them; None = the caller verifies and keeps rows
    next_token: int | None = None  # with accepted: the bonus token (argmax at the last accepted row)


class Engine(ABC):
    name: str = ""

    def __init__(self, target: TargetModel):
        self.target = target
        self.times = StepTimes()  # host and device parts of every step so far (``timing``)
        self.preemptions = 0  # sessions whose KV was given back for others and recomputed later (paged engines)

    @abstractmethod
    def new_kv(self) -> SessionKV:
        """An empty KV for one session (or one plain-API generation)."""

    @abstractmethod
    def run(self, items: Sequence[tuple[SessionKV, Work]]) -> list[ForwardOutput]:
        """Append each item's rows to its KV; one output per item. Callers serialise calls."""

    def check(self, kv: SessionKV, work: Work) -> None:
        """Refuse a work item that cannot run (before it joins a batch, so it fails alone)."""

    def release_batch(self) -> None:
        """The last forward's jobs have run on past it (accepted, exported their features, queued their next
        work): their sessions' KV may be taken for others again. The scheduler calls it after each batch."""

    def cost(self, items: Sequence[Work]) -> int:
        """Tokens a forward over these items computes (what the scheduler's budget counts)."""
        return sum(len(w) for w in items)

    def describe(self) -> str:
        return self.name

    def session_kv_bytes(self, budget: int) -> int:
        """What the session store's memory cap should be, given the server's KV budget."""
        return budget
