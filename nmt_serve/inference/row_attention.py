"""A decoder step's attention for a few rows on the CPU, one query per row and head: numba's kernel.

scaled_dot_product_attention's CPU kernel costs 13-15 us a call at one row (the shipped model's 4 heads of 64, 5 to
40 keys; 2-core AMD EPYC), most of it before it reads a key, where this kernel takes 5-7; a greedy step of one
sentence calls it twice a layer (a lone greedy search 1.05-1.14x, outputs identical; BENCHMARKS.md). The kernel
(row_kernels.attend) reads the cache's keys and values where they are, through their strides, the source mask's
bytes where there is one, and writes (N, H * D), the shape the output projection takes.
"""
from __future__ import annotations

import functools

import torch

from nmt_serve.inference import row_products

# the most rows the kernel takes: every step of fewer rows than the runner's matmul attention takes (16). One layer's
# self-attention, 4 heads of 64, 1 thread, kernel against scaled_dot_product_attention: 1 row 4.6-7.0 against
# 13.4-15.4 us (5 and 40 keys), 4 rows 5.9-18.4 against 18.6-37.7, 16 rows 23.3-95.5 against 75.8-121; 8 heads at
# 250 keys about even (1 row 47.9 against 50.8, 4 rows 227 against 209, 15 rows 1,222 against 1,486)
ROWS = 16
ENABLED = True  # tests turn the kernel off to hold scaled_dot_product_attention to the same results


@functools.cache
def _kernel():
    from nmt_serve.inference import row_kernels

    return row_products.compile_kernel(row_kernels.attend, f"void({', '.join(['intp'] * 13)}, float32)")


def available() -> bool:
    """Whether the kernel runs in this process (compiling it on the first call)."""
    return ENABLED and _kernel() is not None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (N, ...) float32 whose rows each begin with their H * D query values, one query per row and head; k, v
    (N, H, T, D) with the same strides, each vector contiguous; mask (N, 1, 1, T) bool (True where attended), each
    row's contiguous, or None -> (N, H * D): what scaled_dot_product_attention gives for q as (N, H, 1, D),
    softmax(q k^T / sqrt(D)) v. The caller checks the layouts (the runner's own tensors: the cache's keys, values and
    source mask, its step's queries)."""
    N, H, T, D = k.shape
    y = torch.empty(N, H * D)
    m_at, m_row = (mask.data_ptr(), mask.stride(0)) if mask is not None else (0, 0)
    _kernel()(q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), T, m_at, m_row,
              y.data_ptr(), N, H, D, D ** -0.5)
    return y
