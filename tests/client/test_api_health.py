"""/health of the local API, over real HTTP (httpx) against a real uvicorn app on loopback."""
from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

from edgespec.client.http_health import ClientSlot, LinkProbe
from edgespec.client.link.grpc_transport import LinkConfig, LinkDownError
from edgespec.client.loop.generation import GenerationConfig
from edgespec.shared.errors import TokenizerMismatchError


class Served:
    """build_app(slot) on a loopback port in a thread."""

    def __init__(self, slot: ClientSlot, probe: LinkProbe | None = None):
        import uvicorn

        from edgespec.client.http_api import build_app

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(slot, default_max_tokens=8, probe=probe),
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve():
    made = []

    def start(slot, probe=None) -> Served:
        made.append(Served(slot, probe))
        return made[-1]

    yield start
    for s in made:
        s.close()


def _wait(predicate, timeout_s=30.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_health_is_503_while_loading_then_200_with_the_picture(serve, tiny_server, make_client):
    release = threading.Event()
    link = LinkConfig(tiny_server.address)

    def build():
        release.wait(30)
        return make_client(tiny_server.address, "independent")

    slot = ClientSlot.load_in_background(build, "independent", link)
    app = serve(slot)
    r = httpx.get(f"{app.url}/health")
    assert r.status_code == 503
    assert r.json() == {"status": "loading", "drafter": "independent", "server": tiny_server.address,
                        "link": "unknown", "model": None}
    r = httpx.post(f"{app.url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and "still loading" in r.json()["error"]["message"]
    release.set()
    assert _wait(lambda: httpx.get(f"{app.url}/health").status_code == 200)
    body = httpx.get(f"{app.url}/health").json()
    assert body == {"status": "ok", "drafter": "independent", "server": tiny_server.address, "link": "up",
                    "model": slot.client.model_name}
    r = httpx.post(f"{app.url}/v1/completions", json={"prompt": "def f():", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    slot.close()


def test_health_waits_out_an_unreachable_server_and_reports_a_failed_load(serve, tiny_server):
    attempts = []

    def build():
        attempts.append(1)
        if len(attempts) < 3:
            raise LinkDownError("cannot reach the edgespec server at 127.0.0.1:9")
        raise TokenizerMismatchError("the client's tokenizer is not the server's target tokenizer")

    slot = ClientSlot.load_in_background(build, "ngram", LinkConfig(tiny_server.address), retry_initial_s=0.05)
    app = serve(slot)
    assert slot.wait_settled(30) and len(attempts) == 3  # the unreachable server was retried, the mismatch not
    r = httpx.get(f"{app.url}/health")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "failed" and "tokenizer" in body["detail"]
    r = httpx.post(f"{app.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 503 and "loading the client failed" in r.json()["error"]["message"]


def test_health_follows_the_link_down_and_up(serve, relay, make_client):
    client = make_client(relay.target, "ngram")
    slot = ClientSlot.ready(client)
    app = serve(slot, LinkProbe(LinkConfig(relay.target), timeout_s=0.3, max_age_s=0.0))
    assert httpx.get(f"{app.url}/health").json()["link"] == "up"
    relay.cut("reset")
    r = httpx.get(f"{app.url}/health")
    assert r.status_code == 200 and r.json()["link"] == "down"  # the client still serves (offline if it can)
    relay.restore()
    assert _wait(lambda: httpx.get(f"{app.url}/health").json()["link"] == "up")
    relay.cut("blackhole")  # packets vanish: the probe's deadline finds it
    assert httpx.get(f"{app.url}/health").json()["link"] == "down"


def test_health_says_offline_while_a_generation_runs_without_the_link(serve, relay, make_client):
    client = make_client(relay.target, "independent")
    slot = ClientSlot.ready(client)
    app = serve(slot, LinkProbe(LinkConfig(relay.target), timeout_s=0.3, max_age_s=0.0))
    client.generate(client.encode("warm"), GenerationConfig(max_new_tokens=2))
    relay.cut("reset")
    done = {}

    def ask():
        done["r"] = httpx.post(f"{app.url}/v1/completions", json={"prompt": "def g(x):\n", "max_tokens": 60},
                               timeout=120)

    t = threading.Thread(target=ask)
    t.start()
    seen = _wait(lambda: httpx.get(f"{app.url}/health").json()["link"] == "offline")
    relay.restore()
    t.join(120)
    assert seen, "the health check never saw the generation go offline"
    assert done["r"].status_code == 200
    assert httpx.get(f"{app.url}/health").json()["link"] == "up"  # the generation ended: back to the probe
