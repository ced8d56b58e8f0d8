"""Feature extraction: run the target once over the data set and store what drafters learn from.

Per sequence (one ``.npz`` per sample, written atomically, so an interrupted run resumes by
skipping finished files), every tensor as an activation-codec frame (int8 + fp16 outlier
channels + zstd, ``shared/codec.py``):

- ``tokens`` [n] int32, ``loss_mask`` [n] uint8 (1 = a token the drafter should learn to
  predict: the response of a chat sample, all of a code sample)
- ``hidden`` [n, E]: the LM-head input (output of the final norm): EAGLE's feature
- ``kv`` [n, L, 2*E_kv]: every layer's K (after RoPE) | V per token: MoA's LSA input; the
  last N layers' slices are also what TLI = N receives
- ``act{N}`` [n, E] for each TLI depth N: the activation entering layer L-N (N = 0: the
  residual stream before the final norm): MoA's regression target
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgespec.shared.codec import ActivationCodec, Codec, decode_frame
from edgespec.shared.drafters.target_parts import TargetShape, target_shape
from edgespec.shared.kv import output_cache
from .data import chat_ids_and_mask, chat_text, read_samples

log = logging.getLogger(__name__)
CODEC = ActivationCodec(Codec.INT8_OUTLIER, zstd_level=1, outlier_channels=8)


@dataclass
class StoredSequence:
    """One stored sequence, decoded to float32 tensors."""

    id: str
    split: str
    tokens: torch.Tensor  # [n] long
    loss_mask: torch.Tensor  # [n] bool
    hidden: torch.Tensor  # [n, E]
    kv: torch.Tensor  # [n, L, 2*E_kv]
    acts: dict[int, torch.Tensor]  # TLI depth N -> [n, E]

    def to(self, device) -> "StoredSequence":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return StoredSequence(self.id, self.split, move(self.tokens), move(self.loss_mask), move(self.hidden),
                              move(self.kv), {k: move(v) for k, v in self.acts.items()})


def tokenize_sample(tokenizer, row: dict, max_len: int) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one data row, cut to max_len tokens."""
    if "ids" in row:  # already token ids (the target's own output, kept exactly: no decode and encode again)
        ids, mask = list(row["ids"]), list(row["loss_mask"])
        if len(ids) != len(mask):
            raise ValueError(f"row {row.get('id')!r}: {len(ids)} ids but {len(mask)} loss-mask entries")
    elif row["kind"] in ("code", "text"):
        ids = tokenizer.encode(row["prompt"], add_special_tokens=False)
        mask = [1] * len(ids)
    elif "messages" in row:  # a conversation from a chat file (a one-turn request's row has prompt and response)
        ids, mask = chat_ids_and_mask(tokenizer, row["messages"])
    else:
        prefix = tokenizer.encode(chat_text(tokenizer, row["prompt"], None), add_special_tokens=False)
        ids = tokenizer.encode(chat_text(tokenizer, row["prompt"], row["response"]), add_special_tokens=False)
        mask = [0] * len(prefix) + [1] * (len(ids) - len(prefix))
    return ids[:max_len], mask[:max_len]


@torch.inference_mode()
def batch_features(model, batch: list[list[int]], tli_depths: tuple[int, ...], pad_id: int,
                   with_kv: bool = True) -> list[dict]:
    """Per sequence: hidden [n, E], kv [n, L, 2*E_kv], act{N} [n, E] (float32, CPU), from one
    right-padded forward of the whole batch. ``with_kv`` False: no ``kv`` (and no cache kept through
    the forward), for a hidden-only store."""
    shape = target_shape(model)
    base = model.model
    x = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids, dtype=torch.long) for ids in batch], batch_first=True,
                                        padding_value=pad_id)
    layer_inputs: dict[int, torch.Tensor] = {}
    norm_io: dict[str, torch.Tensor] = {}
    hooks = []
    for idx in {shape.num_layers - n for n in tli_depths if n > 0}:
        def pre(mod, args, kwargs, idx=idx):
            layer_inputs[idx] = (args[0] if args else kwargs["hidden_states"]).float().cpu()
        hooks.append(base.layers[idx].register_forward_pre_hook(pre, with_kwargs=True))

    def on_norm(mod, args, out):
        norm_io["in"], norm_io["out"] = args[0].float().cpu(), out.float().cpu()
    hooks.append(base.norm.register_forward_hook(on_norm))
    try:
        out = base(input_ids=x.to(model.device), use_cache=with_kv)
    finally:
        for h in hooks:
            h.remove()
    acts = {n: norm_io["in"] if n == 0 else layer_inputs[shape.num_layers - n] for n in tli_depths}
    per_seq = [{"hidden": norm_io["out"][r, :len(ids)], **{f"act{d}": a[r, :len(ids)] for d, a in acts.items()}}
               for r, ids in enumerate(batch)]
    if not with_kv:
        return per_seq
    cache = output_cache(out)
    # [B, kv_heads, T, D] -> [B, T, kv_heads*D] per layer; then [B, T, L, 2*E_kv]
    flat = lambda t: t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1).float().cpu()  # noqa: E731
    kv = torch.stack([torch.cat([flat(cache.layers[i].keys), flat(cache.layers[i].values)], -1)
                      for i in range(shape.num_layers)], dim=2)
    return [{**f, "kv": kv[r, :len(ids)]} for r, (f, ids) in enumerate(zip(per_seq, batch))]


