"""What one tree level costs a learned drafter on one core, against the independent drafter's small LM.

A level feeds k new nodes: the EAGLE head (width W, one decoder layer) over k rows attending to a context
of C cached rows, then the target's LM head over a draft vocabulary of V rows, in float32, bf16 or int8 (by
either kernel; ``--heads``). The small LM's forward over the same k tokens after a C-token cache is the
baseline, timed in the same run.

    python -m edgespec.netem.bench.drafter_cost --widths 384,768,1024 --vocabs 32768,65536 --rows 1,4,8

Prints the median of ``--repeats`` calls in ms (one thread unless ``--threads``); the heads have random
weights in the real shapes (a level's time does not depend on the weights' values).
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from edgespec.shared.drafters.blocks import KV
from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead
from edgespec.shared.drafters.target_parts import int8_logits, kept_channels, quantize_head
from edgespec.shared.models.registry import DEFAULT_DRAFTER


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first-call allocations and kernel choice
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1000


@torch.inference_mode()
def small_lm_ms(name: str, rows: list[int], context: int, dtype: str, repeats: int,
                packed: bool = False) -> dict[int, float]:
    """The small LM's forward over k new tokens after a cache of ``context`` tokens, per k; `packed`: with its
    linears packed for oneDNN (``shared/packed_weights.py``, float32 only), as the client's float32 drafter."""
    from edgespec.shared.kv import output_cache, with_cache
    from edgespec.shared.models import load_model
    from edgespec.shared.packed_weights import pack_linears

    model = load_model(name, device="cpu", dtype=dtype).model
    if packed:
        pack_linears(model)
    vocab = model.config.vocab_size
    cache = output_cache(model(torch.randint(0, vocab, (1, context)), use_cache=True))
    out = {}
    for k in rows:
        ids = torch.randint(0, vocab, (1, k))

        def level():
            model(ids, use_cache=True, **with_cache(model, cache))
            cache.crop(-k)  # drop the k rows this level added (a positive length is refused for some caches)
        out[k] = median_ms(level, repeats)
    return out


HEADS = ("float32", "bfloat16", "int_mm", "int8pack")  # the LM head: float, or int8 by either kernel


@torch.inference_mode()
def eagle_level_ms(hidden: int, width: int, vocab: int, k: int, context: int, head_kind: str,
                   repeats: int) -> tuple[float, float]:
    """(the whole level, the head's body alone) in ms for one EAGLE level of k nodes; ``head_kind`` one of HEADS:
    "int_mm" and "int8pack" are the client's int8 LM head (shared/drafters/target_parts.py, ``Int8Head``) with
    int8 x int8 products, or with bf16 inputs and the best ids again in float32."""
    heads = max(1, width // 64)
    head = EagleHead(EagleConfig(hidden, width=width, heads=heads, mlp_hidden=2 * width)).eval()
    weight = torch.randn(vocab, hidden)
    if head_kind in ("int_mm", "int8pack"):
        q = quantize_head(weight, kept_channels(torch.rand(hidden)))
        logits = lambda h: int8_logits(h, q, head_kind)  # noqa: E731
    else:
        head_dtype = getattr(torch, head_kind)
        lm = weight.to(head_dtype)
        logits = lambda h: (h.to(head_dtype) @ lm.T).float()  # noqa: E731
    emb, feat = torch.randn(k, hidden), torch.randn(k, hidden)
    pos = torch.arange(context, context + k)
    past = KV(torch.randn(heads, context, width // heads), torch.randn(heads, context, width // heads))
    mask = torch.ones(k, context + k, dtype=torch.bool)

    def level():
        h, _ = head(emb, feat, pos, mask, past)
        return torch.log_softmax(logits(h), -1)
    return median_ms(level, repeats), median_ms(lambda: head(emb, feat, pos, mask, past), repeats)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgespec.netem.bench.drafter_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--small", default=DEFAULT_DRAFTER, help="the independent drafter's LM (baseline); '' skips it")
    p.add_argument("--small-dtype", default="bfloat16")
    p.add_argument("--hidden", type=int, default=1536, help="the target's hidden size (1,536 for the 1.5B)")
    p.add_argument("--widths", type=ints, default=[384, 768, 1024])
    p.add_argument("--vocabs", type=ints, default=[32768, 65536])
    p.add_argument("--rows", type=ints, default=[1, 4, 8], help="new nodes per level")
    p.add_argument("--context", type=int, default=500)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--small-packed", action="store_true",
                   help="also time the small LM with its weights packed for oneDNN, in the same run (float32: the "
                        "independent drafter on a CPU without native bf16)")
    p.add_argument("--heads", type=lambda t: [h for h in t.split(",") if h], default=list(HEADS),
                   help=f"LM heads to time, comma-separated subset of {','.join(HEADS)}")
    args = p.parse_args(argv)
    if set(args.heads) - set(HEADS):
        p.error(f"unknown heads {sorted(set(args.heads) - set(HEADS))}; choose from {','.join(HEADS)}")
    torch.set_num_threads(args.threads)
    if args.small:
        plain = small_lm_ms(args.small, args.rows, args.context, args.small_dtype, args.repeats)
        packed = (small_lm_ms(args.small, args.rows, args.context, args.small_dtype, args.repeats, packed=True)
                  if args.small_packed else {})
        for k, ms in plain.items():
            also = f"; packed {packed[k]:.1f} ms ({ms / packed[k]:.2f}x)" if k in packed else ""
            print(f"small LM {args.small} ({args.small_dtype}) k={k}: {ms:.1f} ms{also}", flush=True)
    for width in args.widths:
        for vocab in args.vocabs:
            for k in args.rows:
                cells = []
                for kind in args.heads:
                    total, body = eagle_level_ms(args.hidden, width, vocab, k, args.context, kind, args.repeats)
                    cells.append(f"{kind} head {total:.1f} ms")
                print(f"eagle W={width} V={vocab} k={k}: {' | '.join(cells)} (body {body:.1f} ms)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
