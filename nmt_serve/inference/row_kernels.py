"""row_products' and row_attention's kernels, as Python for numba to compile (imported only where numba is installed).

`dot_rows` is the one loop, compiled for float32 and int8 weights; `float_rows` and `int8_rows` take the tensors'
addresses and sizes, not numpy arrays: a tensor's `.numpy()` costs 0.75 us from Python, its `data_ptr()` 0.09, and a
step makes 19 calls of a few microseconds each. `float_split` and `int8_split` give each of `threads` threads of
numba's pool a run of the outputs (compiled with parallel=True); `attend` is row_attention's. Module-level functions,
so that numba's cache finds them again in the next process; row_products._compile sets `dot_rows` to its compiled
form before those that call it."""
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


def attend(q_at, q_row, k_at, v_at, kv_row, kv_head, T, m_at, m_row, y_at, N, H, D, scale):
    """y (N, H * D) = softmax(q k^T * scale, masked) v for each of N rows and H heads, one query each: q[n, h] at
    q_at + n * q_row + h * D, key and value t at k_at / v_at + n * kv_row + h * kv_head + t * D (offsets in floats,
    each vector D contiguous floats); the mask's byte t of row n at m_at + n * m_row, nonzero where attended (m_at 0:
    no mask)."""
    q = numba.carray(float_at(q_at), ((N - 1) * q_row + H * D,))
    span = (N - 1) * kv_row + (H - 1) * kv_head + T * D
    k, v = numba.carray(float_at(k_at), (span,)), numba.carray(float_at(v_at), (span,))
    y = numba.carray(float_at(y_at), (N * H * D,))
    masked = m_at != 0
    mask = numba.carray(int8_at(m_at if masked else q_at), ((N - 1) * m_row + T,))
    p = np.empty(T, np.float32)
    for n in range(N):
        for h in range(H):
            # slices, each indexed from 0 by its loop: offsets numba cannot prove positive keep the loops scalar
            qo, ko, yo = n * q_row + h * D, n * kv_row + h * kv_head, (n * H + h) * D
            qh, yh = q[qo:qo + D], y[yo:yo + D]
            top = np.float32(-np.inf)
            for t in range(T):
                if masked and mask[n * m_row + t] == 0:
                    p[t] = -np.inf
                    continue
                kt = k[ko + t * D:ko + t * D + D]
                acc = np.float32(0.0)
                for d in range(D):
                    acc += qh[d] * kt[d]
                p[t] = acc * scale
                top = max(top, p[t])
            total = np.float32(0.0)
            for t in range(T):
                p[t] = np.exp(p[t] - top)
                total += p[t]
            for d in range(D):
                yh[d] = 0.0
            for t in range(T):
                w = p[t] / total
                vt = v[ko + t * D:ko + t * D + D]
                for d in range(D):
                    yh[d] += w * vt[d]
