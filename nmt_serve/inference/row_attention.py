"""A decoder step's attention for a few rows on the CPU, one query per row and head: numba's kernel.

scaled_dot_product_attention's CPU kernel costs about 20 us a call at one row (the shipped model's 4 heads of 64, 5
to 40 keys; 2-core AMD EPYC), most of it before it reads a key; a greedy step of one sentence calls it twice a
layer. The kernel (row_kernels.attend) reads the cache's keys and values where they are, through their strides, the
source mask's bytes where there is one, and writes (N, H * D), the shape the output projection takes.
"""
from __future__ import annotations

import functools

import torch

from nmt_serve.inference import row_products

ROWS = 8  # the most rows the kernel takes (measured below)
ENABLED = True  # tests turn the kernel off to hold scaled_dot_product_attention to the same results


@functools.cache
def _kernel():
    from nmt_serve.inference import row_kernels

    return row_products.compile_kernel(
        row_kernels.attend, "void(intp, intp, intp, intp, intp, intp, intp, intp, intp, intp, intp, intp, intp, float32)")


def available() -> bool:
    """Whether the kernel runs in this process (compiling it on the first call)."""
    return ENABLED and _kernel() is not None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q (N, ...) float32 whose rows each begin with their H * D query values, one query per row and head; k, v (N, H, T, D) with the same
    strides, each vector contiguous; mask (N, 1, 1, T) bool (True where attended) or None -> (N, H * D), what
    scaled_dot_product_attention gives for q as (N, H, 1, D), softmax(q k^T / sqrt(D)) v. The caller checks the
    layouts (the runner's own tensors: the cache's keys and values, its step's queries)."""
    N, H, T, D = k.shape
    y = torch.empty(N, H * D)
    m_at, m_row = (mask.data_ptr(), mask.stride(0)) if mask is not None else (0, 0)
    _kernel()(q.data_ptr(), q.stride(0), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), T, m_at, m_row,
              y.data_ptr(), N, H, D, D ** -0.5)
    return y
