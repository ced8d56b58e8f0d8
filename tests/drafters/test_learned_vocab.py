"""A learned drafter's draft vocabulary is chosen when it is opened, not when it was trained: a list of the
most frequent ids plus the committed text's ids (context ids), through the real server, lossless."""
from __future__ import annotations

import pytest
import torch
from support.clients import edge_client
from support.drafters import learned_options
from support.servers import running_server

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.learned.loading import CHECKPOINT_VOCAB, learned_drafter, open_runtime
from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.server.training.features import target_features
from edgespec.shared.drafters.target_parts import TargetParts

PROMPT = "Write a function that adds two numbers."


def test_context_ids_score_like_the_full_head_and_map_back(target):
    listed = torch.arange(0, 320, 3)  # every third id of the tiny vocabulary
    parts = TargetParts(target.model, vocab_ids=listed)
    full = TargetParts(target.model)
    h = torch.randn(5, full.shape.hidden_size)
    assert parts.set_context_ids([4, 3, 5, 4, 319])  # 3 is listed; 4, 5 and 319 are not
    assert parts.context_ids.tolist() == [4, 5, 319] and parts.draft_vocab_size == len(listed) + 3
    logits = parts.logits(h)
    torch.testing.assert_close(logits[:, len(listed):], full.logits(h)[:, [4, 5, 319]])
    assert parts.to_target_ids(torch.tensor([0, len(listed), len(listed) + 2])).tolist() == [0, 4, 319]
    assert parts.draft_to_target()[len(listed):] == [4, 5, 319]
    assert not parts.set_context_ids([5, 4, 319])  # the same set: nothing to redo
    assert parts.set_context_ids([3]) and parts.context_ids is None and parts.draft_vocab_size == len(listed)
    assert not TargetParts(target.model).set_context_ids([4])  # the full vocabulary drafts every id already


@pytest.fixture(scope="module")
def eagle(train_drafter):
    return train_drafter("eagle", steps=120)


def test_a_prompt_id_outside_the_list_is_drafted(target, eagle):
    ids = target.tokenizer.encode(PROMPT)
    listed = torch.tensor(sorted(set(range(320)) - set(ids))[:3])  # 3 ids, none of the prompt's
    wide = TreeShape(branch=6, depth=2, max_nodes=24, min_prob=0.0)  # a level holds more nodes than the list has ids
    runtime = open_runtime(eagle, target.model, vocab=listed)
    drafter = learned_drafter(runtime, wide, context_vocab=True)
    assert drafter._to_target is not None and len(drafter._to_target) == len(listed)
    features = {runtime.feature: target_features(target.model, ids, ())["hidden"]}
    drafter.start(ids, ids[0], features)  # the prompt, then a first token that is one of its own ids
    assert sorted(drafter._to_target[len(listed):]) == sorted(set(ids))
    assert runtime.root_logprobs().shape[-1] == len(listed) + len(set(ids))
    tree = drafter.propose(DraftRequest(committed=[*ids, ids[0]], max_nodes=64, max_depth=4))
    assert set(tree.tokens) & set(ids), "some drafted node is an id of the prompt the list lacks"
    without = learned_drafter(open_runtime(eagle, target.model, vocab=listed), wide, context_vocab=False)
    without.start(ids, ids[0], features)
    assert len(without._to_target) == len(listed)
    assert not set(without.propose(DraftRequest(committed=[*ids, ids[0]], max_nodes=64, max_depth=4)).tokens) & set(ids)


def test_checkpoint_vocab_is_the_trained_list(target, eagle):
    runtime = open_runtime(eagle, target.model, vocab=CHECKPOINT_VOCAB)
    assert runtime.parts.vocab_ids is None  # the tiny drafters train over every id
    with pytest.raises(ValueError, match="vocab must be"):
        open_runtime(eagle, target.model, vocab="all")


@pytest.fixture(scope="module")
def moa(train_drafter):
    return train_drafter("moa", steps=60, tli=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind,draft_vocab,context_vocab", [("eagle", 64, True), ("eagle", 64, False),
                                                             ("moa", 64, True)])
def test_a_reduced_list_with_context_ids_stays_lossless(target_greedy, target, target_dir, request, kind, draft_vocab,
                                                        context_vocab):
    """MoA keeps predictions of committed positions between steps: a new id of the committed text joining the
    draft vocabulary (which renumbers the context ids) must not meet rows scored over the old one."""
    from edgespec.client.loop.generation import GenerationConfig

    checkpoint = request.getfixturevalue(kind)
    parts = {checkpoint.name: str(checkpoint)} if kind == "moa" else {}
    with running_server(target_dir, http_port=None, moa_server_parts=parts) as server:
        options = learned_options(kind, checkpoint, target_dir, draft_vocab=draft_vocab, context_vocab=context_vocab)
        client = edge_client(server.address, options, target_dir, min_deadline_s=0.5)
        try:
            parts = client.drafter.rt.parts
            assert parts.vocab_ids is not None and len(parts.vocab_ids) == draft_vocab
            ids = client.encode(PROMPT)
            result = client.generate(ids, GenerationConfig(max_new_tokens=32, ignore_eos=True))
            assert result.token_ids == target_greedy(target.model, ids, 32)
            assert (parts.context_ids is not None) == context_vocab
        finally:
            client.close()


def test_a_bf16_head_beside_float32_layers(target):
    listed = torch.arange(0, 320, 2)
    parts = TargetParts(target.model, vocab_ids=listed, head_dtype=torch.bfloat16)
    exact = TargetParts(target.model, vocab_ids=listed)
    assert parts.dtype == torch.float32 and parts.head_weight.dtype == torch.bfloat16
    parts.set_context_ids([1, 3])
    exact.set_context_ids([1, 3])
    h = torch.randn(4, exact.shape.hidden_size)
    got, want = parts.logits(h), exact.logits(h)
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, atol=0.05 * float(want.abs().max()), rtol=0.02)
