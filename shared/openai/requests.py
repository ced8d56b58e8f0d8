"""Request bodies of /v1/completions and /v1/chat/completions, parsed and validated.

Types are strict (a string is not a number, ``true`` is not 1) and NaN or
infinity is no number at all. A field this API does not implement is refused
with a 400 that names it, unless its value is the one that means "off" (a
penalty of 0, no tools), which changes nothing. An unknown field is refused too:
a caller whose option would be ignored should hear so.

Defaults follow OpenAI and vLLM: temperature 1, top_p 1, n 1, a fresh random
seed when none is given, 16 tokens for completions and the rest of the
context for chat. vLLM's sampling controls (min_p, the three penalties,
logit_bias, ignore_eos) take vLLM's ranges; ``response_format`` and (chat)
``tools`` / ``tool_choice`` become a grammar (``shared.grammar``) the output
is constrained to.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgespec.shared import defaults
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.wire import MAX_TOP_LOGPROBS

from .errors import OpenAIError, bad_request, unsupported
from .tool_calls import ToolUse, response_format_grammar, structured_outputs_grammar, template_tool_calls, tool_use

log = logging.getLogger(__name__)

MAX_N = 8  # choices per request; they are generated one after another
MAX_STOPS = 16  # OpenAI allows 4; matching costs the same for any number, this bounds the automaton
MAX_STOP_CHARS = 256  # characters per stop string
MAX_COMPLETION_LOGPROBS = 5  # completions' `logprobs`, as OpenAI
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)  # int64 as OpenAI, or uint64 as the wire's seed


@dataclass(frozen=True)
class Settings:
    """What a request asks of generation, whichever endpoint it came to."""

    max_tokens: int | None  # None: the endpoint's default
    sampling: SamplingSettings  # temperature 1 unless the request says otherwise, as OpenAI
    seed: int | None  # None: a fresh random seed per choice
    n: int  # choices
    stop: tuple[str, ...]  # stop strings, none empty
    top_logprobs: int | None  # None: no logprobs; k: the chosen token's logprob and the k most likely
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    ignore_eos: bool = False  # keep generating past EOS (vLLM's; for fixed-length benchmarks)
    grammar: str | None = None  # llguidance grammar the output is constrained to (response_format, tool_choice)
    tools: ToolUse | None = None  # chat with tools: rendered by the template, calls parsed from the output
    token_ids_as_text: bool = False  # return_tokens_as_token_ids: logprobs name tokens "token_id:{id}"


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None


def _check_text(value: str, what: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds an unpaired UTF-16 surrogate, which is not text") from None
    return value


class _Common(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's extension; -1 and 0 mean off
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    user: str | None = None  # an end-user id for OpenAI's abuse monitoring; nothing to do here
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    logit_bias: dict[str, float] | None = None  # OpenAI's: token id (as a string) -> bias, clamped to [-100, 100]
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(default=None, ge=0)  # vLLM's: no EOS, stop id or stop string before this many
    stop_token_ids: list[Annotated[int, Field(ge=0, le=2 ** 32 - 1)]] | None = Field(default=None, max_length=1024)
    # (vLLM's: ids that end the output, as EOS does)
    response_format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    structured_outputs: dict[str, Any] | None = None  # vLLM's: one of json, regex, choice, grammar, json_object
    return_tokens_as_token_ids: bool | None = None  # vLLM's: logprobs name tokens "token_id:{id}", so a client
    # reads the exact ids without a tokenizer (a benchmark's oracle; byte tokens that are half a character)

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not (key.isascii() and key.isdigit()):
                raise ValueError(f"keys are token ids written as strings ('50256'), got {key!r}")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise ValueError("must be a string or a list of strings")
        if len(value) > MAX_STOPS:
            raise ValueError(f"takes at most {MAX_STOPS} strings, got {len(value)}")
        for s in value:
            if len(s) > MAX_STOP_CHARS:
                raise ValueError(f"strings are at most {MAX_STOP_CHARS} characters, one has {len(s)}")
            _check_text(s, "a stop string")
        return tuple(s for s in value if s)

    def _settings(self, max_tokens: int | None, top_logprobs: int | None) -> Settings:
        if self.stream_options is not None and not self.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        # The fields' bounds above are within SamplingSettings' own (which clamps logit_bias, as OpenAI).
        sampling = SamplingSettings(
            defaults.TEMPERATURE if self.temperature is None else self.temperature,
            defaults.TOP_P if self.top_p is None else self.top_p, max(0, self.top_k or defaults.TOP_K),
            self.min_p or 0.0, self.presence_penalty or 0.0, self.frequency_penalty or 0.0,
            1.0 if self.repetition_penalty is None else self.repetition_penalty,
            tuple((int(k), v) for k, v in (self.logit_bias or {}).items()), self.min_tokens or 0,
            tuple(self.stop_token_ids or ()))
        if max_tokens is not None and sampling.min_tokens > max_tokens:
            raise bad_request(f"'min_tokens' ({sampling.min_tokens}) must be at most 'max_tokens' ({max_tokens})",
                              "min_tokens", "invalid_value")

        tools = self._tools()
        if self.structured_outputs is not None and (self.response_format or {}).get("type", "text") != "text":
            raise bad_request("give 'response_format' or 'structured_outputs', not both", "structured_outputs")
        grammar = ((tools and tools.grammar) or response_format_grammar(self.response_format)
                   or structured_outputs_grammar(self.structured_outputs))
        return Settings(max_tokens=max_tokens, sampling=sampling, seed=self.seed, n=self.n or 1, stop=self.stop,
                        top_logprobs=top_logprobs, stream=bool(self.stream),
                        include_usage=bool(self.stream_options and self.stream_options.include_usage),
                        ignore_eos=bool(self.ignore_eos), grammar=grammar, tools=tools,
                        token_ids_as_text=bool(self.return_tokens_as_token_ids))

    def _tools(self) -> ToolUse | None:
        return None


class CompletionRequest(_Common):
    prompt: str | tuple[int, ...]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> str | tuple[int, ...]:
        if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
            if len(value) != 1:
                raise ValueError(f"one prompt per request is supported, got {len(value)}")
            value = value[0]
        if isinstance(value, str):
            if not value:
                raise ValueError("is empty")
            return _check_text(value, "the prompt")
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            if not value:
                raise ValueError("is an empty list of token ids")
            return tuple(value)
        raise ValueError("must be a string, a list of token ids, or a list holding one of either")

    def settings(self) -> Settings:
        return self._settings(self.max_tokens, self.logprobs)


_MESSAGE_OFF = {"function_call", "refusal", "audio", "annotations"}


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None  # a participant's name; chat templates do not show it
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's earlier calls, shown to the template
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="before")
    @classmethod
    def _no_refusals(cls, value: Any) -> Any:
        # An assistant message given back as the openai library dumps it carries these as null.
        if isinstance(value, dict) and _MESSAGE_OFF & set(value):
            for field in _MESSAGE_OFF & set(value):
                if value[field] not in (None, []):
                    raise ValueError(f"'{field}' is not supported: this API has no refusals, audio or legacy "
                                     f"function calls")
            value = {k: v for k, v in value.items() if k not in _MESSAGE_OFF}
        return value

    @field_validator("tool_calls")
    @classmethod
    def _tool_calls(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return template_tool_calls(value, "tool_calls") if value else None

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, value: Any) -> str | None:
        if value is None or isinstance(value, str):
            return value if value is None else _check_text(value, "the content")
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of text parts")
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise ValueError(f"part {j} is not a text part: only {{'type': 'text', 'text': ...}} parts are "
                                 f"supported (no images or audio)")
            if set(part) - {"type", "text"}:
                raise ValueError(f"part {j} has fields other than 'type' and 'text'")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {j}'s 'text' must be a string")
            texts.append(_check_text(part["text"], f"part {j}"))
        return "\n".join(texts)  # as vLLM joins text parts

    def template_message(self) -> dict[str, Any]:
        """The message as a chat template takes it (templates know 'system', not OpenAI's newer 'developer')."""
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": self.content or ""}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict[str, Any]] | None = None  # [{"type": "function", "function": {"name", "parameters", ...}}]
    tool_choice: str | dict[str, Any] | None = None  # "none" | "auto" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None
    # vLLM's: more variables for the chat template (Qwen3's {"enable_thinking": false}); they win over ours
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        refused = sorted(set(value or {}) & {"chat_template", "tokenize", "conversation", "messages"})
        if refused:
            raise ValueError(f"{refused[0]!r} cannot be set here: the template and the messages are the request's")
        return value

    def _tools(self) -> ToolUse | None:
        return tool_use(self.tools, self.tool_choice, self.parallel_tool_calls is not False)

    def settings(self) -> Settings:
        for i, m in enumerate(self.messages):
            if m.content is None and m.role != "assistant":
                raise bad_request(f"a {m.role} message needs content", f"messages[{i}].content")
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        top = (self.top_logprobs or 0) if self.logprobs else None
        return self._settings(self.max_completion_tokens or self.max_tokens, top)


# Fields this API does not implement, accepted only with the value that changes nothing.
_OFF: dict[str, tuple[Any, str]] = {
    "functions": (lambda v: v is None or v == [], "the legacy 'functions' are not supported; use 'tools'"),
    "function_call": (lambda v: v is None or v == "none", "the legacy 'function_call' is not supported; use "
                                                          "'tool_choice'"),
    "echo": (lambda v: v is None or v is False, "the prompt is not echoed"),
    "suffix": (lambda v: v is None or v == "", "no insertion after a suffix"),
    "store": (lambda v: v is None or v is False, "nothing is stored"),
    "metadata": (lambda v: v is None or v == {}, "nothing is stored"),
    "modalities": (lambda v: v is None or v == ["text"], "only text"),
    "service_tier": (lambda v: v is None or v in ("auto", "default"), "one tier only"),
}


# Chat's tool fields, on /v1/completions (as OpenAI's and vLLM's completions have none).
_COMPLETIONS_OFF: dict[str, tuple[Any, str]] = {
    "tools": (lambda v: v is None or v == [], "tools are for /v1/chat/completions"),
    "tool_choice": (lambda v: v is None or v == "none", "tools are for /v1/chat/completions"),
    "parallel_tool_calls": (lambda v: v is None or isinstance(v, bool), "tools are for /v1/chat/completions"),
}


def _refuse_features(body: dict[str, Any], chat: bool = True) -> dict[str, Any]:
    body = dict(body)
    for field, (is_off, why) in (_OFF if chat else {**_OFF, **_COMPLETIONS_OFF}).items():
        if field in body:
            if not is_off(body[field]):
                raise unsupported(field, f"{why}; leave it out")
            del body[field]
    if "best_of" in body:  # best_of == n picks every choice generated: the same as leaving it out
        best_of, n = body.pop("best_of"), body.get("n") or 1
        if best_of is not None and not (type(best_of) is int and best_of == n):
            raise unsupported("best_of", "only a value equal to n; leave it out")
    return body


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 saying why it is not one."""
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise bad_request(f"the request body is not valid JSON: {err.msg} (line {err.lineno}, column {err.colno})") \
            from None
    except RecursionError:
        raise bad_request("the request body's JSON is nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


# vLLM's and OpenAI's fields this API does not implement, whose other values would change the answer: refused
# unless left at the value that changes nothing. Any other field it does not know is ignored with a warning,
# as vLLM does.
_CHANGES_THE_ANSWER: dict[str, Any] = {
    "use_beam_search": lambda v: v in (None, False), "length_penalty": lambda v: v in (None, 1, 1.0),
    "prompt_logprobs": lambda v: v is None, "bad_words": lambda v: v in (None, []),
    "allowed_token_ids": lambda v: v is None, "include_stop_str_in_output": lambda v: v in (None, False),
    "skip_special_tokens": lambda v: v in (None, True), "spaces_between_special_tokens": lambda v: v in (None, True),
    "truncate_prompt_tokens": lambda v: v is None, "continue_final_message": lambda v: v in (None, False),
    "add_generation_prompt": lambda v: v in (None, True), "documents": lambda v: v is None,
    "logits_processors": lambda v: v in (None, []),
    "guided_json": lambda v: v is None, "guided_regex": lambda v: v is None, "guided_choice": lambda v: v is None,
    "guided_grammar": lambda v: v is None, "guided_decoding_backend": lambda v: v is None,
    "guided_whitespace_pattern": lambda v: v is None, "chat_template": lambda v: v is None,
    "add_special_tokens": lambda v: v is None, "vllm_xargs": lambda v: v is None,
    "prediction": lambda v: v is None, "audio": lambda v: v is None, "reasoning_effort": lambda v: v is None,
}


def _drop_unknown(body: dict[str, Any], model) -> dict[str, Any]:
    """The body without the top-level fields the model does not know, each logged; a 400 for one whose value
    would change the answer (``_CHANGES_THE_ANSWER``)."""
    unknown = [name for name in body if name not in model.model_fields]
    for name in unknown:
        keeps_meaning = _CHANGES_THE_ANSWER.get(name)
        if keeps_meaning is not None and not keeps_meaning(body[name]):
            raise unsupported(name, "this API does not implement it, and ignoring it would change the answer; "
                                    "leave it out")
    if unknown:
        log.warning("request fields ignored (this API does not know them): %s", ", ".join(sorted(unknown)),
                    extra={"ignored_fields": sorted(unknown)})
    return {k: v for k, v in body.items() if k not in unknown}


def parse_request(raw: bytes, model: type[CompletionRequest] | type[ChatCompletionRequest]):
    """A validated request, or an OpenAIError (400) naming the first field that is wrong. Top-level fields the
    API does not know are ignored with a logged warning (vLLM's way), unless ignoring one changes the answer."""
    body = _drop_unknown(_refuse_features(parse_json(raw), model is ChatCompletionRequest), model)
    try:
        return model.model_validate(body)
    except ValidationError as err:
        raise _first_error(err) from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None


def _param(loc: tuple) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            break  # a union member's tag ('list[int]'): what follows names a type, not a field
    return out or None


def _first_error(err: ValidationError) -> OpenAIError:
    e = err.errors(include_url=False, include_input=False, include_context=False)[0]
    param, kind, msg = _param(e["loc"]), e["type"], e["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return OpenAIError(400, f"Unrecognized request argument supplied: {param}", param,
                           "unknown_parameter")
    if kind == "missing":
        return bad_request(f"'{param}' is required", param, "missing_required_parameter")
    if kind.endswith("_type") or kind == "finite_number":
        return bad_request(f"Invalid type for '{param}': {msg}", param, "invalid_type")
    return bad_request(f"Invalid value for '{param}': {msg}", param, "invalid_value")
