"""Beam search's candidates in one kernel call (beam_pick) against the tensor calls they replace."""
import math
import random

import pytest
import torch
from conftest import random_model, random_sources

from nmt_serve.inference import beam_pick
from nmt_serve.inference.continuous import ContinuousSearch, Sentence
from nmt_serve.inference.lexical_constraints import LexicalConstraints
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import AT_MAX_EOS, SearchOptions, beam_search, generate

pytestmark = pytest.mark.skipif(not beam_pick.available(torch.device("cpu")), reason="needs numba's kernels")

EOS = 3
CANDIDATES = beam_pick.candidates  # the kernel's call, which tests wrap


def by_tensors(lp, scores, banned, ban_eos, at_max, k):
    """What search.Constraints.apply, the scores' sum and a top-k make of them: each sentence's k best sums, the
    earlier flat index first among ties (sorted by value, then index)."""
    G, W = scores.shape
    lp = by_masks(lp.clone(), banned, ban_eos, at_max, W)
    sums = lp.view(G, W, -1).add(scores[:, :, None]).view(G, -1)
    order = [sorted(range(sums.size(1)), key=lambda i: (-row[i], i))[:k] for row in sums.tolist()]
    indices = torch.tensor(order)
    return sums.gather(1, indices), indices


def by_masks(lp, banned, ban_eos, at_max, W):
    """lp as search.Constraints.apply masks it, in place."""
    if banned is not None:
        lp.index_fill_(1, banned, -math.inf)
    if ban_eos:
        lp[:, EOS] = -math.inf
    if at_max is not None and at_max.any():
        rows = at_max.repeat_interleave(W)
        lp[rows] = -math.inf
        lp[rows, EOS] = AT_MAX_EOS
    return lp


