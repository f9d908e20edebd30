"""Batched products of many small matrices on the CPU: a decoder step's attention.

A step of beam search attends with two batched products per layer, one matrix per row (or group of K rows) and
head: the scores, q (Q x D) against the keys (D x S), and the values, the weights (Q x S) against the values
(S x D), with Q 1 or K and S the cached positions. On the CPU, torch.bmm hands them to MKL, which copies (packs) its
operands before it multiplies them: on a 2-core AMD EPYC, `perf` found 15% of a beam 4 search of 32 sentences
(1 thread) in MKL, 13 points of it in its copy routines (`sgemm_scopy_*`) and 2 in its kernel. The copies are what
can be saved: the products read each key and value once either way, and with Q = 4 there is little arithmetic to
hide a copy behind.

numpy's matmul hands each matrix to OpenBLAS (the build in numpy's wheel), whose kernel for small matrices
multiplies them where they lie; like torch's ops it lets go of Python's lock meanwhile. On that CPU at one thread
(microseconds for a layer's scores and values with a softmax between, 8 MB streamed through the caches between
calls, the shipped model's 4 heads of 64):

| shape | torch.bmm (MKL) | numpy (OpenBLAS) |
| --- | --- | --- |
| beam 4, 32 sentences, 36 positions (self-attention) | 933 | 415 |
| beam 4, 32 sentences, 12 positions | 204 | 131 |
| beam 4, 32 sentences, 20 source tokens | 126 | 83 |
| greedy, 32 rows, 12 / 36 positions | 74 / 100 | 68 / 76 |

At two threads MKL splits the batch between them and numpy stays on one: 0.56-1.69x as fast, no gain over a whole
search. So numpy takes the products only where torch runs one thread, as the service does on the CPU (each lane
and each engine process has one). Beam 4 searches of 32 sentences at one thread ran 1.09-1.11x as fast (the shipped
model's twin, 320 test sentences; `bench.revisions` on the shipped model, 256), outputs identical in every setting
(BENCHMARKS.md, "Attention's small products through OpenBLAS at one thread").

Products this small run on the calling thread (OpenBLAS threads only larger ones): that search used 9.10 s of CPU in
9.10 s of wall time, so two lanes or engines of one thread each keep to a core each. The sums of a product may round
differently from MKL's (a score's last bit); the values' products came out bit for bit the same.
"""
from __future__ import annotations

import numpy as np
import torch


def through_openblas(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether batched_matmul takes numpy's path for these operands: float32 on the CPU, torch at one thread, and
    nothing for autograd to follow (numpy's product would cut the graph)."""
    return (a.device.type == "cpu" and a.dtype == torch.float32 and torch.get_num_threads() == 1
            and not (a.requires_grad or b.requires_grad))


def batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (E, M, K) @ b (E, K, N) -> (E, M, N), as torch.bmm; either may be a strided view (a transposed cache)."""
    if through_openblas(a, b):
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    return torch.bmm(a, b)
