"""shared.openai: request validation and the prompt's context check, without a server."""
from __future__ import annotations

import json

import pytest

from edgespec.shared.openai.errors import OpenAIError
from edgespec.shared.openai.prompts import PROBE_CHARS_PER_TOKEN, encode_text
from edgespec.shared.openai.requests import (MAX_STOPS, ChatCompletionRequest, CompletionRequest,
                                             parse_request)


def parse(kind, **body):
    return parse_request(json.dumps(body).encode(), kind)


def refused(kind, raw: bytes | None = None, **body) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        parse_request(raw if raw is not None else json.dumps(body).encode(), kind).settings()
    assert info.value.status == 400 and info.value.message
    return info.value


def test_defaults_follow_openai():
    s = parse(CompletionRequest, prompt="x").settings()
    assert (s.sampling.temperature, s.sampling.top_p, s.sampling.top_k) == (1.0, 1.0, 0)
    assert (s.n, s.seed, s.max_tokens, s.stop, s.top_logprobs, s.stream) == (1, None, None, (), None, False)


def test_fields_that_change_nothing_are_accepted_and_others_named():
    parse(ChatCompletionRequest, messages=[{"role": "user", "content": "x"}], frequency_penalty=0, tools=[],
          response_format={"type": "text"}, tool_choice="none", user="u", parallel_tool_calls=False).settings()
    assert refused(ChatCompletionRequest, messages=[{"role": "user", "content": "x"}], presence_penalty=2.5).param \
        == "presence_penalty"
    assert refused(CompletionRequest, prompt="x", max_tokens=0).param == "max_tokens"


def test_unknown_fields_are_ignored_with_a_warning_unless_that_changes_the_answer(caplog):
    """vLLM's way: a field the API does not know is dropped and logged; one whose other values would change
    the answer (beam search, guided decoding's old names, ...) is refused unless it asks for nothing."""
    import logging

    with caplog.at_level(logging.WARNING, logger="edgespec.shared.openai.requests"):
        s = parse(CompletionRequest, prompt="x", whatever=1, priority=3, use_beam_search=False).settings()
    assert s.n == 1 and "ignored" in caplog.text and "whatever" in caplog.text and "priority" in caplog.text
    for field, value in (("use_beam_search", True), ("guided_json", {"type": "object"}),
                         ("include_stop_str_in_output", True), ("skip_special_tokens", False)):
        error = refused(CompletionRequest, prompt="x", **{field: value})
        assert error.param == field and "would change the answer" in error.message
    nested = refused(ChatCompletionRequest, messages=[{"role": "user", "content": "x", "whatever": 1}])
    assert nested.status == 400  # inside a message nothing is ignored


def test_messages_as_the_openai_library_dumps_them_are_accepted():
    body = parse(ChatCompletionRequest, messages=[
        {"role": "developer", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": None}, {"role": "user", "content": "b"}])
    assert [m.template_message() for m in body.messages] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": ""}, {"role": "user", "content": "b"}]


def test_refusals_name_the_field():
    chat = {"messages": [{"role": "user", "content": "x"}]}
    assert refused(ChatCompletionRequest, **chat, top_logprobs=2).param == "top_logprobs"
    assert refused(ChatCompletionRequest, messages=[{"role": "function", "content": "x"}]).param == "messages[0].role"
    assert refused(ChatCompletionRequest, messages=[{"role": "user", "content": [{"type": "image_url"}]}]).param \
        == "messages[0].content"
    assert refused(ChatCompletionRequest, messages=[{"role": "user"}]).param == "messages[0].content"
    assert refused(CompletionRequest, prompt="x", stop=["s"] * (MAX_STOPS + 1)).param == "stop"
    assert refused(CompletionRequest, prompt="x", stop="s" * 300).param == "stop"
    assert refused(CompletionRequest, prompt=[1, True]).param == "prompt"
    assert refused(CompletionRequest, raw=b'{"prompt": "x", "seed": NaN}').param == "seed"
    assert refused(CompletionRequest, raw=b'{"prompt": "\\ud800"}').param == "prompt"


class CountingTokenizer:
    """One token per character; counts the characters it was asked to tokenize."""

    def __init__(self, longest_token: int = 4):
        self.longest_token = longest_token
        self.chars = 0

    def get_vocab(self):
        return {"x" * self.longest_token: 0, "a": 1}

    def __call__(self, text, add_special_tokens=False):
        self.chars += len(text)
        return {"input_ids": [1] * len(text)}


def test_a_prompt_far_over_the_context_is_refused_without_tokenizing():
    tok = CountingTokenizer()
    with pytest.raises(OpenAIError) as info:
        encode_text("a" * 4_000_000, tok, 512, "prompt")
    assert info.value.code == "context_length_exceeded" and tok.chars == 0


def test_a_prompt_over_the_context_is_refused_on_its_first_characters():
    tok = CountingTokenizer(longest_token=100)  # long tokens: the character bound cannot refuse it
    with pytest.raises(OpenAIError) as info:
        encode_text("a" * 100_000, tok, 512, "prompt")
    assert info.value.code == "context_length_exceeded" and tok.chars == PROBE_CHARS_PER_TOKEN * 512


def test_a_prompt_that_fits_is_tokenized_once_and_whole():
    tok = CountingTokenizer()
    assert len(encode_text("a" * 500, tok, 512, "prompt")) == 500 and tok.chars == 500
