"""The training data set: prompts with the target's own greedy responses, plus code text.

A drafter learns to predict the target, so responses must be what the target
writes: they are generated here by the target itself (greedy, chat template).
The builder appends one JSON line per finished sample to ``samples.jsonl``, so
an interrupted run resumes where it stopped. Each line:
``{"id", "kind", "split", "prompt", "response"}`` (``response`` is empty for
plain code text, whose ``prompt`` is the text itself).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .prompts import Sample, derive_samples, split_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfig:
    seed: int = 0  # chooses the prompts; same seed, same data set
    n_write: int = 200  # "write a function that ..." prompts from docstrings
    n_explain: int = 100  # "explain this code" prompts
    n_code: int = 60  # plain code chunks (no generation; the target's features only)
    code_chars: int = 1500  # characters per code chunk
    max_new_tokens: int = 192  # length cap of the target's responses
    batch_size: int = 8  # prompts generated together (left padding); a CPU is much faster batched
    val_fraction: float = 0.1  # share of samples (by id hash) held out for validation
    source_root: str | None = None  # where prompts come from; None = this interpreter's standard library


def read_samples(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by an interruption: everything before it stands
    return rows


def chat_text(tokenizer, prompt: str, response: str | None) -> str:
    """The chat-formatted text of one turn; without response it ends with the generation prompt."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return text if response is None else text + response + tokenizer.eos_token


@torch.inference_mode()
def generate_batch(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
    """Greedy responses of the target to chat prompts, batched with left padding."""
    texts = [chat_text(tokenizer, p, None) for p in prompts]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                         top_k=None, pad_token_id=tokenizer.pad_token_id)
    new = out[:, enc["input_ids"].shape[1]:]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in new]


def build_dataset(target: str, out_dir: str | Path, config: DataConfig = DataConfig(),
                  device: str | None = None, dtype: str | None = None) -> Path:
    """Write (or finish) ``out_dir/samples.jsonl``; returns its path."""
    from tqdm import tqdm

    from ...shared.models import load_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_config.json").write_text(json.dumps({"target": target, **asdict(config)}, indent=1))
    path = out / "samples.jsonl"
    done = {row["id"] for row in read_samples(path)}
    _rewrite_clean(path)
    root = Path(config.source_root) if config.source_root else None
    samples = derive_samples(config.seed, config.n_write, config.n_explain, config.n_code, config.code_chars,
                             root=root)
    todo = [s for s in samples if s.id not in done]
    log.info("%d samples, %d already done, %d to go -> %s", len(samples), len(done), len(todo), path)
    with path.open("a", encoding="utf-8") as f:
        for s in [s for s in todo if s.kind == "code"]:
            _append(f, s, "", config)
        chats = [s for s in todo if s.kind != "code"]
        if not chats:
            return path
        loaded = load_model(target, device=device, dtype=dtype)
        bar = tqdm(total=len(chats), desc="target responses", mininterval=10)
        for i in range(0, len(chats), config.batch_size):
            batch = chats[i:i + config.batch_size]
            t0 = time.perf_counter()
            responses = generate_batch(loaded.model, loaded.tokenizer, [s.prompt for s in batch], config.max_new_tokens)
            for s, r in zip(batch, responses):
                _append(f, s, r, config)
            bar.update(len(batch))
            log.info("batch %d/%d in %.0fs", i // config.batch_size + 1, -(-len(chats) // config.batch_size),
                     time.perf_counter() - t0)
    return path


def _append(f, sample: Sample, response: str, config: DataConfig) -> None:
    row = {"id": sample.id, "kind": sample.kind, "split": split_of(sample.id, config.val_fraction),
           "prompt": sample.prompt, "response": response}
    f.write(json.dumps(row) + "\n")
    f.flush()


def _rewrite_clean(path: Path) -> None:
    """Drop a half-written last line left by an interruption, so appends start on a fresh line."""
    if path.exists():
        rows = read_samples(path)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
