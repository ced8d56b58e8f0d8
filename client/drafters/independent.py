"""A small LM of the target's tokenizer as drafter, with its own KV cache.

The cache follows the committed text: before each proposal the drafter finds
the longest prefix it already holds, crops the rest and feeds what is new, so
verification results, resumes and rollbacks all resync the same way. Trees are
EAGLE-2 trees (``tree_builder``); the frontier nodes of each depth go through
the model in one forward pass with a tree attention mask, their KV appended
after the committed tokens. That KV stays until the next proposal: the nodes the
target accepted were fed with exactly the context they have once committed
(committed tokens, ancestors, themselves; their own positions), so their KV is
moved into place instead of being computed again, and the next pass feeds only
what the tree did not hold (at least the bonus token). Offline it is a plain
greedy LM.

Speed: int8 weights (``IndependentConfig``; ``int8_linear``: passes ~1.5x faster on a CPU), the MLP's in int4
(``int4_linear``: ~1.4x faster again, the drafter's agreement with the target unchanged). The decoder runs
alone and the LM head is applied here, only to the rows that are read, and optionally over a reduced
vocabulary (the most frequent target ids, ``independent_vocab``; with ``context_vocab``, the committed text's
own ids as well). Offline generation keeps the full vocabulary (it is the output).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

import torch

from edgespec.shared import kv
from edgespec.shared.packed_weights import PackedLinear, is_packed, pack_linears, packed_weights_wanted
from edgespec.shared.tree import ROOT, DraftTree

from .base import Drafter, DraftRequest, common_prefix
from .int8_linear import head_rows, int8_matmul_available
from .quantize import quantize_linears
from .tree_builder import Candidates, TreeShape, build_tree

log = logging.getLogger(__name__)
MLP_MODULE = "mlp"  # the decoder layers' MLP, as Hugging Face's Llama-family models (Qwen2 among them) name it


def accepted_slots(suffix: Sequence[int], cands: Candidates, slot: dict[int, int]) -> list[int]:
    """Cache positions of the fed candidates spelling out ``suffix`` (target ids) from the tree's root,
    as far as they go: the KV of tokens the target accepted from the last tree."""
    out, parent = [], ROOT
    by_parent: dict[int, dict[int, int]] = {}
    for c in slot:
        by_parent.setdefault(cands.parents[c], {})[cands.tokens[c]] = c
    for tok in suffix:
        c = by_parent.get(parent, {}).get(int(tok))
        if c is None:
            break
        out.append(slot[c])
        parent = c
    return out


def frontier_mask(frontier: list[int], cands: Candidates, slot: dict[int, int], committed_len: int,
                  past_len: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [1, 1, k, past_len + k] for feeding frontier candidates after the cache.

    The cache holds the committed tokens (positions < committed_len, all visible)
    then earlier fed candidates at ``slot[c]``; a frontier node sees the
    committed tokens, its fed ancestors and itself.
    """
    k = len(frontier)
    allowed = torch.zeros(k, past_len + k, dtype=torch.bool)
    allowed[:, :committed_len] = True
    for row, c in enumerate(frontier):
        for a in cands.ancestors(c)[:-1]:
            allowed[row, slot[a]] = True
        allowed[row, past_len + row] = True
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def wants_int8(config: "IndependentConfig", model: torch.nn.Module) -> bool:
    """int8 weights pay on a CPU for a 16-bit model; float32 means full precision was asked for."""
    param = next(model.parameters())
    return (config.int8_weights and param.device.type == "cpu" and param.dtype != torch.float32
            and int8_matmul_available())


