"""The llguidance constraint on the tiny byte tokenizer: masks along a tree equal masks along each path, state
follows the committed output through rollbacks, drafts are cut to the grammar, tool calls in Qwen's format."""
from __future__ import annotations

import json

import pytest
import torch

from edgespec.shared.grammar import (GrammarConstraint, GrammarError, grammar_tokenizer, json_schema_grammar,
                                     tool_call_grammar)
from edgespec.shared.openai.tool_calls import parse_tool_calls
from edgespec.shared.tree import ROOT, DraftTree

SCHEMA = {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": ["x", "yz"]}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llg(tiny_tokenizer):
    return grammar_tokenizer(tiny_tokenizer, 320, [258])


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_tree_rows_equal_the_masks_after_each_path(tiny_tokenizer, llg):
    c = GrammarConstraint(llg, json_schema_grammar(SCHEMA))
    doc = ids(tiny_tokenizer, '{"a": true, "b": "yz"}')
    output = doc[:3]
    bad = ids(tiny_tokenizer, "q")[0]
    tree = DraftTree((doc[3], bad, doc[4], doc[5], bad, doc[6]), (ROOT, ROOT, 0, 2, 2, 3))
    rows = c.tree_masks(output, tree, 320)
    for i in range(len(tree)):
        if i in (1, 4):  # refused: an unused row, left open
            assert rows[1 + i].all()
            continue
        path = [tree.tokens[a] for a in tree.ancestors(i)]
        assert torch.equal(rows[1 + i], c.path_masks(output, [path], 320)[0]), i
    assert torch.equal(rows[0], c.path_masks(output, [[]], 320)[0])
    assert c.consumed == output  # the walk rolled back all it consumed
    assert c.prune(output, tree) == DraftTree((doc[3], doc[4], doc[5], doc[6]), (ROOT, 0, 1, 2))


def test_state_follows_the_output_through_rollbacks(tiny_tokenizer, llg):
    c = GrammarConstraint(llg, json_schema_grammar(SCHEMA))
    doc = ids(tiny_tokenizer, '{"a": false, "b": "x"}')
    fresh = GrammarConstraint(llg, json_schema_grammar(SCHEMA))
    c.path_masks(doc[:10], [[]], 320)
    got = c.path_masks(doc[:4], [[]], 320)  # a Resume rolled back six tokens
    assert torch.equal(got, fresh.path_masks(doc[:4], [[]], 320))
    done = c.path_masks(doc, [[]], 320)[0]
    assert done.nonzero().flatten().tolist() == [258]  # the document is complete: EOS only
    # an output that leaves the grammar (an offline token kept) ends the constraint instead of failing
    c.path_masks(doc[:2] + ids(tiny_tokenizer, "zz"), [[]], 320)
    assert c.broken


def test_tool_call_grammar_takes_qwens_format_and_the_parser_reads_it(tiny_tokenizer, llg):
    functions = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}, {"name": "now"}]
    c = GrammarConstraint(llg, tool_call_grammar(functions))
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
    allowed = c.path_masks([], [ids(tiny_tokenizer, text)], 320)[0]
    assert allowed[258]  # complete: EOS may follow
    assert not c.path_masks([], [ids(tiny_tokenizer, '<tool_call>\n{"name": "other"')], 320).any()
    content, calls = parse_tool_calls(text)
    assert content is None
    assert [(x["function"]["name"], json.loads(x["function"]["arguments"])) for x in calls] == [
        ("get_weather", {"city": "Oslo"}), ("now", {})]
    assert parse_tool_calls("just text")[0] == "just text"
    with pytest.raises(GrammarError):
        json_schema_grammar({"type": "nonsense"})


def test_tool_tags_that_are_tokens_are_asked_for_as_tokens():
    """Qwen2.5 has <tool_call> and </tool_call> as added tokens, and writes them so: a grammar spelling them
    out as text would allow a token llguidance then refuses to consume (found on the real 1.5B)."""
    from edgespec.shared.models.tiny import tiny_tokenizer
    from edgespec.shared.openai.tool_calls import tool_use

    tok = tiny_tokenizer()
    tok.add_tokens(["<tool_call>", "</tool_call>"])  # ids 259, 260, as Qwen's (not special to HF)
    open_id, close_id = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
    use = tool_use([{"type": "function", "function": {"name": "now"}}], "required", False)
    c = GrammarConstraint(grammar_tokenizer(tok, 320, [258]), use.grammar_for(tok))
    text = ids(tok, '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>')
    assert text[0] == open_id and text[-1] == close_id
    assert c.path_masks([], [[]], 320)[0].nonzero().flatten().tolist() == [open_id]
    assert c.path_masks([], [text], 320)[0].nonzero().flatten().tolist() == [258]
    assert use.grammar_for(tiny_tokenizer()) == use.grammar  # no such tokens: the tags as text