def target_features(model, ids: list[int], tli_depths: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """hidden [n, E], kv [n, L, 2*E_kv], act{N} [n, E] of one sequence (float32, on CPU): a batch of one."""
    return batch_features(model, [ids], tli_depths, pad_id=0)[0]


def data_and_target(target: str, data_dir: str | Path, device: str | None, dtype: str | None,
                    limit: int | None = None) -> tuple[list[dict], object]:
    """The data set's rows (the first ``limit``; None or 0: all) and the loaded target."""
    from edgespec.shared.models import load_model

    rows = read_samples(Path(data_dir) / "samples.jsonl")[:limit or None]
    if not rows:
        raise FileNotFoundError(f"no samples in {data_dir}/samples.jsonl: run `edgespec train data` first")
    return rows, load_model(target, device=device, dtype=dtype)


def store_meta(target: str, loaded, tli_depths: tuple[int, ...], max_len: int, **more) -> dict:
    """A store's ``store.json`` (or its stand-in's ``meta``): the target, its shape, what was extracted."""
    return {"target": target, "fingerprint": loaded.fingerprint, "shape": target_shape(loaded.model).__dict__,
            "tli_depths": list(tli_depths), "max_len": max_len, **more}


def seq_file(store: Path, sample_id: str) -> Path:
    return store / "seq" / (hashlib.sha1(sample_id.encode()).hexdigest()[:16] + ".npz")


def extract_features(target: str, data_dir: str | Path, out_dir: str | Path, max_len: int = 1024,
                     tli_depths: tuple[int, ...] = (0, 1, 3), device: str | None = None,
                     dtype: str | None = None, limit: int | None = None) -> Path:
    from tqdm import tqdm

    store = Path(out_dir)
    (store / "seq").mkdir(parents=True, exist_ok=True)
    rows, loaded = data_and_target(target, data_dir, device, dtype, limit)
    (store / "store.json").write_text(json.dumps(store_meta(target, loaded, tli_depths, max_len), indent=1))
    todo = [r for r in rows if not seq_file(store, r["id"]).exists()]
    log.info("%d sequences, %d already stored, %d to go -> %s", len(rows), len(rows) - len(todo), len(todo), store)
    for row in tqdm(todo, desc="target features", mininterval=10):
        ids, mask = tokenize_sample(loaded.tokenizer, row, max_len)
        if len(ids) < 4:
            continue
        feats = target_features(loaded.model, ids, tuple(tli_depths))
        save_npz(seq_file(store, row["id"]), sequence_arrays("", row["id"], row["split"], ids, mask, feats))
    return store


def sequence_arrays(prefix: str, sample_id: str, split: str, ids: list[int], mask: list[int],
                    feats: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """One sequence's arrays, named as a store file holds them (a shard's sequence j: prefix "s{j}_")."""
    arrays = {prefix + "tokens": np.asarray(ids, np.int32), prefix + "loss_mask": np.asarray(mask, np.uint8),
              prefix + "meta": np.frombuffer(json.dumps({"id": sample_id, "split": split}).encode(), np.uint8)}
    # kv [n, L, 2*E_kv] is encoded as [n, L, 2, E_kv]: one int8 scale per token, layer and K or V. With K|V in one
    # row, K's far larger channels (up to ~190x V's absmax in the 1.5B's first layer) set V's scale: V's error
    # was 7% (90% in that layer), 0.9% apart (issue 47).
    # Encoded from float32 whatever the features came in (the live capture keeps bf16 until a shard is written):
    # a store's frames all say float32, and bf16 values are exact in it.
    arrays.update({prefix + name: np.frombuffer(CODEC.encode((t.unflatten(-1, (2, -1)) if name == "kv" else t)
                                                             .float().contiguous()), np.uint8)
                   for name, t in feats.items()})
    return arrays


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Written under a temporary name (never read as part of the store), renamed when complete."""
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ShardRef:
    """Sequence ``index`` of a shard file (sharded stores, ``extraction.py``)."""

    path: Path
    index: int
    split: str
    tokens: int


class FeatureStore:
    """Read side: the stored sequences of a split, from a sharded store (``shards/``, what
    ``extraction.py`` writes) and/or one file per sequence (``seq/``, older stores). A shard still
    being written (``.tmp.npz``) is not read, so a store can be trained on while it grows."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / "store.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.path} is not a feature store (no store.json): "
                                    "run `edgespec train features`")
        self.meta = json.loads(meta_path.read_text())
        self.shape = TargetShape(**self.meta["shape"])
        seq_files = [f for f in sorted((self.path / "seq").glob("*.npz")) if not f.name.endswith(".tmp.npz")]
        self._splits: dict[object, str] = {f: self._meta_of(f)["split"] for f in seq_files}
        for shard in sorted((self.path / "shards").glob("shard-*.npz")):
            if shard.name.endswith(".tmp.npz"):
                continue
            with np.load(shard) as z:
                index = json.loads(z["index"].tobytes().decode())
            for j, (_, split, n) in enumerate(index):
                self._splits[ShardRef(shard, j, split, n)] = split
        self.files = list(self._splits)

    @staticmethod
    def _meta_of(path: Path) -> dict:
        with np.load(path) as z:
            return json.loads(z["meta"].tobytes().decode())

    def split(self, name: str) -> list:
        return [f for f in self.files if self._splits[f] == name]

    def tokens(self, name: str) -> int:
        """Tokens in a split (sharded stores know it without decoding anything)."""
        return sum(f.tokens if isinstance(f, ShardRef) else self.load(f, ()).tokens.numel() for f in self.split(name))

    @staticmethod
    def load(ref, names: tuple[str, ...] = ("hidden", "kv")) -> StoredSequence:
        # a shard names sequence j's arrays s{j}_tokens, ...; a per-sequence file names them tokens, ...
        path, prefix = (ref.path, f"s{ref.index}_") if isinstance(ref, ShardRef) else (ref, "")
        with np.load(path) as z:
            meta = json.loads(z[prefix + "meta"].tobytes().decode())
            tokens, mask = z[prefix + "tokens"], z[prefix + "loss_mask"]
            dec = {k: decode_frame(z[prefix + k].tobytes()).float() for k in names if prefix + k in z.files}
        kv = dec.get("kv")  # stored [n, L, 2, E_kv] (K and V quantized apart) or, older stores, [n, L, 2*E_kv]
        return StoredSequence(meta["id"], meta["split"], torch.from_numpy(tokens.astype(np.int64)),
                              torch.from_numpy(mask.astype(bool)), dec.get("hidden"),
                              kv.flatten(-2) if kv is not None and kv.dim() == 4 else kv,
                              {int(k[3:]): v for k, v in dec.items() if k.startswith("act")})


