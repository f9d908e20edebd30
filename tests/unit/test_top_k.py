"""top_k: torch.topk's values and (distinct values) indices, through the blocks or around them."""
from __future__ import annotations

import math

import pytest
import torch

from nmt_serve.inference import top_k as top_k_module
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
    assert torch.equal(top_k(scores, 8)[1], scores.topk(8, dim=-1).indices)
    wide = distinct(MIN_ROWS, 2 * 40_000, seed=3)[:, ::2]  # not contiguous
    assert torch.equal(top_k(wide, 8)[1], wide.topk(8, dim=-1).indices)


kernel = pytest.mark.skipif(top_k_module._kernel() is None, reason="needs numba's kernels")


@kernel
@pytest.mark.parametrize("rows", range(1, MIN_ROWS))
@pytest.mark.parametrize("n,k", [(40_000, 8), (31_996, 8), (8_000, 2), (33, 8), (8, 8), (100, 1)])
def test_fewer_rows_take_the_kernel_with_torch_topks_results(rows, n, k, monkeypatch):
    scores = distinct(rows, n, seed=n + rows)
    calls = []
    real = top_k_module._kernel()
    monkeypatch.setattr(top_k_module, "_kernel", lambda: lambda *a: calls.append(a) or real(*a))
    values, indices = top_k(scores, k)
    expected = scores.topk(k, dim=-1)
    assert calls and torch.equal(values, expected.values) and torch.equal(indices, expected.indices)


@kernel
def test_the_kernels_ties_minus_infinity_blocks_and_nan():
    n, k = 32 * 40 + 7, 8
    scores = distinct(3, n, seed=5)
    scores[0, -1] = 5.0  # in the tail past the last whole block
    scores[0, 64:64 + 4] = torch.tensor([9.0, 8.0, 7.0, 6.0])  # four of the best in one block
    scores[1] = -math.inf
    scores[1, 100] = scores[1, 7] = 0.5  # two finite scores, tied; the rest -inf
    scores[2] = torch.randint(0, 3, (n,), generator=torch.Generator().manual_seed(0)).float()  # many ties
    for row in range(3):
        values, indices = top_k(scores[row:row + 1], k)
        assert torch.equal(values, scores[row:row + 1].topk(k, dim=-1).values)
        assert torch.equal(scores[row:row + 1].gather(1, indices), values)
        if row == 0:
            assert indices[0, :5].tolist() == [64, 65, 66, 67, n - 1]
        if row == 1:  # the earlier of tied places first, then the first places of -inf
            assert indices[0, :2].tolist() == [7, 100] and len(set(indices[0].tolist())) == k
        if row == 2:  # the best value's k earliest places
            assert indices[0].tolist() == (scores[2] == 2.0).nonzero().flatten()[:k].tolist()
    with_nan = scores[:1].clone()
    with_nan[0, 500] = math.nan  # torch.topk counts NaN as the largest
    values, indices = top_k(with_nan, k)
    assert math.isnan(values[0, 0]) and indices[0, 0] == 500
    assert torch.equal(values[0, 1:], with_nan.topk(k, dim=-1).values[0, 1:])


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
