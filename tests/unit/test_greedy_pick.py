"""Greedy search's choice in one kernel call (greedy_pick) against the tensor calls it replaces."""
import math

import pytest
import torch
from conftest import random_model, random_sources

from nmt_serve.inference import greedy_pick
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import AT_MAX_EOS, SearchOptions, greedy_search
from nmt_serve.inference.top_k import row_max

pytestmark = pytest.mark.skipif(not greedy_pick.available(torch.device("cpu")), reason="needs numba's kernels")

EOS = 3
PICK = greedy_pick.pick  # the kernel's call, which tests wrap


def by_tensors(lp, banned, ban_eos, at_max):
    """What search.Constraints.apply and row_max make of log-probs (no n-grams, no forced prefix)."""
    lp = lp.clone()
    if banned is not None:
        lp.index_fill_(1, banned, -math.inf)
    if ban_eos:
        lp[:, EOS] = -math.inf
    if at_max is not None and at_max.any():
        lp[at_max] = -math.inf
        lp[at_max, EOS] = AT_MAX_EOS
    return row_max(lp)


def rows_of(V: int, N: int, seed: int) -> torch.Tensor:
    """(N, V) log-probs with the awkward rows: ties for the best, a NaN, every value -inf, the best in the tail past
    the last block of 16 and in the first element."""
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(N, V, generator=g), -1)
    lp[0, 32] = lp[0, 70] = lp[0].max() + 1  # a tie, the first at a block's start: the first index
    lp[1, 33] = math.nan
    lp[1, 5] = lp[1].max() + 1
    lp[2] = -math.inf
    lp[3, V - 1] = lp[3].max() + 1
    lp[4, 0] = lp[4].max() + 1
    lp[5, 20] = lp[5, 80] = math.nan  # the first NaN
    return lp


@pytest.mark.parametrize("V", [7, 16, 100, 7999])
@pytest.mark.parametrize("ban_eos", [False, True])
@pytest.mark.parametrize("forced", [False, True])
def test_the_kernel_chooses_as_the_tensor_calls_do(V, ban_eos, forced):
    N = 8
    lp = rows_of(max(V, 100), N, seed=V)[:, :V].contiguous()
    banned = torch.tensor([0, 2]) if V > 3 else None
    at_max = torch.tensor([False, True, False, False, True, False, False, True]) if forced else None
    values, expected = by_tensors(lp, banned, ban_eos, at_max)
    scores = torch.linspace(-3, 0, N)
    expected_scores = scores + values
    tokens = torch.full((N,), -1, dtype=torch.long)
    prefix = torch.full((N, 6), -1, dtype=torch.long)
    ended = greedy_pick.pick(lp, banned, EOS, ban_eos, at_max, AT_MAX_EOS, scores, tokens, prefix, 4)
    assert tokens.tolist() == expected.tolist()
    assert prefix[:, 4].tolist() == expected.tolist() and (prefix[:, :4] == -1).all() and (prefix[:, 5] == -1).all()
    torch.testing.assert_close(scores, expected_scores, equal_nan=True, rtol=0, atol=0)
    assert ended == int((expected == EOS).sum())


@pytest.mark.parametrize("seed, eos_bias", [(1, 1.8), (2, 2.6)])
@pytest.mark.parametrize("options", [dict(), dict(min_length=3), dict(max_length=5), dict(length_penalty=0.6)])
def test_greedy_search_is_the_same_with_the_kernel(seed, eos_bias, options, monkeypatch):
    """Whole searches of a batch whose sentences end at different steps (eos made likely: some end by the model,
    some at their max length) give the same tokens and scores, bit for bit, with the kernel and without it."""
    model = random_model(seed=seed, final_logits_bias=True)
    model.logits_bias[EOS] = eos_bias
    src = random_sources(6, 9, 64, seed=seed + 10)
    opts = SearchOptions(beam_size=1, **options)
    picks = []
    monkeypatch.setattr(greedy_pick, "pick", lambda *a: picks.append(1) or PICK(*a))
    with_kernel = greedy_search(ModelRunner(model), src, opts)
    assert picks
    monkeypatch.setattr(greedy_pick, "ENABLED", False)
    calls = len(picks)
    without = greedy_search(ModelRunner(model), src, opts)
    assert len(picks) == calls
    kept = lambda hyps: [(h.tokens, h.score, h.normalized_score) for h in hyps]  # noqa: E731
    assert kept(with_kernel) == kept(without)
    if not options:  # some ended by the model, some at their max length
        assert 0 in {len(h.tokens) for h in with_kernel} and len({len(h.tokens) for h in with_kernel}) > 2


def test_n_grams_keep_the_tensor_calls_and_a_forced_prefix_until_it_ends(monkeypatch):
    model = random_model(seed=2)
    src = random_sources(2, 8, 64, seed=3)
    monkeypatch.setattr(greedy_pick, "pick", lambda *a: pytest.fail("the kernel ran"))
    greedy_search(ModelRunner(model), src, SearchOptions(beam_size=1, no_repeat_ngram_size=2, max_length=6))
    columns = []
    monkeypatch.setattr(greedy_pick, "pick", lambda *a: columns.append(a[-1]) or PICK(*a))
    opts = SearchOptions(beam_size=1, target_prefix=(5, 6), max_length=6)
    with_kernel = greedy_search(ModelRunner(model), src, opts)
    assert columns and min(columns) == 3  # steps 0 and 1 forced, the kernel from the third token on
    monkeypatch.setattr(greedy_pick, "ENABLED", False)
    without = greedy_search(ModelRunner(model), src, opts)
    assert [(h.tokens, h.score) for h in with_kernel] == [(h.tokens, h.score) for h in without]
    assert all(h.tokens[:2] == [5, 6] for h in with_kernel)

