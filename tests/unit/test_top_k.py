"""top_k: torch.topk's values and (distinct values) indices, through the blocks or around them."""
from __future__ import annotations

import math

import pytest
import torch

from nmt_serve.inference.top_k import BLOCK, MAX_MIN_ROWS, MIN_BLOCKS_PER_K, MIN_ROWS, row_max, top_k


def distinct(rows: int, n: int, seed: int) -> torch.Tensor:
    """Scores with no ties: a permutation of n distinct values per row."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g).float() / n - 1.0 for _ in range(rows)])


@pytest.mark.parametrize("rows,n,k", [(MIN_ROWS, 31_996, 8), (32, 32_000, 8), (5, 8 * BLOCK * MIN_BLOCKS_PER_K + 7, 8), (4, 40_000, 2)])
def test_the_k_best_and_where_they_are(rows, n, k):
    scores = distinct(rows, n, seed=n + k)
    values, indices = top_k(scores, k)
    expected = scores.topk(k, dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


def test_best_in_the_tail_past_the_last_whole_block_and_all_in_one_block():
    n, k = 20 * BLOCK * MIN_BLOCKS_PER_K + BLOCK - 1, 4
    scores = distinct(MIN_ROWS, n, seed=1)
    scores[0, -1] = 5.0  # the last element, in no whole block
    scores[1, BLOCK : BLOCK + k] = torch.tensor([9.0, 8.0, 7.0, 6.0])  # the k best in one block
    values, indices = top_k(scores, k)
    assert indices[0, 0] == n - 1 and values[0, 0] == 5.0
    assert indices[1].tolist() == list(range(BLOCK, BLOCK + k)) and values[1].tolist() == [9.0, 8.0, 7.0, 6.0]


def test_ties_and_minus_infinity_give_torch_topks_values():
    n, k = 16 * BLOCK * MIN_BLOCKS_PER_K, 8
    scores = torch.full((max(3, MIN_ROWS), n), -math.inf)
    scores[0, :: 3 * BLOCK] = -1.0  # fewer finite scores than whole blocks, all equal
    scores[1, 5] = 0.5  # one finite score; every other candidate is -inf
    scores[2] = torch.randint(0, 4, (n,), generator=torch.Generator().manual_seed(0)).float()  # many ties
    values, indices = top_k(scores, k)
    expected = scores.topk(k, dim=-1)
    assert torch.equal(values, expected.values)
    assert torch.equal(scores.gather(1, indices), values)  # each index holds its value
    assert all(len(set(row)) == k for row in indices.tolist())  # k distinct places


def test_small_rows_and_other_layouts_are_torch_topk():
    scores = distinct(MIN_ROWS, 1_000, seed=2)  # too few blocks for k
    assert torch.equal(top_k(scores, 8).indices, scores.topk(8, dim=-1).indices)
    wide = distinct(MIN_ROWS, 2 * 40_000, seed=3)[:, ::2]  # not contiguous
    one = distinct(1, 40_000, seed=4)  # fewer rows than MIN_ROWS
    assert torch.equal(top_k(one, 8).indices, one.topk(8, dim=-1).indices)
    assert torch.equal(top_k(wide, 8).indices, wide.topk(8, dim=-1).indices)


@pytest.mark.parametrize("rows,n", [(MAX_MIN_ROWS, 8_000), (32, 7_999), (40, BLOCK * 3 + 1), (MAX_MIN_ROWS - 1, 8_000), (20, BLOCK + 5)])
def test_a_rows_best_is_torch_max_and_its_first_place_among_ties(rows, n):
    g = torch.Generator().manual_seed(n)
    scores = torch.randint(0, 50, (rows, n), generator=g).float()  # many ties for the best
    scores[0, -1] = 99.0  # in the tail only
    scores[1, n - BLOCK + 1] = scores[1, n - BLOCK] = 99.0  # the overlap of the tail and the block before
    scores[2, 3] = scores[2, -2] = 99.0  # first block and tail
    scores[3] = -math.inf
    scores[3, n // 2] = -1.0
    scores[4] = -math.inf  # nothing allowed: the first place, as torch
    values, indices = row_max(scores)
    expected = scores.max(dim=-1)
    assert torch.equal(values, expected.values) and torch.equal(indices, expected.indices)
    assert indices[:3].tolist() == [n - 1, n - BLOCK, 3]