@dataclass(frozen=True)
class IndependentConfig:
    """Settings of the independent drafter."""

    tree: TreeShape = TreeShape()  # EAGLE-2 tree shape
    draft_vocab: int = 65536  # draft over the N most frequent target ids (independent_vocab; 0 = the full
    # vocabulary): the int8 head is 40 % of a pass's weight reads once the MLP is int4, and 64k ids keep almost
    # all of tau (5.35 -> 5.32 on 4 HumanEval + 4 MT-Bench prompts, while 32k ids cost 5.35 -> 4.72); a token
    # outside the list is never drafted, so the output stays the target's
    context_vocab: bool = True  # with a reduced vocabulary, also draft every id of the committed text (prompt and
    # answer so far) that the list lacks: answers that copy rare words from their prompt (extraction,
    # summarization, code) need exactly those; a few hundred rows more cost little beside the list's 65,536
    int8_weights: bool = True  # from_pretrained stores Linear weights (and the LM head) as int8 per channel
    # when the model loads in 16 bits on a CPU (the default); an explicit float32 asks for full precision
    prefill_float: bool = True  # with int8 weights, keep the 16-bit ones too for passes of many tokens (the
    # prompt's prefill), where the int8 kernel is ~2x slower than a 16-bit matrix product; costs 2x the memory
    int4_mlp: bool = True  # with int8 weights, the MLP's (87 % of a layer's weights) as int4 in groups of 64
    # instead (int4_linear; where the torch build has the kernel)
    packed_weights: bool | None = None  # a float32 model on a CPU (one without native bf16, where int8 weights do
    # not apply) also holds each linear's weight packed for oneDNN, so a tree level's rows cost nearly one row's
    # (shared/packed_weights.py; the weights are held twice); unset: on there

    @property
    def weights(self) -> str:
        """What the drafter's Linear layers become on a CPU in 16 bits: "int4-mlp", "int8" or "float"."""
        return "float" if not self.int8_weights else "int4-mlp" if self.int4_mlp else "int8"


WEIGHTS = ("int4-mlp", "int8", "float")  # IndependentConfig.weights, by name (the CLI's and the benchmarks')


def weights_config(name: str) -> dict:
    """IndependentConfig's fields for a weights name of WEIGHTS."""
    if name not in WEIGHTS:
        raise ValueError(f"unknown drafter weights {name!r}; choose one of {', '.join(WEIGHTS)}")
    return {"int8_weights": name != "float", "int4_mlp": name == "int4-mlp"}


def config_vocab_ids(config: IndependentConfig, model: torch.nn.Module, tokenizer,
                     fingerprint: str | None = None) -> torch.Tensor | None:
    """The draft vocabulary config.draft_vocab asks for, for this tokenizer (None: every id); `fingerprint`:
    the tokenizer's, where the caller has it already (hashing a 150k vocabulary is a start-up cost)."""
    from edgespec.shared.fingerprint import tokenizer_fingerprint

    from .independent_vocab import draft_vocab_ids

    if not config.draft_vocab:
        return None
    vocab_size = model.get_output_embeddings().out_features
    return draft_vocab_ids(tokenizer, fingerprint or tokenizer_fingerprint(tokenizer), config.draft_vocab,
                           vocab_size)


def quantize(model: torch.nn.Module, config: IndependentConfig) -> None:
    """The drafter's own model, in place, to the weights config asks for (wants_int8 said yes)."""
    from .int4_linear import Int4Linear, int4_matmul_available

    int4 = MLP_MODULE if config.int4_mlp and int4_matmul_available() else None
    quantize_linears(model, config.prefill_float, int4_under=int4)
    if int4 and not any(isinstance(m, Int4Linear) for m in model.modules()):
        # the MLP is found by its module's name: an architecture that names it otherwise would silently lose
        # the int4 speed-up, so say so
        log.warning("int4 MLP asked for, but %s has no linear layer under a module named %r that the int4 kernel "
                    "takes: every layer is int8", type(model).__name__, MLP_MODULE)


