"""Logits processors on hand-made logits: vLLM's penalties and logit_bias, per tree row from that row's own
history, min_p, and lossless sampling under processors and a grammar (chi-square against the processed
target distribution)."""
from __future__ import annotations


import llguidance
import pytest
import torch
from support.constrained import Controls, grammar_allowed, processed
from support.stats import chi_square, chi_square_critical

from edgespec.shared.logits_processors import RowProcessors, apply_penalties, tree_histories
from edgespec.shared.session_contract import SamplingSettings
from edgespec.shared.tree import ROOT, DraftTree
from edgespec.shared.verification import Draws, sample_verify, target_probs

V = 8


def penalised(presence: float, frequency: float, repetition: float, bias: dict[int, float]) -> SamplingSettings:
    return SamplingSettings(presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
                            logit_bias=tuple(bias.items()))


def test_penalties_have_vllms_meaning():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0, -1.0, 0.0, 4.0]])
    prompt_seen = torch.zeros(V, dtype=torch.bool)
    prompt_seen[1] = True
    counts = torch.zeros(1, V)
    counts[0, 0], counts[0, 4] = 2, 1
    out = apply_penalties(logits, penalised(0.5, 0.25, 2.0, {7: -10.0, 3: 200.0}), prompt_seen, counts)[0]
    assert out[0] == pytest.approx(2.0 / 2 - 0.25 * 2 - 0.5)  # output twice: repetition, frequency x2, presence
    assert out[1] == pytest.approx(-2.0 * 2)  # prompt only: repetition multiplies a negative logit
    assert out[4] == pytest.approx(3.0 / 2 - 0.25 - 0.5)
    assert out[3] == pytest.approx(0.5 + 100.0)  # bias clamped to 100
    assert out[7] == pytest.approx(4.0 - 10.0)
    assert out[2] == out[2] and out[2] == 1.0 and out[6] == 0.0  # never seen: untouched


def test_each_tree_row_is_processed_from_its_own_history():
    """Row 1 + i of a tree equals the one-row processing after committed + node i's path."""
    gen = torch.Generator().manual_seed(0)
    tree = DraftTree((3, 3, 5, 3, 1), (ROOT, 0, 0, 1, ROOT))  # token 3 recurs along a path
    logits = torch.randn(1 + len(tree), V, generator=gen)
    prompt, output = [1, 2], [5, 5, 0]
    rows = RowProcessors(penalised(0.3, 0.6, 1.5, {2: 1.0}), prompt, V)
    got = rows.tree_logits(logits, prompt + output, tree)
    controls = Controls(0.3, 0.6, 1.5, {2: 1.0})
    for r in range(1 + len(tree)):
        path = [] if r == 0 else [tree.tokens[a] for a in tree.ancestors(r - 1)]
        want = processed(logits[r], prompt, output + path, controls)
        assert torch.allclose(got[r].double(), want, atol=1e-5), r
    counts = tree_histories(torch.zeros(V), tree)
    assert counts[4, 3] == 3  # node 3's path: 3, 3, 3


def test_penalties_refuse_vllms_out_of_range_values():
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingSettings(presence_penalty=2.5)
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingSettings(frequency_penalty=-3)
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingSettings(repetition_penalty=0)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingSettings(logit_bias=((9, 1.0),)).check_vocab(V)
    assert not SamplingSettings().penalized and SamplingSettings(logit_bias=((1, 0.5),)).penalized


def test_min_p_drops_tokens_below_its_share_of_the_top_probability():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.12, 0.08]]))
    probs = target_probs(logits, SamplingSettings(temperature=1.0, min_p=0.2))[0]  # floor 0.1
    assert probs[3] == 0 and probs[2] > 0
    assert torch.allclose(probs[:3], torch.tensor([0.5, 0.3, 0.12], dtype=torch.float64) / 0.92)
    with pytest.raises(ValueError, match="min_p"):
        SamplingSettings(min_p=1.5)


