"""EdgespecClient: the link, the target's tokenizer and a drafter, ready to run generations.

The CLI, the local OpenAI-style API, the demo and the benchmark all go through
it. One generation runs at a time (the drafter keeps one KV cache), so
``generate`` holds a lock for as long as its Generation is being iterated.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from edgespec.shared.errors import TokenizerMismatchError
from edgespec.shared.fingerprint import tokenizer_fingerprint
from edgespec.shared.grammar import grammar_tokenizer
from edgespec.shared.wire import MAX_NODES

from .drafters.base import Drafter
from .drafters.factory import DrafterOptions, make_drafter, split_lookup
from .link.grpc_transport import GrpcTransport, Link, LinkConfig
from .link.verifier import FeatureWidths, Verifier
from .loop.generation import Event, Generation, GenerationConfig, GenerationResult, TokenizerInfo
from .loop.planner import LoopConfig, LoopEstimates
from .metrics import NO_WATCH, ClientMetrics

# Token strings that end a Qwen-style chat turn or text, besides tokenizer.eos_token
# (Qwen's generation_config lists both <|im_end|> and <|endoftext|>).
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


def eos_ids(tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in END_TOKENS if t in vocab)
    return ids


def stop_ids(info, tokenizer) -> set[int]:
    """The ids a generation ends on: the server's (Info.eos_token_ids, from the target's generation config,
    which the plain API also stops on) plus the tokenizer's own EOS. A server too old to send them
    leaves the tokenizer's guess (``eos_ids``)."""
    if not info.eos_token_ids:
        return eos_ids(tokenizer)
    return {int(i) for i in [*info.eos_token_ids, tokenizer.eos_token_id] if i is not None}


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    from edgespec.shared.models.loading import hub_errors, model_location

    with hub_errors(name_or_path):
        return AutoTokenizer.from_pretrained(model_location(name_or_path))


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Ids of the chat template applied to messages, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class ClientConfig:
    """Everything the client needs to start."""

    link: LinkConfig  # how to reach the server
    drafter: DrafterOptions = field(default_factory=DrafterOptions)  # which drafter to run
    tokenizer: str | None = None  # the target's tokenizer (name or dir); None: the drafter's model, whose
    # tokenizer is the target's for the default pair (the fingerprint check catches a wrong one)
    loop: LoopConfig = field(default_factory=lambda: LoopConfig(tree="fixed"))  # drafting ahead and tree
    # sizing: a library user's drafter shape is kept every step unless asked otherwise; `edgespec client`,
    # `client serve` and edgespec.Client default to tree="auto"


class EdgespecClient:
    def __init__(self, config: ClientConfig, tokenizer=None, drafter: Drafter | None = None, small_model=None):
        """``tokenizer``, ``drafter``: already made (else from ``config``); ``small_model``: the independent
        drafter's LM already loaded (make_drafter's, for a benchmark that shares one)."""
        self.config = config
        self.link = Link(config.link)
        self.info = self.link.info()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self._tokenizer_source())
        fingerprint = tokenizer_fingerprint(self.tokenizer)
        if fingerprint != self.info.tokenizer_fingerprint:
            raise TokenizerMismatchError(
                f"the client's tokenizer ({self._tokenizer_source()}) is not the server's target tokenizer "
                f"(model {self.info.model_name}); pass --tokenizer with the target's model name or directory")
        if drafter is None:
            drafter = make_drafter(config.drafter, self.info, small_model, self.tokenizer)
        self.drafter = drafter
        eos = stop_ids(self.info, self.tokenizer)
        self.tokens = TokenizerInfo(fingerprint, eos,
                                    lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=True),
                                    lambda: grammar_tokenizer(self.tokenizer, self.info.vocab_size, eos))
        self._lock = threading.Lock()
        # what the loop measures to size trees, kept across generations; it starts from the server's cost curve
        self.estimates = LoopEstimates(self.info.verify_cost_nodes, [ns / 1e9 for ns in self.info.verify_cost_ns])
        self.metrics: ClientMetrics | None = None  # told about every generation (client serve's /metrics)

    def _tokenizer_source(self) -> str:
        if self.config.tokenizer:
            return self.config.tokenizer
        if split_lookup(self.config.drafter.name)[0] == "independent":
            return self.config.drafter.model
        name = self.info.registry_name or self.info.model_name  # model_name may be a served alias
        from edgespec.shared.models.registry import REGISTRY

        return name if name in REGISTRY or Path(name).is_dir() else self.config.drafter.model

    @property
    def model_name(self) -> str:
        return self.info.model_name

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_chat(self, messages: Sequence[dict]) -> list[int]:
        return chat_prompt_ids(self.tokenizer, messages)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokens.decode(ids)

    def generation(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig()) -> Generation:
        """A Generation to iterate. Use ``stream`` or ``generate`` to hold the client's lock while it runs."""
        widths = FeatureWidths(self.info.hidden_size, self.info.kv_size)  # bounds the feature frames it decodes
        return Generation(Verifier(GrpcTransport(self.link), widths), self.drafter, prompt_ids, config, self.tokens,
                          max_tree_nodes=self.info.limits.max_tree_nodes or MAX_NODES, loop=self.config.loop,
                          estimates=self.estimates)

    def stream(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig()
               ) -> Iterator[Event | GenerationResult]:
        """Events as they come, then the GenerationResult as the last item."""
        watch = self.metrics.watch() if self.metrics else NO_WATCH
        try:
            with self._lock:
                watch.started()
                gen = self.generation(prompt_ids, config)
                for event in gen:
                    watch.event(event)
                    yield event
                watch.finished(gen.result)
                yield gen.result
        finally:
            watch.close()

    def generate(self, prompt_ids: Sequence[int], config: GenerationConfig = GenerationConfig()) -> GenerationResult:
        for item in self.stream(prompt_ids, config):
            pass
        return item

    def close(self) -> None:
        self.drafter.close()
        self.link.close()

    def __enter__(self) -> "EdgespecClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