class IndependentDrafter(Drafter):
    name = "independent"
    can_generate_offline = True
    stops_by_path = True

    def __init__(self, model: torch.nn.Module, config: IndependentConfig = IndependentConfig(),
                 vocab_ids: torch.Tensor | None = None):
        from transformers import DynamicCache

        self.model = model.eval()
        self.config = config
        self._cache = DynamicCache()
        self._fed: list[int] = []  # committed ids whose KV is in the cache, in order (the cache's first len(_fed))
        self._tree = None  # (candidates as target ids, cache slot per fed candidate) of the last tree, kept in
        # the cache behind the committed tokens until the next sync
        self._scores: list[float] = []  # cumulative log-probability of each node of the last tree
        self._head = model.get_output_embeddings()  # the full LM head (offline generation)
        # vocab_ids: [V'] target ids, ascending; the draft head's row r scores target id vocab_ids[r]
        self.vocab_ids = None if vocab_ids is None else torch.as_tensor(vocab_ids, dtype=torch.long).cpu()
        if self.vocab_ids is not None:
            size = self._head.out_features
            if len(self.vocab_ids) == 0 or int(self.vocab_ids.min()) < 0 or int(self.vocab_ids.max()) >= size:
                raise ValueError(f"vocab_ids must be non-empty target ids in 0..{size - 1}")
            self._vocab_list = self.vocab_ids.tolist()  # draft id -> target id, for building trees in Python
        self._draft_head = head_rows(self._head, self.vocab_ids)
        if is_packed(model) and type(self._draft_head) is torch.nn.Linear:  # a tree level's rows, as the layers'
            self._draft_head = PackedLinear(self._draft_head)
        # context_vocab: the committed text's ids the list lacks (draft ids len(list) + i), the head rows that
        # score them, and which target ids the list holds
        self._listed: torch.Tensor | None = None
        self._context_ids: list[int] = []
        self._context_head: torch.nn.Module | None = None
        self._to_target = self.vocab_ids  # draft id -> target id for build_tree (None: the same id)
        if self.vocab_ids is not None and config.context_vocab:
            self._listed = torch.zeros(self._head.out_features, dtype=torch.bool)
            self._listed[self.vocab_ids] = True

    @classmethod
    def from_pretrained(cls, name_or_path: str, config: IndependentConfig = IndependentConfig(),
                        device: str | None = "cpu", dtype: str | torch.dtype | None = None) -> "IndependentDrafter":
        from edgespec.shared.models import load_model

        loaded = load_model(name_or_path, device=device, dtype=dtype)
        ids = config_vocab_ids(config, loaded.model, loaded.tokenizer, loaded.fingerprint)
        if wants_int8(config, loaded.model):
            quantize(loaded.model, config)  # this model is ours alone: quantize in place
        elif packed_weights_wanted(loaded.device, loaded.dtype, config.packed_weights, loaded.model):
            # ours alone too (from_model's may be shared, so it is left as it is); the full LM head only scores
            # one row at a time (offline generation): the draft head is packed from its rows below
            pack_linears(loaded.model, exclude=(loaded.model.get_output_embeddings(),))
        return cls(loaded.model, config, ids)

    @classmethod
    def from_model(cls, model: torch.nn.Module, config: IndependentConfig = IndependentConfig(),
                   vocab_ids: torch.Tensor | None = None, tokenizer=None) -> "IndependentDrafter":
        """A drafter on its own copy of model, prepared as from_pretrained prepares one (int8 when asked and
        the model is 16-bit on a CPU); model itself is left as it is (e.g. shared with a baseline). Without
        vocab_ids, the draft vocabulary is config.draft_vocab's list for `tokenizer`; with neither, all ids."""
        import copy

        if vocab_ids is None and tokenizer is not None:
            vocab_ids = config_vocab_ids(config, model, tokenizer)
        if not wants_int8(config, model):
            return cls(model, config, vocab_ids)
        owned = copy.deepcopy(model)
        quantize(owned, config)
        return cls(owned, config, vocab_ids)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @torch.inference_mode()
    def _hidden(self, ids: list[int], positions: list[int], mask: torch.Tensor | None) -> torch.Tensor:
        """Final hidden states [len(ids), E] of ids fed after the cache (which grows by len(ids))."""
        body = self.model.get_decoder()
        out = body(input_ids=torch.tensor([ids], device=self.device),
                   position_ids=torch.tensor([positions], device=self.device),
                   attention_mask=None if mask is None else mask.to(self.device),
                   use_cache=True, **kv.with_cache(body, self._cache))
        return out.last_hidden_state[0]

    @torch.inference_mode()
    def _draft_logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the draft vocabulary [T, V'] (draft ids) for hidden [T, E]."""
        logits = self._draft_head(hidden)
        if self._context_head is not None:
            logits = torch.cat([logits, self._context_head(hidden)], dim=-1)
        return torch.log_softmax(logits.float(), dim=-1)

    def _target_id(self, draft_id: int) -> int:
        if self.vocab_ids is None:
            return draft_id
        listed = len(self._vocab_list)
        return self._vocab_list[draft_id] if draft_id < listed else self._context_ids[draft_id - listed]

    def _add_context_ids(self, committed: Sequence[int]) -> None:
        """context_vocab: the draftable extra ids are the unlisted ids of this text (ascending); the head rows
        that score them are cut again only when that set changes. Trees are turned into target ids as soon as
        they are built, so draft ids beyond the list may mean other ids from one proposal to the next."""
        if self._listed is None:
            return
        ids = torch.as_tensor(list(committed), dtype=torch.long)
        ids = ids[(ids >= 0) & (ids < len(self._listed))]
        unlisted = ids[~self._listed[ids]].unique().tolist()  # unique() sorts
        if unlisted != self._context_ids:
            self._context_ids = unlisted
            self._context_head = head_rows(self._head, torch.tensor(unlisted, dtype=torch.long)) if unlisted else None
            self._to_target = self._vocab_list + unlisted if unlisted else self.vocab_ids

    def _sync(self, committed: Sequence[int]) -> torch.Tensor:
        """Make the cache hold exactly `committed`; return the hidden state after its last token [E]."""
        n_old = len(self._fed)
        keep = min(common_prefix(self._fed, committed), len(committed) - 1)
        tree, self._tree = self._tree, None
        if tree is not None and keep == n_old:
            # Accepted tree nodes: move their KV into place (the last token is fed anyway, for its hidden state).
            slots = accepted_slots(committed[n_old:len(committed) - 1], *tree)
            kv.keep_rows(self._cache, n_old, [s - n_old for s in slots])
            keep += len(slots)
        kv.crop(self._cache, keep)
        hidden = self._hidden(list(committed[keep:]), list(range(keep, len(committed))), None)
        self._fed = list(committed)
        return hidden[-1]

    def propose(self, request: DraftRequest) -> DraftTree:
        committed = request.committed
        self._add_context_ids(committed)
        root_logprobs = self._draft_logprobs(self._sync(committed)[None])[0]  # [V']
        n = len(committed)
        slot: dict[int, int] = {}  # candidate index -> cache position
        # Candidates hold draft ids (rows of the draft head); the model is fed target ids.

        def expand(frontier: list[int], cands: Candidates) -> torch.Tensor:
            past = self._cache.get_seq_length()
            mask = frontier_mask(frontier, cands, slot, n, past, self.dtype)
            for row, c in enumerate(frontier):
                slot[c] = past + row
            hidden = self._hidden([self._target_id(cands.tokens[c]) for c in frontier],
                                  [n - 1 + cands.depths[c] for c in frontier], mask)
            return self._draft_logprobs(hidden)

        try:
            _, cands = build_tree(root_logprobs, expand, self.config.tree, request.max_nodes, request.max_depth,
                                  request.constraint, self._to_target, ahead=request.ahead,
                                  stop=request.stop, floors=request.path_floors)
        except BaseException:
            kv.crop(self._cache, n)
            raise
        if self.vocab_ids is not None:  # draft ids to target ids, for the tree and for the KV its accepted nodes keep
            cands.tokens = [self._target_id(t) for t in cands.tokens]
        self._tree = (cands, slot)  # its KV stays behind the committed tokens until the next sync
        self._scores = cands.kept_scores()
        return cands.subtree(cands.kept)  # the tree build_tree returned, in target ids

    def tree_scores(self) -> list[float]:
        """The drafter's own cumulative log-probabilities. ``rewind`` keeps the cache as it is: every call syncs
        it to the text it is given (a wrong guess is cropped then), and a right one reuses its KV."""
        return list(self._scores)

    @torch.inference_mode()
    def generate_offline(self, committed: Sequence[int]) -> int:
        return int(self._head(self._sync(committed)[None])[0].argmax())

    def close(self) -> None:
        self._cache = type(self._cache)()
        self._fed = []
        self._tree = None
        self._scores = []
        self._context_ids, self._context_head, self._to_target = [], None, self.vocab_ids
