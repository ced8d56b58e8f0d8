"""/tokenize and /detokenize in vLLM's shapes, on both APIs.

    POST /tokenize   {"prompt": "text"}                       -> {"count", "max_model_len", "tokens", "token_strs"}
    POST /tokenize   {"messages": [...], "add_generation_prompt": true}   (the chat template applied, as /v1/chat does)
    POST /detokenize {"tokens": [ids]}                        -> {"prompt": "text"}

The text is measured and tokenized with the same checks as a completion's prompt (a prompt that cannot
fit the context is refused before it is tokenized), and ids are checked against the vocabulary.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from .errors import bad_request
from .prompts import _encode, chat_text, check_chars, check_ids
from .requests import ChatMessage, _first_error, _Strict, parse_json

MAX_DETOKENIZE_IDS = 1 << 20  # ids per /detokenize call (a context is at most a few hundred thousand)


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True  # chat: end with the assistant's turn, as /v1/chat/completions does
    add_special_tokens: bool = False  # prompt: add the tokenizer's BOS/EOS (the completions API adds none)
    return_token_strs: bool = False  # also each token's text


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_IDS)


def parse(raw: bytes, kind):
    try:
        return kind.model_validate(parse_json(raw))
    except ValidationError as err:
        raise _first_error(err) from None


def tokenize(backend, body: TokenizeRequest) -> dict[str, Any]:
    """The ids of a prompt or of chat messages under the chat template (a 400 when neither or both are given)."""
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("give either 'prompt' (text) or 'messages' (chat), not both and not neither", "prompt")
    limit, tok = backend.max_context_tokens, backend.tokenizer
    if body.messages is not None:
        messages = [m.template_message() for m in body.messages]
        ids = _encode(tok, chat_text(tok, messages, limit, add_generation_prompt=body.add_generation_prompt))
    else:
        check_chars(len(body.prompt), tok, limit, "prompt")
        ids = list(tok(body.prompt, add_special_tokens=body.add_special_tokens)["input_ids"])
    strs = tok.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {"count": len(ids), "max_model_len": limit, "tokens": ids, "token_strs": strs}


def detokenize(backend, body: DetokenizeRequest) -> dict[str, Any]:
    ids = check_ids(body.tokens, backend.vocab_size, MAX_DETOKENIZE_IDS + 1, "tokens")
    return {"prompt": backend.tokenizer.decode(ids)}
