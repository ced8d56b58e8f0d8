"""The int8 LM head: the same logits as float32 within int8's error, outlier channels kept exact, the draft
vocabulary's rows and context ids alike, and the default on a CPU."""
from __future__ import annotations

import torch

import pytest

from edgespec.shared.drafters.target_parts import (REFINE, TargetParts, int8_head_kernel, int8_logits, kept_channels,
                                                   quantize_head, select_rows)

KERNELS = ["int_mm", "int8pack"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_logits_follow_float32_and_the_kept_channels_carry_the_outliers(kernel):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(700, 64, generator=g) * 0.05
    h = torch.randn(9, 64, generator=g)
    h[:, [3, 40]] *= 30  # two outlier channels, as a final norm's output has
    norm = torch.ones(64)
    norm[[3, 40]] = 20.0
    channels = kept_channels(norm, k=2)
    assert channels.tolist() == [3, 40]
    want = h @ w.T
    got = int8_logits(h, quantize_head(w, channels), kernel)
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.01 and (got.argmax(-1) == want.argmax(-1)).all()
    # Without keeping them, those two channels set every row's scale: the rest lose most of their bits.
    blunt = int8_logits(h, quantize_head(w, torch.tensor([], dtype=torch.long)), kernel)
    assert (blunt - want).abs().max() / want.abs().max() > 2 * err
    # Rows taken out of a quantized head are the same rows quantized alone; chunks change nothing either.
    ids = torch.tensor([5, 600, 2])
    torch.testing.assert_close(int8_logits(h, select_rows(quantize_head(w, channels), ids), kernel),
                               int8_logits(h, quantize_head(w[ids], channels), kernel))
    torch.testing.assert_close(int8_logits(h, quantize_head(w, channels, chunk=64), kernel), got)


def test_int8pack_computes_each_rows_best_ids_again_in_float32():
    """bf16 logits come in steps of 0.125 at 16-32, which would tie a tree's candidates: the best REFINE ids of
    each row are the int8 rows' float32 products, the rest stay bf16's."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(3000, 64, generator=g) * 0.5
    h = torch.randn(5, 64, generator=g) * 4
    head = quantize_head(w, torch.tensor([7]))
    rest = h.index_fill(1, head.channels, 0.0)
    exact = rest @ (head.weight.float() * head.scale[:, None]).T + h[:, head.channels] @ head.kept.T
    got = int8_logits(h, head, "int8pack")
    top = exact.topk(REFINE // 2, -1).indices
    torch.testing.assert_close(got.gather(1, top), exact.gather(1, top), atol=1e-4, rtol=1e-5)
    coarse = (got - exact).abs().max()
    assert 1e-3 < coarse < 0.02 * exact.abs().max()  # the others: bf16's rounding, no more
    with pytest.raises(ValueError, match="unknown int8 head kernel"):
        int8_logits(h, head, "vnni")


def test_the_kernel_follows_the_cpus_int8_dot_products():
    from edgespec.shared.device import cpu_flags

    fast_int8 = bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})
    assert int8_head_kernel() == ("int_mm" if fast_int8 else "int8pack")


def test_target_parts_with_an_int8_head_and_context_ids(target):
    listed = torch.arange(0, 320, 2)
    parts = TargetParts(target.model, vocab_ids=listed, head_dtype=torch.int8)
    exact = TargetParts(target.model, vocab_ids=listed)
    assert parts.head_weight.dtype == torch.bfloat16  # the float rows an LM-head router reads
    assert parts.set_context_ids([1, 3]) and exact.set_context_ids([1, 3])
    h = torch.randn(6, exact.shape.hidden_size)
    got, want = parts.logits(h), exact.logits(h)
    assert got.dtype == torch.float32 and got.shape == want.shape == (6, len(listed) + 2)
    torch.testing.assert_close(got, want, atol=0.03 * float(want.abs().max()), rtol=0.02)
    assert parts.set_context_ids([3]) and parts.logits(h).shape == (6, len(listed) + 1)


def test_a_learned_drafter_on_a_cpu_takes_the_int8_head_unless_a_dtype_is_asked():
    from edgespec.client.drafters.factory import DrafterOptions, _learned_head_dtype

    assert _learned_head_dtype(DrafterOptions()) == torch.int8
    assert _learned_head_dtype(DrafterOptions(dtype="float32")) is None
    assert _learned_head_dtype(DrafterOptions(device="cuda")) is None