@pytest.fixture(scope="module")
def digits_grammar(tiny_tokenizer):
    """A grammar over the tiny byte tokenizer: a digit in 1-4, then one in 5-8, then EOS."""
    from edgespec.shared.grammar import check_grammar, grammar_tokenizer

    grammar = check_grammar(llguidance.LLMatcher.grammar_from_regex("[1-4][5-8]"))
    return grammar_tokenizer(tiny_tokenizer, 320, [258]), grammar


def test_sampling_under_processors_and_a_grammar_is_distributed_as_the_processed_target(tiny_tokenizer,
                                                                                          digits_grammar):
    """The committed token at the root and after an accepted node follow the target's processed (penalised,
    masked, tempered) distribution there, whatever the drafts, the grammar refusing some of them."""
    from edgespec.shared.grammar import GrammarConstraint

    llg_tok, grammar = digits_grammar
    ids = {d: tiny_tokenizer.convert_tokens_to_ids(d) for d in "12345678"}
    gen = torch.Generator().manual_seed(0)
    prompt, output = [ids["2"], 40], []
    tree = DraftTree((ids["3"], ids["7"], ids["1"], ids["5"], ids["6"]), (ROOT, ROOT, ROOT, 0, 0))  # "7" refused
    logits = torch.randn(1 + len(tree), 320, generator=gen) * 1.5
    for d in "12345678":  # the grammar's tokens likely enough for every child to be tried
        logits[:, ids[d]] += 3.0
    controls = Controls(presence=0.5, frequency=0.5, repetition=1.4, logit_bias={ids["4"]: 1.0})
    rows = RowProcessors(penalised(0.5, 0.5, 1.4, {ids["4"]: 1.0}), prompt, 320,
                         GrammarConstraint(llg_tok, grammar))
    config = SamplingSettings(temperature=0.9)
    probs = target_probs(rows.tree_logits(logits, prompt + output, tree), config)
    # the reference: a fresh matcher, and the processing written out (support.constrained)
    matcher = llguidance.LLMatcher(llg_tok, grammar, log_level=0)
    root = target_probs(processed(logits[0], prompt, output, controls, grammar_allowed(matcher, 320))[None], config)[0]
    assert matcher.consume_token(ids["3"])
    after_3 = target_probs(processed(logits[1], prompt, output + [ids["3"]], controls,
                                     grammar_allowed(matcher, 320))[None], config)[0]
    assert root[ids["7"]] == 0 and set(root.nonzero().flatten().tolist()) == {ids[d] for d in "1234"}
    trials = 8000
    first, second = torch.zeros(320), torch.zeros(320)
    for trial in range(trials):  # a seed a trial: a draw is keyed by (seed, position)
        out = sample_verify(tree, probs, Draws(trial), 0)
        committed = [tree.tokens[i] for i in out.accepted] + [out.next_token]
        first[committed[0]] += 1
        if out.accepted[:1] == (0,):
            second[committed[1]] += 1
    stat, dof = chi_square(first, root)
    assert stat < chi_square_critical(dof), (first[first > 0], root[root > 0])
    stat, dof = chi_square(second, after_3)
    assert stat < chi_square_critical(dof), (second[second > 0], after_3[after_3 > 0])


def test_min_tokens_masks_eos_and_stop_ids_in_the_rows_still_short():
    """Each row of a tree is masked from its own output length (the committed output and its path)."""
    sampling = SamplingSettings(min_tokens=4, stop_token_ids=(7,))
    rows = RowProcessors(sampling, prompt=[1, 2], vocab_size=10, eos_ids=[9])
    tree = DraftTree((3, 4, 5), (ROOT, 0, 1))  # a chain: node i's row has 1 + i path tokens
    out = rows.tree_logits(torch.zeros(4, 10), [1, 2, 0, 0], tree)  # 2 output tokens committed
    masked = torch.isinf(out[:, [7, 9]]).all(dim=1).tolist()
    assert masked == [True, True, False, False]  # outputs of 2 and 3 tokens are short; 4 and 5 are not
    assert not torch.isinf(out[:, :7]).any()
    free = RowProcessors(SamplingSettings(stop_token_ids=(7,)), prompt=[1, 2], vocab_size=10, eos_ids=[9])
    assert not torch.isinf(free.tree_logits(torch.zeros(4, 10), [1, 2, 0, 0], tree)).any()
