"""Training runs the target's frozen parts under bf16 autocast: the head's rows and the TLI layers' linear
weights are cast once and kept, and every result equals what autocast computes from the float32 weights."""
from __future__ import annotations

import torch

from edgespec.server.training.eagle_recipe import EagleRecipe, EagleRecipeConfig
from edgespec.server.training.losses import soft_cross_entropy
from edgespec.shared.drafters.blocks import causal_mask
from edgespec.shared.drafters.eagle.model import EagleConfig, EagleHead
from edgespec.shared.drafters.target_parts import TargetParts

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def _uncached(parts: TargetParts) -> TargetParts:
    """The same parts with the casts left to autocast on every call (what training did before)."""
    parts.cast_once = False
    return parts


def test_head_rows_are_cast_once_and_give_autocasts_logits(target):
    parts = TargetParts(target.model, tli=0, vocab_ids=torch.arange(0, 200, 3), dtype=torch.float32)
    plain = _uncached(TargetParts(target.model, tli=0, vocab_ids=torch.arange(0, 200, 3), dtype=torch.float32))
    h = torch.randn(7, parts.shape.hidden_size)
    with torch.autocast(**BF16):
        got, again = parts.logits(h), parts.logits(h * 2)
        want = plain.logits(h)
        cached = parts._autocast_head(h)
        assert cached is parts._autocast_head(h) and cached.dtype == torch.bfloat16
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want)
    assert not torch.equal(got, again)
    # Outside autocast the float32 rows are used as before.
    assert parts._autocast_head(h) is None
    assert torch.equal(parts.logits(h), h @ parts.head_weight.T)


def test_tli_layers_cast_once_give_autocasts_outputs_and_input_gradients(target):
    parts = TargetParts(target.model, tli=2, dtype=torch.float32)
    plain = _uncached(TargetParts(target.model, tli=2, dtype=torch.float32))
    n = 9
    pos, mask = torch.arange(n), causal_mask(n, "cpu")
    outs, grads = [], []
    for p in (parts, plain):
        x = torch.randn(n, p.shape.hidden_size, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with torch.autocast(**BF16):
            out, _ = p.run_layers(x, pos, mask)
        out.float().pow(2).sum().backward()
        outs.append(out.detach())
        grads.append(x.grad)
    assert torch.equal(outs[0], outs[1]) and torch.equal(grads[0], grads[1])
    with torch.autocast(**BF16):
        first = parts._autocast_layers(x)
        assert first is parts._autocast_layers(x)
    assert all(m.weight.dtype == torch.bfloat16 for m in first.modules() if isinstance(m, torch.nn.Linear))
    # The parts' own layers stay float32 (validation and the client run them without autocast).
    assert all(m.weight.dtype == torch.float32 for m in parts.layers.modules() if isinstance(m, torch.nn.Linear))


def test_eagle_ce_reuses_the_drafting_logits_and_keeps_loss_and_gradient(target, store):
    """The CE term reads the logits the unrolled step already made: the loss and the head's gradient equal
    those of a second pass through the LM head."""
    parts = TargetParts(target.model, tli=0, dtype=torch.float32)
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(target.model.config.hidden_size, width=32, heads=4, mlp_hidden=64))
    recipe = EagleRecipe(head, parts, EagleRecipeConfig(unroll=2))
    seq = store.load(store.split("train")[0], recipe.feature_names)
    end = min(seq.tokens.shape[0], 40)

    def ce_and_grad(reuse: bool):
        head.zero_grad()
        out = recipe.forward(seq, 0, end, torch.Generator().manual_seed(4))
        if reuse:
            term = recipe._ce_term(out)
        else:
            term = recipe._per_step(out, lambda step, tgt, tl, w: soft_cross_entropy(parts.logits(step.pred), tl, w))
        term.mean().backward()
        return term.mean().detach(), [p.grad.clone() for p in head.parameters() if p.grad is not None]

    loss, grads = ce_and_grad(True)
    loss2, grads2 = ce_and_grad(False)
    assert torch.equal(loss, loss2)
    assert len(grads) == len(grads2) > 0 and all(torch.equal(a, b) for a, b in zip(grads, grads2))