def log_probs(G: int, W: int, V: int, seed: int) -> torch.Tensor:
    """(G * W, V) log-probs with the awkward rows: ties for the best at a block's start, every value -inf, the best in
    the tail past the last block of 32 and at index 0, values a hair apart (equal once a large score is added)."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(G * W, V, generator=g), -1)
    awkward = [lambda r: (r.__setitem__(32 % V, r.max() + 1), r.__setitem__(70 % V, r.max())),
               lambda r: r.fill_(-math.inf),
               lambda r: r.__setitem__(V - 1, r.max() + 1),
               lambda r: r.__setitem__(0, r.max() + 1),
               lambda r: (r.__setitem__(1, -0.5), r.__setitem__(V - 2, -0.5 + 2e-8), r.__setitem__(V // 2, -0.5 - 2e-8)),
               lambda r: (r.__setitem__(min(31, V - 1), r.max() + 1), r.__setitem__(min(63, V - 1), r.max()))]
    for i in range(G * W):
        if i % (len(awkward) + 1) < len(awkward):  # every kind, and plain rows between
            awkward[i % (len(awkward) + 1)](lp[i])
    return lp


@pytest.mark.parametrize("V", [7, 100, 7999])
@pytest.mark.parametrize("G,W", [(1, 1), (1, 4), (2, 4), (3, 2)])
@pytest.mark.parametrize("ban_eos", [False, True])
@pytest.mark.parametrize("forced", [False, True])
def test_the_kernel_finds_the_candidates_the_tensor_calls_do(V, G, W, ban_eos, forced):
    lp = log_probs(G, W, V, seed=V + G + W)
    scores = torch.linspace(-3, 0, G * W).view(G, W)
    scores[0, -1] = -math.inf  # a beam not live yet
    if G > 1:
        scores[1] -= 1000.0  # sums of values a hair apart become equal
    banned = torch.tensor([0, 2]) if V > 3 else None
    at_max = torch.tensor([i % 2 == 1 for i in range(G)]) if forced else None
    k = min(2 * W, W * V)
    values, indices = by_tensors(lp, scores, banned, ban_eos, at_max, k)
    got = CANDIDATES(lp, scores, banned, EOS, ban_eos, at_max, AT_MAX_EOS, k)
    assert got is not None
    assert torch.equal(got[0], values) and torch.equal(got[1], indices)


def test_a_nan_leaves_the_step_to_the_tensor_calls():
    lp = log_probs(2, 4, 100, seed=1)
    lp[5, 40] = math.nan
    before = lp.clone()
    banned, at_max = torch.tensor([0, 2]), torch.tensor([True, False])
    assert CANDIDATES(lp, torch.zeros(2, 4), banned, EOS, True, at_max, AT_MAX_EOS, 8) is None
    # what the kernel changed before it met the NaN, the tensor calls make again
    masked = lambda lp: by_masks(lp.clone(), banned, True, at_max, 4)  # noqa: E731
    torch.testing.assert_close(masked(lp), masked(before), equal_nan=True, rtol=0, atol=0)


def searches(model, src, options):
    kept = lambda results: [[(h.tokens, h.score, h.normalized_score) for h in hyps] for hyps in results]  # noqa: E731
    return kept(generate(ModelRunner(model), src, options))


@pytest.mark.parametrize("seed, eos_bias", [(1, 1.8), (2, 2.6), (3, 4.0)])
@pytest.mark.parametrize("options", [dict(), dict(min_length=3), dict(max_length=5), dict(length_penalty=0.6),
                                     dict(beam_size=2, num_hypotheses=2)])
@pytest.mark.parametrize("sentences", [1, 3])
def test_beam_search_is_the_same_with_the_kernel(seed, eos_bias, options, sentences, monkeypatch):
    """Whole searches of sentences that end at different steps (eos made likely: some end by the model, some at their
    max length) give the same hypotheses and scores, bit for bit, with the kernel and without it."""
    model = random_model(seed=seed, final_logits_bias=True)
    model.logits_bias[EOS] = eos_bias
    src = random_sources(sentences, 9, 64, seed=seed + 10)
    opts = SearchOptions(**{"beam_size": 4, "num_hypotheses": 4, **options})
    calls = []
    monkeypatch.setattr(beam_pick, "candidates", lambda *a: calls.append(1) or CANDIDATES(*a))
    with_kernel = searches(model, src, opts)
    assert calls
    monkeypatch.setattr(beam_pick, "ENABLED", False)
    count = len(calls)
    assert searches(model, src, opts) == with_kernel and len(calls) == count
    if not options and sentences == 3 and eos_bias < 3:  # some ended by the model, some at their max length
        lengths = {len(h[0]) for hyps in with_kernel for h in hyps}
        assert min(lengths) < 8 and len(lengths) > 2


def test_n_grams_lexical_constraints_and_many_sentences_keep_the_tensor_calls_a_prefix_until_it_ends(monkeypatch):
    model = random_model(seed=2)
    src = random_sources(2, 8, 64, seed=3)
    monkeypatch.setattr(beam_pick, "candidates", lambda *a: pytest.fail("the kernel ran"))
    generate(ModelRunner(model), src, SearchOptions(beam_size=4, no_repeat_ngram_size=2, max_length=6))
    beam_search(ModelRunner(model), src, SearchOptions(beam_size=4, max_length=6),
                lexical=[LexicalConstraints(include=((40,),)), None])  # the constrained search (not the free one first)
    generate(ModelRunner(model), random_sources(beam_pick.MAX_SENTENCES, 8, 64, seed=4), SearchOptions(beam_size=4, max_length=6))
    steps = []
    monkeypatch.setattr(beam_pick, "candidates", lambda *a: steps.append(1) or CANDIDATES(*a))
    opts = SearchOptions(beam_size=4, target_prefix=(5, 6), max_length=6, num_hypotheses=4)
    with_kernel = generate(ModelRunner(model), src, opts)
    assert len(steps) == 6 - 2  # steps 0 and 1 forced, the kernel from the third token on
    monkeypatch.setattr(beam_pick, "ENABLED", False)
    without = generate(ModelRunner(model), src, opts)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in with_kernel] == [[(h.tokens, h.score) for h in hyps] for hyps in without]
    assert all(h.tokens[:2] == [5, 6] for hyps in with_kernel for h in hyps)


@pytest.mark.parametrize("beam", [2, 4])
def test_the_continuous_search_finds_its_candidates_through_the_kernel_as_through_the_tensor_calls(beam, monkeypatch):
    """The engine's eager search: sentences joining at different steps into groups that others left, a few groups at
    a time through the kernel and more through the tensor calls, some ending at their max length, one forced while its
    prefix lasts: the same hypotheses, scores and kept attention with the kernel and without it."""
    model = random_model(seed=1, final_logits_bias=True)
    model.logits_bias[EOS] = 1.8
    runner = ModelRunner(model)
    rng = random.Random(beam)
    srcs = [row[row != 0].tolist() for row in random_sources(9, 12, 64, seed=beam)]
    sentences = [Sentence(i, s, rng.choice([3, 6, 12]), length_penalty=rng.choice([0.6, 1.0]), num_hypotheses=beam,
                          attention_span=(0, len(s) - 1) if i % 3 else None, prefix=(9, 11) if i == 4 else ())
                 for i, s in enumerate(srcs)]
    groups = []
    monkeypatch.setattr(beam_pick, "candidates", lambda *a: groups.append(a[1].size(0)) or CANDIDATES(*a))

    def run() -> dict:
        search, results = ContinuousSearch(runner, beam_size=beam), {}
        for batch, steps in zip([sentences[:2], sentences[2:5], sentences[5:]], [0, 3, 4]):
            for _ in range(steps):
                results.update(dict(search.step()))
            search.add(batch)
        while len(search):
            results.update(dict(search.step()))
        return {key: [(h.tokens, h.score, h.normalized_score, h.entropies, h.looks) for h in hyps]
                for key, hyps in results.items()}

    with_kernel = run()
    assert groups and max(groups) > 1 and max(groups) < beam_pick.MAX_SENTENCES
    calls = len(groups)
    monkeypatch.setattr(beam_pick, "ENABLED", False)
    assert run() == with_kernel and len(groups) == calls
    assert all(h[0][:2] == [9, 11] for h in with_kernel[4])
