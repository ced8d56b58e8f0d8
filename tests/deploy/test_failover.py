"""The cluster topology without containers: `edgespec server` replicas on a
tiny model behind nginx rendered from deploy/nginx's template (the config shipped
for hosts without Kubernetes), on loopback. The replica holding a session is
taken away mid-generation (SIGKILL: a crash; SIGTERM: a drain); the client resumes
through nginx on another replica, which re-prefills, and the output is token for
token the target's own greedy one."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # three server processes behind nginx, end to end


LISTENING = r"edgespec server listening grpc=(\S+) http=(\S+)"
PROMPT = "def fibonacci(n):\n    "
MAX_NEW_TOKENS = 48
KILL_AFTER_TOKENS = 8


class Replica:
    """One `edgespec server` process on loopback, on free ports it picks itself."""

    def __init__(self, procs, model_dir: Path, log_path: Path):
        self.service = procs.Service(
            [sys.executable, "-m", "edgespec", "server", "--model", str(model_dir),
             "--host", "127.0.0.1", "--grpc-port", "0", "--port", "0", "--device", "cpu", "--dtype", "float32",
             "--log-format", "json", "--drain-grace", "5"], log_path, LISTENING)
        self.proc = self.service.proc
        self.grpc = self.http = ""

    def wait_listening(self, timeout_s: float) -> None:
        m = self.service.wait_ready(timeout_s)
        self.grpc, self.http = m.group(1), m.group(2)

    def health(self) -> dict:
        with urllib.request.urlopen(f"http://{self.http}/health", timeout=5) as resp:
            return json.loads(resp.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=5) as resp:
            return resp.read().decode()

    def log(self) -> str:
        return self.service.log()

    def stop(self) -> None:
        self.service.stop()


@pytest.fixture(scope="module")
def replicas(procs, tiny_model_dir, tmp_path_factory):
    """Three replicas: each test takes one away and needs one more to resume on, in any order."""
    logs = tmp_path_factory.mktemp("replicas")
    started = [Replica(procs, tiny_model_dir, logs / f"replica{i}.log") for i in range(3)]
    try:
        for r in started:
            r.wait_listening(180)
        yield started
    finally:
        for r in started:
            r.stop()


@pytest.fixture(scope="module")
def nginx_proxy(procs, nginx_bin, render_nginx, nginx_main_conf, replicas, tmp_path_factory):
    """nginx with deploy/nginx/edgespec-grpc.conf.template rendered for the replicas."""
    workdir = tmp_path_factory.mktemp("nginx")
    port = procs.free_port()
    site = workdir / "edgespec-grpc.conf"
    site.write_text(render_nginx(f"127.0.0.1:{port}", [r.grpc for r in replicas], workdir / "access.log"))
    main = workdir / "nginx.conf"
    main.write_text(nginx_main_conf(workdir, site))
    check = subprocess.run([nginx_bin, "-t", "-p", str(workdir), "-c", str(main)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([nginx_bin, "-p", str(workdir), "-c", str(main)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        procs.wait_port(port, 10)
        yield f"127.0.0.1:{port}", workdir / "access.log"
    finally:
        proc.terminate()  # nginx: SIGTERM is a fast shutdown of master and workers
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def client(nginx_proxy, tiny_model_dir, tiny_drafter_dir):
    """A client with the tiny drafter (independent: it can go on offline), connected to nginx."""
    from edgespec.client.drafters.factory import DrafterOptions
    from edgespec.client.edge_client import ClientConfig, EdgespecClient
    from edgespec.client.link.grpc_transport import LinkConfig

    config = ClientConfig(LinkConfig(address=nginx_proxy[0], min_deadline_s=2.0, backoff_max_s=0.5),
                          DrafterOptions(name="independent", model=str(tiny_drafter_dir), dtype="float32"),
                          tokenizer=str(tiny_model_dir))
    with EdgespecClient(config) as c:
        yield c


@pytest.fixture(scope="module")
def expected(client, tiny_model_dir, greedy):
    prompt_ids = client.encode(PROMPT)
    ids = greedy(tiny_model_dir, prompt_ids, client.tokens.eos_ids, MAX_NEW_TOKENS)
    assert len(ids) > 2 * KILL_AFTER_TOKENS, "the prompt must give a reply long enough to cut in the middle"
    return prompt_ids, ids


def _logged_session_streams(access_log: Path, session_id: str, want: int, timeout_s: float = 10.0) -> list[dict]:
    """A session's streams in nginx's JSON access log; a stream is logged when it ends, so wait a little."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = access_log.read_text().splitlines() if access_log.exists() else []
        streams = [e for e in map(json.loads, lines) if e["method"].endswith("/Session") and e["session"] == session_id]
        if len(streams) >= want or time.monotonic() > deadline:
            return streams
        time.sleep(0.1)


