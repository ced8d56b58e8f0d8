"""The int8 LM head: the same logits as float32 within int8's error, outlier channels kept exact, the draft
vocabulary's rows and context ids alike, and the default on a CPU."""
from __future__ import annotations

import torch

from edgespec.shared.drafters.target_parts import TargetParts, int8_logits, kept_channels, quantize_head, select_rows


def test_int8_logits_follow_float32_and_the_kept_channels_carry_the_outliers():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(700, 64, generator=g) * 0.05
    h = torch.randn(9, 64, generator=g)
    h[:, [3, 40]] *= 30  # two outlier channels, as a final norm's output has
    norm = torch.ones(64)
    norm[[3, 40]] = 20.0
    channels = kept_channels(norm, k=2)
    assert channels.tolist() == [3, 40]
    want = h @ w.T
    got = int8_logits(h, quantize_head(w, channels))
    err = (got - want).abs().max() / want.abs().max()
    assert err < 0.01 and (got.argmax(-1) == want.argmax(-1)).all()
    # Without keeping them, those two channels set every row's scale: the rest lose most of their bits.
    blunt = int8_logits(h, quantize_head(w, torch.tensor([], dtype=torch.long)))
    assert (blunt - want).abs().max() / want.abs().max() > 2 * err
    # Rows taken out of a quantized head are the same rows quantized alone; chunks change nothing either.
    ids = torch.tensor([5, 600, 2])
    torch.testing.assert_close(int8_logits(h, select_rows(quantize_head(w, channels), ids)),
                               int8_logits(h, quantize_head(w[ids], channels)))
    torch.testing.assert_close(int8_logits(h, quantize_head(w, channels, chunk=64)), got)


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
