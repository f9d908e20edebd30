"""Greedy search's choice of each row's next token on the CPU in one call: numba's kernel (row_kernels.pick_rows).

A lone sentence's greedy step after its log-softmax was half a dozen tensor calls around the choice (the banned ids
filled with -inf, the row's best with its index, the score's sum, the prefix's concatenation, the eos test and the
host's read of it): the search's loop around a stub step took 35 us a token on the shipped model's twin (2-core AMD
EPYC, 2 threads), 14 with the kernel, beside a decoder step of about 175.
The kernel bans the same ids (and eos before min_length), forces eos where a row is at its max_length, takes each
row's best as torch's max does (the first index among ties, NaN as the largest), adds its log-prob to the row's score,
writes the token into the search's prefix buffer and counts the rows that ended: the search reads one integer back.
No-repeat n-grams, and the steps of a forced target prefix, keep the tensor calls (search.Constraints.apply).
The engine's continuous search chooses through it too (continuous.ContinuousSearch._pick) where no running sentence
has a forced token, a lexical constraint or eos not allowed yet: a lone sentence through it 1.06x as fast.
"""
from __future__ import annotations

import functools

import torch

from nmt_serve.inference import row_products

ENABLED = True  # tests turn the kernel off to hold the tensor calls to the same results


@functools.cache
def _kernel():
    from nmt_serve.inference import row_kernels

    return row_products.compile_kernel(
        row_kernels.pick_rows,
        "intp(intp, intp, intp, intp, intp, intp, boolean, intp, float32, intp, intp, intp, intp, intp)")


def available(device: torch.device) -> bool:
    """Whether the kernel runs for a search on this device: the CPU, numba's kernels loaded."""
    return ENABLED and device.type == "cpu" and row_products.available() and _kernel() is not None


def pick(lp: torch.Tensor, banned: torch.Tensor | None, eos: int, ban_eos: bool, at_max: torch.Tensor | None,
         forced: float, scores: torch.Tensor, tokens: torch.Tensor, prefix: torch.Tensor, column: int) -> int:
    """Each row's next token (see the module's docstring) -> how many rows took eos. lp (N, V) float32, contiguous
    (log_softmax's), its banned ids and eos set to -inf here; banned (k,) int64 or None; at_max (N,) bool, rows that
    must end now, or None; forced: the log-prob eos takes there; scores (N,) float32, each row's log-prob added;
    tokens (N,) int64 and prefix[:, column] of prefix (N, T) int64 receive the tokens. Each tensor contiguous (prefix
    by rows), on the CPU: the search's own, checked by its tests rather than at each of its steps."""
    N, V = lp.shape
    return _kernel()(lp.data_ptr(), N, V, banned.data_ptr() if banned is not None else 0,
                     banned.size(0) if banned is not None else 0, eos, ban_eos,
                     at_max.data_ptr() if at_max is not None else 0, forced, scores.data_ptr(), tokens.data_ptr(),
                     prefix.data_ptr(), prefix.stride(0), column)
