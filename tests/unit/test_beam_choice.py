"""The beam choice that the eager and the continuous searches share (search.choose_beams)."""
from __future__ import annotations

import math

from nmt_serve.inference.search import choose_beams

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
