"""A row or a few times a weight on the CPU, at the rate the weight streams from memory: numba's kernels.

Greedy search of one sentence multiplies one row by each of a step's weights, each read once a step and
so from the last-level cache or memory, never from a hot L2. Every torch kernel tried for that product
reads the weight at 60-75% of the rate `torch.sum` does (MKL's gemv and gemm on W or W^T, in column
blocks or not, oneDNN, OpenBLAS through numpy, fbgemm's embedding bag; BENCHMARKS.md). The products are
about 60% of such a step. A dot product per output over W as it is, (C_out, C_in), with the sum free to
run in vector lanes (LLVM's reassociation), is what reaches that rate: on a 2-core AMD EPYC at one thread,
the shipped model's 19 products of a step 365-397 us against 629-689 for the runner's column blocks, and
`torch.sum` over the same weights 315-385.

int8 weights (one scale per output channel) are read the same way, converted to float in the lanes, the
row left in float32: 222-228 us a step against fbgemm's dynamic quantization's 374-397 (which quantizes the
row too, and costs about 12 us a call before it reads a byte).

The kernels run on the calling thread without Python's lock: a product of one row per thread is what two
lanes or engines want. A search stepped alone on more threads (the engine's lone search, on the cores other
processes leave idle; a Translator used on more threads) splits each product's outputs over them: `threads`
above 1, through numba's OpenMP pool (`splits()`), whose threads wake in microseconds. Each output is the same
sum either way, so the results do not depend on the threads. numba's workqueue (2 ms a step to wake) is never
used; TBB's pool ran a lone greedy search 1.02-1.14x where OpenMP's ran it 1.06-1.38x. Every product splits, the
small ones too, though a split costs about 3.6 us a call (19 products of 8 x 256 took 151 us split over 2 threads
against 83 at one): the pool's threads then spin from one product to the next instead of sleeping between the large
ones, and leaving weights below 512 KiB on the calling thread made a lone greedy search 0.81x (float32) and 0.86x
(int8) as fast as splitting them all (the shipped model's twin, 2 threads, GOMP_SPINCOUNT=10000). The OpenMP pool is
GNU's libgomp of the system, a second runtime beside the one torch bundles; it spins GOMP_SPINCOUNT times after
a product, as torch's does (the engine sets it low, supervisor.py). At more rows the dot products become the
cost (each row computes its own, the weight from L1 after the first): at 2 rows still 1.9x the packed oneDNN
product, at 4 about even, at 8 behind, so they take ROWS rows at most. Since dot_rows shares each weight's load among
four rows, a float32 product of a few rows more (FLOAT_ROWS_PER_THREAD a thread the outputs split over, for a weight
of at most FLOAT_ROWS_ELEMENTS) is faster through the kernel than through oneDNN's packed product, whose fixed cost per
call dominates there: a short source's encoder (a one-word request's join 1.5x as fast).

Compiled on their first use in a process (0.5-0.9 s, and 6 s for the split ones: numba's parallel pipeline), or
loaded from numba's cache (0.7 s for all four) where a writable place for it exists; numba's import takes 0.2 s
besides. numba costs an engine process about 35 MB of private memory (LLVM's, and the compiled code) besides its
shared libraries. Where numba is not installed or cannot compile, `available()` is False and the runner keeps torch's
products.
"""
from __future__ import annotations

import functools
import logging
import threading

import torch

log = logging.getLogger("nmt_serve.inference.row_products")

ROWS = 2  # the most rows a kernel takes: beyond, torch's products (measured above)
# A float32 weight of at most FLOAT_ROWS_ELEMENTS takes up to this many rows a thread its outputs split over (one where
# they do not) through the kernel, a larger one ROWS a thread: dot_rows shares each weight's load among four rows, and
# oneDNN's packed product of a few rows pays a fixed cost per call, which a larger weight's work outweighs sooner.
# Against the packed product, 2-core AMD EPYC:
# - the shipped model's encoder weights (256 x 256 to 1,536 x 256): 4 rows at 1 thread 1.2-2.4x as fast, 6 rows
#   0.8-1.1x; 8 rows at 2 threads 1.1-2.2x, 12 rows 0.9-1.7x;
# - OPUS-MT's (512 x 512 to 2,048 x 512, 512 x 2,048): 4 rows at 2 threads 1.1-1.9x; 8 rows at 2 threads 1.3-1.5x for
#   512 x 512, 0.44-1.06x for the larger ones; 4 rows at 1 thread 0.90-1.47x.
# A short source's encoder and a few rows of a step the step kernel does not take go through it.
FLOAT_ROWS_PER_THREAD = 4
FLOAT_ROWS_ELEMENTS = 1 << 19

