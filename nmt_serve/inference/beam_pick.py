"""Beam search's candidates on the CPU in one call: numba's kernel (row_kernels.beam_rows).

After its log-softmax, a beam search step of a sentence or a few was a handful of tensor calls before its choice: the
banned ids filled with -inf (eos too before min_length), the rows at their max length made -inf but for eos, every
row's beam score added to its V log-probs (a write of all of them), and the top 2K of each sentence's K x V sums
(top_k). The kernel does all of it in one pass over the log-probs and one over the few blocks that can hold a best
candidate, without writing the sums: the values and indices are torch.topk's of the sums, the earlier index first
among ties. The choice among the 2K (search.choose_beams) stays the search's. No-repeat n-grams, the steps of a forced
target prefix and lexical constraints keep the tensor calls, and so does a step whose log-probs hold a NaN.
"""
from __future__ import annotations

import functools

import torch

from nmt_serve.inference import row_products

ENABLED = True  # tests turn the kernel off to hold the tensor calls to the same results
# from this many sentences on, the tensor calls (top_k's blocks on torch's threads) take the step: the kernel is one
# thread's
MAX_SENTENCES = 4


@functools.cache
def _kernel():
    from nmt_serve.inference import row_kernels

    return row_products.compile_kernel(
        row_kernels.beam_rows,
        "boolean(intp, intp, intp, intp, intp, intp, intp, boolean, intp, float32, intp, intp, intp, intp)")


def available(device: torch.device) -> bool:
    """Whether the kernel runs for a search on this device: the CPU, numba's kernels loaded."""
    return ENABLED and device.type == "cpu" and row_products.available() and _kernel() is not None


def candidates(lp: torch.Tensor, scores: torch.Tensor, banned: torch.Tensor | None, eos: int, ban_eos: bool,
               at_max: torch.Tensor | None, forced: float, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The k best candidates of each sentence (see the module's docstring): lp (G * W, V) float32, contiguous
    (log_softmax's), changed in place; scores (G, W) float32, contiguous, each row's beam score; banned (n,) int64 or
    None; at_max (G,) bool, the sentences that must end now, or None; forced: the log-prob eos takes there -> values
    (G, k) and flat indices (G, k) into each sentence's W x V, or None where a row holds a NaN (lp then holds the masks of
    the rows before it, which the caller's tensor calls, taking the step, make again)."""
    G, W = scores.shape
    V = lp.size(1)
    values, indices = torch.empty(G, k), torch.empty(G, k, dtype=torch.long)
    done = _kernel()(lp.data_ptr(), G, W, V, banned.data_ptr() if banned is not None else 0,
                     banned.size(0) if banned is not None else 0, eos, ban_eos,
                     at_max.data_ptr() if at_max is not None else 0, forced, scores.data_ptr(), k,
                     values.data_ptr(), indices.data_ptr())
    return (values, indices) if done else None
