"""The loop's bookkeeping as pure functions: what a verification or a resume commits, when to stop.

Words: ``committed`` is prompt + generated ids on the client; ``confirmed`` is
how many of them the server has confirmed (the rest are provisional, made
offline). Every function here takes and returns plain lists, so each rule is
tested on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from edgespec.shared.errors import EdgespecError
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import ResumePolicy


class ProtocolError(EdgespecError):
    """The server's answer contradicts the request (wrong step, accepted nodes not a path, lengths off)."""

    grpc_code = "INTERNAL"


def accepted_path(tree: DraftTree, accepted: Sequence[int]) -> list[int]:
    """Tokens of the accepted nodes, after checking they form a path from the root."""
    parent = ROOT
    for i in accepted:
        if not 0 <= i < len(tree):
            raise ProtocolError(f"server accepted node {i} of a {len(tree)}-node tree")
        if tree.parents[i] != parent:
            raise ProtocolError(f"server's accepted nodes {list(accepted)} are not a root-to-leaf path of the tree")
        parent = i
    return [tree.tokens[i] for i in accepted]


def check_committed_len(expected: int, reported: int, what: str) -> None:
    if expected != reported:
        raise ProtocolError(f"{what}: server reports committed_len {reported}, the client expected {expected}")


def resume_commit(committed: Sequence[int], confirmed: int, agreed: int, bonus: int,
                  policy: ResumePolicy) -> list[int]:
    """Committed ids after a Resume answered (agreed, bonus)."""
    provisional = len(committed) - confirmed
    if not 0 <= agreed <= provisional:
        raise ProtocolError(f"server agreed with {agreed} of {provisional} provisional tokens")
    kept = len(committed) if policy is ResumePolicy.KEEP else confirmed + agreed
    return list(committed[:kept]) + [int(bonus)]


@dataclass(frozen=True)
class Finish:
    """Where the output ends, if it does."""

    keep: int  # generated tokens that stay
    reason: str | None  # "stop" (EOS or stop string), "length", or None (not finished)


def first_stop(text: str, stops: Iterable[str]) -> int | None:
    """Index in text where the earliest stop string starts, None if there is none."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(hits) if hits else None


def finish_point(generated: Sequence[int], checked: int, eos_ids: set[int], max_new_tokens: int,
                 stops: Sequence[str] = (), decode: Callable[[Sequence[int]], str] | None = None,
                 ignore_eos: bool = False) -> Finish:
    """Earliest end among tokens generated[checked:] (earlier ones were checked before).

    EOS is kept as the last token (as Hugging Face's greedy output keeps it); a
    stop string ends the output with the token that completes it (the text is
    cut before it by ``first_stop``); past max_new_tokens nothing is kept.
    """
    limit = min(len(generated), max_new_tokens)
    for k in range(checked, limit):
        if not ignore_eos and generated[k] in eos_ids:
            return Finish(k + 1, "stop")
        if stops and decode is not None and first_stop(decode(generated[: k + 1]), stops) is not None:
            return Finish(k + 1, "stop")
    if limit >= max_new_tokens:
        return Finish(max_new_tokens, "length")
    return Finish(len(generated), None)
