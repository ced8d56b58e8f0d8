"""The loop's bookkeeping as pure functions: what a verification or a resume commits, when to stop.

Words: ``committed`` is prompt + generated ids on the client; ``confirmed`` is
how many of them the server has confirmed (the rest are provisional, made
offline). Every function here takes and returns plain lists, so each rule is
tested on its own; ``StopStrings`` keeps the one piece of state, the text seen so far.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from edgespec.shared.text_stream import Decode, TextStream
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.wire import ResumePolicy

from edgespec.client.link.verifier import ProtocolError


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


class StopStrings:
    """Whether the generated text has reached a stop string, fed a token at a time through the APIs' own
    ``TextStream`` (incremental decoding, one automaton for all stops), so the loop ends exactly where the
    APIs cut the text and a token costs the same late in a long answer as early on."""

    def __init__(self, decode: Decode, stops: Sequence[str]):
        self.decode, self.stops = decode, tuple(stops)
        self._fed = 0  # tokens of generated[] the stream has seen
        self._stream = TextStream(decode, self.stops)

    def reached(self, generated: Sequence[int], k: int) -> bool:
        """Does the text of generated[: k + 1] hold a stop string? Calls come with k rising; a k below what was
        seen means the text from k on changed (a rollback), so the stream starts again from generated[:k]."""
        if self._fed != k:
            self._stream, self._fed = TextStream(self.decode, self.stops), k
            for token in generated[:k]:
                self._stream.push(token)
        self._stream.push(generated[k])
        self._fed += 1
        return self._stream.stopped


def finish_point(generated: Sequence[int], checked: int, eos_ids: set[int], max_new_tokens: int,
                 stops: StopStrings | None = None, ignore_eos: bool = False, stop_ids: Sequence[int] = (),
                 min_tokens: int = 0) -> Finish:
    """Earliest end among tokens generated[checked:] (earlier ones were checked before).

    EOS (and a stop id, vLLM's stop_token_ids) is kept as the last token (as Hugging Face's greedy output
    keeps it); a stop string ends the output with the token that completes it (the text is cut before it
    where it is shown); past max_new_tokens nothing is kept. Before min_tokens tokens nothing ends the
    output but the length (vLLM's min_tokens: its stop checks start there).
    """
    limit = min(len(generated), max_new_tokens)
    for k in range(max(checked, min_tokens - 1), limit):
        if ((not ignore_eos and generated[k] in eos_ids) or generated[k] in stop_ids
                or (stops is not None and stops.reached(generated, k))):
            return Finish(k + 1, "stop")
    if limit >= max_new_tokens:
        return Finish(max_new_tokens, "length")
    return Finish(len(generated), None)