class StoreUnion:
    """Several feature stores of one target read as one (``edgespec train fit --features A --features B``):
    a bulk of raw text in one, the target's own answers in another, each extracted and grown on its own."""

    def __init__(self, paths: list[str | Path]):
        self.stores = [FeatureStore(p) for p in paths]
        first = self.stores[0]
        for other in self.stores[1:]:
            if other.meta.get("fingerprint") != first.meta.get("fingerprint") or other.shape != first.shape:
                raise ValueError(f"feature stores {first.path} and {other.path} come from different targets "
                                 "(tokenizer or shape): train on stores of one target")
        self.path = Path(",".join(str(s.path) for s in self.stores))  # what messages and the card name
        # Only what every store holds can be trained on: one hidden-only store makes the union hidden-only.
        contents = "hidden" if any(s.meta.get("contents") == "hidden" for s in self.stores) else "full"
        depths = set.intersection(*(set(s.meta.get("tli_depths", [])) for s in self.stores))
        self.meta = {**first.meta, "contents": contents, "tli_depths": sorted(depths),
                     "stores": [str(s.path) for s in self.stores]}
        self.shape = first.shape
        self.files = [f for s in self.stores for f in s.files]
        self._splits = {f: split for s in self.stores for f, split in s._splits.items()}

    def split(self, name: str) -> list:
        return [f for f in self.files if self._splits[f] == name]

    def tokens(self, name: str) -> int:
        return sum(s.tokens(name) for s in self.stores)

    load = staticmethod(FeatureStore.load)


def open_stores(paths: str | Path | list) -> FeatureStore | StoreUnion:
    """One store, or the union of several (a list of more than one path)."""
    if isinstance(paths, (str, Path)):
        return FeatureStore(paths)
    return FeatureStore(paths[0]) if len(paths) == 1 else StoreUnion(list(paths))
