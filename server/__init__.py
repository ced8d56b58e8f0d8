"""edgespec.server: the verification server.

Modules, from the model outwards (a sub-package is a subsystem; the rest are flat):
- ``architectures``: which causal LMs tree verification runs (sliding windows switched off within them;
  other state refused at start).
- ``target``: TargetModel, the model's decoder and LM head, nothing per session.
- ``engine/``: how the target runs forwards. ``engine.base`` (Work, ForwardOutput, the Engine interface),
  ``engine.generic`` (a DynamicCache per session) and ``engine.batched`` (one pre-allocated KV pool, one forward
  for every session's ready work, masks built on the device), ``engine.choice`` (which of the two:
  ``--engine``); the batched engine's parts: ``engine.kv`` (the paged pool), ``engine.masks``, ``engine.step``
  (one packed upload, one readback), ``engine.accept`` (greedy acceptance and KV compaction for the whole batch
  on the device), ``engine.graphs`` (the step eager, compiled, or CUDA graphs per shape bucket), ``engine.rows``
  (a batch as one run of rows), ``engine.attention`` (attention straight from the paged pool), ``engine.fusion``
  (merged projections, fused norms), ``engine.memory`` (the pool's size), ``engine.timing`` (the step's parts).
- ``prefix/``: the prefix cache of finished sessions' KV: ``prefix.cache`` (PrefixCache), ``prefix.index`` (a
  radix tree over token ids), ``prefix.kv`` (snapshots: blocks shared on a paged pool, rows copied elsewhere).
- ``scheduler``: ModelScheduler, the one thread every forward pass runs on; jobs yield their forwards.
- ``features``: what each answer carries back (hidden state, MoA's LSA output, TLI K/V), codec-encoded.
- ``session``: VerifierSession, one session's open / verify / resume as jobs.
- ``session_store``: SessionStore, TTL, session cap, LRU eviction by KV memory.
- ``core``: VerifierCore, the service without protobuf (store + sessions + metrics).
- ``rpc/``: the gRPC side, one of the two protobuf adapters: ``rpc.service`` (the servicer and the one place
  errors become statuses), ``rpc.grpc_server`` (grpc.aio).
- ``decoder``, ``http_api``: the plain OpenAI-style API's backend (the protocol is ``edgespec.shared.openai``),
  /health, /metrics; ``metrics``: the server's Prometheus series.
- ``server_config``: ServerConfig; ``app``: start_server, ServerHandle. ``cli``: `edgespec server`, its flags made
  from ServerConfig. ``gpu_check``: the prepared check for a GPU host (``python -m edgespec.server.gpu_check``).
- ``training/``: the learned drafters' training (`edgespec train`), on its own floor: it may use the runtime
  above, which never imports it.

(The verification maths itself lives in ``edgespec.shared.verification``; the benchmark in
``edgespec.netem.bench.server_engines``.)

The public face (``__all__``): what a benchmark or a user's program may build, imported from here
(``from edgespec.server import VerifierCore``) rather than from the modules, which may move; netem names
nothing else of the server (tests/shared/test_layering.py). Each name loads its module on first use, so
`import edgespec.server.cli` (and `edgespec --help`) stays light.
"""
from __future__ import annotations

import importlib

_FACE = {  # name -> the module (under edgespec.server) that defines it
    # a server process
    "ServerConfig": "server_config", "ServerHandle": "app", "start_server": "app",
    # the verifier without gRPC, and the servicer that answers its messages in process
    "TargetModel": "target", "VerifierCore": "core", "CoreLimits": "core", "VerifierServicer": "rpc.service",
    # an engine, the one thread its forwards run on, one session, and one step of the plain decoder
    "build_engine": "engine.choice", "PoolConfig": "engine.batched", "ModelScheduler": "scheduler",
    "VerifierSession": "session", "decode_step": "decoder",
    # training: feature extraction and the recipes' acceptance, which the drafter benchmarks run
    "ExtractConfig": "training.train_config", "extract_sharded": "training.extraction",
    "FeatureStore": "training.features", "extract_features": "training.features", "open_stores": "training.features",
    "generate_batch": "training.data",
    "TrainConfig": "training.trainer", "Trainer": "training.trainer", "build_recipe": "training.fit",
    "Acceptance": "training.losses", "eagle_acceptance": "training.eagle_recipe",
    "moa_acceptance": "training.moa_recipe", "WIRE_CODECS": "training.moa_recipe",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
