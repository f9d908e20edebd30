"""row_products', row_attention's and row_step's kernels, as Python for numba to compile (imported only where numba
is installed).

`dot_rows` is the one product loop, compiled for float32 and int8 weights; `float_rows` and `int8_rows` take the
tensors' addresses and sizes, not numpy arrays: a tensor's `.numpy()` costs 0.75 us from Python, its `data_ptr()`
0.09, and a step made 19 calls of a few microseconds each. `split_rows` gives each of `threads` threads of numba's
pool a run of the outputs (compiled with parallel=True; `float_split` and `int8_split` call it); `attend` is
row_attention's; `step_layers` (through `float_step` and `int8_step`, or on several threads `float_step_split` and
`int8_step_split`) runs a decoder step's layers for row_step.
Module-level functions, so that numba's cache finds them again in the next process; row_products._compile compiles
the HELPERS and split_rows before the kernels that call them.
"""
import math
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def float_at(typingctx, address):
    """The float32 pointer at an address (an integer)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.float32)))
    return types.CPointer(types.float32)(types.intp), codegen


@intrinsic
def int64_at(typingctx, address):
    """The int64 pointer at an address (an integer)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int64)))
    return types.CPointer(types.int64)(types.intp), codegen


@intrinsic
def void_at(typingctx, address):
    """The untyped pointer at an address (an integer), for numba.carray to read as a dtype it is given."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.voidptr))
    return types.voidptr(types.intp), codegen


@intrinsic
def int8_at(typingctx, address):
    """The int8 pointer at an address (an integer)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int8)))
    return types.CPointer(types.int8)(types.intp), codegen


@intrinsic
def atomic_add(typingctx, address, value):
    """The int64 at an address increased by value, atomically (sequentially consistent) -> the value it held."""
    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", builder.inttoptr(args[0], ir.IntType(64).as_pointer()), args[1], "seq_cst")
    return types.int64(types.intp, types.int64), codegen


@intrinsic
def atomic_load(typingctx, address):
    """The int64 at an address, read atomically (acquire: what was written before its last increase is seen)."""
    def codegen(context, builder, signature, args):
        return builder.load_atomic(builder.inttoptr(args[0], ir.IntType(64).as_pointer()), "acquire", 8)
    return types.int64(types.intp), codegen


@intrinsic
def spin_pause(typingctx):
    """x86's pause (nothing elsewhere): a spinning wait that leaves the core's other work room."""
    def codegen(context, builder, signature, args):
        if platform.machine().lower() in ("x86_64", "amd64", "i686", "x86"):
            builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                        "llvm.x86.sse2.pause"), [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def sched_yield(typingctx):
    """The C library's sched_yield: the core to another thread that waits for it."""
    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(function, [])
        return context.get_dummy_value()
    return types.none(), codegen


def dot_rows(x, w, s, b, y, start, stop):
    """y[:, start:stop] of y (R, C_out) = x (R, C_in) (w * s)^T + b: a dot product per output over w (C_out, C_in) as
    it is, in float32 whatever w holds; s: a scale per output, or None. start: a multiple of 4 (split_rows).
    - Four rows at a time share each weight's conversion to float and its load: from 4 rows on the products are the
      cost, not the weights' bytes (the shipped model's step weights, int8, 1 thread: 4 rows 298 -> 246 us, 8 rows
      564 -> 454; float32 8 rows 1,016 -> 755).
    - The rows left (fewer than 4: a lone row) take four outputs at a time, four sums side by side over one read of
      the row: the step's float32 weights at one row 590 -> 440 us out of cache, 369-465 -> 326-351 from L3.
    Outputs are grouped in fours from output 0, whatever `start`, so that each is the same sum however the outputs
    are split."""
    R, C_in = x.shape
    R4 = R - R % 4
    for o in range(start, stop):
        wo = w[o]
        for r in range(0, R4, 4):
            x0, x1, x2, x3 = x[r], x[r + 1], x[r + 2], x[r + 3]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for k in range(C_in):
                wk = np.float32(wo[k])
                a0 += wk * x0[k]
                a1 += wk * x1[k]
                a2 += wk * x2[k]
                a3 += wk * x3[k]
            y[r, o], y[r + 1, o], y[r + 2, o], y[r + 3, o] = a0, a1, a2, a3
    if R4 < R:
        o = start
        while o + 4 <= stop:
            w0, w1, w2, w3 = w[o], w[o + 1], w[o + 2], w[o + 3]
            for r in range(R4, R):
                xr = x[r]
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for k in range(C_in):
                    xk = xr[k]
                    a0 += np.float32(w0[k]) * xk
                    a1 += np.float32(w1[k]) * xk
                    a2 += np.float32(w2[k]) * xk
                    a3 += np.float32(w3[k]) * xk
                y[r, o], y[r, o + 1], y[r, o + 2], y[r, o + 3] = a0, a1, a2, a3
            o += 4
        for o in range(o, stop):
            wo = w[o]
            for r in range(R4, R):
                xr = x[r]
                acc = np.float32(0.0)
                for k in range(C_in):
                    acc += np.float32(wo[k]) * xr[k]
                y[r, o] = acc
    for o in range(start, stop):
        for r in range(R):
            y[r, o] = (y[r, o] if s is None else y[r, o] * s[o]) + b[o]


def float_rows(x_at, w_at, b_at, y_at, R, C_in, C_out):
    """dot_rows over float32 weights, no scale."""
    dot_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(float_at(w_at), (C_out, C_in)), None,
             numba.carray(float_at(b_at), (C_out,)), numba.carray(float_at(y_at), (R, C_out)), 0, C_out)


