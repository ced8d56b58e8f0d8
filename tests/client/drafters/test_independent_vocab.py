"""The independent drafter over a reduced vocabulary: trees, offline generation, the id list, losslessness."""
from __future__ import annotations

import pytest
import torch
from support.clients import generate_exactly

from edgespec.client.drafters.base import DraftRequest
from edgespec.client.drafters.independent import IndependentConfig, IndependentDrafter
from edgespec.client.drafters.independent_vocab import (SHIPPED_DIR, count_vocab, draft_vocab_ids, load_vocab,
                                                        save_vocab, special_ids, vocab_file_name)
from edgespec.client.drafters.tree_builder import TreeShape
from edgespec.client.loop.generation import TokenOrigin
from edgespec.netem.bench.independent import accepted_length
from edgespec.shared.tree import DraftTree

SHAPE = TreeShape(branch=3, depth=4, max_nodes=30, min_prob=0.0)


@pytest.fixture(scope="module")
def small_lm(tiny_drafter_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_drafter_dir), dtype=torch.float32).eval()


def _subset(vocab: int = 320, keep: int = 120, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(vocab, generator=g)[:keep].sort().values


@torch.inference_mode()
def _reduced_logprobs(model, ids, vocab_ids):
    """Log-probabilities renormalised over vocab_ids, indexed by target id (-inf elsewhere)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    out = torch.full_like(logits, -float("inf"))
    out[vocab_ids] = torch.log_softmax(logits[vocab_ids], -1)
    return out


def test_reduced_vocab_trees_use_only_listed_ids_with_renormalised_scores(small_lm):
    ids = _subset()
    drafter = IndependentDrafter(small_lm, IndependentConfig(SHAPE, draft_vocab=len(ids), context_vocab=False),
                                 vocab_ids=ids)
    ctx = list(range(40, 70))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    tree.validate()
    assert len(tree) == 30
    allowed = set(ids.tolist())
    assert set(tree.tokens) <= allowed
    for i in range(len(tree)):
        path = [tree.tokens[j] for j in tree.ancestors(i)]
        lp = _reduced_logprobs(small_lm, ctx + path[:-1], ids)
        assert path[-1] in lp.topk(3).indices.tolist()  # a top-B child among the listed ids
    assert drafter._fed == ctx and drafter._cache.get_seq_length() > len(ctx)  # tree KV kept for the next sync


def test_full_vocab_tree_equals_the_plain_head(small_lm):
    """The decoder + own head path gives the same trees as the model's own logits (no reduced list)."""
    drafter = IndependentDrafter(small_lm, IndependentConfig(SHAPE, draft_vocab=0))
    ctx = list(range(90, 120))
    tree = drafter.propose(DraftRequest(ctx, 255, 10))
    assert tree.tokens[0] == int(_reduced_logprobs(small_lm, ctx, torch.arange(320)).argmax())
    assert max(tree.tokens) < 320 and len(tree) == 30


def test_offline_generation_keeps_the_full_head(small_lm):
    ctx = list(range(40, 60))
    with torch.inference_mode():
        best = int(small_lm(input_ids=torch.tensor([ctx])).logits[0, -1].argmax())
    ids = torch.tensor(sorted(set(range(320)) - {best}))
    drafter = IndependentDrafter(small_lm, IndependentConfig(SHAPE, context_vocab=False), vocab_ids=ids)
    assert drafter.generate_offline(ctx) == best  # an id the reduced list lacks: offline text is the LM's own
    assert best not in drafter.propose(DraftRequest(ctx, 255, 1)).tokens


def _text_holding_its_next_token(model) -> tuple[list[int], int]:
    """A text whose greedy next token (by `model`) is one of its own: the case context_vocab is for."""
    g = torch.Generator().manual_seed(5)
    for _ in range(200):
        text = torch.randint(0, 320, (40,), generator=g).tolist()
        with torch.inference_mode():
            best = int(model(input_ids=torch.tensor([text])).logits[0, -1].argmax())
        if best in text:
            return text, best
    pytest.fail("no text among 200 holds its own next token")


def test_context_vocab_drafts_the_texts_unlisted_ids(small_lm):
    """context_vocab: an id the list lacks is draftable while the committed text holds it, and only then."""
    text, best = _text_holding_its_next_token(small_lm)
    ids = torch.tensor(sorted(set(range(320)) - {best, 7}))
    plain = IndependentDrafter(small_lm, IndependentConfig(SHAPE, context_vocab=False), vocab_ids=ids)
    drafter = IndependentDrafter(small_lm, IndependentConfig(SHAPE, context_vocab=True), vocab_ids=ids)
    assert best not in plain.propose(DraftRequest(text, 255, 30)).tokens
    tree = drafter.propose(DraftRequest(text, 255, 30))
    tree.validate()
    assert tree.tokens[0] == best  # the LM's own first choice, in the text, so draftable again
    assert drafter._context_ids == sorted({best, 7} & set(text))
    assert set(tree.tokens) <= set(ids.tolist()) | {best, 7}
    # another text without them: they leave the draft vocabulary (the tree is over the list alone again)
    other = [t for t in range(40, 70) if t not in (best, 7)]
    tree = drafter.propose(DraftRequest(other, 255, 30))
    assert best not in tree.tokens and drafter._context_ids == []
    assert tree.tokens == plain.propose(DraftRequest(other, 255, 30)).tokens


def test_bad_vocab_ids_are_refused(small_lm):
    with pytest.raises(ValueError, match="vocab_ids"):
        IndependentDrafter(small_lm, vocab_ids=torch.tensor([3, 999]))


def test_counted_vocab_keeps_frequent_and_special_ids(tiny_tokenizer):
    texts = ["aaaa bbb cc d"] * 3
    ids = count_vocab(tiny_tokenizer, texts, 6, 320)
    a, b = tiny_tokenizer("a", add_special_tokens=False)["input_ids"][0], \
        tiny_tokenizer("b", add_special_tokens=False)["input_ids"][0]
    assert ids.tolist() == sorted(ids.tolist()) and len(ids) == 6
    assert {a, b} <= set(ids.tolist())
    assert set(special_ids(tiny_tokenizer)) <= set(ids.tolist())  # end-of-turn tokens stay draftable


@pytest.mark.slow
def test_vocab_cache_round_trip_and_wrong_tokenizer(tmp_path, monkeypatch, tiny_tokenizer):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert draft_vocab_ids(tiny_tokenizer, "f" * 64, 0, 320) is None
    assert draft_vocab_ids(tiny_tokenizer, "f" * 64, 320, 320) is None  # not smaller: no reduction
    saved = save_vocab(tmp_path / "v.safetensors", torch.tensor([1, 5, 9]), "a" * 64, "test")
    assert load_vocab(saved, "a" * 64).tolist() == [1, 5, 9]
    with pytest.raises(ValueError, match="another tokenizer"):
        load_vocab(saved, "b" * 64)
    # no shipped or cached list for this fingerprint: counted from the stdlib once, then read from the cache
    fp = "c" * 64
    first = draft_vocab_ids(tiny_tokenizer, fp, 100, 320)
    cached = tmp_path / ".cache" / "edgespec" / "draft-vocab" / vocab_file_name(fp, 100)
    assert cached.is_file() and len(first) == 100
    assert torch.equal(draft_vocab_ids(tiny_tokenizer, fp, 100, 320), first)


def test_shipped_vocab_is_a_sorted_id_list():
    files = sorted(SHIPPED_DIR.glob("*.safetensors"))
    assert files, f"no reduced vocabulary shipped in {SHIPPED_DIR}"
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            ids = handle.get_tensor("vocab_ids").long()
            meta = handle.metadata()
        assert f.name == vocab_file_name(meta["fingerprint"], len(ids))
        assert torch.all(ids[1:] > ids[:-1]) and int(ids[0]) >= 0
        assert "humaneval" not in meta["corpus"].lower() and "mt_bench" not in meta["corpus"].lower()


def test_accepted_length_walks_the_matching_path():
    tree = DraftTree((5, 6, 7, 8), (255, 255, 0, 2))  # 5 -> 7 -> 8 and 6
    assert accepted_length(tree, [5, 7, 8, 1]) == 3
    assert accepted_length(tree, [6, 7]) == 1
    assert accepted_length(tree, [9]) == 0


@pytest.mark.parametrize("context_vocab", [False, True], ids=["list", "list+context"])
def test_reduced_vocab_stays_lossless_end_to_end(tiny_server, tiny_model_dir, tiny_target_f32, greedy,
                                                 context_vocab):
    """The target's own weights draft over half the vocabulary (and the text's own ids): output token-exact,
    drafts still accepted."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    ids = _subset(keep=160, seed=2)
    drafter = IndependentDrafter(model, IndependentConfig(TreeShape(branch=2, depth=5, max_nodes=12, min_prob=0.0),
                                                          context_vocab=context_vocab), vocab_ids=ids)
    result = generate_exactly(drafter, tiny_server.address, tiny_model_dir, tiny_target_f32, greedy,
                              "def fib(n):\n    if n < 2:\n        return n\n")
    accepted = [t for t, o in zip(result.token_ids, result.origins) if o is TokenOrigin.ACCEPTED]
    assert accepted
    if not context_vocab:
        assert set(accepted) <= set(ids.tolist())


def test_the_factory_passes_the_draft_vocabulary(tmp_path, monkeypatch, tiny_model_dir):
    """`--draft-vocab N` reaches the drafter: the list of N ids found for the tokenizer; 0 drafts over all ids."""
    from transformers import AutoTokenizer

    from edgespec.client.drafters.factory import DrafterOptions, make_drafter
    from edgespec.shared.fingerprint import tokenizer_fingerprint

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    fingerprint = tokenizer_fingerprint(tokenizer)
    monkeypatch.setenv("HOME", str(tmp_path))  # a cached list of 100 ids for this tokenizer, written by hand
    cached = tmp_path / ".cache" / "edgespec" / "draft-vocab" / vocab_file_name(fingerprint, 100)
    ids = _subset(keep=100, seed=3)
    save_vocab(cached, ids, "x" * 64, "test")
    with pytest.raises(ValueError, match="another tokenizer"):  # the file's own fingerprint is checked
        make_drafter(DrafterOptions("independent", model=str(tiny_model_dir), dtype="float32", draft_vocab=100))
    save_vocab(cached, ids, fingerprint, "test")
    reduced = make_drafter(DrafterOptions("independent", model=str(tiny_model_dir), dtype="float32", draft_vocab=100))
    assert torch.equal(reduced.vocab_ids, ids)
    assert reduced.config.context_vocab  # the default: the committed text's ids as well
    assert not make_drafter(DrafterOptions("independent", model=str(tiny_model_dir), dtype="float32", draft_vocab=100,
                                           context_vocab=False)).config.context_vocab
    full = make_drafter(DrafterOptions("independent", model=str(tiny_model_dir), dtype="float32", draft_vocab=0))
    assert full.vocab_ids is None
    # a benchmark's shared model: the list is the one for the client's tokenizer
    shared = make_drafter(DrafterOptions("independent", draft_vocab=100), small_model=full.model, tokenizer=tokenizer)
    assert torch.equal(shared.vocab_ids, ids)
