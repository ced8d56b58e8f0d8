"""Text in, text out: edgespec from Python, over the same generation loop as the CLI and the local API.

    import edgespec  # or: from edgespec.client import Client, AsyncClient

    with edgespec.Client(server="gpu-box:50051", drafter="ngram") as client:
        print(client.chat([{"role": "user", "content": "Write quicksort in Python"}]))
        for piece in client.chat([{"role": "user", "content": "And mergesort"}], stream=True):
            print(piece, end="", flush=True)
        print(client.complete("def fib(n):", max_tokens=64, stop=["\\n\\n"]))
        print(client.last_result.metrics.summary())  # tokens/s, acceptance length, calls, bytes

    async with edgespec.AsyncClient(server="gpu-box:50051", drafter="independent") as client:
        text = await client.chat(messages)
        async for piece in await client.chat(messages, stream=True):
            ...

Tools as the HTTP chat API takes them (the same template rendering, the same constraint and parsing):

    reply = client.chat(messages, tools=[weather_tool], tool_choice="required")
    messages.append(reply.message)  # the assistant's turn, its calls included
    for call in reply.tool_calls:  # ToolCall(id, name, arguments): arguments decoded from JSON
        messages.append({"role": "tool", "tool_call_id": call.id, "content": functions[call.name](**call.arguments)})

With ``tools`` a chat returns a ``ChatReply`` (content, tool_calls, finish_reason), not a string.

Sampling defaults are the HTTP APIs' (OpenAI's and vLLM's): temperature 1, top_p 1, top_k off. Text is what
the target itself would write: at temperature=0 exactly its greedy output, otherwise distributed as its own
samples. A keyword that is not a sampling option is refused with a TypeError that names it and the options
there are. When the link is lost and the drafter cannot finish alone, the text ends early and
``last_result.finish_reason`` is "link_lost" (``last_result.detail`` says why).
"""
from __future__ import annotations

import asyncio
import difflib
import inspect
import json
import os
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Iterator, Sequence

from edgespec.shared import defaults
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.wire import ResumePolicy

from .drafters.factory import DrafterOptions
from .edge_client import ClientConfig, EdgespecClient
from .link.grpc_transport import LinkConfig
from .loop.generation import GenerationConfig, GenerationResult
from .loop.planner import LoopConfig
from .text import TextStreamer

Messages = Sequence[dict]
CHAT_OPTIONS = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")  # chat's, besides sampling


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made: ``arguments`` decoded from the JSON it wrote (a dict for a function whose
    parameters are an object schema); ``id`` names the call in the tool message that answers it."""

    id: str
    name: str
    arguments: Any

    @property
    def arguments_json(self) -> str:
        """The arguments as JSON text, as the HTTP APIs and OpenAI's library carry them."""
        return json.dumps(self.arguments, ensure_ascii=False)

    def to_openai(self) -> dict:
        """The call as an OpenAI tool_calls entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_json}}


@dataclass(frozen=True)
class ChatReply:
    """What ``chat`` returns when given tools: ``content`` the text outside the calls (None when nothing is left),
    ``tool_calls`` the calls parsed out of the answer (empty when the model wrote none, or with tool_choice "none"),
    ``finish_reason`` "tool_calls" when there are calls, else the generation's ("stop", "length", "link_lost")."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str

    @property
    def message(self) -> dict:
        """The assistant message to append to the conversation for the next turn (as the HTTP API answers it)."""
        out: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return out


