"""Grammar-constrained decoding (JSON schema, JSON object, tool calls) through llguidance.

Why llguidance (over xgrammar): it needs no torch build of its own and builds its token masks from the
Hugging Face tokenizer both sides already load, with masks in microseconds per row; its matcher can roll
back, which is what walking a draft tree needs (consume a node, mask its children, roll back).

A grammar travels as llguidance's own serialised form (a JSON string, ``SamplingParams.grammar``): the
client builds it from the request (``response_format``, ``tools``), and both sides compile it against
the same tokenizer (the tokenizer fingerprint is checked at Open), so the server masks the target's rows
and the client masks its drafter's candidates with the same language.

JSON is generated compact (no free whitespace): a model cannot then pad a document with blanks forever,
and what it writes parses as it stands.
"""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, Sequence

import numpy as np
import torch

from edgespec.shared.tree import ROOT, DraftTree

log = logging.getLogger(__name__)

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # json.dumps style
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"  # the Qwen2.5 / Hermes tool-call format


class GrammarError(ValueError):
    """A grammar (schema, tool list) llguidance refuses; the message says why."""


def _llg():
    import llguidance  # imported when a grammar is first used: servers without one never pay for it

    return llguidance


# ------------------------------------------------------------------ grammars from requests
def json_schema_grammar(schema: dict[str, Any]) -> str:
    """A grammar for documents valid under a JSON schema."""
    try:
        grammar = _llg().LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as err:  # not a JSON object, options it does not know
        raise GrammarError(str(err)) from None
    return check_grammar(grammar)


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    """The JSON of one call: {"name": <the function's>, "arguments": <valid under its parameters>}."""
    params = function.get("parameters") or {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_grammar(functions: Sequence[dict[str, Any]], parallel: bool = True, tags_are_tokens: bool = False) -> str:
    """A grammar for one (or, when parallel, one or more) tool calls to `functions` in the Qwen2.5 / Hermes
    format: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one per line. `tags_are_tokens`:
    the tokenizer has <tool_call> and </tool_call> as tokens of their own (Qwen2.5's added tokens), which
    llguidance matches as special tokens, not as text."""
    if not functions:
        raise GrammarError("a tool call needs at least one function to call")
    schema = {"anyOf": [_call_schema(f) for f in functions]} if len(functions) > 1 else _call_schema(functions[0])
    options = {**JSON_OPTIONS, "coerce_one_of": True}
    if tags_are_tokens:
        open_tag, close_tag = f'{TOOL_CALL_OPEN} "\\n"', f'"\\n" {TOOL_CALL_CLOSE}'
    else:
        open_tag, close_tag = f'"{TOOL_CALL_OPEN}\\n"', f'"\\n{TOOL_CALL_CLOSE}"'
    call = f"{open_tag} %json {json.dumps({**schema, 'x-guidance': options})} {close_tag}"
    more = ' ("\\n" call)*' if parallel else ""
    lark = f"start: call{more}\ncall: {call}\n"
    return check_grammar(_llg().LLMatcher.grammar_from_lark(lark))


def tool_tags_are_tokens(hf_tokenizer) -> bool:
    """True when the tokenizer has the tool-call tags as added tokens of their own (Qwen2.5 has)."""
    added = hf_tokenizer.get_added_vocab() if hasattr(hf_tokenizer, "get_added_vocab") else {}
    return TOOL_CALL_OPEN in added and TOOL_CALL_CLOSE in added


def regex_grammar(pattern: str) -> str:
    """A grammar for text that matches a regular expression (llguidance's syntax, anchored at both ends)."""
    try:
        grammar = _llg().LLMatcher.grammar_from_regex(pattern)
    except (ValueError, TypeError) as err:
        raise GrammarError(str(err)) from None
    return check_grammar(grammar)


def lark_grammar(lark: str) -> str:
    """A grammar from a Lark (llguidance) grammar text."""
    try:
        grammar = _llg().LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError) as err:
        raise GrammarError(str(err)) from None
    return check_grammar(grammar)


def check_grammar(grammar: str) -> str:
    """The grammar, or a GrammarError with llguidance's reason it is not one."""
    error = _llg().LLMatcher.validate_grammar(grammar)
    if error:
        raise GrammarError(error)
    return grammar


# ------------------------------------------------------------------ tokenizer
def grammar_tokenizer(hf_tokenizer, vocab_size: int, eos_ids: Sequence[int]):
    """llguidance's view of a Hugging Face tokenizer, masks sized to the model's vocabulary (its LM head may
    have more rows than the tokenizer has tokens). Building one takes about a second on a 150k vocabulary,
    so it is kept on the tokenizer object."""
    key = (vocab_size, tuple(sorted(eos_ids)))
    cache = getattr(hf_tokenizer, "_edgespec_llg", None)
    if cache is None or cache[0] != key:
        from llguidance.hf import from_tokenizer

        cache = (key, from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids)))
        with contextlib.suppress(AttributeError):  # a tokenizer that takes no attributes: built again next time
            hf_tokenizer._edgespec_llg = cache
    return cache[1]