def int8_rows(x_at, w_at, s_at, b_at, y_at, R, C_in, C_out):
    """dot_rows over int8 weights with a scale per output (float32)."""
    dot_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(int8_at(w_at), (C_out, C_in)),
             numba.carray(float_at(s_at), (C_out,)), numba.carray(float_at(b_at), (C_out,)),
             numba.carray(float_at(y_at), (R, C_out)), 0, C_out)


def split_rows(x, w, s, b, y, threads):
    """dot_rows over all outputs, in `threads` runs, one per thread of numba's pool (compiled with parallel=True
    where the pool loads). Each output is the same sum in the same order as on one thread, whichever thread computes
    it: the results are identical."""
    C_out = w.shape[0]
    run = -(-C_out // (4 * threads)) * 4  # a multiple of 4: dot_rows' groups of outputs
    for t in numba.prange(threads):
        dot_rows(x, w, s, b, y, t * run, min(C_out, (t + 1) * run))


def float_split(x_at, w_at, b_at, y_at, R, C_in, C_out, threads):
    """float_rows with the outputs split over `threads` threads (split_rows)."""
    split_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(float_at(w_at), (C_out, C_in)), None,
               numba.carray(float_at(b_at), (C_out,)), numba.carray(float_at(y_at), (R, C_out)), threads)


def int8_split(x_at, w_at, s_at, b_at, y_at, R, C_in, C_out, threads):
    """int8_rows with the outputs split over `threads` threads (split_rows)."""
    split_rows(numba.carray(float_at(x_at), (R, C_in)), numba.carray(int8_at(w_at), (C_out, C_in)),
               numba.carray(float_at(s_at), (C_out,)), numba.carray(float_at(b_at), (C_out,)),
               numba.carray(float_at(y_at), (R, C_out)), threads)


def attend(q_at, q_row, k_at, v_at, kv_row, kv_head, T, m_at, m_row, y_at, N, H, D, scale):
    """y (N, H * D) = softmax(q k^T * scale, masked) v for each of N rows and H heads, one query each: q[n, h] at
    q_at + n * q_row + h * D, key and value t at k_at / v_at + n * kv_row + h * kv_head + t * D (offsets in floats,
    each vector D contiguous floats); the mask's byte t of row n at m_at + n * m_row, nonzero where attended (m_at 0:
    no mask)."""
    q = numba.carray(float_at(q_at), ((N - 1) * q_row + H * D,))
    span = (N - 1) * kv_row + (H - 1) * kv_head + T * D
    k, v = numba.carray(float_at(k_at), (span,)), numba.carray(float_at(v_at), (span,))
    y = numba.carray(float_at(y_at), (N * H * D,))
    mask = numba.carray(int8_at(m_at if m_at != 0 else q_at), ((N - 1) * m_row + T,))
    attend_rows(q, q_row, k, v, kv_row, kv_head, T, np.zeros(N, np.int64), mask, m_at != 0, m_row, y, N, H, D, scale,
                np.empty(T, np.float32), np.zeros((1, 1), np.float32), np.float32(0.0))


def attend_rows(q, q_row, k, v, kv_row, kv_head, T, first, mask, masked, m_row, y, N, H, D, scale, p, kept, share):
    """attend over flat arrays at those offsets, row n over keys first[n] to T - 1 (a row that joined a running batch
    attends from its own first position); p: room for T scores. share, unless 0: each weight times share is added to
    kept (N, T) (a step's weights averaged over its layers and heads)."""
    for n in range(N):
        lo = first[n]
        for h in range(H):
            # slices, each indexed from 0 by its loop: offsets numba cannot prove positive keep the loops scalar
            qo, ko, yo = n * q_row + h * D, n * kv_row + h * kv_head, (n * H + h) * D
            qh, yh = q[qo:qo + D], y[yo:yo + D]
            top = np.float32(-np.inf)
            for t in range(lo, T):
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
            for t in range(lo, T):
                p[t] = np.exp(p[t] - top)
                total += p[t]
            for d in range(D):
                yh[d] = 0.0
            for t in range(lo, T):
                w = p[t] / total
                if share != 0:
                    kept[n, t] += w * share
                vt = v[ko + t * D:ko + t * D + D]
                for d in range(D):
                    yh[d] += w * vt[d]


