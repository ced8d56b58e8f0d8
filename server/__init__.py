"""edgespec.server: the verification server.

Modules, from the model outwards:
- ``architectures``: which causal LMs tree verification runs (sliding windows switched off within them;
  other state refused at start).
- ``target``: TargetModel, the model's decoder and LM head, nothing per session.
- ``engine``, ``engine_batched``, ``engine_kv``, ``engine_masks``: the generic engine (a DynamicCache per
  session) and the batched one (one pre-allocated KV pool, one forward for every session's ready work,
  masks built on the device); ``engine_choice`` (which of the two: ``--engine``); ``engine_step`` (the batched
  step: one packed upload, one readback), ``device_accept`` (greedy acceptance and KV compaction for the whole batch on the device),
  ``engine_graphs`` (the step eager, compiled, or a CUDA graph per shape bucket).
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
"""
