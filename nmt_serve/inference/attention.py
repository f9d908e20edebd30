"""Which scaled_dot_product_attention kernels inference may use, chosen explicitly.

Left to itself, PyTorch (2.11, CUDA 13) picks the cuDNN backend on Hopper, and cuDNN builds an
execution plan for every new shape (batch, source length, cache length) it meets: about a second
each on an H100, and a translation service meets new shapes all
the time. The backends below need no per-shape planning: flash attention where it applies (no mask),
memory-efficient attention where a mask is needed (padded sources, the static decoder's masked
step), the math kernels last. PyTorch takes the first in the list that supports a call.
The order follows the kernels' documented behaviour; `python -m bench.gpu --sections attention`
times each backend alone for the encoder and the one-token step.
"""
from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_backend(device: torch.device | str) -> str:
    """The attention kernels inference on `device` may use, in order of preference, for start-up logs and /v1/models."""
    if torch.device(device).type == "cuda":
        return "sdpa:" + ",".join(b.name.lower().removesuffix("_attention") for b in CUDA_BACKENDS)
    return "sdpa:cpu-default"  # PyTorch's own choice on CPU (its flash kernel where it applies, else math)


def attention_backends(device: torch.device | str):
    """A context in which attention on `device` never uses a backend that plans per shape."""
    if torch.device(device).type == "cuda":
        return sdpa_kernel(CUDA_BACKENDS)
    return contextlib.nullcontext()
