"""edgespec.server: the verification server.

Modules, from the model outwards:
- ``architectures``: which causal LMs tree verification runs (sliding windows switched off within them;
  other state refused at start).
- ``target``: TargetModel, the model's decoder and LM head, nothing per session.
- ``engine``, ``engine_batched``, ``engine_kv``, ``engine_masks``: the generic engine (a DynamicCache per
  session) and the batched one (one pre-allocated KV pool, one forward for every session's ready work,
  masks built on the device); ``engine_choice`` (which of the two: ``--engine``); ``engine_step`` (the batched
  step: one packed upload, one readback), ``device_accept`` (greedy acceptance and KV compaction for the whole batch on the device),
  ``engine_graphs`` (the step eager, compiled, or CUDA graphs per shape bucket), ``engine_rows`` (a batch as one
  run of rows), ``engine_attention`` (attention straight from the paged pool), ``engine_fusion`` (merged
  projections, fused norms).
- ``scheduler``: ModelScheduler, the one thread every forward pass runs on; jobs yield their forwards.
- ``features``: what each answer carries back (hidden state, MoA's LSA output, TLI K/V), codec-encoded.
- ``session``: VerifierSession, one session's open / verify / resume as jobs.
- ``session_store``: SessionStore, TTL, session cap, LRU eviction by KV memory.
- ``core``: VerifierCore, the service without protobuf (store + sessions + metrics).
- ``service``: the gRPC servicer and the one place errors become statuses; ``grpc_server``: grpc.aio.
- ``decoder``, ``http_api``: the plain OpenAI-style API's backend (the protocol is ``edgespec.shared.openai``),
  /health, /metrics; ``metrics``: the server's Prometheus series.
- ``config``: ServerConfig; ``app``: start_server, ServerHandle. ``cli``: `edgespec server`, its flags made from
  ServerConfig.

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
    "ServerConfig": "config", "ServerHandle": "app", "start_server": "app",
    # the verifier without gRPC, and the servicer that answers its messages in process
    "TargetModel": "target", "VerifierCore": "core", "CoreLimits": "core", "VerifierServicer": "service",
    # an engine, the one thread its forwards run on, one session, and one step of the plain decoder
    "build_engine": "engine_choice", "PoolConfig": "engine_batched", "ModelScheduler": "scheduler",
    "VerifierSession": "session", "decode_step": "decoder",
    # training: feature extraction and the recipes' acceptance, which the drafter benchmarks run
    "ExtractConfig": "training.train_config", "extract_sharded": "training.extraction",
    "FeatureStore": "training.features", "extract_features": "training.features", "generate_batch": "training.data",
    "TrainConfig": "training.trainer", "Trainer": "training.trainer", "build_recipe": "training.fit",
    "Acceptance": "training.losses", "eagle_acceptance": "training.eagle_recipe",
    "moa_acceptance": "training.moa_recipe", "WIRE_CODECS": "training.moa_recipe",
}
__all__ = sorted(_FACE)


def __getattr__(name: str):
    if name in _FACE:
        return getattr(importlib.import_module(f"{__name__}.{_FACE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