# A decoder step's layers for a few rows in one call (row_step.py). Each layer's row of the table holds addresses:
# for each of its Linears (LINEARS, in that order) the weight's, its scale's per output (float32; ones for float
# weights) and its bias's, then each norm's weight and bias (NORMS).
LINEARS = ("self_qkv", "self_out", "cross_q", "cross_out", "fc1", "fc2")
NORMS = ("self_norm", "cross_norm", "ffn_norm")
COLUMNS = 3 * len(LINEARS) + 2 * len(NORMS)
# The step's ends (step_layers' ends_at): the target vocabulary V, the target embedding's address, the position table's
# rows P and address, the last norm's weight and bias (0: none), the output layer's weight, scale and bias
ENDS = 9
RELU, GELU, SWISH = 0, 1, 2  # the feed-forward's activation
# what the kernels call, compiled (row_products._compile) before the kernels that call them
HELPERS = ("dot_rows", "attend_rows", "layer_norm", "activate", "claim", "done", "wait", "product", "linear", "norm",
           "residual", "settle", "step_layers", "step_phases", "step_work",
           "block_maxima", "best_of", "insert_best", "best_sums", "ban", "copy", "move_row")


def layer_norm(x, w, b, eps, y):
    """y (N, C) = each row of x (N, C) normalized, times w plus b; y may be x."""
    N, C = x.shape
    for n in range(N):
        xn, yn = x[n], y[n]
        mean = np.float32(0.0)
        for c in range(C):
            mean += xn[c]
        mean /= C
        var = np.float32(0.0)
        for c in range(C):
            d = xn[c] - mean
            var += d * d
        r = np.float32(1.0) / np.sqrt(var / C + eps)
        for c in range(C):
            yn[c] = (xn[c] - mean) * r * w[c] + b[c]


def activate(f, act, lo, hi):
    """The feed-forward's activation over columns lo to hi - 1 of f (N, F), in place: relu, gelu (erf's) or swish."""
    N = f.shape[0]
    for n in range(N):
        fn = f[n]
        for c in range(lo, hi):
            v = fn[c]
            if act == RELU:
                fn[c] = max(v, np.float32(0.0))
            elif act == GELU:
                fn[c] = np.float32(0.5) * v * (np.float32(1.0) + math.erf(v * np.float32(0.7071067811865476)))
            else:
                fn[c] = v / (np.float32(1.0) + np.exp(-v))


# A step on several threads runs as one parallel region, its work in phases, each phase in parts: a product's outputs
# and the attention's rows in one part per thread, the rest (the norms, the residuals, the embedding) in one. A part is
# done by the thread that claims it first (a flag per part, increased atomically); thread t asks for part t first, so
# that each thread reads the same weights at every step, from its own core's cache where they fit. A thread waits for
# a phase's parts to be done before the next phase. A thread that the OS has not started yet, or has stopped, finds
# its parts done by the other, so the step never waits on a thread to begin (numba's pool running the region's
# iterations one after the other still ends the step). One parallel region per product, as before, cost about 1.9 us a
# product at 2 threads: the shipped model's 18 decoder products of a lone row took 87-98 us that way, 62 as phases of
# one region, 115 at 1 thread. The wait spins SPINS times, then yields the core at each look, so that a thread of the
# step that shares its core with it gets to run.
SPINS = 100


def claim(at, k, c, parts):
    """Whether this thread takes part c of phase k: the first to ask does. The counters at `at` hold for each phase a
    flag per part and the parts done, parts + 1 int64."""
    return atomic_add(at + 8 * (k * (parts + 1) + c), 1) == 0


def done(at, k, parts):
    """One more part of phase k done."""
    atomic_add(at + 8 * (k * (parts + 1) + parts), 1)


def wait(at, k, parts, count):
    """Until `count` parts of phase k are done."""
    spins = 0
    while atomic_load(at + 8 * (k * (parts + 1) + parts)) < count:
        if spins < SPINS:
            spin_pause()
            spins += 1
        else:
            sched_yield()


