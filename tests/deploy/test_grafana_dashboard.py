"""deploy/grafana/edgespec.json: every query names a series that a running server or `client serve` exports.

Both are started for real (a tiny random target, `client serve` with the independent drafter against it), one
request goes through the client, and both /metrics are scraped; a query naming a series neither exports (a typo,
a renamed metric) fails here."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgespec.netem.bench.server_process import ServerProcess

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "edgespec.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}

pytestmark = pytest.mark.slow


def exported(text: str) -> set[str]:
    """Every series name a /metrics page offers a query, with the suffixes its families' samples take (a labelled
    counter nothing has counted yet has a family but no sample)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def queried() -> dict[str, set[str]]:
    """Each panel's title -> the series its queries name."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: {n for t in p["targets"] for n in re.findall(r"\bedgespec[\w:]*", t["expr"])}
            for p in panels if p["type"] != "row"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def scraped(tiny_model_dir, tiny_drafter_dir, tmp_path_factory) -> dict[str, set[str]]:
    with ServerProcess(str(tiny_model_dir), threads=1) as server:
        port = free_port()
        err = open(tmp_path_factory.mktemp("serve") / "stderr.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "edgespec", "client", "serve", "--server", server.grpc_address,
                                 "--port", str(port), "--tokenizer", str(tiny_model_dir), "--drafter", "independent",
                                 "--drafter-model", str(tiny_drafter_dir)],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            assert "edgespec local API on" in proc.stdout.readline()
            done = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 6},
                              timeout=120)
            assert done.status_code == 200
            yield {"server": exported(httpx.get(f"http://{server.http_address}/metrics", timeout=10).text),
                   "client": exported(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)}
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
            err.close()


def test_every_query_names_an_exported_series(scraped):
    known = scraped["server"] | scraped["client"]
    unknown = {title: sorted(names - known) for title, names in queried().items() if names - known}
    assert not unknown, unknown


def test_the_dashboard_covers_both_sides_and_the_link(scraped):
    names = set().union(*queried().values())
    assert names & scraped["server"] and names & scraped["client"]
    for series in ("edgespec_client:server_calls_total", "edgespec_client:offline_tokens_total",
                   "edgespec_client:link_state", "edgespec_client:link_disconnects_total",
                   "edgespec_client:link_resumes_total", "edgespec:spec_decode_num_drafts_total"):
        assert series in names, series
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)  # Grafana keys panels by id
    assert all(t["datasource"]["uid"] == "${datasource}" for p in panels for t in p.get("targets", []))


def test_a_misspelt_query_would_fail(scraped):
    assert "edgespec:spec_decode_num_draft_total" not in scraped["server"] | scraped["client"]
