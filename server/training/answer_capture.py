"""The target's features captured while it writes its answers, into a sharded store.

Generating an answer already runs the target over every prompt and answer token, so its final-norm
output, the TLI activations and every layer's K/V are there for the taking: keeping them saves a second
pass over the same tokens (`train features`), which on a CPU costs about as much as the generation itself
for the hidden states and twice as much with every layer's K/V. Each generation batch becomes one shard
of the store (`extraction.write_shard`'s layout), written after its rows are in ``samples.jsonl``; an
interruption between the two loses that batch's features, never duplicates them.

What is stored per answer is what went through the model: the prompt and the answer without its last
token (the last token is sampled, never fed back), with the loss mask on the answer's part.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from edgespec.shared.models.loading import model_eos_ids
from .batched_greedy import chat_batch, greedy_batch
from .extraction import Sequence, shard_path, write_shard
from .features import store_meta
from .train_config import CaptureConfig

log = logging.getLogger(__name__)


@dataclass
class CapturedAnswer:
    response: str  # the answer's text, as `generate_chat` returns it
    ids: list[int]  # prompt + answer tokens that the model read (the answer's last token is not one)
    mask: list[int]  # 1 on the answer's tokens
    feats: dict[str, torch.Tensor]  # hidden, act{N}, kv (when asked): [len(ids), ...] on the CPU, in the model's
    # dtype: a batch's features wait in memory until its shard is written, and at 256 answers of a 1.5B (57 KB of
    # K/V a token in float32) float32 copies took about 7 GB of a 24 GB machine; the store encodes them as float32


@torch.inference_mode()
def generate_captured(model, tokenizer, histories: list[list[dict]], max_new_tokens: int,
                      tli_depths: tuple[int, ...] = (), with_kv: bool = False) -> list[CapturedAnswer]:
    """Greedy answers to chat histories (batched, left padding, as `data.generate_chat`) with the features
    of every token the model read. A row's features are read from the one batched generation: its left
    padding is masked out, so they are the target's features of that row alone (up to the batch's rounding)."""
    enc = chat_batch(tokenizer, histories, model.device)
    base, n_layers = model.model, model.config.num_hidden_layers
    norm_in, norm_out, layer_in = [], [], {n: [] for n in tli_depths if n > 0}
    prompt_len = enc["input_ids"].shape[1]
    pads = (enc["attention_mask"] == 0).sum(1).tolist()
    kv: dict[int, torch.Tensor] = {}

    def on_norm(module, args, output) -> None:  # a hook that returns something replaces the output
        norm_in.append(args[0])
        norm_out.append(output)

    def before_layer(module, args, kwargs, store) -> None:
        store.append(args[0] if args else kwargs["hidden_states"])

    def on_leave(cache, positions, rows, seen) -> None:  # each layer's K | V row, [T, L, 2 * kv_heads * D]
        flat = lambda t, j, r, n: t[j, :, pads[r]:n].transpose(0, 1).flatten(1)  # noqa: E731
        for j, r, n in zip(positions, rows, seen):
            kv[r] = torch.stack([torch.cat([flat(layer.keys, j, r, n), flat(layer.values, j, r, n)], -1)
                                 for layer in cache.layers], dim=1).cpu()

    hooks = [base.norm.register_forward_hook(on_norm)]
    for n, store in layer_in.items():
        hooks.append(base.layers[n_layers - n].register_forward_pre_hook(
            lambda m, a, kw, store=store: before_layer(m, a, kw, store), with_kwargs=True))
    try:
        run = greedy_batch(model, enc["input_ids"], enc["attention_mask"], max_new_tokens,
                           model_eos_ids(model, tokenizer), tokenizer.pad_token_id,
                           on_leave=on_leave if with_kv else None)
    finally:
        for h in hooks:
            h.remove()
    # each forward's rows, in batch order: the prefill [b, P, E], then one [b', 1, E] a step for the rows left
    per_name = {"hidden": norm_out, **({"act0": norm_in} if 0 in tli_depths else {}),
                **{f"act{n}": parts for n, parts in layer_in.items()}}
    places: list[list[tuple[int, int]]] = [[] for _ in histories]
    for s, rows in enumerate(run.steps):
        for j, r in enumerate(rows):
            places[r].append((s, j))
    answers = []
    for r, generated in enumerate(run.generated):
        start, end = pads[r], prompt_len + len(generated) - 1  # the last answer token was never read
        feats = {name: torch.cat([parts[s][j] for s, j in places[r]])[start:end].cpu()
                 for name, parts in per_name.items()}
        if with_kv:
            feats["kv"] = kv.pop(r)
        row = enc["input_ids"][r].tolist() + generated
        answers.append(CapturedAnswer(
            response=tokenizer.decode(generated, skip_special_tokens=True), ids=row[start:end],
            mask=[0] * (prompt_len - start) + [1] * (len(generated) - 1), feats=feats))
    return answers


def capture_into(config: CaptureConfig):
    """`build_dataset`'s ``capture``: opens the store once the target is loaded (None without a folder)."""
    if not config.features_out:
        return None
    return lambda target, loaded, first_row: CaptureStore(config, target, loaded, first_row)