# The kernels run on one thread. One row of an int8 weight up to this size ran as fast through them as through
# fbgemm on two threads or faster, and faster at one (2-core AMD EPYC, each call after 64 MB read elsewhere, us at
# 1 and 2 threads: 8,000 x 256 136-160 against 268-461 and 132-138 against 191-205; 10,000 x 256 175 against 364
# and 169 against 205; 8,000 x 512 249 against 324 and 241-257 against 221-225). Larger ones stream from memory,
# where fbgemm read about as fast at 1 thread and split them over its threads (16,000 x 512 463 against 497 and
# 442 against 350; 58,101 x 512, OPUS-MT's output layer, 1,756 against 1,659 and 1,719 against 723; whole greedy
# searches at that shape 0.96x with it through the kernel): those stay with fbgemm, with no plain copy.
INT8_MAX_BYTES = 4 * 2**20

# reassociation lets the sums run in vector lanes; no assumption about infinities or NaNs (scores may be -inf)
_FASTMATH = {"reassoc", "contract"}


def _compile(cache: bool):
    import numba

    from nmt_serve.inference import row_kernels

    options = dict(fastmath=_FASTMATH, boundscheck=False, nogil=True, cache=cache)
    for name in row_kernels.HELPERS:  # what the kernels call, compiled first (numba binds them when it compiles those)
        setattr(row_kernels, name, numba.njit(**options)(_source(getattr(row_kernels, name))))
    split = _compile_split(numba, row_kernels, options)
    kernels = (numba.njit("void(intp, intp, intp, intp, intp, intp, intp)", **options)(row_kernels.float_rows),
               numba.njit("void(intp, intp, intp, intp, intp, intp, intp, intp)", **options)(row_kernels.int8_rows))
    return kernels + split


def _source(function):
    """A function of row_kernels as Python, whether or not an earlier attempt compiled it."""
    return getattr(function, "py_func", function)


def _compile_split(numba, row_kernels, options: dict) -> tuple:
    """The split kernels, or (None, None) where numba's OpenMP pool does not load (no libgomp on the system) or
    another layer was asked for that is not thread-safe (the workqueue: the engine's lanes call from several
    threads). row_kernels.split_rows is then compiled without threads, and a lone row's step (row_step) runs on one
    thread (compile_parallel_kernel gives None)."""
    # never cached: numba's cache does not tell it from the parallel compile of the same function
    serial = numba.njit(**{**options, "cache": False})(_source(row_kernels.split_rows))
    if numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "omp"
    try:
        row_kernels.split_rows = numba.njit(parallel=True, **options)(_source(row_kernels.split_rows))
        split = (numba.njit("void(intp, intp, intp, intp, intp, intp, intp, intp)", **options)(row_kernels.float_split),
                 numba.njit("void(intp, intp, intp, intp, intp, intp, intp, intp, intp)", **options)(
                     row_kernels.int8_split))
        x, y = torch.ones(1, 4), torch.zeros(1, 2)
        w = torch.ones(2, 4)
        split[0](x.data_ptr(), w.data_ptr(), y.data_ptr(), y.data_ptr(), 1, 4, 2, 2)  # loads the threading layer
        if numba.threading_layer() == "workqueue":
            row_kernels.split_rows = serial
            return None, None
        return split
    except RuntimeError:  # no writable place for numba's cache: _kernels compiles them all in memory
        raise
    except Exception as e:  # noqa: BLE001 - the one-thread kernels serve on their own
        log.info("numba's OpenMP threads are not available (%s); a lone row's products run on one thread", e)
        row_kernels.split_rows = serial
        return None, None


def _compiled(build, what: str):
    """build(cache) with numba's cache where it has a writable place, else in memory; None where it does not compile
    (torch's path serves instead). torch's threads are what they were: numba's threading layer, as it loads, sets the
    OpenMP runtime's threads to its pool's size, and where that runtime is the one torch loaded (its libgomp.so.1) a
    process that had set torch's threads (a benchmark's one-thread engine, an engine's lanes) would then run on all
    of them."""
    threads = torch.get_num_threads()
    try:
        return _build(build, what)
    finally:
        torch.set_num_threads(threads)