# ------------------------------------------------------------------ the constraint
class GrammarConstraint:
    """One generation's grammar state, kept in step with the committed output by prefix: each call gets the
    committed output ids, so rollbacks (Resume, retracted offline tokens) need no bookkeeping by the caller.

    A token the grammar refuses can still be committed (an offline token kept by a Resume under the `keep`
    policy); the constraint then ends for this generation, with a warning: the text is already outside
    the grammar, and masking what follows could not bring it back."""

    def __init__(self, llg_tokenizer, grammar: str):
        llg = _llg()
        self.matcher = llg.LLMatcher(llg_tokenizer, grammar, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error())
        self.vocab_size = llg_tokenizer.vocab_size
        self.eos_ids = list(llg_tokenizer.eos_tokens)
        self.consumed: list[int] = []
        self.broken = False

    def _sync(self, output: Sequence[int]) -> None:
        keep = 0
        limit = min(len(self.consumed), len(output))
        while keep < limit and self.consumed[keep] == output[keep]:
            keep += 1
        if keep < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - keep)
            del self.consumed[keep:]
        for token in output[keep:]:
            if self.broken:
                return
            if not self._push(token):
                self.broken = True
                log.warning("a committed token (%d) is outside the grammar; the constraint ends here", token)

    def _push(self, token: int) -> bool:
        """Consume token when the grammar allows it (a refused token would leave the matcher in error for good)."""
        if self.matcher.is_stopped() or self.matcher.validate_tokens([token]) != 1:
            return False
        ok = self.matcher.consume_token(token)
        if ok:
            self.consumed.append(token)
        return ok

    def _pop(self) -> None:
        self.matcher.rollback(1)
        self.consumed.pop()

    def _allowed(self, vocab_size: int) -> torch.Tensor:
        """[vocab_size] bool: what may come next (EOS once the grammar is complete; after an EOS, which
        ended the grammar, EOS again: a row that allowed nothing would be no distribution at all)."""
        row = torch.zeros(vocab_size, dtype=torch.bool)
        mask = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8) > 0
        n = min(vocab_size, len(mask))
        row[:n] = torch.from_numpy(mask[:n].copy())
        if not row.any():
            row[[t for t in self.eos_ids if t < vocab_size]] = True
        return row

    def tree_masks(self, output: Sequence[int], tree: DraftTree, vocab_size: int) -> torch.Tensor:
        """Allowed tokens [1 + N, V] for [root] + nodes after `output`; a node the grammar refuses gets an
        all-true row (it is never accepted, since its parent's row refuses it, so its row is never used)."""
        self._sync(output)
        rows = torch.ones(1 + len(tree), vocab_size, dtype=torch.bool)
        if self.broken:
            return rows
        rows[0] = self._allowed(vocab_size)
        children = tree.children()
        stack = [(c, 0) for c in reversed(children[0])]  # (node, depth of the matcher before consuming it)
        depth = 0
        while stack:
            node, at = stack.pop()
            while depth > at:  # leave the subtree just walked
                self._pop()
                depth -= 1
            if not rows[tree_parent_row(tree, node), tree.tokens[node]] or not self._push(tree.tokens[node]):
                continue
            depth += 1
            rows[1 + node] = self._allowed(vocab_size)
            stack.extend((c, depth) for c in reversed(children[1 + node]))
        while depth:
            self._pop()
            depth -= 1
        return rows

    def path_masks(self, output: Sequence[int], paths: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
        """Allowed tokens [k, V] after `output` + each path (target ids; an impossible path allows nothing)."""
        self._sync(output)
        rows = torch.ones(len(paths), vocab_size, dtype=torch.bool)
        if self.broken:
            return rows
        for r, path in enumerate(paths):
            pushed = 0
            for token in path:
                if not self._push(token):
                    rows[r] = False
                    break
                pushed += 1
            else:
                rows[r] = self._allowed(vocab_size)
            for _ in range(pushed):
                self._pop()
        return rows

    def after(self, output: Sequence[int]) -> "PathMasks":
        """This constraint after `output`, as a drafter asks it (``tree_builder.DraftConstraint``)."""
        return PathMasks(self, tuple(output))

    def prune(self, output: Sequence[int], tree: DraftTree) -> DraftTree:
        """The tree without the nodes the grammar refuses (and their subtrees): for drafters that draft without
        distributions (n-gram), whose refused nodes would only cost the verifier rows."""
        if not len(tree):
            return tree
        masks = self.tree_masks(output, tree, self.vocab_size)
        kept: list[int] = []
        where = {ROOT: ROOT}
        for i, (token, parent) in enumerate(zip(tree.tokens, tree.parents)):
            if parent in where and masks[tree_parent_row(tree, i), token]:
                where[i] = len(kept)
                kept.append(i)
        return DraftTree(tuple(tree.tokens[i] for i in kept), tuple(where[tree.parents[i]] for i in kept))


class PathMasks:
    """A constraint at a fixed committed output: what it allows after each of some draft paths."""

    def __init__(self, constraint: GrammarConstraint, output: tuple[int, ...]):
        self.constraint, self.output = constraint, output

    def path_masks(self, paths: Sequence[Sequence[int]]) -> torch.Tensor:
        return self.constraint.path_masks(self.output, paths, self.constraint.vocab_size)


def tree_parent_row(tree: DraftTree, node: int) -> int:
    """The logits row of node's parent: 0 for the root, 1 + parent otherwise."""
    parent = tree.parents[node]
    return 0 if parent == ROOT else 1 + parent
