"""Codec benchmark on real activations of a target model.

    edgespec bench activation-codec --model qwen2.5-coder-1.5b-instruct

Runs the target over a few real prompts (chat-formatted coding questions with
source code from the standard library inside, a few hundred tokens each),
takes the tensors edgespec sends or could send: the last hidden state (the
LM-head input, E per token) and the K|V of every layer (2*E_kv*L per token),
and prints, for each codec, outlier count K and zstd level, bytes per token, the share of fp16's
bytes, the relative L2 error and the encode/decode time. Frames are measured
both as one frame per prompt (what Open sends) and as 4-token frames (a
typical verification). `edgespec bench codec OUT` runs the same as an experiment (400 tokens a prompt,
JSON lines and the report).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import time
from dataclasses import asdict, dataclass

from .records import markdown_table

PROMPTS = [
    ("Explain what this function does and suggest one improvement.", "textwrap", "dedent"),
    ("Write unit tests with pytest for this function.", "shlex", "quote"),
    ("Rewrite this function with type hints and a docstring.", "json", "dumps"),
    ("Find a bug or an edge case this code does not handle.", "fnmatch", "translate"),
]


def settings() -> list[tuple]:
    """(codec, zstd level, outlier channels K) of every row."""
    from edgespec.shared.codec import Codec

    return [(Codec.FP16, level, 0) for level in (0, 1, 3, 9)] + [
        (Codec.INT8, level, 0) for level in (0, 1, 3, 9)] + [
        (Codec.INT8_OUTLIER, level, k) for k in (8, 32) for level in (0, 1, 3, 9)]


@dataclass
class Row:
    tensor: str
    codec: str
    outliers: int
    zstd: int
    frame_tokens: str
    bytes_per_token: float
    share_of_fp16: float
    rel_error: float
    encode_ms: float
    decode_ms: float


def real_prompts(tokenizer, max_tokens: int) -> list[list[int]]:
    out = []
    for question, module, func in PROMPTS:
        source = inspect.getsource(getattr(importlib.import_module(module), func))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{question}\n\n```python\n{source}\n```"}],
            tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text).input_ids[:max_tokens])
    return out


def activations(model, prompts: list[list[int]]) -> dict[str, list]:
    """Per prompt: 'hidden' [T, E] and 'kv' [T, L, 2*E_kv], in the model's dtype."""
    import torch

    from edgespec.shared.kv import output_cache

    hidden, kv = [], []
    with torch.no_grad():
        for ids in prompts:
            out = model(torch.tensor([ids], device=model.device), use_cache=True, output_hidden_states=True)
            hidden.append(out.hidden_states[-1][0].cpu())
            layers = []
            for layer in output_cache(out).layers:
                k = layer.keys[0].transpose(0, 1).flatten(1)  # [T, kv_heads*head_dim]
                v = layer.values[0].transpose(0, 1).flatten(1)
                layers.append(torch.cat([k, v], dim=-1))
            kv.append(torch.stack(layers, dim=1).cpu())
    return {"hidden": hidden, "kv": kv}


def measure(name: str, tensors: list, frame_tokens: int | None) -> list[Row]:
    import torch

    from edgespec.shared.codec import Codec, decode_frame, encode_frame

    frames = [t if frame_tokens is None else c for t in tensors
              for c in (torch.split(t, frame_tokens) if frame_tokens else [t])]
    tokens = sum(t.shape[0] for t in tensors)
    rows, fp16_bytes = [], None
    for codec, level, outliers in settings():
        size, err_num, err_den, enc, dec = 0, 0.0, 0.0, 0.0, 0.0
        for f in frames:
            t0 = time.perf_counter()
            blob = encode_frame(f, codec, level, outliers)
            t1 = time.perf_counter()
            back = decode_frame(blob)
            t2 = time.perf_counter()
            size += len(blob)
            enc, dec = enc + t1 - t0, dec + t2 - t1
            err_num += (back.float() - f.float()).pow(2).sum().item()
            err_den += f.float().pow(2).sum().item()
        if codec is Codec.FP16 and level == 0:
            fp16_bytes = size
        rows.append(Row(name, codec.name.lower(), outliers, level, "prompt" if frame_tokens is None else str(frame_tokens),
                        size / tokens, size / fp16_bytes, (err_num / err_den) ** 0.5,
                        1000 * enc / len(frames), 1000 * dec / len(frames)))
    return rows


def measure_all(model, prompts: list[list[int]]) -> list[Row]:
    """Every tensor of the prompts' activations, as one frame per prompt and as 4-token frames."""
    return [row for name, tensors in activations(model, prompts).items() for frame in (None, 4)
            for row in measure(name, tensors, frame)]


def markdown(rows: list[Row]) -> str:
    return markdown_table(
        ["tensor", "frame", "codec", "K", "zstd", "bytes/token", "vs fp16", "rel. L2 error", "encode ms/frame",
         "decode ms/frame"],
        ([r.tensor, r.frame_tokens, r.codec, r.outliers or "", r.zstd, f"{r.bytes_per_token:,.0f}",
          f"{100 * r.share_of_fp16:.1f} %", f"{100 * r.rel_error:.3f} %", f"{r.encode_ms:.2f}", f"{r.decode_ms:.2f}"]
         for r in rows))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--max-tokens", type=int, default=400, help="tokens per prompt")
    parser.add_argument("--json", help="also write the rows as JSON lines here")


def run(args: argparse.Namespace) -> int:
    from edgespec.shared.models.loading import load_model

    loaded = load_model(args.model)
    prompts = real_prompts(loaded.tokenizer, args.max_tokens)
    n = sum(len(p) for p in prompts)
    print(f"model {loaded.name} on {loaded.device} ({loaded.dtype}), {len(prompts)} prompts, {n} tokens\n")
    rows = measure_all(loaded.model, prompts)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(asdict(r)) + "\n")
    return 0
