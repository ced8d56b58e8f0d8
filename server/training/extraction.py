"""Feature extraction at scale: many sequences per forward, written as sharded int8 stores as it goes.

The data rows are tokenized up front and cut into shards in file order: shard k is always the
same run of sequences (consecutive sequences until ``shard_tokens`` tokens), so a run killed at
any point resumes by skipping the shards already on disk and produces the same store as a run
that was never stopped. Each shard is written to a temporary name and renamed when complete.

Inside a shard, sequences go through the target in forwards of at most ``batch_tokens`` padded
tokens (longest first, right padding: a real token never attends to a pad behind it, so padding
does not change its features). A shard file ``shards/shard-NNNNNN.npz`` holds, per sequence j,
``s{j}_tokens``, ``s{j}_loss_mask``, ``s{j}_meta`` and each feature (``features.py``) as an
activation-codec frame; ``index`` lists (id, split, tokens) of the shard's sequences.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .features import batch_features, data_and_target, save_npz, sequence_arrays, store_meta, tokenize_sample
from .train_config import ExtractConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sequence:
    id: str
    split: str
    ids: list[int]
    mask: list[int]


def plan_shards(seqs: list[Sequence], shard_tokens: int) -> list[list[Sequence]]:
    """Consecutive sequences grouped until each group holds at least shard_tokens tokens."""
    shards, cur, n = [], [], 0
    for s in seqs:
        cur.append(s)
        n += len(s.ids)
        if n >= shard_tokens:
            shards.append(cur)
            cur, n = [], 0
    if cur:
        shards.append(cur)
    return shards


def plan_batches(seqs: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Indices of seqs in forwards of at most batch_tokens padded tokens, longest first."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].ids))
    batches, cur = [], []
    for i in order:
        longest = len(seqs[cur[0]].ids) if cur else len(seqs[i].ids)
        if cur and longest * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def shard_path(store: Path, k: int) -> Path:
    return store / "shards" / f"shard-{k:06d}.npz"


def write_shard(path: Path, seqs: list[Sequence], feats: list[dict]) -> None:
    arrays = {"index": np.frombuffer(json.dumps([[s.id, s.split, len(s.ids)] for s in seqs]).encode(), np.uint8)}
    for j, (s, f) in enumerate(zip(seqs, feats)):
        arrays.update(sequence_arrays(f"s{j}_", s.id, s.split, s.ids, s.mask, f))
    save_npz(path, arrays)


def tokenized_rows(tokenizer, rows: list[dict], max_len: int) -> list[Sequence]:
    out = []
    for row in rows:
        ids, mask = tokenize_sample(tokenizer, row, max_len)
        if len(ids) >= 4:
            out.append(Sequence(row["id"], row["split"], ids, mask))
    return out


def extract_sharded(target: str, data_dir: str | Path, out_dir: str | Path, config: ExtractConfig = ExtractConfig(),
                    device: str | None = None, dtype: str | None = None) -> Path:
    """Extract (or finish extracting) the target's features of ``data_dir/samples.jsonl`` into a
    sharded store at ``out_dir``; returns the store's path."""
    store = Path(out_dir)
    (store / "shards").mkdir(parents=True, exist_ok=True)
    if config.contents not in ("full", "hidden"):
        raise ValueError(f"contents must be 'full' or 'hidden', got {config.contents!r}")
    full = config.contents == "full"
    depths = tuple(config.tli_depths) if full else ()  # a hidden-only store has no TLI activations either
    rows, loaded = data_and_target(target, data_dir, device, dtype, config.limit)
    meta = store_meta(target, loaded, depths, config.max_len, format="sharded", dtype=str(loaded.dtype),
                      contents=config.contents, extract=asdict(config))
    meta_path = store / "store.json"
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        # dtype too: shards of float32 and bf16 features in one store would be two targets' numbers. A store
        # from before stores recorded it says nothing, and is not refused for that.
        old.setdefault("contents", "full")  # stores from before hidden-only ones were full
        keys = ("fingerprint", "contents", "tli_depths", "max_len") + (("dtype",) if "dtype" in old else ())
        for key in keys:
            if old.get(key) != meta[key]:
                raise ValueError(f"{store} was extracted with {key}={old.get(key)!r}, this run asks {meta[key]!r}: "
                                 "resume with the same settings or use a new folder")
        if old.get("extract", {}).get("shard_tokens") != config.shard_tokens:
            raise ValueError(f"{store} was cut into shards of {old.get('extract', {}).get('shard_tokens')} tokens; "
                             f"resuming with {config.shard_tokens} would regroup them")
    meta_path.write_text(json.dumps(meta, indent=1))
    seqs = tokenized_rows(loaded.tokenizer, rows, config.max_len)
    shards = plan_shards(seqs, config.shard_tokens)
    if config.growing and shards and sum(len(s.ids) for s in shards[-1]) < config.shard_tokens:
        # Written now, it would hold fewer sequences than the same shard planned over more rows, and a later run
        # would skip it as done: the rows between would never be extracted.
        shards = shards[:-1]
    todo = [k for k in range(len(shards)) if not shard_path(store, k).exists()]
    total = sum(len(s.ids) for sh in shards for s in sh)
    left = sum(len(s.ids) for k in todo for s in shards[k])
    log.info("%d sequences (%d tokens) in %d shards; %d shards (%d tokens) to go -> %s", len(seqs), total,
             len(shards), len(todo), left, store)
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    t0, done_tokens = time.perf_counter(), 0
    for k in todo:
        shard = shards[k]
        feats: list[dict | None] = [None] * len(shard)
        for batch in plan_batches(shard, config.batch_tokens):
            for i, f in zip(batch, batch_features(loaded.model, [shard[i].ids for i in batch], depths, pad,
                                                  with_kv=full)):
                feats[i] = f
        write_shard(shard_path(store, k), shard, feats)
        done_tokens += sum(len(s.ids) for s in shard)
        rate = done_tokens / (time.perf_counter() - t0)
        log.info("shard %d/%d written: %d of %d tokens this run, %.1f tokens/s, %.1f h to go", k + 1, len(shards),
                 done_tokens, left, rate, (left - done_tokens) / max(rate, 1e-9) / 3600)
    return store
