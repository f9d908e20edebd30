"""Which scaled_dot_product_attention kernels inference may use, chosen explicitly.

Left to itself, PyTorch (2.11, CUDA 13) picks the cuDNN backend on Hopper, and cuDNN builds an
execution plan for every new shape (batch, source length, cache length) it meets: about a second
each on an H100, and a translation service meets new shapes all the time. The backends below need
no per-shape planning. Measured on an H100 (bench/gpu.py, `attention` table in BENCHMARKS.md):
flash attention is the fastest for the encoder where it applies (no padding mask), efficient
attention where a mask is needed, and for one query per row (the decoder step) efficient attention
too. Each backend appears in priority order; PyTorch takes the first one that supports the call.
"""
from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backends(device: torch.device | str):
    """A context in which attention on `device` never uses a backend that plans per shape."""
    if torch.device(device).type == "cuda":
        return sdpa_kernel(CUDA_BACKENDS)
    return contextlib.nullcontext()
