"""The C library's allocator, set for decoding on the CPU: memory freed by one step kept for the next.

Every decoding step allocates and frees the same temporaries again: logits, log-probabilities, the candidates
of beam search, the batch's activations, a few megabytes each at a batch of 32. torch's CPU tensors come from
the C library's malloc, and glibc serves a block past its mmap threshold (128 KiB at first, raised up to 32 MiB
as such blocks are freed) with a fresh mapping, and gives the free memory at the top of its heap back to the
kernel once it passes its trim threshold (twice the mmap threshold). The next step's temporaries then fault
their pages in again, each zeroed by the kernel: on the shipped model's beam 4 at batch 32, 230 page faults a
step and 2% of the run's CPU time in the kernel, and more in the caches those pages flush.

`keep_freed_memory()` fixes both thresholds (`mallopt`): blocks up to 32 MiB (the most glibc would raise its
threshold to) come from the heap, and up to 64 MiB of free memory stays at the top of the heap. There the faults
fell to 3 a step, float32 searches at batch 32 ran 1.02-1.06x as fast and int8 ones within this VM's noise
(BENCHMARKS.md), for 26 MiB more held at the peak. The engine's continuous search faults about as often either
way: its rows and positions change from step to step, and Python's own arenas come and go. PyTorch's CPU tuning
guides reach for the same by preloading jemalloc or tcmalloc (jemalloc as Debian ships it faulted 8x as often
there); this needs no other library. Elsewhere than glibc (musl, macOS) it does nothing.
"""
from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1  # glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 64 * 2**20


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (whose mallopt options and malloc_trim these are), else None."""
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has: its C library's
        libc.gnu_get_libc_version  # glibc's own
    except (OSError, AttributeError, TypeError):  # no C library to ask (Windows), or not glibc
        return None
    return libc


@functools.cache
def keep_freed_memory() -> bool:
    """Set the thresholds once per process; True where glibc took them. The settings are the whole process's,
    as the environment's MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ would set them at its start."""
    if (libc := glibc()) is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def release_freed_memory() -> bool:
    """The free memory of the C library's heap given back to the kernel now (glibc's malloc_trim), whatever the
    thresholds above keep: after a large block of memory that will not be needed again was freed (a runner's own
    copy of the weights, once they are shared: shared_weights.py). True where glibc gave some back."""
    if (libc := glibc()) is None:
        return False
    malloc_trim = libc.malloc_trim
    malloc_trim.argtypes, malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return bool(malloc_trim(0))
