"""Structured output and tool calling: requests to grammars, outputs to OpenAI's tool_calls.

- ``response_format`` {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}
  becomes a grammar the output is constrained to (``shared.grammar``).
- ``tools`` are rendered by the model's chat template (Qwen2.5's renders them and asks for calls as
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, the Hermes format). ``tool_choice``
  "required" or a named function constrains the output to such calls; "auto" lets the model choose and
  the calls it writes are parsed; "none" renders the tools and parses nothing (as vLLM).
- A parsed answer carries ``tool_calls`` (arguments as a JSON string, as OpenAI sends them) and
  finish_reason "tool_calls".
"""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from edgespec.shared.grammar import (TOOL_CALL_CLOSE, TOOL_CALL_OPEN, GrammarError, json_schema_grammar,
                                     lark_grammar, regex_grammar, tool_call_grammar, tool_tags_are_tokens)

from .errors import bad_request

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_CALL = re.compile(re.escape(TOOL_CALL_OPEN) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_CLOSE), re.S)


@dataclass(frozen=True)
class ToolUse:
    """A chat request's tools, as the template and the answer need them."""

    tools: tuple[dict[str, Any], ...]  # [{"type": "function", "function": {...}}], for the chat template
    grammar: str | None  # the constraint for "required" or a named function, tags as text; None: the model chooses
    parse: bool  # parse calls out of the output (not for tool_choice "none")
    chosen: tuple[dict[str, Any], ...] = ()  # the functions the constraint allows calls to
    parallel: bool = True  # more than one call allowed

    def grammar_for(self, tokenizer) -> str | None:
        """The constraint for this tokenizer: where the tags are tokens of their own (Qwen2.5), the grammar
        asks for those tokens (the model writes them so; their text spelt out is not what it would write)."""
        if self.grammar is None or not tool_tags_are_tokens(tokenizer):
            return self.grammar
        return tool_call_grammar(self.chosen, self.parallel, tags_are_tokens=True)


def response_format_grammar(response_format: dict[str, Any] | None) -> str | None:
    """The grammar of a response_format, None for plain text; a 400 naming the field when it is wrong."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    try:
        if kind == "text" and set(response_format) == {"type"}:
            return None
        if kind == "json_object" and set(response_format) == {"type"}:
            return json_schema_grammar({"type": "object"})  # any JSON object
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
                raise bad_request("'response_format.json_schema' must be an object with a 'name' and a 'schema'",
                                  "response_format.json_schema")
            schema = spec.get("schema", {})
            if not isinstance(schema, dict):
                raise bad_request("'response_format.json_schema.schema' must be a JSON schema object",
                                  "response_format.json_schema.schema")
            return json_schema_grammar(schema)
    except GrammarError as err:
        raise bad_request(f"Invalid value for 'response_format': the JSON schema cannot be used: {err}",
                          "response_format.json_schema.schema") from None
    raise bad_request("'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
                      "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}", "response_format")


STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")  # vLLM's structured_outputs


def structured_outputs_grammar(spec: dict[str, Any] | None) -> str | None:
    """The grammar of vLLM's structured_outputs (exactly one of json, regex, choice, grammar, json_object), None
    for none; a 400 naming the field when it is wrong."""
    if spec is None:
        return None
    given = [k for k in STRUCTURED_KINDS if spec.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad_request(f"'structured_outputs' takes exactly one of {', '.join(STRUCTURED_KINDS)}, got "
                          f"{given or 'none'}", "structured_outputs")
    kind, value = given[0], spec[given[0]]
    where = f"structured_outputs.{kind}"
    try:
        if kind == "json":
            schema = json.loads(value) if isinstance(value, str) else value
            if not isinstance(schema, dict):
                raise bad_request(f"'{where}' must be a JSON schema (an object or its JSON text)", where)
            return json_schema_grammar(schema)
        if kind == "json_object":
            return json_schema_grammar({"type": "object"})
        if kind == "regex" and isinstance(value, str):
            return regex_grammar(value)
        if kind == "grammar" and isinstance(value, str):
            return lark_grammar(value)
        if kind == "choice" and isinstance(value, list) and value and all(isinstance(c, str) and c for c in value):
            return lark_grammar("start: " + " | ".join(json.dumps(c) for c in value))  # the strings, as literals
    except json.JSONDecodeError as err:
        raise bad_request(f"'{where}' is not JSON: {err.msg}", where) from None
    except GrammarError as err:
        raise bad_request(f"Invalid value for '{where}': {err}", where) from None
    raise bad_request(f"'{where}' must be {'a list of strings' if kind == 'choice' else 'a string'}", where)


def _functions(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_request(f"'{where}' must be {{'type': 'function', 'function': {{'name': ..., ...}}}}", where)
        f = tool["function"]
        if not isinstance(f.get("name"), str) or not _NAME.match(f["name"]):
            raise bad_request(f"'{where}.function.name' must be 1-64 letters, digits, '_' or '-'",
                              f"{where}.function.name")
        if "parameters" in f and not isinstance(f["parameters"], dict):
            raise bad_request(f"'{where}.function.parameters' must be a JSON schema object",
                              f"{where}.function.parameters")
        functions.append(f)
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise bad_request("two tools have the same function name", "tools")
    return functions


def tool_use(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
             parallel: bool) -> ToolUse | None:
    """What a chat request's tools ask for; a 400 naming the field when they are wrong."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
        return None
    functions = _functions(tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice in ("none", "auto"):
        return ToolUse(tuple(tools), None, choice == "auto")
    if choice == "required":
        chosen = functions
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = [f for f in functions if f["name"] == name]
        if not chosen:
            raise bad_request(f"'tool_choice' names function {name!r}, which is not among the tools",
                              "tool_choice.function.name")
        parallel = False  # a named function is called once
    else:
        raise bad_request("'tool_choice' must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
    try:
        grammar = tool_call_grammar(chosen, parallel)
    except GrammarError as err:
        raise bad_request(f"Invalid value for 'tools': a function's parameters cannot be used: {err}",
                          "tools") from None
    return ToolUse(tuple(tools), grammar, True, tuple(chosen), parallel)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of an output: the text outside the <tool_call> blocks (None when nothing is left)
    and each block that holds {"name": ..., "arguments": ...} as an OpenAI tool call; a block that does not
    parse stays in the content, as written."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    end = 0
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        kept.append(text[end:match.start()])
        end = match.end()
        arguments = body.get("arguments", body.get("parameters", {}))
        calls.append({"id": f"call_{secrets.token_hex(12)}", "type": "function",
                      "function": {"name": body["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    if not calls:
        return text, []
    content = ("".join(kept) + text[end:]).strip()
    return content or None, calls


def template_tool_calls(calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """An assistant message's earlier tool calls as chat templates take them: arguments as an object (OpenAI
    sends a JSON string; Qwen's template writes `arguments | tojson`), as vLLM gives them."""
    out = []
    for j, call in enumerate(calls):
        f = call.get("function") if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise ValueError(f"{where}[{j}] must be {{'type': 'function', 'function': {{'name', 'arguments'}}}}")
        arguments = f.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                raise ValueError(f"{where}[{j}].function.arguments is not JSON") from None
        out.append({"type": "function", "id": call.get("id"),
                    "function": {"name": f["name"], "arguments": arguments}})
    return out
