"""The learned drafters' scaling curve: how far their chains reach on the target's own answers, per snapshot.

    edgespec bench drafter-curve ~/.cache/edgespec/train/fit/eagle-w768 [RUN ...] --humaneval 20 --mtbench 20

A run of `edgespec train fit --snapshot-tokens T` keeps its drafter at every doubling of the tokens it has
seen (``snapshots/tokens-*/``); this scores each of them, and the run's last drafter, on one fixed set: the
target's greedy answers (``--max-tokens``) to the first HumanEval prompts and MT-Bench first turns, which no
training set holds (the data builder refuses them). From every answer position a greedy chain of ``--depth``
tokens is drafted as the client drafts it (the target's features of the verified text, the draft
vocabulary the client opens with: ``--draft-vocab`` most frequent ids plus the prompt's; the LM head in
int8, ``--head``) and scored by the
trainer's acceptance: the tokens accepted before the first miss, where the answer follows the target.
Mean accepted + 1 is the tau of a one-chain tree (a tree's is higher).

The answers and their features (all of them: EAGLE reads the last hidden state, MoA the K/V and TLI
activations) are made once into ``--eval-dir`` (the target answering and a feature pass: minutes on a
CPU) and reused by every later call.
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

from .prompt_sets import add_prompt_arguments, chosen_prompts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="training run folders (or a drafter checkpoint folder)")
    p.add_argument("--eval-dir", type=Path, default=None,
                   help="where the answers and their features are kept (default: EDGESPEC_HOME/train/eval-answers)")
    p.add_argument("--depth", type=int, default=6, help="chain length drafted from each position")
    p.add_argument("--draft-vocab", type=int, default=65536, help="most frequent ids drafted, plus the prompt's")
    p.add_argument("--batch-size", type=int, default=8, help="prompts the target answers together")
    p.add_argument("--dtype", default=None, help="the target's dtype for the answers and their features (default: "
                   "bf16 where the CPU has it, as the server runs it); an evaluation folder keeps its first one")
    p.add_argument("--head", choices=("int8", "bfloat16", "float32"), default="int8",
                   help="the LM head's precision (default int8, as the client drafts on a CPU)")
    p.add_argument("--drafter-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="the drafter's own layers (and MoA's TLI layers): float32 (the curve's figures so far), or "
                        "bf16 autocast, near what the client runs where the CPU has native bf16")
    add_prompt_arguments(p, humaneval=20, mtbench=20, max_tokens=128, drafter_model=False)


def run(args: argparse.Namespace) -> int:
    from .records import markdown_table

    eval_dir = args.eval_dir or Path(os.environ.get("EDGESPEC_HOME", Path.home() / ".cache" / "edgespec")) \
        / "train" / "eval-answers"
    store = eval_store(args.target, eval_dir, chosen_prompts(args), args.max_tokens, args.batch_size, args.dtype)
    scorer = Scorer(args.target, store, args.draft_vocab, args.depth, args.head, args.drafter_dtype)
    rows = []
    for run_dir in args.runs:
        for point in curve_points(run_dir):
            acc = scorer.score(point["path"])
            rows.append([run_dir.name, point["kind"], point["tokens_seen"], point["train_tokens"] or "-",
                         *(f"{acc[s].mean_length():.3f} / {acc[s].rates()[0]:.3f}" if s in acc else "-"
                           for s in ("humaneval", "mtbench"))])
    print(markdown_table(["run", "kind", "tokens seen", "training tokens", "HumanEval: mean accepted / @1",
                          "MT-Bench: mean accepted / @1"], rows))
    return 0


# -- the evaluation set ----------------------------------------------------------------------------------

def eval_store(target: str, folder: Path, prompts: list, max_new_tokens: int, batch_size: int,
               dtype: str | None = None):
    """The target's answers to ``prompts`` (``folder/samples.jsonl``, kept) and their features, all kinds
    (``folder/store``), made where missing; the FeatureStore."""
    from edgespec.server import ExtractConfig, FeatureStore, extract_sharded

    folder.mkdir(parents=True, exist_ok=True)
    samples = folder / "samples.jsonl"
    have = {json.loads(line)["id"] for line in samples.read_text().splitlines()} if samples.exists() else set()
    wanted = [p for p in prompts if f"{p.set_name}:{p.id}" not in have]
    if wanted:
        answer_prompts(target, samples, wanted, max_new_tokens, batch_size, dtype)
    extract_sharded(target, folder, folder / "store",
                    ExtractConfig(max_len=4096, tli_depths=(0, 1), contents="full", batch_tokens=2048,
                                  shard_tokens=4096), device="cpu", dtype=dtype)
    return FeatureStore(folder / "store")


def answer_prompts(target: str, samples: Path, prompts: list, max_new_tokens: int, batch_size: int,
                   dtype: str | None = None) -> None:
    """Append the target's greedy answers to ``prompts`` as held-out rows of token ids (kept as generated:
    text decoded and encoded again is not always the same ids); ``dtype``: the target's, default bf16 where
    the CPU has it, as the server runs it."""
    import torch

    from edgespec.shared.models import load_model

    loaded = load_model(target, device="cpu", dtype=dtype)
    tok, model = loaded.tokenizer, loaded.model
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    eos = model.generation_config.eos_token_id
    stops = (set(eos) if isinstance(eos, list) else {eos}) | {tok.eos_token_id}
    stops.discard(None)
    with samples.open("a", encoding="utf-8") as f:
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i:i + batch_size]
            heads = [tok.apply_chat_template(list(p.messages()), add_generation_prompt=True, tokenize=True,
                                             return_dict=False) for p in batch]
            width = max(map(len, heads))
            x = torch.tensor([[pad] * (width - len(h)) + h for h in heads])  # left padding: answers start together
            attention = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in heads])
            with torch.inference_mode():
                out = model.generate(input_ids=x, attention_mask=attention, max_new_tokens=max_new_tokens,
                                     do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad)
            for p, h, row in zip(batch, heads, out[:, width:].tolist()):
                answer = next((row[:k + 1] for k, t in enumerate(row) if t in stops), row)  # through the stop id
                f.write(json.dumps({"id": f"{p.set_name}:{p.id}", "kind": "answer", "split": "val",
                                    "ids": h + answer, "loss_mask": [0] * len(h) + [1] * len(answer)}) + "\n")
                f.flush()


# -- the drafters ------------------------------------------------------------------------------------------

def snapshot_point(snap: Path) -> dict:
    """One snapshot folder (``RUN/snapshots/tokens-T``) as a point, with the figures it was taken at."""
    from edgespec.shared.drafters.checkpoint import checkpoint_kind, find_checkpoint

    meta = json.loads((snap / "snapshot.json").read_text())
    return {"path": find_checkpoint(snap), "kind": checkpoint_kind(snap), "tokens_seen": meta["tokens_seen"],
            "train_tokens": meta.get("train_tokens")}


def curve_points(run_dir: Path) -> list[dict]:
    """A run's snapshots, by tokens seen, then its last drafter (where it has one); a snapshot given alone is
    its own one point."""
    from edgespec.shared.drafters.checkpoint import DrafterCheckpointError, checkpoint_kind, find_checkpoint

    if (run_dir / "snapshot.json").is_file():
        return [snapshot_point(run_dir)]
    points = [snapshot_point(snap) for snap in sorted((run_dir / "snapshots").glob("tokens-*"))
              if not snap.name.endswith(".tmp")]
    points.sort(key=lambda p: p["tokens_seen"])
    try:
        last = find_checkpoint(run_dir)
    except DrafterCheckpointError:
        if not points:
            raise
        return points
    card = json.loads((run_dir / "card.json").read_text()) if (run_dir / "card.json").is_file() else {}
    training = card.get("training", {})
    # cards from before tokens were counted: the steps times the tokens a step
    seen = training.get("tokens_seen") or training.get("steps", 0) * training.get("config", {}).get("batch_tokens", 0)
    if not points or seen > points[-1]["tokens_seen"]:
        points.append({"path": last, "kind": checkpoint_kind(run_dir), "tokens_seen": seen,
                       "train_tokens": card.get("data", {}).get("train_tokens")})
    return points


class Scorer:
    """Scores drafters on the evaluation store, with the target's parts loaded once per TLI depth."""

    def __init__(self, target: str, store, draft_vocab: int, depth: int, head: str = "int8",
                 drafter_dtype: str = "float32"):
        from transformers import AutoTokenizer

        from edgespec.client import draft_vocab_ids
        from edgespec.shared.fingerprint import tokenizer_fingerprint
        from edgespec.shared.models.loading import model_location

        self.target, self.store, self.depth, self.head = target, store, depth, head
        self.bf16 = drafter_dtype == "bfloat16"
        tok = AutoTokenizer.from_pretrained(model_location(target))
        self.vocab_ids = draft_vocab_ids(tok, tokenizer_fingerprint(tok), draft_vocab, len(tok)) if draft_vocab else None
        self._parts: dict[int, object] = {}
        self.seqs = [store.load(ref, ("hidden", "kv", "act0", "act1")) for ref in store.split("val")]

    def parts(self, tli: int):
        import torch

        from edgespec.shared.drafters.target_parts import load_target_parts

        if tli not in self._parts:  # the LM head as asked (int8 by default, as the client runs it on a CPU)
            self._parts[tli] = load_target_parts(self.target, tli, self.vocab_ids, torch.float32,
                                                 getattr(torch, self.head))
        return self._parts[tli]

    def score(self, path: Path) -> dict:
        """{"humaneval"|"mtbench": Acceptance} of the drafter at ``path``."""
        import torch

        from edgespec.server import WIRE_CODECS, Acceptance, eagle_acceptance, moa_acceptance
        from edgespec.shared.codec import ActivationCodec
        from edgespec.shared.drafters.checkpoint import checkpoint_kind
        from edgespec.shared.drafters.eagle.model import load_eagle
        from edgespec.shared.drafters.moa.model import load_moa

        kind = checkpoint_kind(path)
        if kind == "eagle":
            head = load_eagle(path)[0].float()
            parts = self.parts(0)
            draft = lambda seq: eagle_acceptance(head, parts, seq, self.depth)  # noqa: E731
        elif kind == "moa":
            model = load_moa(path)
            model.client.float()
            parts = self.parts(model.client.config.tli)
            wire = ActivationCodec(WIRE_CODECS["int8_outlier"])  # as the client asks the server to send it
            draft = lambda seq: moa_acceptance(model, parts, seq, self.depth, wire=wire)  # noqa: E731
        else:
            raise ValueError(f"{path}: the curve scores EAGLE and MoA drafters, not {kind}")
        out: dict[str, Acceptance] = defaultdict(lambda: Acceptance(0, [0] * self.depth))
        # bf16 autocast: the drafter's (and TLI layers') products in bf16, as a bf16 drafter computes them; the int8
        # head's integer product is the same either way.
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            for seq in self.seqs:
                first = int(seq.loss_mask.nonzero()[0]) if seq.loss_mask.any() else len(seq.tokens)
                parts.set_context_ids(seq.tokens[:first].tolist())  # the prompt's ids, as the client adds them
                out[seq.id.split(":", 1)[0]] += draft(seq)
        return dict(out)