class Client:
    """A text-level client. ``server`` is the gRPC HOST:PORT; ``drafter`` a name (ngram, independent,
    eagle, moa-tli0, ...) or DrafterOptions; ``tree`` "auto" (each step's tree sized from measured costs) or
    "fixed" (the drafter's shape every step); ``pipeline`` False for the serial loop; ``server_api_key`` the key the
    edgespec server asks for (unset: $EDGESPEC_SERVER_API_KEY, as ``edgespec client`` reads it); other keywords go
    to LinkConfig (tls, root_certificates, min_deadline_s, ...). The defaults are every surface's
    (``edgespec.shared.defaults``). Calls run one at a time (one drafter, one cache)."""

    def __init__(self, server: str = defaults.SERVER, drafter: str | DrafterOptions = defaults.DRAFTER, *,
                 drafter_model: str | None = None, tokenizer: str | None = None, max_tokens: int = defaults.MAX_TOKENS,
                 policy: ResumePolicy | str = ResumePolicy.ROLLBACK, tree: str = "auto", pipeline: bool = True,
                 server_api_key: str | None = None, **link):
        options = drafter if isinstance(drafter, DrafterOptions) else DrafterOptions(
            name=drafter, **({"model": drafter_model} if drafter_model else {}))
        loop = LoopConfig(pipeline=pipeline, tree=tree)
        if "api_key" in link:  # the old name: it was always the server's key
            if server_api_key is not None:
                raise TypeError("give the server's key once, as server_api_key (api_key is its old name)")
            server_api_key = link.pop("api_key")
        if server_api_key is None:
            server_api_key = os.environ.get(defaults.SERVER_API_KEY_ENV) or None
        if server_api_key is not None:
            link["api_key"] = server_api_key
        self.edge = EdgespecClient(ClientConfig(LinkConfig(server, **link), options, tokenizer=tokenizer, loop=loop))
        self.max_tokens = max_tokens  # when a call gives none
        self.policy = ResumePolicy[policy.upper()] if isinstance(policy, str) else ResumePolicy(policy)
        self.last_result: GenerationResult | None = None  # token ids, origins, finish reason, metrics

    @property
    def model_name(self) -> str:
        return self.edge.model_name

    def chat(self, messages: Messages, stream: bool = False, *, tools: Sequence[dict] | None = None,
             tool_choice: str | dict | None = None, parallel_tool_calls: bool | None = None,
             chat_template_kwargs: dict | None = None, **sampling) -> str | Iterator[str] | ChatReply:
        """The assistant's answer to chat messages, under the target's chat template. Messages are the HTTP chat
        API's ({role, content}; an assistant's earlier ``tool_calls``, a tool message's ``tool_call_id``), checked
        and rendered as it does them; a ValueError says what is wrong with one.

        tools: OpenAI's function tools, rendered by the chat template. tool_choice "auto" (the default with tools)
        lets the model choose and parses the calls it writes; "required" or {"type": "function", "function":
        {"name": ...}} constrains the answer to calls (of that function, once), whose arguments then follow the
        function's parameters schema; "none" renders the tools and parses nothing. parallel_tool_calls=False: at
        most one call. With tools the answer is a ``ChatReply`` (its calls as ``ToolCall``s), not a string, and
        stream=True is refused: a call is known only once the answer ends. chat_template_kwargs: more variables
        for the template, as vLLM's (Qwen3's {"enable_thinking": False}).

        sampling: max_tokens, temperature (default 1, as the HTTP APIs; 0 = greedy), top_p, top_k, stop (strings),
        seed (unset: a fresh one each call, as the HTTP APIs), vLLM's min_p, presence_penalty, frequency_penalty,
        repetition_penalty, min_tokens and stop_token_ids, response_format (OpenAI's) or structured_outputs
        (vLLM's: json, regex, choice, grammar), and logprobs (the N most likely alternatives, 0 to 20): then
        ``last_result.logprobs`` holds the target's log-probability of every token, and no offline token is handed
        out before the target scored it."""
        from edgespec.shared.openai.tool_calls import parse_tool_calls

        _check_sampling(sampling, CHAT_OPTIONS)
        ids, use = self._chat_prompt(messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs)
        if use is None:
            return self._run(ids, stream, sampling)
        if stream:
            raise ValueError("stream=True cannot be given with tools: a tool call is known only once the answer "
                             "ends, so ask without stream (the answer is a ChatReply)")
        config = self._config(**sampling)
        if use.grammar:  # "required" or a named function: the answer is calls, tags as this tokenizer writes them
            config = replace(config, grammar=use.grammar_for(self.edge.tokenizer))
        text = "".join(self._pieces(ids, config))
        content, calls = parse_tool_calls(text) if use.parse else (text, [])
        parsed = tuple(ToolCall(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                       for c in calls)
        return ChatReply(content, parsed, "tool_calls" if parsed else self.last_result.finish_reason)

    def complete(self, prompt: str, stream: bool = False, **sampling) -> str | Iterator[str]:
        """The continuation of raw text (no chat template); sampling as for ``chat``."""
        return self._run(self.edge.encode(prompt), stream, sampling)

    def _chat_prompt(self, messages: Messages, tools, tool_choice, parallel_tool_calls, template_kwargs):
        """(prompt ids, ToolUse or None) of a chat: the messages and tools checked as the HTTP chat API checks them
        (its request model) and rendered as it renders them (``chat_text``)."""
        from edgespec.shared.openai.errors import OpenAIError
        from edgespec.shared.openai.prompts import chat_text, encode_text
        from edgespec.shared.openai.requests import ChatCompletionRequest, parse_request

        body = {"messages": list(messages), "tools": tools, "tool_choice": tool_choice,
                "parallel_tool_calls": parallel_tool_calls, "chat_template_kwargs": template_kwargs}
        limit = self.edge.info.limits.max_context_tokens or DEFAULT_CONTEXT_TOKENS
        try:
            request = parse_request(json.dumps({k: v for k, v in body.items() if v is not None}).encode(),
                                    ChatCompletionRequest)
            use = request.settings().tools
            text = chat_text(self.edge.tokenizer, [m.template_message() for m in request.messages], limit,
                             use.tools if use is not None else None, template_kwargs=request.chat_template_kwargs)
            return encode_text(text, self.edge.tokenizer, limit, "messages"), use
        except OpenAIError as err:
            raise ValueError(err.message) from None

    def _run(self, ids: list[int], stream: bool, sampling: dict) -> str | Iterator[str]:
        _check_sampling(sampling)
        pieces = self._pieces(ids, self._config(**sampling))
        return pieces if stream else "".join(pieces)

    def _config(self, max_tokens: int | None = None, temperature: float = defaults.TEMPERATURE,
                top_p: float = defaults.TOP_P, top_k: int = defaults.TOP_K, stop: str | Sequence[str] | None = None,
                seed: int | None = defaults.SEED, logprobs: int | None = None, min_p: float = 0.0,
                presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty: float = 1.0,
                min_tokens: int = 0, stop_token_ids: Sequence[int] = (), response_format: dict | None = None,
                structured_outputs: dict | None = None) -> GenerationConfig:
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        seed = defaults.fresh_seed() if seed is None else seed % defaults.SEED_MODULUS
        max_new = max_tokens or self.max_tokens
        if min_tokens > max_new:
            raise ValueError(f"min_tokens ({min_tokens}) must be at most max_tokens ({max_new})")
        sampling = SamplingSettings(temperature, top_p, top_k, min_p, presence_penalty, frequency_penalty,
                                    repetition_penalty, min_tokens=min_tokens, stop_token_ids=tuple(stop_token_ids))
        grammar = _grammar(response_format, structured_outputs)
        return GenerationConfig(max_new_tokens=max_new, sampling=sampling, stop=stops, seed=seed, grammar=grammar,
                                resume_policy=self.policy, logprobs=logprobs)

    def _pieces(self, ids: list[int], config: GenerationConfig) -> Iterator[str]:
        # Under rollback, offline tokens are held back until the target confirmed them, so no piece
        # handed out is ever taken back; with logprobs, until the target scored them (as the local API does).
        hold = config.resume_policy is ResumePolicy.ROLLBACK or config.logprobs is not None
        streamer = TextStreamer(self.edge.decode, config.stop, hold_offline=hold,
                                min_tokens=config.sampling.min_tokens)
        for item in self.edge.stream(ids, config):
            if isinstance(item, GenerationResult):
                self.last_result = item
                continue
            if piece := streamer.feed(item):
                yield piece
        if rest := streamer.finish():
            yield rest

    def close(self) -> None:
        self.edge.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


SAMPLING_OPTIONS = tuple(inspect.signature(Client._config).parameters)[1:]  # what chat/complete take besides stream
DEFAULT_CONTEXT_TOKENS = 32768  # a server too old to say its context (the local API's assumption too)


def _grammar(response_format: dict | None, structured_outputs: dict | None) -> str:
    """The llguidance grammar the HTTP APIs make of these (OpenAI's response_format, vLLM's structured_outputs);
    "" for free text. A ValueError says what is wrong with them."""
    from edgespec.shared.openai.errors import OpenAIError
    from edgespec.shared.openai.tool_calls import response_format_grammar, structured_outputs_grammar

    if response_format is not None and structured_outputs is not None:
        raise ValueError("give response_format or structured_outputs, not both")
    try:
        return response_format_grammar(response_format) or structured_outputs_grammar(structured_outputs) or ""
    except OpenAIError as err:
        raise ValueError(err.message) from None


def _check_sampling(sampling: dict, also: Sequence[str] = ()) -> None:
    """Refuse a keyword that is no sampling option, naming it (and the option it looks like, among the sampling
    options and `also`, the call's own)."""
    for name in sampling:
        if name not in SAMPLING_OPTIONS:
            near = difflib.get_close_matches(name, (*SAMPLING_OPTIONS, *also), n=1)
            raise TypeError(f"{name!r} is not a sampling option of edgespec.Client"
                            + (f" (did you mean {near[0]!r}?)" if near else "")
                            + f"; chat() and complete() take stream and {', '.join(SAMPLING_OPTIONS)}"
                            + (f"; chat() also {', '.join(also)}" if also else ""))


class AsyncClient:
    """``Client`` for asyncio: the same arguments; loading and generation run on worker threads, so
    the event loop never waits on the model. Loads on ``async with`` or the first call."""

    def __init__(self, server: str = defaults.SERVER, drafter: str | DrafterOptions = defaults.DRAFTER, **options):
        self._args = (server, drafter)
        self._options = options
        self._client: Client | None = None
        self._loading = asyncio.Lock()

    async def _ready(self) -> Client:
        async with self._loading:
            if self._client is None:
                self._client = await asyncio.to_thread(Client, *self._args, **self._options)
        return self._client

    @property
    def last_result(self) -> GenerationResult | None:
        return self._client.last_result if self._client else None

    async def chat(self, messages: Messages, stream: bool = False, **options) -> str | AsyncIterator[str] | ChatReply:
        """The answer's text, or with stream=True an async iterator of its pieces (as OpenAI's AsyncClient); with
        tools a ChatReply. Options as ``Client.chat``'s."""
        client = await self._ready()
        if stream:
            return _pieces_off_loop(lambda: client.chat(messages, True, **options))
        return await asyncio.to_thread(client.chat, messages, False, **options)

    async def complete(self, prompt: str, stream: bool = False, **sampling) -> str | AsyncIterator[str]:
        client = await self._ready()
        if stream:
            return _pieces_off_loop(lambda: client.complete(prompt, True, **sampling))
        return await asyncio.to_thread(client.complete, prompt, False, **sampling)

    async def close(self) -> None:
        if self._client is not None:
            await asyncio.to_thread(self._client.close)

    async def __aenter__(self) -> "AsyncClient":
        await self._ready()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


_END = object()


async def _pieces_off_loop(start) -> AsyncIterator[str]:
    """A blocking iterator's items, each fetched on a worker thread; closed there too if the consumer stops."""
    pieces = await asyncio.to_thread(start)  # encoding the prompt also blocks
    try:
        while (piece := await asyncio.to_thread(next, pieces, _END)) is not _END:
            yield piece
    finally:
        await asyncio.to_thread(pieces.close)