def _build(build, what: str):
    try:
        return build(True)
    except RuntimeError:  # no writable place for numba's cache: compile in memory
        pass
    except Exception as e:  # noqa: BLE001 - any failure to compile leaves torch's path in place
        log.warning("numba could not compile %s (%s); torch's path runs instead", what, e)
        return None
    try:
        return build(False)
    except Exception as e:  # noqa: BLE001
        log.warning("numba could not compile %s (%s); torch's path runs instead", what, e)
        return None


@functools.cache
def _kernels():
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    return _compiled(_compile, "the row kernels")


def compile_kernel(function, signature: str):
    """Another of row_kernels' functions compiled as these are (nogil, reassociated sums), from numba's cache where
    it has a writable place; None where the kernels are not available or it does not compile."""
    if not available():
        return None
    import numba

    return _compiled(lambda cache: numba.njit(signature, fastmath=_FASTMATH, boundscheck=False, nogil=True,
                                              cache=cache)(function), function.__name__)


def compile_parallel_kernel(function, signature: str):
    """As compile_kernel, compiled with parallel=True: its prange runs on numba's OpenMP pool. None where that pool
    does not serve (splits() is False) or it does not compile."""
    if not splits():
        return None
    import numba

    return _compiled(lambda cache: numba.njit(signature, parallel=True, fastmath=_FASTMATH, boundscheck=False,
                                              nogil=True, cache=cache)(function), function.__name__)


ENABLED = True  # tests turn the kernels off to hold torch's path to the same results
SPLIT = True  # tests turn the split kernels off to hold the one-thread layouts

_float_rows = _int8_rows = _float_split = _int8_split = None  # the compiled kernels, once available() found them
_max_threads = 1  # numba's pool's size: the most threads a split takes


def available() -> bool:
    """Whether the kernels run in this process (compiling them on the first call)."""
    global _float_rows, _int8_rows, _float_split, _int8_split, _max_threads
    kernels = _kernels() if ENABLED else None
    if kernels is not None and _float_rows is None:
        _float_rows, _int8_rows, _float_split, _int8_split = kernels
        if _float_split is not None:
            import numba

            _max_threads = numba.config.NUMBA_NUM_THREADS
    return kernels is not None


def splits() -> bool:
    """Whether a product stepped on more threads than one splits its outputs over them (numba's OpenMP pool)."""
    return available() and SPLIT and _float_split is not None


_pool = threading.local()  # `threads`: the share of numba's pool this thread's splits take, as numba was last told


def _share(threads: int) -> int:
    """numba's pool is as large as the machine's CPUs, and a split runs on each of its threads that this thread's
    share holds (numba.set_num_threads, thread-local): a split over 2 threads on a 16-core machine would wake 16.
    The share is set where it changes (from Python: a kernel that sets it cannot be cached)."""
    threads = min(threads, _max_threads)
    if getattr(_pool, "threads", 0) != threads:
        import numba

        numba.set_num_threads(threads)
        _pool.threads = threads
    return threads


def float_rows(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, rows: int, threads: int = 1) -> torch.Tensor:
    """x (rows, C_in), a few rows (ROWS, or FLOAT_ROWS_PER_THREAD a thread), times weight (C_out, C_in)^T plus bias
    (C_out,) -> (rows, C_out); every tensor float32 and contiguous (x may have more dims, its rows read in order),
    nothing for autograd to follow (the caller checks x, the owner the rest). The outputs split over `threads`
    threads where splits(), else one."""
    C_out, C_in = weight.shape
    y = torch.empty(rows, C_out)
    if threads > 1 and SPLIT and _float_split is not None:
        _float_split(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, C_in, C_out, _share(threads))
    else:
        _float_rows(x.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, C_in, C_out)
    return y


def int8_rows(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, rows: int,
              threads: int = 1) -> torch.Tensor:
    """As float_rows, weight int8 (C_out, C_in) with scale (C_out,) float32: x (W * scale)^T + bias."""
    C_out, C_in = weight.shape
    y = torch.empty(rows, C_out)
    if threads > 1 and SPLIT and _int8_split is not None:
        _int8_split(x.data_ptr(), weight.data_ptr(), scale.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, C_in,
                    C_out, _share(threads))
    else:
        _int8_rows(x.data_ptr(), weight.data_ptr(), scale.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, C_in, C_out)
    return y
