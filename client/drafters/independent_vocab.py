"""The independent drafter's reduced vocabulary: the N most frequent target ids of a text corpus.

The 0.5B drafter's LM head (151,936 x 896) costs a quarter of a drafting pass on
a laptop CPU; drafting over the 32k most frequent ids cuts it fivefold. A token
outside the list is simply never drafted: the target verifies with its full
vocabulary, so the output stays exactly the target's.

The list depends only on the tokenizer (keyed by its fingerprint). It is looked
for among the shipped checkpoints (``shared/drafters/checkpoints/independent-vocab/``,
for the Qwen2.5 tokenizer), then in ``~/.cache/edgespec/draft-vocab/``, and otherwise counted
once from the Python standard library's source (never from an evaluation set)
and cached there.

    python -m edgespec.client.drafters.independent_vocab --tokenizer qwen2.5-coder-0.5b-instruct \
        --size 32768 --samples runs/data/qwen0.5b/samples.jsonl --out shared/drafters/checkpoints/independent-vocab
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import sysconfig
from pathlib import Path
from typing import Iterable, Iterator

import torch

from edgespec.shared.drafters.checkpoint import CHECKPOINT_DIR
from edgespec.shared.drafters.vocab import most_frequent_ids

SHIPPED_DIR = CHECKPOINT_DIR / "independent-vocab"
STDLIB_CHAR_BUDGET = 12_000_000  # characters of stdlib source counted: enough for stable ranks, ~1 min to tokenize


def cache_dir() -> Path:
    return Path.home() / ".cache" / "edgespec" / "draft-vocab"


def vocab_file_name(fingerprint: str, size: int) -> str:
    return f"{fingerprint[:16]}-{size}.safetensors"


def stdlib_texts(char_budget: int = STDLIB_CHAR_BUDGET) -> Iterator[str]:
    """Python standard library sources in a fixed order (tests skipped), up to char_budget characters."""
    root = Path(sysconfig.get_paths()["stdlib"])
    used = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(p in ("test", "tests", "idlelib", "site-packages", "lib2to3") for p in rel):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield text
        used += len(text)
        if used >= char_budget:
            return


def sample_texts(path: str | Path) -> Iterator[str]:
    """prompt + response of each line of a training samples.jsonl (the drafter data pipeline's output)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield str(row.get("prompt", "")) + str(row.get("response", ""))


def special_ids(tokenizer) -> list[int]:
    """Ids that must stay draftable whatever their count: specials and the end-of-turn tokens."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = tokenizer.get_vocab()
    ids.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>") if t in vocab)
    return sorted(i for i in ids if i is not None)


def count_vocab(tokenizer, texts: Iterable[str], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent ids of texts under tokenizer, specials always in, ascending."""
    streams = (torch.tensor(tokenizer(t, add_special_tokens=False)["input_ids"], dtype=torch.long)
               for t in texts if t)
    return most_frequent_ids(streams, size, vocab_size, special_ids(tokenizer))


def save_vocab(path: Path, ids: torch.Tensor, fingerprint: str, corpus: str) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({"vocab_ids": ids.to(torch.int32).contiguous()}, str(tmp),
              metadata={"fingerprint": fingerprint, "corpus": corpus})
    tmp.replace(path)  # atomic: a second process never reads half a file
    return path


def load_vocab(path: Path, fingerprint: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("fingerprint") != fingerprint:
            raise ValueError(f"{path} is the reduced vocabulary of another tokenizer "
                             f"({meta.get('fingerprint', '?')[:16]}, not {fingerprint[:16]}); delete it")
        return f.get_tensor("vocab_ids").long()


def draft_vocab_ids(tokenizer, fingerprint: str, size: int, vocab_size: int) -> torch.Tensor | None:
    """The reduced vocabulary for this tokenizer (None when size is 0 or not smaller than the vocabulary)."""
    if size <= 0 or size >= vocab_size:
        return None
    name = vocab_file_name(fingerprint, size)
    for where in (SHIPPED_DIR / name, cache_dir() / name):
        if where.is_file():
            return load_vocab(where, fingerprint)
    ids = count_vocab(tokenizer, stdlib_texts(), size, vocab_size)
    save_vocab(cache_dir() / name, ids, fingerprint, "python stdlib")
    return ids


def main(argv: list[str] | None = None) -> int:
    from edgespec.shared.fingerprint import tokenizer_fingerprint
    from edgespec.shared.models.loading import model_location
    from transformers import AutoConfig, AutoTokenizer

    p = argparse.ArgumentParser(prog="python -m edgespec.client.drafters.independent_vocab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default="qwen2.5-coder-0.5b-instruct", help="model name or directory")
    p.add_argument("--size", type=int, default=32768, help="ids kept (default 32768)")
    p.add_argument("--samples", action="append", default=[], help="samples.jsonl to count too (repeatable)")
    p.add_argument("--out", default=str(cache_dir()), help="folder to write into (default: the user cache)")
    args = p.parse_args(argv)
    where = model_location(args.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(where)
    vocab_size = AutoConfig.from_pretrained(where).vocab_size
    fingerprint = tokenizer_fingerprint(tokenizer)
    texts = itertools.chain(stdlib_texts(), *map(sample_texts, args.samples))
    ids = count_vocab(tokenizer, texts, args.size, vocab_size)
    corpus = "python stdlib" + "".join(f" + {Path(s).name}" for s in args.samples)
    out = save_vocab(Path(args.out) / vocab_file_name(fingerprint, args.size), ids, fingerprint, corpus)
    print(f"wrote {out} ({len(ids)} ids of {vocab_size}; corpus {corpus})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
