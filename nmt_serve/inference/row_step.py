"""A decoder step of a few rows on the CPU in one call: numba's kernel (row_kernels.step_layers).

A lone sentence's greedy step through the runner's layers is about 70 tensor calls and their Python around 19
products: on the shipped model's twin (2-core AMD EPYC, 1 thread) the products took 212 us of a 326 us step, the
rest of it norms, residual adds, views, the cache's copies and attention, each a microsecond or more from Python.
The kernel runs every decoder layer for the step's rows in one call: the same products (row_kernels.dot_rows over
the weights the Linears hold for a lone row, float32 or int8, split over the step's threads where they split), the
norms, the attention over the cache's keys and values where they are (storing the new position there) and over the
source, the residuals and the activation. Whole lone greedy searches of the twin ran 1.24x (float32) and 1.52x
(int8) as fast at 1 thread, 1.38x and 1.62x at 2 (BENCHMARKS.md), translations identical.

The step's two ends are the kernel's too where it reads them: it embeds the tokens (the embedding times its scale
plus each row's position; an embedding with a norm of its own, mBART's, is the runner's), and computes the logits
(the last norm and the output layer, over the weights a lone row reads) of an int8 step of up to row_products.ROWS
rows and a float step of any it takes; an int8 output layer past row_products' limit (fbgemm's) is the runner's.
Lone greedy searches 1.03x as fast at 1 and 2 threads.

On more threads than one the step is one parallel region of numba's pool (row_kernels.float_step_split,
int8_step_split), its products and attention in a part per thread and the rest on one, where it was one region per
product: the shipped model's twin, a lone sentence at 2 threads, searches 1.17x (float32 greedy), 1.09x (beam 4), 1.23x
(int8 greedy) and 1.08x (int8 beam 4) as fast, translations identical (BENCHMARKS.md).

Rows that joined a running batch (continuous batching) attend from their own first position, and a step that keeps
its cross-attention weights gets them from the kernel's attention, averaged over layers and heads. Where the kernel
does not apply the runner steps as before: more rows than ROWS_PER_THREAD a thread, a grouped cache (beams of larger
batches), weights the kernels do not read (an Intel CPU's small float weights keep their transposed copy for a few
rows, `model_runner.reads_rows`), a norm other than LayerNorm, an activation other than relu, gelu and swish, or
numba absent.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from nmt_serve.inference import row_products

# the most rows a step takes through the kernel, per thread its products split over: the kernel's products compute a
# dot product per row and output, where oneDNN's packed product of many rows is a matrix product (the shipped model's
# twin, whole searches against the runner's own step, AMD EPYC: 4 rows 1.18-1.27x at 1 thread and 1.45-1.67x at 2;
# 8 rows 0.91-0.97x at 1 thread and 1.17-1.25x at 2)
ROWS_PER_THREAD = 4
ENABLED = True  # tests turn the kernel off to hold the runner's own step to the same results

_ACTIVATIONS = {torch.relu: 0, F.relu: 0, F.gelu: 1, F.silu: 2}  # row_kernels.RELU, GELU, SWISH


SIGNATURE = f"void({', '.join(['intp'] * 7)}, float32, boolean, {', '.join(['intp'] * 20)}, float32, intp)"


@functools.cache
def _kernels():
    from nmt_serve.inference import row_kernels

    kernels = (row_products.compile_kernel(row_kernels.float_step, SIGNATURE),
               row_products.compile_kernel(row_kernels.int8_step, SIGNATURE))
    return kernels if None not in kernels else None


@functools.cache
def _split_kernels():
    """The step on several threads in one parallel region (row_kernels.float_step_split, int8_step_split), or None
    where numba's pool does not serve: the step then runs on one thread."""
    from nmt_serve.inference import row_kernels

    kernels = (row_products.compile_parallel_kernel(row_kernels.float_step_split, SIGNATURE),
               row_products.compile_parallel_kernel(row_kernels.int8_step_split, SIGNATURE))
    return kernels if None not in kernels else None


