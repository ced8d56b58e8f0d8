"""CORAL's LM-head router: compute only a few groups of the LM head per drafted row.

The LM head is most of a drafter's cost on a laptop CPU when the vocabulary is large
(151,936 x E for Qwen). The draft vocabulary (all target ids, or the reduced one) is split
into N groups; a small router reads the same vector the head reads (the drafter's
predicted LM-head input, [T, E]) and scores the groups; only the rows of the top-g groups
are multiplied, the other logits are -inf. Verification always uses the full vocabulary,
so the router can only cost acceptance, never correctness.

The split (``split``): "frequency" (default) sorts the draft vocabulary by how often each
token occurs in the training data (ties: lower id first) and cuts that order into N equal
groups, so the frequent tokens share the first groups and most of the probability mass of
any row sits in a few groups; the head's rows are copied once in group order so each group
is one contiguous matmul. "contiguous" cuts the ids in order (BPE ids roughly follow merge
order, hence frequency): no copy of the head, at some cost in how well groups separate.

    router = LMHeadRouter(RouterConfig(E, V', n_groups=32, top_g=4), *frequency_groups(counts, 32))
    routed = bind_router(router, parts)          # checks it fits the drafter's vocabulary
    routed.logprobs(hidden)                       # [T, V'], -inf outside the chosen groups
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .checkpoint import DrafterCheckpointError, load_weights, save_weights

KIND = "router"
FILE_NAME = "router.safetensors"
SPLITS = ("frequency", "contiguous")


class RouterMismatchError(DrafterCheckpointError):
    """A router made for another draft vocabulary or hidden size than the drafter's."""


@dataclass(frozen=True)
class RouterConfig:
    hidden_size: int  # E: width of the LM-head input the router reads
    vocab_size: int  # V': size of the draft vocabulary the groups partition
    n_groups: int = 32  # N: groups the vocabulary is cut into
    top_g: int = 4  # groups whose head rows are computed per drafted row (top_g / N of the head's cost)
    router_hidden: int = 256  # width of the router's two layers
    split: str = "frequency"  # how tokens are assigned to groups: "frequency" or "contiguous" (module doc)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"router split must be one of {SPLITS}, got {self.split!r}")
        if not 1 <= self.top_g <= self.n_groups <= self.vocab_size:
            raise ValueError(f"router needs 1 <= top_g ({self.top_g}) <= n_groups ({self.n_groups}) "
                             f"<= vocabulary size ({self.vocab_size})")
        if self.router_hidden < 1:
            raise ValueError(f"router_hidden must be >= 1, got {self.router_hidden}")


# -- the split: pure functions -------------------------------------------------------------------
def equal_offsets(vocab_size: int, n_groups: int) -> torch.Tensor:
    """[N + 1] group boundaries in the group order: sizes differ by at most one."""
    base, extra = divmod(vocab_size, n_groups)
    sizes = torch.tensor([base + (1 if g < extra else 0) for g in range(n_groups)], dtype=torch.long)
    return torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])


