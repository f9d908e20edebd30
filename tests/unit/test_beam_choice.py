"""The beam choice that the eager and the continuous searches share (search.choose_beams, best_candidates)."""
from __future__ import annotations

import math

import pytest
import torch

from nmt_serve.inference.search import best_candidates, choose_beams

EOS, V, K = 3, 10, 2


def flat(beam: int, token: int) -> int:
    return beam * V + token


def test_eos_among_the_best_k_ends_a_hypothesis_and_the_best_k_others_continue():
    scores = [-0.1, -0.2, -0.3, -0.4]
    indices = [flat(1, EOS), flat(0, 5), flat(1, 6), flat(0, 7)]
    ended, continuing = choose_beams(scores, indices, K, V, EOS)
    assert ended == [(1, -0.1)]
    assert continuing == [(0, 5, -0.2), (1, 6, -0.3)]  # K of them, best first, the eos skipped


def test_eos_past_the_best_k_or_impossible_ends_nothing():
    ended, continuing = choose_beams([-0.1, -0.2, -0.3, -0.4], [flat(0, 5), flat(1, 6), flat(0, EOS), flat(1, 7)], K, V, EOS)
    assert ended == [] and continuing == [(0, 5, -0.1), (1, 6, -0.2)]
    ended, _ = choose_beams([-math.inf, -0.2, -0.3, -0.4], [flat(0, EOS), flat(0, 5), flat(1, 6), flat(1, 7)], K, V, EOS)
    assert ended == []  # a forbidden eos (-inf) is not a hypothesis


def test_both_best_candidates_eos_leaves_the_next_two_to_continue():
    ended, continuing = choose_beams([-0.1, -0.2, -0.3, -0.4], [flat(0, EOS), flat(1, EOS), flat(0, 4), flat(1, 8)], K, V, EOS)
    assert ended == [(0, -0.1), (1, -0.2)] and continuing == [(0, 4, -0.3), (1, 8, -0.4)]


@pytest.mark.parametrize("n", [4 * 64 * 8, 32_000, 32_000 + 37])  # whole chunks, and a short last one
def test_best_candidates_are_topks_with_the_best_anywhere(n):
    """The chunked selection gives topk's values and indices, wherever the best lie: in one chunk
    together, in the short tail, at the very ends of the row."""
    g = torch.Generator().manual_seed(23)
    rows, k = 6, 8
    scores = torch.randn(rows, n, generator=g)
    scores[1, 128:136] += 10.0  # all k best in one chunk
    scores[2, -5:] += 10.0  # at the end: in the tail when n is not a multiple of the chunk
    scores[3, 0] += 10.0
    scores[3, -1] += 10.0
    scores[4, :] = -math.inf  # banned everywhere but a few, as at a sentence's length limit
    scores[4, [7, 900, n - 2]] = torch.tensor([-1.0, -0.5, -2.0])
    values, index = best_candidates(scores, k)
    expected = scores.topk(k, dim=-1)
    assert torch.equal(values, expected.values)
    finite = values > -math.inf  # among -inf ties, any index will do
    assert torch.equal(index[finite], expected.indices[finite])
    assert torch.equal(scores.gather(1, index), values)
    assert index[4, :3].tolist() == [900, 7, n - 2]


def test_best_candidates_of_a_short_row_are_topks():
    scores = torch.randn(3, 50)
    values, index = best_candidates(scores, 8)
    assert torch.equal(index, scores.topk(8, dim=-1).indices) and torch.equal(values, scores.topk(8, dim=-1).values)
