"""`--model org/name` where the Hugging Face hub cannot be reached: one clear error within seconds (not after
huggingface_hub's retries, about 45 s a file), naming the ways to a model without the hub; a model already in
the Hugging Face cache is read from there without a request.

The hub's address is a local port that refuses connections (HF_ENDPOINT, as a user sets it), and the cache an
empty folder of the test's own, so nothing depends on whether this machine reaches the internet.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

FAST_S = 10.0  # the error path's bound: huggingface_hub's retries alone take 1 + 2 + 4 + 8 + 8 s a file

TIMED = """
import json, sys, time
from edgespec.client.edge_client import load_tokenizer
from edgespec.shared.errors import ModelPrepareError
from edgespec.shared.models.loading import load_model

out = {}
for what, load in (("model", lambda: load_model(sys.argv[1], device="cpu", dtype="float32")),
                   ("tokenizer", lambda: load_tokenizer(sys.argv[1]))):
    start = time.monotonic()
    try:
        loaded = load()
        result = {"loaded": type(loaded).__name__}
    except ModelPrepareError as err:
        result = {"error": str(err)}
    out[what] = {**result, "seconds": time.monotonic() - start}
print(json.dumps(out))
"""


@pytest.fixture
def no_hub(tmp_path):
    """The environment of a machine without the hub: HF_ENDPOINT a local port that refuses connections (bound,
    never listening, so no one else takes it meanwhile), an empty Hugging Face cache, offline mode not set."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed.getsockname()[1]}", HF_HUB_CACHE=str(tmp_path / "hub"),
               HF_HOME=str(tmp_path / "hf"))
    yield env
    closed.close()


def timed_loads(repo_id: str, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", TIMED, repo_id], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_hub_id_not_cached_fails_within_seconds_naming_the_offline_route(no_hub):
    got = timed_loads("nobody-here/no-such-model", no_hub)
    for what in ("model", "tokenizer"):
        message, seconds = got[what].get("error"), got[what]["seconds"]
        assert message is not None, got[what]
        assert seconds < FAST_S, f"the {what}'s error took {seconds:.1f} s"
        assert message.startswith("model 'nobody-here/no-such-model' is neither a registry name nor a folder here")
        assert "not in the Hugging Face cache" in message and no_hub["HF_ENDPOINT"] in message
        assert "`hf download nobody-here/no-such-model --local-dir DIR`" in message  # the model fetched elsewhere
        assert "give its path" in message  # a local folder
        assert "qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct" in message  # the registry's names
        assert "`edgespec models prepare NAME`" in message and "\n" not in message


def test_the_server_command_says_it_in_one_line(no_hub):
    proc = subprocess.run([sys.executable, "-m", "edgespec", "server", "--model", "nobody-here/no-such-model",
                           "--grpc-port", "0", "--port", "0"], env=no_hub, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "nobody-here/no-such-model" in line]
    assert len(errors) == 1 and "hf download nobody-here/no-such-model" in errors[0], proc.stderr
    assert "Retrying" not in proc.stderr and "Traceback" not in proc.stderr


def test_a_hub_id_in_the_cache_loads_from_it_without_the_hub(no_hub, tiny_model_dir):
    """The Hugging Face cache's layout (refs/main naming a snapshot folder) holding the tiny model, as a
    download made earlier leaves it: loaded from there, at once, though the hub refuses connections."""
    repo = os.path.join(no_hub["HF_HUB_CACHE"], "models--somebody--cached-tiny")
    revision = "0" * 40
    shutil.copytree(tiny_model_dir, os.path.join(repo, "snapshots", revision))
    os.makedirs(os.path.join(repo, "refs"))
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(revision)
    got = timed_loads("somebody/cached-tiny", no_hub)
    assert got["model"].get("loaded") == "LoadedModel" and got["tokenizer"].get("loaded"), got
    assert got["model"]["seconds"] < FAST_S and got["tokenizer"]["seconds"] < FAST_S, got
