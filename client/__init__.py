"""edgespec.client: the laptop's side. ``Client`` and ``AsyncClient`` are the text-level Python API (also at the
top: ``edgespec.Client``; ``python_client`` shows their use).

The public face (``__all__``): what a benchmark or a user's program may build, imported from here
(``from edgespec.client import Generation``) rather than from the modules, which may move; netem names
nothing else of the client (tests/shared/test_layering.py). Each name loads its module on first use, so
`import edgespec.client.cli` (and `edgespec --help`) stays light.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .python_client import AsyncClient, ChatReply, Client, ToolCall

_FACE = {  # name -> the module (under edgespec.client) that defines it
    # the text-level Python API
    "AsyncClient": "python_client", "ChatReply": "python_client", "Client": "python_client",
    "ToolCall": "python_client",
    # a client of a running server: its link, the target's tokenizer, chat prompts
    "EdgespecClient": "edge_client", "ClientConfig": "edge_client", "LinkConfig": "link.grpc_transport",
    "load_tokenizer": "edge_client", "chat_prompt_ids": "edge_client", "eos_ids": "edge_client",
    # one generation, on any verifier (a server's, or a VerifierCore's in this process), and its loop
    "Generation": "loop.generation", "GenerationConfig": "loop.generation", "TokenizerInfo": "loop.generation",
    "TokenEvent": "loop.generation", "RetractEvent": "loop.generation", "Verifier": "link.verifier",
    "InProcessTransport": "link.in_process", "LoopConfig": "loop.planner",
    "verify_time": "loop.tree_size",  # the server's verification time at a tree size, from its cost curve
    # a drafter by name, or one's own
    "DrafterOptions": "drafters.factory", "make_drafter": "drafters.factory", "BUILTIN": "drafters.factory",
    "LEARNED": "drafters.factory", "Drafter": "drafters.base", "DraftRequest": "drafters.base",
    "LOOKUP_SUFFIX": "drafters.factory", "split_lookup": "drafters.factory",  # NAME+ngram
    "TreeShape": "drafters.tree_builder", "open_runtime": "drafters.learned.loading",
    # the independent drafter's parts its micro-benchmark measures (weights, reduced vocabulary and head)
    "IndependentConfig": "drafters.independent", "IndependentDrafter": "drafters.independent",
    "WEIGHTS": "drafters.independent", "quantize": "drafters.independent", "weights_config": "drafters.independent",
    "draft_vocab_ids": "drafters.independent_vocab", "head_rows": "drafters.int8_linear",
    # the client command's flags and printer, for commands that run a client (the demo, the benchmarks)
    "add_client_options": "cli", "client_from_args": "cli", "generation_config_from_args": "cli",
    "link_config": "cli", "LOOP_GENERATION_FLAGS": "cli", "add_tree_arguments": "cli", "tree_shape": "cli",
    "vocab_count": "cli", "TerminalPrinter": "render", "use_color": "render",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