class CaptureStore:
    """The store `build_dataset` fills as the answers come: it answers each batch (``answer``), then writes
    that batch's features as one shard once the rows are in ``samples.jsonl`` (``write``)."""

    def __init__(self, config: CaptureConfig, target: str, loaded, first_row: int):
        if config.features_contents not in ("full", "hidden"):
            raise ValueError(f"capture contents must be 'full' or 'hidden', got {config.features_contents!r}")
        self.path, self.full = Path(config.features_out), config.features_contents == "full"
        self.depths = tuple(config.features_tli) if self.full else ()
        self._pending: list[CapturedAnswer] = []
        (self.path / "shards").mkdir(parents=True, exist_ok=True)
        meta = store_meta(target, loaded, self.depths, 0, format="sharded", dtype=str(loaded.dtype),
                          contents=config.features_contents, capture={"first_row": first_row})
        meta_path = self.path / "store.json"
        if meta_path.exists():
            old = json.loads(meta_path.read_text())
            for key in ("fingerprint", "contents", "tli_depths", "dtype"):
                if old.get(key) != meta[key]:
                    raise ValueError(f"{self.path} holds features with {key}={old.get(key)!r}, this run asks "
                                     f"{meta[key]!r}: use the same settings or a new folder")
            # where capture began stays as first written (the rows before it need `train features`)
            meta.update(capture=old.get("capture", meta["capture"]), max_len=old.get("max_len", 0))
        self.meta, self.meta_path = meta, meta_path
        meta_path.write_text(json.dumps(meta, indent=1))
        self.next = len([p for p in (self.path / "shards").glob("shard-*.npz") if not p.name.endswith(".tmp.npz")])

    def answer(self, model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[str]:
        """`data.generate_batch`'s answers, their features kept for ``write``."""
        self._pending = generate_captured(model, tokenizer, [[{"role": "user", "content": p}] for p in prompts],
                                          max_new_tokens, self.depths, with_kv=self.full)
        return [a.response for a in self._pending]

    def write(self, rows: list[dict]) -> None:
        """The last batch's features as one shard; ``rows``: its data rows (ids and splits), in order."""
        answers, self._pending = self._pending, []
        keep = [(row, a) for row, a in zip(rows, answers) if len(a.ids) >= 4]
        if not keep:
            return
        seqs = [Sequence(row["id"], row["split"], a.ids, a.mask) for row, a in keep]
        write_shard(shard_path(self.path, self.next), seqs, [a.feats for _, a in keep])
        self.meta["max_len"] = max(self.meta["max_len"], *(len(s.ids) for s in seqs))  # the longest stored
        self.meta_path.write_text(json.dumps(self.meta, indent=1))
        log.info("features of %d answers (%d tokens) -> shard %d of %s", len(seqs), sum(len(s.ids) for s in seqs),
                 self.next, self.path)
        self.next += 1