def frequency_groups(counts: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [V'], offsets [N + 1]): draft indices by descending count (ties: lower index first);
    group g is order[offsets[g]:offsets[g + 1]]."""
    order = torch.argsort(-counts.double(), stable=True)
    return order, equal_offsets(counts.shape[0], n_groups)


def contiguous_groups(vocab_size: int, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, offsets) cutting the draft indices 0..V'-1 in order."""
    return torch.arange(vocab_size), equal_offsets(vocab_size, n_groups)


def group_index(order: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[V'] the group of every draft index."""
    sizes = offsets[1:] - offsets[:-1]
    groups = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    out = torch.empty_like(order)
    out[order] = groups
    return out


def group_probabilities(logits: torch.Tensor, group_of: torch.Tensor, n_groups: int) -> torch.Tensor:
    """The router's training target: [T, V'] logits -> [T, N] probability mass of each group."""
    p = torch.softmax(logits.float(), -1)
    out = torch.zeros(p.shape[0], n_groups, dtype=p.dtype, device=p.device)
    return out.index_add_(1, group_of.to(p.device), p)


def merged_spans(groups: list[int]) -> list[tuple[int, int]]:
    """Sorted group ids -> [g0, g1) runs of consecutive ids: [1, 2, 3, 7] -> [(1, 4), (7, 8)]."""
    spans: list[tuple[int, int]] = []
    for g in groups:
        if spans and spans[-1][1] == g:
            spans[-1] = (spans[-1][0], g + 1)
        else:
            spans.append((g, g + 1))
    return spans


def restrict_to_groups(logits: torch.Tensor, chosen: torch.Tensor, group_of: torch.Tensor) -> torch.Tensor:
    """Full-head logits [T, V'] with -inf outside each row's chosen groups (chosen: [T, g]): what the
    routed head computes, obtained from logits that exist anyway (training-time validation)."""
    n_groups = int(group_of.max()) + 1
    picked = torch.zeros(chosen.shape[0], n_groups, dtype=torch.bool, device=chosen.device)
    picked.scatter_(1, chosen, True)  # [T, N]
    return logits.masked_fill(~picked[:, group_of.to(chosen.device)], float("-inf"))


# -- the router ----------------------------------------------------------------------------------
class LMHeadRouter(nn.Module):
    """Scores the N groups from the LM-head input: norm, two layers with a residual, a group projection."""

    def __init__(self, config: RouterConfig, order: torch.Tensor, offsets: torch.Tensor,
                 vocab_ids: torch.Tensor | None = None):
        super().__init__()
        if sorted(order.tolist()) != list(range(config.vocab_size)):
            raise ValueError(f"the group order must be a permutation of 0..{config.vocab_size - 1}")
        if offsets.shape != (config.n_groups + 1,) or int(offsets[-1]) != config.vocab_size:
            raise ValueError(f"offsets must be {config.n_groups + 1} boundaries ending at {config.vocab_size}")
        self.config = config
        e, h = config.hidden_size, config.router_hidden
        self.norm = nn.RMSNorm(e, eps=1e-6)  # the head's input has a few huge channels: scale them away
        self.fc1 = nn.Linear(e, h)
        self.fc2 = nn.Linear(h, h)
        self.out = nn.Linear(h, config.n_groups)
        self.register_buffer("order", order.long().clone())
        self.register_buffer("offsets", offsets.long().clone())
        self.vocab_ids = None if vocab_ids is None else vocab_ids.clone()  # draft index -> target id (or None)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, E] LM-head input -> group scores [T, N] (logits of the group distribution)."""
        x = self.fc1(self.norm(hidden.to(self.fc1.weight.dtype)))
        x = x + self.fc2(F.silu(x))
        return self.out(F.silu(x))

    @torch.no_grad()
    def choose(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, top_g] the groups to compute for each row."""
        return self(hidden).topk(self.config.top_g, dim=-1).indices

    def group_of(self) -> torch.Tensor:
        return group_index(self.order, self.offsets)


class RoutedHead:
    """An LM head that computes only the router's chosen groups. ``head_weight``: [V', E]."""

    def __init__(self, router: LMHeadRouter, head_weight: torch.Tensor):
        self.router = router.eval()
        order = router.order.to(head_weight.device)
        identity = bool((order == torch.arange(len(order), device=order.device)).all())
        # Group-ordered rows make each group one contiguous slice; "contiguous" needs no copy.
        self.weight = head_weight if identity else head_weight[order].contiguous()
        self.order = order
        self.bounds = router.offsets.tolist()

    @torch.no_grad()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, E] -> [T, V']: the head's logits on the chosen groups, -inf elsewhere."""
        chosen = self.router.choose(hidden)  # [T, g]
        x = hidden.to(self.weight.dtype)
        picked = torch.zeros(x.shape[0], len(self.bounds) - 1, dtype=torch.bool, device=x.device)
        picked.scatter_(1, chosen, True)  # [T, N]
        # Every row gets the union of the rows' groups (the weight read is the cost, not the few rows),
        # adjacent groups merged into one slice; what a row did not choose is masked after.
        spans = merged_spans(torch.unique(chosen).tolist())
        vals = torch.cat([x @ self.weight[self.bounds[g0]:self.bounds[g1]].T for g0, g1 in spans], 1)  # [T, K]
        sizes = torch.tensor([self.bounds[g + 1] - self.bounds[g] for g0, g1 in spans for g in range(g0, g1)],
                             device=x.device)
        keep = torch.repeat_interleave(picked[:, [g for g0, g1 in spans for g in range(g0, g1)]], sizes, dim=1)
        idx = torch.cat([self.order[self.bounds[g0]:self.bounds[g1]] for g0, g1 in spans])  # [K]
        out = torch.full((x.shape[0], self.weight.shape[0]), float("-inf"), dtype=x.dtype, device=x.device)
        return out.scatter_(1, idx.expand(x.shape[0], -1), vals.masked_fill(~keep, float("-inf")))

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, V'] log-probabilities normalised over the chosen groups (-inf elsewhere)."""
        return torch.log_softmax(self.logits(hidden).float(), -1)


def check_router_fits(router: LMHeadRouter, parts, where: str = "the router") -> None:
    """Refuse a router whose vocabulary or width is not the drafter's: its groups would name other tokens."""
    c = router.config
    if c.vocab_size != parts.draft_vocab_size or c.hidden_size != parts.shape.hidden_size:
        raise RouterMismatchError(
            f"{where} was trained for a draft vocabulary of {c.vocab_size} tokens and hidden size {c.hidden_size}; "
            f"this drafter has {parts.draft_vocab_size} and {parts.shape.hidden_size}: train a router for it "
            f"(edgespec train fit --kind eagle+router / moa+router --init RUN)")
    mine, theirs = router.vocab_ids, parts.vocab_ids
    same = (mine is None and theirs is None) or (
        mine is not None and theirs is not None and torch.equal(mine.cpu(), theirs.cpu()))
    if not same:
        raise RouterMismatchError(f"{where} was trained for another draft vocabulary than this drafter's "
                                  f"(reduced vocabulary ids differ): train a router for this drafter")


def bind_router(router: LMHeadRouter, parts) -> RoutedHead:
    """The routed head of a drafter's target parts, after checking the router fits them."""
    check_router_fits(router, parts)
    return RoutedHead(router, parts.head_weight)


def routed_head_for(router: "LMHeadRouter | RoutedHead | None", parts) -> "RoutedHead | None":
    """What a drafting runtime attaches: None, a RoutedHead made for ``parts``, or one already made
    (reused: no second copy of the head) after checking its router fits ``parts``."""
    if router is None:
        return None
    if isinstance(router, RoutedHead):
        check_router_fits(router.router, parts)
        return router
    return bind_router(router, parts)


# -- files ---------------------------------------------------------------------------------------
def save_router(router: LMHeadRouter, path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """``router.safetensors``: weights, the group map (order, offsets) and the draft vocabulary's ids.
    float32 by default: it is small (E x 256), and bf16 would change which groups win close calls."""
    return save_weights(path, KIND, asdict(router.config), router.state_dict(), router.vocab_ids, dtype)


def load_router(path: str | Path) -> LMHeadRouter:
    config, state, vocab_ids = load_weights(path, KIND)
    try:
        router = LMHeadRouter(RouterConfig(**config), state["order"], state["offsets"], vocab_ids)
        router.load_state_dict(state)
    except (KeyError, RuntimeError, ValueError, TypeError) as exc:
        raise DrafterCheckpointError(f"{path} is not a valid router checkpoint: {exc}") from None
    return router.eval()


def router_path(checkpoint: str | Path) -> Path:
    """Where a drafter checkpoint's router lives: beside ``eagle.safetensors``, inside a MoA folder."""
    checkpoint = Path(checkpoint)
    return (checkpoint.parent if checkpoint.is_file() else checkpoint) / FILE_NAME


def attach_router_if_present(runtime, checkpoint: str | Path, enabled: bool = True) -> LMHeadRouter | None:
    """Attach the checkpoint's ``router.safetensors`` (if there is one and ``enabled``) to a drafting
    runtime (the client's ``LearnedRuntime``); returns the router or None."""
    path = router_path(checkpoint)
    if not enabled or not path.is_file():
        return None
    router = load_router(path)
    check_router_fits(router, runtime.parts, where=str(path))
    runtime.attach_router(router)
    return router
