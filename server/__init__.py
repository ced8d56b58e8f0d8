"""edgespec.server: the verification server.

Modules, from the model outwards:
- ``target``: TargetModel, forward passes on a per-session DynamicCache (tree mask, crop + gather).
- ``features``: what each answer carries back (hidden state, MoA's LSA output, TLI K/V), codec-encoded.
- ``session``: VerifierSession, one session's open / verify / resume.
- ``sessions``: SessionStore, TTL, session cap, LRU eviction by KV memory.
- ``scheduler``: ModelScheduler, the single thread every forward pass runs on.
- ``core``: VerifierCore, the service without protobuf (store + sessions + metrics).
- ``service``: the gRPC servicer and the one place errors become statuses.
- ``decoder``, ``text_stream``, ``http_api``: the plain OpenAI-style API, /health, /metrics.
- ``app``: ServerConfig, start_server, ServerHandle. ``cli``: `edgespec server`. ``bench``: the benchmark.

(The verification maths itself lives in ``edgespec.shared.verification``.)
"""
