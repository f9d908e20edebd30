"""Batched products of many small matrices on the CPU: a decoder step's attention.

A step of beam search attends with two batched products per layer, one matrix per row (or group of K rows)
and head: the scores, q (Q x D) against the keys (D x S), and the values, the weights (Q x S) against the
values (S x D), with Q 1 or K and S the cached positions. On the CPU, torch.bmm hands them to MKL, which copies
(packs) every right-hand matrix before it multiplies it: on a 2-core AMD EPYC, `perf` put 87% of the time of
those products at 1 thread in MKL's copy routines (`sgemm_scopy_*`) and 13% in its kernel. Those copies are
all there is to gain: the products read each key and value once either way, and with Q = 4 there is little
arithmetic to hide them behind.

numpy's matmul hands each matrix to OpenBLAS (the build in numpy's wheel), whose kernel for small matrices
multiplies them where they lie. On that CPU at one thread (microseconds, a layer's scores and values with a
softmax between, 8 MB streamed through the caches between calls, the shipped model's 4 heads of 64):

| shape | torch.bmm (MKL) | numpy (OpenBLAS) |
| --- | --- | --- |
| beam 4, 32 sentences, 36 positions (self-attention) | 933 | 415 |
| beam 4, 32 sentences, 12 positions | 204 | 131 |
| beam 4, 32 sentences, 20 source tokens | 126 | 83 |
| greedy, 32 rows, 12 / 36 positions | 74 / 100 | 68 / 76 |

At two threads MKL splits the batch between them and numpy stays on one: 0.56-1.69x as fast, no gain over a whole
search; so numpy takes the products only where torch runs one thread, as the service's lanes do (one thread
each). A beam 4 search of 32 sentences (the shipped model's twin, 320 test sentences, 1 thread) ran 1.09-1.12x
as fast, outputs identical (BENCHMARKS.md, "Attention's small products through OpenBLAS at one thread").

Each product is below OpenBLAS's threshold for threads of its own (M x N x K < 262,144: 4 x 64 x 144 is 36,864),
so it runs on the calling thread. The sums of a product may round differently from MKL's (a score's last bit);
the values' products came out bit for bit the same.
"""
from __future__ import annotations

import numpy as np
import torch


def through_openblas(a: torch.Tensor) -> bool:
    """Whether batched_matmul takes numpy's path for this left-hand side: float32 on the CPU, torch at one thread."""
    return a.device.type == "cpu" and a.dtype == torch.float32 and torch.get_num_threads() == 1


def batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (E, M, K) @ b (E, K, N) -> (E, M, N), as torch.bmm; either may be a strided view (a transposed cache)."""
    if through_openblas(a):
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return torch.bmm(a, b)
