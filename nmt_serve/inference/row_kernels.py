"""row_products' kernels, as Python for numba to compile (imported only where numba is installed).

They take the tensors' addresses and sizes, not numpy arrays: a tensor's `.numpy()` costs 0.75 us from Python,
its `data_ptr()` 0.09, and a step makes 19 calls of a few microseconds each. Defined at module level so that
numba's cache finds them again in the next process."""
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


def float_rows(x_at, w_at, b_at, y_at, R, C_in, C_out):
    """y (R, C_out) = x (R, C_in) w (C_out, C_in)^T + b (C_out,): a dot product per output, over W as it is."""
    x = numba.carray(float_at(x_at), (R, C_in))
    w = numba.carray(float_at(w_at), (C_out, C_in))
    b = numba.carray(float_at(b_at), (C_out,))
    y = numba.carray(float_at(y_at), (R, C_out))
    for o in range(C_out):
        for r in range(R):
            acc = np.float32(0.0)
            for k in range(C_in):
                acc += w[o, k] * x[r, k]
            y[r, o] = acc + b[o]


def int8_rows(x_at, w_at, s_at, b_at, y_at, R, C_in, C_out):
    """As float_rows, w int8 with a scale per output (s, float32): y = x (w * s)^T + b, x left in float32."""
    x = numba.carray(float_at(x_at), (R, C_in))
    w = numba.carray(int8_at(w_at), (C_out, C_in))
    s = numba.carray(float_at(s_at), (C_out,))
    b = numba.carray(float_at(b_at), (C_out,))
    y = numba.carray(float_at(y_at), (R, C_out))
    for o in range(C_out):
        for r in range(R):
            acc = np.float32(0.0)
            for k in range(C_in):
                acc += np.float32(w[o, k]) * x[r, k]
            y[r, o] = acc * s[o] + b[o]