def available() -> bool:
    """Whether the kernel runs in this process (compiling it on the first call)."""
    return ENABLED and row_products.available() and _kernels() is not None


class RowStep:
    """A runner's decoder layers as the kernel reads them: a table of their tensors' addresses, and those of the step's
    two ends, the target embedding and the output layer (made again when the runner's tensors move:
    ModelRunner.refresh_key)."""

    def __init__(self, runner, kernel, split_kernel, tensors: list[list[torch.Tensor]], ends: list, eps: float,
                 activation: int, embeds: bool, outputs: bool):
        self.kernel = kernel
        self.split_kernel = split_kernel  # the step on several threads (None: every step on one)
        self.held = tensors  # what the table's addresses point into, and the ones that scale float weights
        self.held_ends = ends  # the ends' sizes, and the tensors their addresses point into
        self.table = torch.tensor([[t.data_ptr() for t in row] for row in tensors], dtype=torch.int64)
        self.ends = torch.tensor([t.data_ptr() if isinstance(t, torch.Tensor) else t for t in ends], dtype=torch.int64)
        self.eps, self.activation = eps, activation
        self.C, self.H, self.F = runner.d_model, runner.n_heads, runner.config.d_ff
        self.V = runner.tgt_embedding.size(0)
        self.pre = runner.pre_norm
        self.scale = float(runner.embed_scale)
        self.embeds = embeds  # whether the kernel embeds the tokens
        # the most rows whose logits the kernel computes (0: none): an int8 output layer's rows as the runner's own
        # takes them to the kernel, no more (from 3 rows fbgemm's quantized product was the faster: beam 4 of one
        # sentence on the shipped model's twin 0.87-0.92x as fast through the kernel)
        self.output_rows = (row_products.ROWS if runner.quantization == "int8" else 1 << 30) if outputs else 0
        self.grad = runner.tgt_embedding.requires_grad

    @classmethod
    def of(cls, runner) -> "RowStep | None":
        """The runner's step as the kernel runs it, or None where it cannot (see the module's docstring)."""
        if runner.device.type != "cpu" or not available():
            return None
        activation = _ACTIVATIONS.get(runner.activation)
        int8 = runner.quantization == "int8"
        if activation is None or runner.model.output_proj.weight.dtype != torch.float32:
            return None
        rows, norms = [], []
        # float weights' scales: ones, one tensor for all (the kernel reads the first C_out)
        V = runner.tgt_embedding.size(0)
        ones = torch.ones(max(runner.config.d_ff, 3 * runner.d_model, V))
        for w in runner.decoder_layers:
            row = []
            for linear in (w.self_qkv, w.self_out, w.cross_q, w.cross_out, w.ffn.fc1, w.ffn.fc2):
                if getattr(linear, "rows", None) is None:
                    return None
                row += [linear.rows, linear.rows_scale if int8 else ones, linear.rows_bias]
            for norm in (w.self_norm, w.cross_norm, w.ffn.norm):
                if norm is None or norm.shape != (runner.d_model,):
                    return None
                norms.append(norm)
                row += [norm.weight if norm.weight is not None else torch.ones(runner.d_model),
                        norm.bias if norm.bias is not None else torch.zeros(runner.d_model)]
            rows.append(row)
        held = [t for row in rows for t in row]
        if len({n.eps for n in norms}) != 1 or not all(
                t.is_contiguous() and t.dtype in (torch.float32, torch.int8) and t.device.type == "cpu" for t in held):
            return None
        embedding, positions = runner.tgt_embedding.detach(), runner.tgt_positions.detach()
        embeds = (runner.tgt_embed_norm is None and embedding.dtype == positions.dtype == torch.float32
                  and embedding.is_contiguous() and positions.is_contiguous())
        last, output = runner.decoder_norm, runner.output
        weight = getattr(output, "rows", None)
        outputs = (weight is not None and weight.dtype == held[0].dtype and weight.shape == (V, runner.d_model)
                   and (last is None or (last.shape == (runner.d_model,) and last.eps == norms[0].eps)))
        if outputs:
            scale = output.rows_scale if int8 else ones
            last_w = (last.weight if last.weight is not None else torch.ones(runner.d_model)) if last is not None else 0
            last_b = (last.bias if last.bias is not None else torch.zeros(runner.d_model)) if last is not None else 0
            out = [last_w, last_b, weight, scale, output.rows_bias]
        else:
            out = [0] * 5
        ends = [V, embedding if embeds else 0, positions.size(0), positions if embeds else 0] + out
        split = _split_kernels()
        return cls(runner, _kernels()[int8], split[int8] if split else None, rows, ends, norms[0].eps, activation,
                   embeds, outputs)

    def threads(self, tokens: torch.Tensor, cache) -> int:
        """The threads the kernel takes this step on (torch's, where the step on several threads runs: split_kernel), 0
        where it does not take it. It takes tokens (N,), at most ROWS_PER_THREAD rows a thread
        of an ungrouped cache, the tensors laid out as the kernel reads them, where autograd has nothing to follow."""
        threads = torch.get_num_threads() if self.split_kernel is not None else 1
        kv, m, start = cache.cross_kv, cache.src_mask, cache.start
        joined = start is None or (start.dtype == torch.int64 and start.is_contiguous() and len(start) == len(tokens))
        takes = (tokens.size(0) <= ROWS_PER_THREAD * threads and not cache.grouped and joined
                 and not (self.grad and torch.is_grad_enabled()) and kv.stride(-1) == 1
                 and kv.stride(-2) == self.C // self.H and kv.dtype == torch.float32
                 and (m is None or m.stride(-1) == 1))
        return threads if takes else 0

    def __call__(self, tokens: torch.Tensor, x: torch.Tensor | None, cache, threads: int,
                 weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The step on `threads` threads (what `threads` gave) for tokens (N,): the kernel embeds them where it does
        (`embeds`; else x (N, C) holds them embedded) -> the last layer's output (N, C) and the logits (N, V), which
        the kernel computes for up to `output_rows` rows (else None: the runner's output layer's). The new position is
        stored in the cache, which advances. weights: zeros (N, S) float32, contiguous, S the cache's source positions,
        to receive the step's cross-attention weights averaged over layers and heads (what the attention maps'
        alignment and source entropy read)."""
        N = tokens.size(0)
        kv = cache.with_room()
        ckv, mask, start = cache.cross_kv, cache.src_mask, cache.start
        if self.embeds:
            tokens = tokens if tokens.dtype == torch.int64 and tokens.is_contiguous() else tokens.long().contiguous()
            x = torch.empty(N, self.C)
        y = torch.empty(N, self.V) if N <= self.output_rows else None
        split = row_products._share(threads) if threads > 1 else 1
        kernel = self.split_kernel if split > 1 else self.kernel
        m_at, m_row = (mask.data_ptr(), mask.stride(0)) if mask is not None else (0, 0)
        s, c = kv.stride(), ckv.stride()  # (layer, key/value, row, head, ...)
        kernel(x.data_ptr(), N, self.C, self.H, self.F, self.table.data_ptr(), self.table.size(0), self.eps, self.pre,
               self.activation, kv.data_ptr(), s[0], s[1], s[2], s[3], cache.length, ckv.data_ptr(), c[0], c[1], c[2],
               c[3], ckv.size(4), m_at, m_row, weights.data_ptr() if weights is not None else 0,
               start.data_ptr() if start is not None else 0, self.ends.data_ptr(),
               tokens.data_ptr() if self.embeds else 0, y.data_ptr() if y is not None else 0, self.scale, split)
        cache.advance()
        return x, y
