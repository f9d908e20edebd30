"""The k best scores of each row, as `torch.topk(scores, k, dim=-1)` gives them, and the best one, as
`scores.max(dim=-1)` does, faster on the CPU.

Beam search picks 2K candidates out of K x V per sentence (32,000 for beam 4 and an 8,000-word
vocabulary), and torch's CPU top-k walks every element through its selection: on a 2-core AMD EPYC it
took 56 us for one such row and 1.2 ms for 32 rows at 1 thread, a tenth of a beam 4 batch 32 step.

Here a row is cut into blocks of BLOCK elements. An element among the k best of its row lies in one
of the k blocks whose maxima are largest: at most k elements of the row are >= it, so at most k
blocks have a maximum >= its own block's. One vectorized pass takes the blocks' maxima, a top-k over
those picks k blocks, and a last top-k runs over their k x BLOCK elements (and the row's tail past
its last whole block). Timed per call inside beam 4 searches of the shipped model's twin (31,996
candidates a sentence): 32 sentences 1,260 -> 437 us at 1 thread and 694 -> 431 us at 2; 4 sentences
188-204 -> 124-127 us.

The values are exactly torch.topk's; where several elements tie for a place, which of their indices
is returned may differ (torch.topk promises no order among ties either). NaN counts as the largest,
as in torch.topk, since a block's maximum is NaN when the block holds one.

Fewer rows than MIN_ROWS (beam search of one sentence) take numba's kernel (row_kernels.top_rows), where the
blocks' handful of tensor calls cost more than they save: the blocks' maxima in vector lanes, the k-th largest of them
as a bound, and the few blocks that reach it read again, in one call. One row of 31,996 took 9.6-11.8 us against
torch.topk's 28.7-29.7 (1 thread); from 4 rows the blocks' tensor calls (on torch's threads) were as fast or faster.
Among ties it returns the earlier index first; a row holding a NaN goes to torch.topk.

Greedy search takes each row's best (row_max) the same way: torch's max with its index reads 6.8 us per
8,000-element row at 1 thread where a vectorized amax reads 0.64 (this project's AMD EPYC), so the blocks'
maxima, the first block holding the row's, and the first place in it give exactly what max gives, the
first index among ties included.
"""
from __future__ import annotations

from functools import cache, lru_cache

import torch

BLOCK = 64  # 32-128 measured alike for one row; 64-128 best from 8 rows on (16 is slower than torch.topk)
MIN_BLOCKS_PER_K = 8  # below k x this many blocks per row, the blocks save little: plain torch.topk
# Fewer rows go to torch.topk: in a search (beam 4 batch 1, one row of 31,996) the blocks' handful of
# small calls cost more than they saved (80 against 64 us a step, 2 threads); from 4 rows on they save
# (above).
MIN_ROWS = 4
# row_max below this many rows is torch's: its handful of calls cost more than they save (1 row: 34 against
# 10 us, 4 rows 39 against 30; 32 rows 76 against 218, 128 rows 178 against 855; 7,999 columns, 1 thread)
MAX_MIN_ROWS = 16


@lru_cache(maxsize=64)  # column numbers made once per range: an arange per call cost as much as a gather
def _columns(start: int, stop: int, device: torch.device) -> torch.Tensor:
    return torch.arange(start, stop, device=device)


@cache
def _kernel():
    from nmt_serve.inference import row_kernels, row_products

    return row_products.compile_kernel(row_kernels.top_rows, "boolean(intp, intp, intp, intp, intp, intp)")


ENABLED = True  # tests turn the kernel off to hold the tensor calls to the same results


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (N, n) -> (values, indices), each (N, k), each row best first, as torch.topk(scores, k)."""
    N, n = scores.shape
    if (N < MIN_ROWS and ENABLED and scores.device.type == "cpu" and scores.dtype == torch.float32
            and scores.is_contiguous() and k <= n):
        kernel = _kernel()
        if kernel is not None:
            values, indices = torch.empty(N, k), torch.empty(N, k, dtype=torch.long)
            if kernel(scores.data_ptr(), N, n, k, values.data_ptr(), indices.data_ptr()):
                return values, indices
    blocks = n // BLOCK
    if scores.device.type != "cpu" or N < MIN_ROWS or blocks < k * MIN_BLOCKS_PER_K or not scores.is_contiguous():
        return scores.topk(k, dim=-1)
    maxima = scores.as_strided((N, blocks, BLOCK), (n, BLOCK, 1)).amax(-1)  # (N, blocks)
    best = maxima.topk(k, dim=-1).indices  # (N, k)
    columns = torch.add(_columns(0, BLOCK, scores.device), best[:, :, None], alpha=BLOCK).view(N, k * BLOCK)
    if blocks * BLOCK < n:  # the tail past the last whole block is always looked at
        columns = torch.cat([columns, _columns(blocks * BLOCK, n, scores.device).expand(N, -1)], dim=1)
    values, picked = scores.gather(1, columns).topk(k, dim=-1)
    return values, columns.gather(1, picked)


def row_max(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (N, n) -> (values, indices), each (N,): as scores.max(dim=-1), the first index where a row's best
    value is repeated."""
    N, n = scores.shape
    blocks = n // BLOCK
    if scores.device.type != "cpu" or N < MAX_MIN_ROWS or blocks < 2 or not scores.is_contiguous():
        return scores.max(dim=-1)
    maxima = scores.as_strided((N, blocks, BLOCK), (n, BLOCK, 1)).amax(-1)  # (N, blocks)
    if blocks * BLOCK < n:  # the tail as one more block, the last BLOCK elements (it overlaps the one before:
        # where the overlap holds the best value, that block comes first and is taken)
        maxima = torch.cat([maxima, scores[:, blocks * BLOCK :].amax(-1, keepdim=True)], dim=1)
    first = torch.argmax(maxima, dim=-1).mul_(BLOCK).clamp_(max=n - BLOCK)  # (N,): where the first best block starts
    columns = torch.add(_columns(0, BLOCK, scores.device), first[:, None])  # (N, BLOCK)
    values, picked = scores.gather(1, columns).max(dim=-1)
    return values, columns.gather(1, picked[:, None]).view(N)

