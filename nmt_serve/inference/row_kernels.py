"""row_products' kernels, as Python for numba to compile (imported only where numba is installed).

`dot_rows` is the one loop, compiled for float32 and int8 weights; `float_rows` and `int8_rows` take the tensors'
addresses and sizes, not numpy arrays: a tensor's `.numpy()` costs 0.75 us from Python, its `data_ptr()` 0.09, and a
step makes 19 calls of a few microseconds each. `float_split` and `int8_split` give each of `threads` threads of
numba's pool a run of the outputs (compiled with parallel=True). Module-level functions, so that numba's cache finds
them again in the next process; row_products._compile sets `dot_rows` to its compiled form before those that call
it."""
import numba
import numpy as np
from numba import types
from numba.extending import intrinsic


@intrinsic
def float_at(typingctx, address):
    """The float32 pointer at an address (an integer)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))
    return types.CPointer(types.float32)(types.intp), codegen


@intrinsic
def int8_at(typingctx, address):
    """The int8 pointer at an address (an integer)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int8)))
    return types.CPointer(types.int8)(types.intp), codegen


def dot_rows_source(x, w, s, b, y, start, stop):
    """y[:, start:stop] of y (R, C_out) = x (R, C_in) (w * s)^T + b: a dot product per output over w (C_out, C_in) as
    it is, in float32 whatever w holds; s: a scale per output, or None."""
    R, C_in = x.shape
    for o in range(start, stop):
        for r in range(R):
            acc = np.float32(0.0)
            for k in range(C_in):
                acc += np.float32(w[o, k]) * x[r, k]
            y[r, o] = (acc if s is None else acc * s[o]) + b[o]


dot_rows = dot_rows_source  # its compiled form once row_products compiles the kernels


def float_rows(x_at, w_at, b_at, y_at, R, C_in, C_out):
    """dot_rows over float32 weights, no scale."""
    dot_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(float_at(w_at), (C_out, C_in)), None,
             numba.carray(float_at(b_at), (C_out,)), numba.carray(float_at(y_at), (R, C_out)), 0, C_out)


def int8_rows(x_at, w_at, s_at, b_at, y_at, R, C_in, C_out):
    """dot_rows over int8 weights with a scale per output (float32)."""
    dot_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(int8_at(w_at), (C_out, C_in)),
             numba.carray(float_at(s_at), (C_out,)), numba.carray(float_at(b_at), (C_out,)),
             numba.carray(float_at(y_at), (R, C_out)), 0, C_out)


def float_split(x_at, w_at, b_at, y_at, R, C_in, C_out, threads):
    """float_rows with the outputs in `threads` runs, one per thread. Each output is the same sum in the same order
    as float_rows', whichever thread computes it: the results are identical."""
    x, w = numba.carray(float_at(x_at), (R, C_in)), numba.carray(float_at(w_at), (C_out, C_in))
    b, y = numba.carray(float_at(b_at), (C_out,)), numba.carray(float_at(y_at), (R, C_out))
    run = -(-C_out // threads)
    for t in numba.prange(threads):
        dot_rows(x, w, None, b, y, t * run, min(C_out, (t + 1) * run))


def int8_split(x_at, w_at, s_at, b_at, y_at, R, C_in, C_out, threads):
    """int8_rows with the outputs in `threads` runs, as float_split."""
    x, w = numba.carray(float_at(x_at), (R, C_in)), numba.carray(int8_at(w_at), (C_out, C_in))
    s, b = numba.carray(float_at(s_at), (C_out,)), numba.carray(float_at(b_at), (C_out,))
    y = numba.carray(float_at(y_at), (R, C_out))
    run = -(-C_out // threads)
    for t in numba.prange(threads):
        dot_rows(x, w, s, b, y, t * run, min(C_out, (t + 1) * run))
