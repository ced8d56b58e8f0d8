"""`edgespec bench link|disconnect|specbench --server HOST:PORT`: the benchmark measures a server it did not start.

A real `edgespec server` (tiny random model) runs in a subprocess on loopback, started by the test; the bench's
clients reach it over real sockets, the plain API over its real HTTP side, and every line records the link as tc
shows it on the route (loopback here: unshaped, "none")."""
from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from edgespec.netem.bench.experiments import BenchConfig, run
from edgespec.netem.bench.remote import RemoteServerError
from edgespec.netem.bench.server_process import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def elsewhere(tiny_model_dir):
    """A server this test starts and the benchmark does not: `edgespec server` in its own process."""
    with ServerProcess(str(tiny_model_dir), ["--prefix-cache-gb", "0"], threads=1) as server:
        yield server


def bench(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "edgespec", "bench", *args], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def remote_args(server, tiny_model_dir, tiny_drafter_dir) -> list[str]:
    return ["--server", server.grpc_address, "--server-http", server.http_address, "--model", str(tiny_model_dir),
            "--drafter-model", str(tiny_drafter_dir), "--max-new-tokens", "12", "--no-progress"]


def test_link_measures_a_server_it_did_not_start(tmp_path, elsewhere, tiny_model_dir, tiny_drafter_dir):
    out = bench("link", str(tmp_path), "--sets", "humaneval", "--limit", "1", "--drafters", "ngram",
                *remote_args(elsewhere, tiny_model_dir, tiny_drafter_dir)).stdout
    assert f"server: {elsewhere.grpc_address}" in out and "link: none on lo" in out
    rows = lines(tmp_path / "link.jsonl")
    assert {(r["profile"], r["system"]) for r in rows} == {("none", "local-only"), ("none", "plain-api"),
                                                          ("none", "ngram")}
    for r in rows:  # every line says which server and which network it measured
        server = r["env"]["server"]
        assert server["grpc"] == elsewhere.grpc_address and server["http"] == elsewhere.http_address
        assert server["link"] == {"profile": "none", "device": "lo", "qdiscs": []}
        assert r["env"]["cpus"] == {"pinned": False}
    by = {r["system"]: r for r in rows}
    assert by["ngram"]["text"] == by["plain-api"]["text"]  # lossless against the same remote target
    assert by["ngram"]["calls"] >= 1 and by["ngram"]["bytes_up"] > 0 and by["plain-api"]["bytes_down"] > 0
    assert not list(tmp_path.glob("*-server.log"))  # it started no server of its own
    assert elsewhere.proc.poll() is None  # and left the one it measured running
    report = (tmp_path / "report.md").read_text()
    assert f"server at {elsewhere.grpc_address} started elsewhere" in report and "| none | ngram |" in report
    assert (tmp_path / "tokens_per_s.png").stat().st_size > 1000


def test_disconnect_cuts_on_the_clients_side(tmp_path, elsewhere, tiny_model_dir, tiny_drafter_dir):
    bench("disconnect", str(tmp_path), "--limit", "1", "--drafters", "independent", "--cut-after", "3,never",
          "--cut-mode", "reset", *remote_args(elsewhere, tiny_model_dir, tiny_drafter_dir))
    rows = lines(tmp_path / "disconnect.jsonl")
    assert [(r["system"], r["cut_after"], r["profile"]) for r in rows] == [
        ("target", None, "none"), ("independent", None, "none"), ("independent", 3, "none")]
    target, never, cut = rows
    assert never["text"] == target["text"] and never["disconnects"] == 0
    assert cut["disconnects"] >= 1 and cut["offline_tokens"] > 0  # the local relay cut it; the drafter went on
    assert elsewhere.proc.poll() is None  # the server lives on: only this side's link was cut
    assert "## Disconnection success" in (tmp_path / "report.md").read_text()


def test_specbench_against_a_server_elsewhere(tmp_path, elsewhere, tiny_model_dir, tiny_drafter_dir):
    bench("specbench", str(tmp_path), "--limit", "1", "--categories", "writing", "--drafters", "ngram",
          *remote_args(elsewhere, tiny_model_dir, tiny_drafter_dir))
    rows = lines(tmp_path / "specbench.jsonl")
    assert {(r["profile"], r["system"]) for r in rows} == {("none", "plain-api"), ("none", "ngram")}
    assert all(r["env"]["server"]["grpc"] == elsewhere.grpc_address for r in rows)
    assert list((tmp_path / "specbench" / "none").glob("*-ngram-none.jsonl"))  # Spec-Bench's answer files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refusals(tmp_path):
    unused_tcp_port = free_port()
    with pytest.raises(ValueError, match="runs against a server it starts"):
        run(BenchConfig("speed", tmp_path, server="127.0.0.1:1"))
    with pytest.raises(ValueError, match="--server-cpus"):
        run(BenchConfig("link", tmp_path, server="127.0.0.1:1", server_cpus="0"))
    with pytest.raises(RemoteServerError, match="no edgespec server ready"):
        run(BenchConfig("link", tmp_path, server=f"127.0.0.1:{unused_tcp_port}",
                        server_http=f"127.0.0.1:{unused_tcp_port}"))
    assert not (tmp_path / "link.jsonl").exists()