def _holder(replicas: list[Replica]) -> Replica:
    alive = [r for r in replicas if r.proc.poll() is None]
    assert len(alive) >= 2, "each test needs a replica to lose and one to resume on"
    held = [r.health()["sessions"] for r in alive]
    assert sorted(held) == [0] * (len(alive) - 1) + [1], f"expected one replica to hold the session: {held}"
    return alive[held.index(1)]


def generate_losing_the_holder(client, prompt_ids, replicas, take_away):
    """Generate greedily; after KILL_AFTER_TOKENS tokens, with the generation paused, call
    take_away(replica holding the session). Returns (result, emitted ids, link events, that replica)."""
    from edgespec.client.loop.generation import GenerationConfig, LinkEvent, RetractEvent, TokenEvent

    emitted: list[int] = []
    link_events: list[LinkEvent] = []
    victim = None
    for item in client.stream(prompt_ids, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS)):
        if isinstance(item, TokenEvent):
            emitted.append(item.token)
        elif isinstance(item, RetractEvent):
            del emitted[item.index:]
        elif isinstance(item, LinkEvent):
            link_events.append(item)
        if victim is None and len(emitted) == KILL_AFTER_TOKENS:
            victim = _holder(replicas)
            take_away(victim)
    return item, emitted, link_events, victim


def assert_resumed_elsewhere_exactly(result, emitted, link_events, survivors, expected_ids, client):
    from edgespec.client.loop.generation import TokenOrigin

    # The link went down and came back on a replica that never saw the session.
    assert [e.online for e in link_events] == [False, True], [e.detail for e in link_events]
    assert "re-prefilled" in link_events[1].detail, link_events[1].detail
    resumed = [r for r in survivors if re.search(r'edgespec_resumes_total\{restored="false"\} [1-9]', r.metrics())]
    assert resumed, "no surviving replica counted a re-prefilling Resume"
    # Nothing lost, nothing duplicated: exactly the target's greedy output, all of it verified.
    assert result.token_ids == expected_ids, (result.token_ids, expected_ids)
    assert emitted == expected_ids
    assert result.provisional == 0 and TokenOrigin.OFFLINE not in result.origins
    assert client.decode(result.token_ids) == client.decode(expected_ids)


def test_session_survives_a_crashed_replica(replicas, nginx_proxy, client, expected):
    """SIGKILL (no drain) of the replica holding the session, mid-generation."""
    prompt_ids, expected_ids = expected

    def crash(replica: Replica) -> None:
        replica.proc.send_signal(signal.SIGKILL)
        replica.proc.wait(timeout=10)

    result, emitted, events, victim = generate_losing_the_holder(client, prompt_ids, replicas, crash)
    assert victim.proc.returncode == -signal.SIGKILL
    survivors = [r for r in replicas if r.proc.poll() is None]
    assert_resumed_elsewhere_exactly(result, emitted, events, survivors, expected_ids, client)
    # nginx logged both of the session's streams (the broken one and the resumed one),
    # with the session header it hashed on, on two different replicas.
    streams = _logged_session_streams(nginx_proxy[1], result.session_id, want=2)
    assert len(streams) == 2, streams
    assert streams[0]["upstream"] == victim.grpc, streams
    assert streams[1]["upstream"].split(", ")[-1] != victim.grpc, streams


def test_session_survives_a_draining_replica(replicas, nginx_proxy, client, expected):
    """SIGTERM (what systemd and Kubernetes send) to the replica holding the session: it
    stops taking sessions, gives the open stream its drain grace, exits 0; the client resumes."""
    prompt_ids, expected_ids = expected

    def drain(replica: Replica) -> None:
        replica.proc.send_signal(signal.SIGTERM)
        # The client is paused, so its stream outlives the drain grace (5 s) and is cut.
        assert replica.proc.wait(timeout=60) == 0, replica.log()[-1500:]

    result, emitted, events, victim = generate_losing_the_holder(client, prompt_ids, replicas, drain)
    assert '"draining' in victim.log(), victim.log()[-1500:]
    survivors = [r for r in replicas if r.proc.poll() is None]
    assert_resumed_elsewhere_exactly(result, emitted, events, survivors, expected_ids, client)
