"""The compose topology without containers: the images' entrypoint run for real in
its three roles (server, relay with a network profile, client serving the local
OpenAI-compatible API), configured only through EDGESPEC_* variables as compose
sets them, on a tiny model. The real `openai` client asks the client's API for a
completion; the text is the target's own greedy output, and the health-check role
agrees that both sides are up. SIGTERM reaches edgespec itself (the entrypoint
execs it), which drains and exits 0."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # server, relay and client processes, end to end

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "deploy/bin/edgespec-entrypoint"
PROMPT = "class Stack:\n    def push(self, item):\n"
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def box(procs, tiny_model_dir, tiny_drafter_dir, tmp_path_factory):
    """server <- relay (4g) <- client serve, each started by the entrypoint from its environment."""
    work = tmp_path_factory.mktemp("box")
    ports = {name: procs.free_port() for name in ("grpc", "http", "relay", "api")}
    base = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "EDGESPEC_HOME": str(work / "home"),
            "EDGESPEC_HOST": "127.0.0.1"}
    roles = {
        "server": ({"EDGESPEC_MODEL": str(tiny_model_dir), "EDGESPEC_GRPC_PORT": str(ports["grpc"]),
                    "EDGESPEC_HTTP_PORT": str(ports["http"]), "EDGESPEC_DRAIN_GRACE": "5"},
                   # extra flags after the role are passed on (and win over the environment)
                   ["--device", "cpu", "--dtype", "float32"], r"edgespec server listening"),
        "relay": ({"EDGESPEC_PROFILE": "4g", "EDGESPEC_RELAY_LISTEN": f"127.0.0.1:{ports['relay']}",
                   "EDGESPEC_RELAY_UPSTREAM": f"127.0.0.1:{ports['grpc']}"}, ["--seed", "1"], r"relay 4g: "),
        "client": ({"EDGESPEC_SERVER": f"127.0.0.1:{ports['relay']}", "EDGESPEC_DRAFTER": "independent",
                    "EDGESPEC_DRAFTER_MODEL": str(tiny_drafter_dir), "EDGESPEC_TOKENIZER": str(tiny_model_dir),
                    "EDGESPEC_CLIENT_PORT": str(ports["api"])}, [], r"edgespec local API on"),
    }
    started = {}
    try:
        for role, (env, extra, ready) in roles.items():
            started[role] = procs.Service(["bash", str(ENTRYPOINT), role, *extra], work / f"{role}.log", ready,
                                          env={**base, **env})
            started[role].wait_ready(180)  # in order: the client needs the server through the relay
        yield started, ports, base
    finally:
        for svc in started.values():
            svc.stop()


def healthcheck(role: str, ports: dict, base: dict) -> int:
    env = {**os.environ, **base, "EDGESPEC_HEALTH_ROLE": role, "EDGESPEC_HTTP_PORT": str(ports["http"]),
           "EDGESPEC_CLIENT_PORT": str(ports["api"])}
    return subprocess.run(["bash", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, timeout=30).returncode


def test_openai_client_through_the_emulated_link_gets_the_target_text(box, tiny_model_dir, greedy):
    from openai import OpenAI
    from transformers import AutoTokenizer

    services, ports, base = box
    assert healthcheck("server", ports, base) == 0, services["server"].log()[-1500:]
    assert healthcheck("client", ports, base) == 0, services["client"].log()[-1500:]

    api = OpenAI(base_url=f"http://127.0.0.1:{ports['api']}/v1", api_key="unused", max_retries=0, timeout=120)
    (model,) = [m.id for m in api.models.list().data]
    answer = api.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt_ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    eos = {tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])}
    expected = greedy(tiny_model_dir, prompt_ids, eos, MAX_TOKENS)
    assert answer.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    assert answer.usage.completion_tokens == len(expected)


def test_sigterm_reaches_edgespec_which_drains_and_exits_zero(box):
    services, ports, base = box
    server = services["server"]
    server.proc.send_signal(signal.SIGTERM)
    # A bash wrapper that did not exec would die of the signal (-15) without draining.
    assert server.proc.wait(timeout=60) == 0, server.log()[-1500:]
    assert "draining" in server.log()
    assert healthcheck("server", ports, base) != 0