def product(at, k, tid, parts, x, w, s, b, y, act):
    """Phase k: y (N, C_out) = x (N, C_in) (w * s)^T + b (dot_rows), its outputs in `parts` parts (runs of a multiple
    of 4), each followed by the activation `act` over its outputs unless act < 0. Thread tid asks for part tid first:
    a thread reads the same weights at every step where the other keeps up, from its own core's cache where they fit
    (with the parts taken in the order the threads asked, float32 lone searches of the shipped model's twin ran
    0.93-0.97x as fast as with a parallel region per product)."""
    C_out = w.shape[0]
    run = -(-C_out // (4 * parts)) * 4
    for j in range(parts):
        c = (tid + j) % parts
        if claim(at, k, c, parts):
            lo, hi = min(C_out, c * run), min(C_out, (c + 1) * run)
            dot_rows(x, w, s, b, y, lo, hi)
            if act >= 0:
                activate(y, act, lo, hi)
            done(at, k, parts)
    wait(at, k, parts, parts)


def linear(table, i, j, C_out, C_in, dtype):
    """The layer's Linear j: its weight (C_out, C_in) of `dtype`, its scale and its bias (C_out,)."""
    return (numba.carray(void_at(table[i, 3 * j]), (C_out, C_in), dtype),
            numba.carray(float_at(table[i, 3 * j + 1]), (C_out,)), numba.carray(float_at(table[i, 3 * j + 2]), (C_out,)))


def norm(x, table, i, k, eps, y):
    """y = the layer's norm k over x."""
    C = x.shape[1]
    j = 3 * len(LINEARS) + 2 * k
    layer_norm(x, numba.carray(float_at(table[i, j]), (C,)), numba.carray(float_at(table[i, j + 1]), (C,)), eps, y)


def step_layers(x_at, N, C, H, F, table_at, L, dtype, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t,
                c_at, c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale,
                tid, parts, work):
    """Every decoder layer of a step for N rows, x (N, C) at x_at in and out (the embedded tokens, then the last
    layer's output); weights of `dtype` at the addresses of the table (L, COLUMNS); eps the norms'; pre: pre-norm,
    else post-norm; act: RELU, GELU or SWISH. The self-attention cache at kv_at: layer l's keys of row n, head h,
    position p at kv_at + l * kv_layer + n * kv_row + h * kv_head + p * D, its values kv_kv further (offsets in
    floats); the new position t is written there. The source's keys and values likewise at c_at (S positions), its
    mask as in attend (m_at 0: none). w_at, unless 0: the cross-attention weights averaged over the layers and heads,
    (N, S) float32, are added there (the caller zeroes it). s_at, unless 0: each row's first position of its own,
    (N,) int64 (rows that joined a running batch): its self-attention starts there. The ends (ENDS int64 at ends_at:
    the addresses and sizes the step's two ends read):
    - tok_at, unless 0: the rows' tokens (N,) int64, which the kernel embeds into x first: the target embedding
      (V, C) times `embed_scale` plus the position table's row (P, C) of each row's position (t, or t - its first for a
      row that joined; at most P - 1);
    - y_at, unless 0: the logits (N, V) are written there: the last norm over x (none where its weight's address is
      0), then the output layer (weights of `dtype`, a scale per output, a bias).
    Each thread of the step (tid, of `parts`) runs this over the same arguments: the products and the attention in
    `parts` parts (one per thread), the phases' counters and the buffers every thread reads in `work` (step_work)."""
    counters, h, a, o, qkv, f = work
    at = counters.ctypes.data  # the array itself is held in `work`: numba frees an array after its last use
    p = np.empty(max(t + 1, S), np.float32)  # the attention's scores: each thread's own
    rows = -(-N // parts)  # the attention's rows in each of its parts
    D = C // H
    scale = np.float32(D ** -0.5)
    x = numba.carray(float_at(x_at), (N, C))
    table = numba.carray(int64_at(table_at), (L, COLUMNS))
    self_span = (N - 1) * kv_row + (H - 1) * kv_head + (t + 1) * D
    cross_span = (N - 1) * c_row + (H - 1) * c_head + S * D
    mask = numba.carray(int8_at(m_at if m_at != 0 else x_at), ((N - 1) * m_row + S,))
    every = np.zeros(N, np.int64)  # the source's first position, and the cache's where every row began together
    kept = numba.carray(float_at(w_at), (N, S)) if w_at != 0 else np.zeros((1, 1), np.float32)
    share = np.float32(1.0 / (L * H)) if w_at != 0 else np.float32(0.0)
    first = numba.carray(int64_at(s_at), (N,)) if s_at != 0 else every
    ends = numba.carray(int64_at(ends_at), (ENDS,))
    V, P = ends[0], ends[2]
    k = 0  # the phase: each `if claim(at, k, 0, parts):` block is a phase of one part, run by the thread that takes it
    if tok_at != 0:
        if claim(at, k, 0, parts):
            tokens = numba.carray(int64_at(tok_at), (N,))
            embedding, positions = numba.carray(float_at(ends[1]), (V, C)), numba.carray(float_at(ends[3]), (P, C))
            for n in range(N):
                e, row = embedding[tokens[n]], positions[min(t - first[n], P - 1)]
                for c in range(C):
                    x[n, c] = row[c] + embed_scale * e[c]
            done(at, k, parts)
        wait(at, k, parts, 1)
        k += 1
    for i in range(L):
        # self-attention over the cache and the new position, which it stores
        if pre:
            if claim(at, k, 0, parts):
                norm(x, table, i, 0, eps, h)
                done(at, k, parts)
            wait(at, k, parts, 1)
            k += 1
        w, sc, b = linear(table, i, 0, 3 * C, C, dtype)
        product(at, k, tid, parts, h if pre else x, w, sc, b, qkv, -1)
        k += 1
        kc = numba.carray(float_at(kv_at + 4 * i * kv_layer), (self_span,))
        vc = numba.carray(float_at(kv_at + 4 * (i * kv_layer + kv_kv)), (self_span,))
        for j in range(parts):  # each part: its rows' new position stored, and their attention
            c = (tid + j) % parts
            if not claim(at, k, c, parts):
                continue
            r0, r1 = min(N, c * rows), min(N, (c + 1) * rows)
            for n in range(r0, r1):
                for hd in range(H):
                    start = n * kv_row + hd * kv_head + t * D
                    kc[start:start + D] = qkv[n, C + hd * D:C + hd * D + D]
                    vc[start:start + D] = qkv[n, 2 * C + hd * D:2 * C + hd * D + D]
            if r0 < r1:
                attend_rows(qkv.reshape(N * 3 * C)[r0 * 3 * C:], 3 * C, kc[r0 * kv_row:], vc[r0 * kv_row:], kv_row,
                            kv_head, t + 1, first[r0:r1], mask, False, 0, a.reshape(N * C)[r0 * C:], r1 - r0, H, D,
                            scale, p, kept, np.float32(0.0))
            done(at, k, parts)
        wait(at, k, parts, parts)
        k += 1
        w, sc, b = linear(table, i, 1, C, C, dtype)
        product(at, k, tid, parts, a, w, sc, b, o, -1)
        k += 1
        # cross-attention over the source
        settle(at, k, parts, x, o, pre, table, i, 0, eps, h)
        k += 1
        w, sc, b = linear(table, i, 2, C, C, dtype)
        product(at, k, tid, parts, h if pre else x, w, sc, b, o, -1)
        k += 1
        ck = numba.carray(float_at(c_at + 4 * i * c_layer), (cross_span,))
        cv = numba.carray(float_at(c_at + 4 * (i * c_layer + c_kv)), (cross_span,))
        for j in range(parts):  # each part: its rows' attention over their sources
            c = (tid + j) % parts
            if not claim(at, k, c, parts):
                continue
            r0, r1 = min(N, c * rows), min(N, (c + 1) * rows)
            if r0 < r1:
                attend_rows(o.reshape(N * C)[r0 * C:], C, ck[r0 * c_row:], cv[r0 * c_row:], c_row, c_head, S,
                            every[r0:r1], mask[r0 * m_row:], m_at != 0, m_row, a.reshape(N * C)[r0 * C:], r1 - r0, H,
                            D, scale, p, kept[r0:r1] if w_at != 0 else kept, share)
            done(at, k, parts)
        wait(at, k, parts, parts)
        k += 1
        w, sc, b = linear(table, i, 3, C, C, dtype)
        product(at, k, tid, parts, a, w, sc, b, o, -1)
        k += 1
        # feed-forward
        settle(at, k, parts, x, o, pre, table, i, 1, eps, h)
        k += 1
        w, sc, b = linear(table, i, 4, F, C, dtype)
        product(at, k, tid, parts, h if pre else x, w, sc, b, f, act)
        k += 1
        w, sc, b = linear(table, i, 5, C, F, dtype)
        product(at, k, tid, parts, f, w, sc, b, o, -1)
        k += 1
        settle(at, k, parts, x, o, pre, table, i, 2, eps, h)
        k += 1
    if y_at != 0:
        last = x
        if ends[4] != 0:
            if claim(at, k, 0, parts):
                layer_norm(x, numba.carray(float_at(ends[4]), (C,)), numba.carray(float_at(ends[5]), (C,)), eps, h)
                done(at, k, parts)
            wait(at, k, parts, 1)
            k += 1
            last = h
        w = numba.carray(void_at(ends[6]), (V, C), dtype)
        product(at, k, tid, parts, last, w, numba.carray(float_at(ends[7]), (V,)), numba.carray(float_at(ends[8]), (V,)),
                numba.carray(float_at(y_at), (N, V)), -1)


def step_phases(L):
    """The most phases of a step of L layers (step_layers): the embedding; in each layer a pre-norm's first norm, the
    six products, the two attentions and the three residuals; the last norm and the output layer."""
    return 1 + 12 * L + 2


def step_work(N, C, F, L, parts):
    """What every thread of a step shares (step_layers' `work`): the phases' counters (zeros) and the buffers the phases
    write and read."""
    return (np.zeros((parts + 1) * step_phases(L), np.int64), np.empty((N, C), np.float32),
            np.empty((N, C), np.float32), np.empty((N, C), np.float32), np.empty((N, 3 * C), np.float32),
            np.empty((N, F), np.float32))


def residual(x, o, pre, table, i, k, eps):
    """x += o, then post-norm's norm k."""
    x += o
    if not pre:
        norm(x, table, i, k, eps, x)


def settle(at, k, parts, x, o, pre, table, i, r, eps, h):
    """Phase k, one part: the residual r (residual), then with pre-norm the next sublayer's norm into h (none after the
    feed-forward, r 2)."""
    if claim(at, k, 0, parts):
        residual(x, o, pre, table, i, r, eps)
        if pre and r < 2:
            norm(x, table, i, r + 1, eps, h)
        done(at, k, parts)
    wait(at, k, parts, 1)


def float_step(x_at, N, C, H, F, table_at, L, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t, c_at, c_layer,
               c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale, threads):
    """step_layers over float32 weights, on this thread (threads is 1)."""
    work = step_work(N, C, F, L, 1)
    step_layers(x_at, N, C, H, F, table_at, L, np.float32, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t,
                c_at, c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale, 0,
                1, work)


def int8_step(x_at, N, C, H, F, table_at, L, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t, c_at, c_layer,
              c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale, threads):
    """step_layers over int8 weights, on this thread (threads is 1)."""
    work = step_work(N, C, F, L, 1)
    step_layers(x_at, N, C, H, F, table_at, L, np.int8, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t,
                c_at, c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale, 0,
                1, work)


def float_step_split(x_at, N, C, H, F, table_at, L, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t, c_at,
                     c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale,
                     threads):
    """step_layers over float32 weights on `threads` threads of numba's pool, one parallel region (compiled with
    parallel=True)."""
    work = step_work(N, C, F, L, threads)
    for tid in numba.prange(threads):
        step_layers(x_at, N, C, H, F, table_at, L, np.float32, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head,
                    t, c_at, c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at,
                    embed_scale, tid, threads, work)


def int8_step_split(x_at, N, C, H, F, table_at, L, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head, t, c_at,
                    c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at, embed_scale,
                    threads):
    """step_layers over int8 weights on `threads` threads of numba's pool, one parallel region."""
    work = step_work(N, C, F, L, threads)
    for tid in numba.prange(threads):
        step_layers(x_at, N, C, H, F, table_at, L, np.int8, eps, pre, act, kv_at, kv_layer, kv_kv, kv_row, kv_head,
                    t, c_at, c_layer, c_kv, c_row, c_head, S, m_at, m_row, w_at, s_at, ends_at, tok_at, y_at,
                    embed_scale, tid, threads, work)


def block_maxima(x, B, maxima):
    """maxima[b] = the largest of x's block b of B values (the last block may be shorter), each whole block's in vector
    lanes -> whether x holds a NaN (which the maxima do not show)."""
    n = x.size
    whole = n - n % B
    nan = False
    for c in range(0, whole, B):
        top = x[c]
        nan |= top != top
        for j in range(1, B):
            v = x[c + j]
            top = v if v > top else top
            nan |= v != v
        maxima[c // B] = top
    if whole < n:
        top = x[whole]
        for j in range(whole, n):
            v = x[j]
            top = v if v > top else top
            nan |= v != v
        maxima[whole // B] = top
    return nan


def best_of(x, maxima):
    """The index of x's largest value, the first where it repeats, NaN counting as the largest (the first NaN), as
    torch's max gives it: the first block of 16 holding the largest maximum (block_maxima, into maxima: room for
    a block each), then the first place in it (torch's max with its index reads each element on its own: an
    8,000-element row 1.5 us here against 5.7)."""
    B = 16
    if block_maxima(x, B, maxima):
        for k in range(x.size):
            if x[k] != x[k]:
                return k
    best = np.float32(-np.inf)
    at = -1
    for b in range(-(-x.size // B)):
        if maxima[b] > best:
            best, at = maxima[b], b
    if at < 0:  # every value -inf
        return 0
    for k in range(at * B, x.size):
        if x[k] == best:
            return k
    return at * B


def ban(row, banned, eos, ban_eos):
    """The banned ids of one row of log-probs set to -inf, and eos too with ban_eos."""
    for j in range(banned.size):
        row[banned[j]] = -np.inf
    if ban_eos:
        row[eos] = -np.inf


def pick_rows(lp_at, N, V, banned_at, n_banned, eos, ban_eos, force_at, forced, scores_at, tokens_at, prefix_at,
              prefix_row, column):
    """Greedy search's choice for N rows of log-probs lp (N, V) float32: the banned ids (n_banned int64 at
    banned_at) and, with ban_eos, eos set to -inf in lp; a row whose byte at force_at (unless 0) is nonzero takes eos
    at log-prob `forced` (search.AT_MAX_EOS); every other row its best token (best_of). Each row's token goes to
    tokens (N,) int64 and to its prefix row's place `column` (prefix_at + n * prefix_row, in int64s); its log-prob is
    added to scores (N,) float32. Returns how many rows took eos."""
    lp = numba.carray(float_at(lp_at), (N, V))
    banned = numba.carray(int64_at(banned_at if n_banned else tokens_at), (n_banned,))
    force = numba.carray(int8_at(force_at if force_at != 0 else lp_at), (N,))
    scores = numba.carray(float_at(scores_at), (N,))
    tokens = numba.carray(int64_at(tokens_at), (N,))
    prefix = numba.carray(int64_at(prefix_at), ((N - 1) * prefix_row + column + 1,))
    ended = 0
    maxima = np.empty(-(-V // 16), np.float32)
    for n in range(N):
        row = lp[n]
        ban(row, banned, eos, ban_eos)
        if force_at != 0 and force[n] != 0:
            token, value = eos, forced
        else:
            token = best_of(row, maxima)
            value = row[token]
        scores[n] += value
        tokens[n] = token
        prefix[n * prefix_row + column] = token
        ended += token == eos
    return ended


def insert_best(v, i, values, indices, count, k):
    """Puts value v at index i into the best `count` of values/indices (largest first, the earlier index first among
    ties: i comes after every index there) where it belongs among the best k -> the new count."""
    if count == k:
        if not v > values[k - 1]:
            return count
        count -= 1
    j = count
    while j > 0 and v > values[j - 1]:
        values[j], indices[j] = values[j - 1], indices[j - 1]
        j -= 1
    values[j], indices[j] = v, i
    return count + 1


def best_sums(rows, scores, k, maxima, top_v, top_i):
    """The k best of rows (W, n) float32 plus each row's score (W,) into top_v / top_i (the value; the index w * n + j),
    best first, the earlier index first among ties, without writing the sums. Each block of 32 takes its maximum in
    vector lanes, plus its row's score (a float sum keeps the order, so that is the block's largest sum); the k-th
    largest of those maxima bounds the k-th best sum from below (the k blocks with the largest maxima hold k sums at
    least as large; with fewer blocks than k, the least of them: every block is read), so only the blocks whose maximum
    reaches it are read again. maxima: room for W x the blocks of a row. Returns False where a row holds a NaN."""
    B = 32
    W, n = rows.shape
    blocks = -(-n // B)
    for w in range(W):
        if block_maxima(rows[w], B, maxima[w * blocks:(w + 1) * blocks]):
            return False
        for b in range(blocks):
            maxima[w * blocks + b] += scores[w]
    count = 0
    for b in range(W * blocks):
        count = insert_best(maxima[b], b, top_v, top_i, count, k)
    bound = top_v[count - 1]
    count = 0
    for w in range(W):
        row, s = rows[w], scores[w]
        for b in range(blocks):
            if maxima[w * blocks + b] >= bound:
                for j in range(b * B, min(n, b * B + B)):
                    count = insert_best(row[j] + s, w * n + j, top_v, top_i, count, k)
    return True


def top_rows(s_at, N, n, k, v_at, i_at):
    """The k best of each row of scores (N, n) float32 -> values (N, k) float32 and indices (N, k) int64, best first,
    the earlier index first among ties (best_sums, each row alone, no score added). Returns False where a row holds a
    NaN (torch's topk, which counts NaN as the largest, then gives the caller every row's)."""
    scores = numba.carray(float_at(s_at), (N, n))
    values = numba.carray(float_at(v_at), (N, k))
    indices = numba.carray(int64_at(i_at), (N, k))
    maxima = np.empty(-(-n // 32), np.float32)
    top_v, top_i = np.empty(k, np.float32), np.empty(k, np.int64)
    none = np.zeros(1, np.float32)
    for r in range(N):
        if not best_sums(scores[r:r + 1], none, k, maxima, top_v, top_i):
            return False
        for j in range(k):
            values[r, j], indices[r, j] = top_v[j], top_i[j]
    return True


def beam_rows(lp_at, G, W, V, banned_at, n_banned, eos, ban_eos, force_at, forced, scores_at, k, v_at, i_at):
    """Beam search's k best candidates of each of G sentences of W rows: lp (G * W, V) float32 log-probs, the banned
    ids (n_banned int64 at banned_at) and, with ban_eos, eos set to -inf in it; the rows of a sentence whose byte at
    force_at (unless 0) is nonzero made -inf but for eos, which takes `forced` (search.AT_MAX_EOS); then each row's
    beam score (G, W) at scores_at added. The k best of each sentence's W x V candidates -> values (G, k) float32 and
    flat indices (G, k) int64 (row within the sentence * V + token), best first, the earlier index first among ties:
    torch.topk's of lp.view(G, W, V) + scores[:, :, None], without writing the sums (best_sums). Returns False where
    a row holds a NaN (the caller's tensor calls then take the step, masking lp again)."""
    lp = numba.carray(float_at(lp_at), (G * W, V))
    banned = numba.carray(int64_at(banned_at if n_banned else i_at), (n_banned,))
    force = numba.carray(int8_at(force_at if force_at != 0 else lp_at), (G,))
    scores = numba.carray(float_at(scores_at), (G * W,))
    values = numba.carray(float_at(v_at), (G, k))
    indices = numba.carray(int64_at(i_at), (G, k))
    maxima = np.empty(W * -(-V // 32), np.float32)
    top_v, top_i = np.empty(k, np.float32), np.empty(k, np.int64)
    for g in range(G):
        for r in range(g * W, g * W + W):
            ban(lp[r], banned, eos, ban_eos)
            if force_at != 0 and force[g] != 0:
                lp[r, :] = -np.inf
                lp[r, eos] = forced
        if not best_sums(lp[g * W:g * W + W], scores[g * W:g * W + W], k, maxima, top_v, top_i):
            return False
        for j in range(k):
            values[g, j], indices[g, j] = top_v[j], top_i[j]
    return True


def move_rows(kv_at, blocks, block, row, heads, head, span, parents_at, n):
    """Row i of a cache's self-attention buffer becomes old row parents[i] (n int64 at parents_at, each below n), in
    place: the buffer at kv_at holds `blocks` blocks (a layer's keys, its values) `block` floats apart, in each row r's
    head h from r * row + h * head, of which the first `span` floats are copied (the positions stored). A row that
    keeps its own history is not touched. A row is written once every row that reads its old history has been; where
    rows read each other's in a cycle (beams swapping parents), one of them is kept aside first.
    -> False, nothing written, where a parent is not a row (below 0 or from n on)."""
    kv = numba.carray(float_at(kv_at), ((blocks - 1) * block + (n - 1) * row + (heads - 1) * head + span,))
    parents = numba.carray(int64_at(parents_at), (n,))
    for i in range(n):
        if parents[i] < 0 or parents[i] >= n:
            return False
    readers = np.zeros(n, np.int64)  # rows not yet written that read each row's old history
    written = np.zeros(n, np.bool_)
    for i in range(n):
        if parents[i] == i:
            written[i] = True
        else:
            readers[parents[i]] += 1
    ready = np.empty(n, np.int64)  # rows whose old history no row still needs
    count = 0
    for i in range(n):
        if not written[i] and readers[i] == 0:
            ready[count] = i
            count += 1
    while count:
        count -= 1
        i = ready[count]
        move_row(kv, parents[i], i, blocks, block, row, heads, head, span)
        written[i] = True
        p = parents[i]
        readers[p] -= 1
        if readers[p] == 0 and not written[p]:
            ready[count] = p
            count += 1
    kept = np.empty((blocks, heads, span), np.float32)
    for c in range(n):  # what is left is cycles: each row read by the next
        if written[c]:
            continue
        for b in range(blocks):
            for h in range(heads):
                at = b * block + c * row + h * head
                copy(kv[at:at + span], kept[b, h])
        i = c
        while True:
            p = parents[i]
            written[i] = True
            if p == c:
                for b in range(blocks):
                    for h in range(heads):
                        to = b * block + i * row + h * head
                        copy(kept[b, h], kv[to:to + span])
                break
            move_row(kv, p, i, blocks, block, row, heads, head, span)
            i = p
    return True


def move_row(kv, p, i, blocks, block, row, heads, head, span):
    """Row p's history copied into row i (move_rows)."""
    # slices indexed from 0 by their loops (offsets numba cannot prove positive keep a loop scalar)
    for b in range(blocks):
        for h in range(heads):
            at, to = b * block + p * row + h * head, b * block + i * row + h * head
            copy(kv[at:at + span], kv[to:to + span])


def copy(x, y):
    """y[:] = x[:], two slices that do not overlap."""
    for j in range(x.size):
        y[j] = x[j]
