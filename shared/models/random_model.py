"""Random-weight models in a known model's shapes, to time the server without the weights.

    edgespec models random --like qwen2.5-coder-1.5b-instruct DIR            # the 1.5B's shapes
    edgespec models random --like qwen2.5-coder-1.5b-instruct DIR --shape 7b  # Qwen2.5-7B's
    edgespec models random --like qwen2.5-coder-1.5b-instruct DIR --layers 4  # 1.5B widths, 4 layers
    edgespec models random DIR --shape small --dtype float32                  # a CPU bench in minutes

A forward's cost depends on shapes, not on weights, so verification and decode
timings of a random model stand for the real one's (acceptance does not: random
weights accept nothing, which is why the server bench takes the acceptance
length as a parameter). The config comes from the registry model's prepared
folder when there is one, else from the shapes written here. The tokenizer is
the prepared model's when the model embeds all its ids, else the tiny byte-level
one (ids beyond it are simply never produced by text; the server does not mind).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .prepare import is_prepared
from .registry import REGISTRY, prepared_dir
from .tiny import tiny_tokenizer


@dataclass(frozen=True)
class Shape:
    """A Qwen2-style decoder's sizes."""

    hidden_size: int  # E
    num_layers: int  # decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (GQA)
    intermediate_size: int  # MLP width
    vocab_size: int  # LM head rows
    tie_word_embeddings: bool  # LM head shares the embedding (small Qwen models do)
    max_positions: int = 32768  # RoPE positions the config allows
    rope_theta: float = 1_000_000.0


# The registry models' published configs, and the 7B of the same family.
SHAPES: dict[str, Shape] = {
    "qwen2.5-coder-1.5b-instruct": Shape(1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-coder-0.5b-instruct": Shape(896, 24, 14, 2, 4864, 151936, True),
    "7b": Shape(3584, 28, 28, 4, 18944, 152064, False),
    # A small decoder of the same family for timing engines on a CPU in minutes: the ratios between engines,
    # not the absolute figures, are what it is for.
    "small": Shape(512, 4, 8, 2, 1536, 32000, False),
}


def shape_of(like: str, shape: str | None = None, layers: int = 0) -> Shape:
    """The shape to build: `shape` ("7b") if given, else `like`'s (its prepared config when present)."""
    if shape is not None:
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
        out = SHAPES[shape]
    else:
        out = _prepared_shape(like) or SHAPES.get(like)
        if out is None:
            raise ValueError(f"no known shape for {like!r}; known: {sorted(SHAPES)}")
    return replace(out, num_layers=layers) if layers else out


def _prepared_shape(name: str) -> Shape | None:
    if name not in REGISTRY or not is_prepared(name):
        return None
    c = json.loads((prepared_dir(name) / "config.json").read_text())
    return Shape(c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"],
                 c["intermediate_size"], c["vocab_size"], bool(c.get("tie_word_embeddings", False)),
                 c.get("max_position_embeddings", 32768), c.get("rope_theta", 1_000_000.0))


def qwen2_config(shape: Shape):
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                      num_attention_heads=shape.num_heads, num_key_value_heads=shape.num_kv_heads,
                      intermediate_size=shape.intermediate_size, vocab_size=shape.vocab_size,
                      tie_word_embeddings=shape.tie_word_embeddings, max_position_embeddings=shape.max_positions,
                      rope_theta=shape.rope_theta, bos_token_id=256, pad_token_id=256, eos_token_id=258)
    cfg._attn_implementation = "sdpa"
    return cfg


@torch.no_grad()
def save_random_model(out_dir: str | Path, like: str, shape: Shape, dtype: torch.dtype = torch.bfloat16,
                      seed: int = 0, std: float = 0.02, device: str = "cpu") -> Path:
    """Write a random Qwen2 model of `shape` and a tokenizer as a Hugging Face folder; returns it.

    Weights are made straight in `dtype` on the CPU (a 7B in bf16 needs ~15 GB of memory, not 30 in
    float32): the model is built on the meta device and each tensor filled once. ``device`` draws the
    numbers there (``cuda``: a 7B in seconds rather than a minute of one CPU core; other numbers than the
    CPU's for the same seed, which timing does not mind).
    """
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen2_config(shape), dtype=dtype)
    model.to_empty(device="cpu")
    gen = torch.Generator(device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        else:
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32, device=device).mul_(std).to(dtype))
    model.save_pretrained(out)
    _tokenizer(like, shape.vocab_size).save_pretrained(out)
    (out / "edgespec-random.json").write_text(json.dumps(
        {"like": like, "shape": asdict(shape), "dtype": str(dtype).removeprefix("torch."), "seed": seed}, indent=2))
    return out


def _tokenizer(like: str, vocab_size: int):
    """The prepared model's tokenizer when the model has a row for each of its ids, else the tiny byte-level
    one: the `small` shape's 32000 rows cannot embed Qwen's 151k ids, and text run through it must not fail."""
    if like in REGISTRY and is_prepared(like):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(prepared_dir(like))
        if len(tok) <= vocab_size:
            return tok
    return tiny_tokenizer()
