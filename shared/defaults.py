"""The user-facing defaults, defined once: `edgespec client`, `edgespec client serve`, `edgespec.Client`, both
OpenAI-compatible HTTP APIs, `edgespec demo` and the deploy files read them from here (tests/shared/test_defaults.py
reads every surface's default back and compares it with this module). README.md's "Defaults" table lists them.

No torch here: the command-line parsers import this module while they are built."""
from __future__ import annotations

import secrets

DRAFTER = "independent"  # the small LM of the target's tokenizer (the registry's default small drafter)
MAX_TOKENS = 512  # new tokens when a request names none (capped by what is left of the context)
TEMPERATURE = 1.0  # as OpenAI and vLLM; 0 is the target's greedy output
TOP_P = 1.0
TOP_K = 0  # off
SEED = None  # unset: a fresh random seed for every request (and every choice), as the HTTP APIs draw it
DEMO_PROFILE = "4g"  # `edgespec demo --profile` and the compose relay's EDGESPEC_PROFILE
DTYPE = "auto"  # bf16 on a GPU or a CPU that computes it natively (AVX512-BF16, AMX), float32 on other CPUs

GRPC_PORT = 50051  # the server's gRPC Verifier, where clients connect
HTTP_PORT = 8080  # the server's HTTP side: its plain OpenAI API, /health, /metrics
CLIENT_PORT = 8000  # `client serve`'s local API, so the three fit on one machine
SERVER = f"127.0.0.1:{GRPC_PORT}"  # where a client looks for the server

# The keys: an API asks its callers for --api-key (the server's and `client serve`'s alike, as vLLM's); a client
# sends the server's key as --server-api-key (`edgespec.Client(server_api_key=...)`).
API_KEY_ENV = "EDGESPEC_API_KEY"
SERVER_API_KEY_ENV = "EDGESPEC_SERVER_API_KEY"

SEED_MODULUS = 2 ** 64  # seeds travel as uint64


def fresh_seed() -> int:
    """A random sampling seed in [0, 2**64), for a request that gives none."""
    return secrets.randbits(64)
