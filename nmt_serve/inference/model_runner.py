"""The model runner that search runs on: the encoder, and the decoder one new token at a time.

It computes what `Transformer.encode` and `Transformer.decode` compute (the tests hold it to that),
with the per-call work cut down. At batch 1 a decoder step is a few hundred small tensor operations,
so their number matters as much as their size:
- q/k/v come from one matmul on a fused (3C, C) weight, and the cross-attention keys/values of every
  decoder layer from one matmul over the source (done once per search);
- the embedding's scale by sqrt(d_model) and the positions enter one add (`alpha`): no scaled copy
  of the table, which in a model with a large vocabulary (256k x 1024 in NLLB) is its largest tensor,
  usually shared with the output layer; the logits bias is the output matmul's bias;
- layers call tensor functions directly rather than through nn.Module calls and closures;
- on the CPU the Linear products are oneDNN's, on weights prepacked for it when the memory plan
  allows (FloatLinear);
- a step writes its new keys/values to the cache in one copy per layer, and attention needs no mask
  for one new token (nor for a source in which no row is padded);
- on the CPU the encoder's Linears, and the cross-attention keys/values, multiply only the rows of
  real tokens of a padded batch (`real_rows`): only attention needs the (B, S) layout.
The nn.Module path (`Transformer.encode/decode`) stays the reference: it trains, it returns attention
probabilities, and `SearchOptions(use_cache=False)` decodes with it.

The runner is built from a model (`ModelRunner(model)`, by the Translator or whoever searches); the model
knows nothing of it. The fused weights are copies, unless the owner asks for `share_storage`: then
the model's own parameters become views into them, so that a served model holds its weights once.
Packed weights are copies by design (oneDNN's layout is opaque), which the memory plan counts; with
`share_storage` the transposed copies laid out for a lone row (FloatLinear) are where the model's own
weights then live (W as a view of W^T), so that a packed model holds its Linear weights twice, not
three times. `ModelRunner.is_current()` says whether the model's parameters and buffers are still the
ones it was made from (keyed on each tensor's storage and version counter), so an owner that trains
between searches remakes it rather than decoding with stale weights.

Linear layers may run in int8 (`quantization="int8"`, CPU only): weights quantized per output
channel, activations quantized dynamically per call (fbgemm; the output layer of a large batch through
oneDNN's kernel, on the same int8 weights), but for a decoder step of one or two rows, which multiplies
the int8 values with the rows left in float32 (row_products). It is an option with a measured BLEU
cost (see the model cards and BENCHMARKS.md), never the default. Because an activation scale covers
the whole batch, a sentence's int8 translation can depend on the other sentences in its batch (35 of
200 test sentences differed between alone and batched, beam 4); in float32 it never does.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt_serve.inference import row_attention, row_products, row_step
from nmt_serve.inference.cache import KVCache
from nmt_serve.inference.small_products import batched_matmul, through_openblas
from nmt_serve.network.masks import additive_bias, padding_mask
from nmt_serve.network.transformer import Transformer

QUANTIZATIONS = ("none", "int8")

# From this many rows on, a decoder step's attention (one query per row) runs as batched matmuls
# (ModelRunner._matmul_attention): on a 2-core AMD EPYC, keys and values out of cache, 1 and 2 threads,
# scaled_dot_product_attention's kernel took 1.3-2.4x as long at 32 and 128 rows, where at 2 and 4
# rows it was the faster one (8-16 against 16-21 us).
MATMUL_ATTENTION_MIN_ROWS = 16


def onednn_runs(weight: torch.Tensor) -> bool:
    """Whether a Linear with this weight runs through oneDNN: on the CPU, in float32 or bfloat16 (the
    CPU's bfloat16 support permitting). float16 has no fast oneDNN path on most CPUs; CUDA has cuBLAS."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


# oneDNN picks the packed layout for a number of rows; from 4 on the choice is the same (measured on the
# OPUS-MT shape's layers, 1-128 rows), and a layout packed for 1 row is slower for every other count
PACK_ROWS = 4


def linear_shapes(cfg) -> list[tuple[int, int]]:
    """(C_out, C_in) of every Linear the runner holds, fused as ModelRunner fuses them: q/k/v of self-
    attention in one, the cross-attention keys/values of all decoder layers in one (for the memory plan)."""
    C, F = cfg.d_model, cfg.d_ff
    encoder = [(3 * C, C), (C, C), (F, C), (C, F)] * cfg.n_encoder_layers
    return encoder + [(cfg.n_decoder_layers * 2 * C, C)] + step_linear_shapes(cfg)


def step_linear_shapes(cfg) -> list[tuple[int, int]]:
    """(C_out, C_in) of the Linears a decoder step calls: each decoder layer's, and the output layer."""
    C, F = cfg.d_model, cfg.d_ff
    return [(3 * C, C), (C, C), (C, C), (C, C), (F, C), (C, F)] * cfg.n_decoder_layers + [(cfg.tgt_vocab_size, C)]


def lone_row_elements(cfg, threads: int = 1, *, float32: bool = True) -> int:
    """Elements of the lone row's weights that a float runner sharing the model's storage (the engine's)
    keeps beside its packed weights and the model's: its transposed copies hold the model's weights, so
    only the column blocks of small weights (copies of their own) are more."""
    total = 0
    for o, i in linear_shapes(cfg):
        blocks = keeps_blocks(o, i, threads, float32=float32)
        if blocks > 1 and o * i <= FEW_ROWS_ELEMENTS:
            total += blocks * (o - (blocks - 1) * (o // blocks)) * i
    return total


def lone_row_copies(out_features: int, in_features: int) -> bool:
    """Whether the lone row's layout at 1 thread is a transposed copy of a weight, (C_in, C_out), or the
    weight as it is. One row times a (C_in, C_out) weight streams it as rows of outputs to add up, which
    is faster where the output is at least as wide as the input (1 thread, a 2-core AMD EPYC, weights
    cycled out of cache: 256->1024 40 against 83 us, 256->768 25 against 35, 256->8000 378 against
    1,010); where the input is wider, the weight as it is gives dot products of long rows and wins for
    one row (1024->256: 48 against 81 us). Where more rows than one read the layout (`rows_of_lone_row`)
    it is always a copy: at 32 rows on a 2-core Intel Xeon, 1 thread, ATen's product on the weight as it
    is took 153 us for 1024->256 against 96 on the copy and 129 on oneDNN's packed weight."""
    return in_features <= out_features or rows_of_lone_row(out_features * in_features) > 1


def few_rows(vendor: str) -> int:
    """The most rows that take a lone row's layout rather than oneDNN's packed weight, on a CPU of this
    vendor (/proc/cpuinfo's vendor_id), for a weight of at most FEW_ROWS_ELEMENTS. On a 2-core Intel
    Xeon (AVX-512, AMX), every Linear of a decoder step run in turn at 1 thread (the step's weights
    cycled through the cache as a search cycles them), packed / lone row's layout per call: at 4 rows
    1.28-2.1x for the shipped model's weights (256x256 to 256x1024), at 32 rows 1.11-1.68x, at 64 rows
    1.13-1.43x, at 256 rows the packed weight ahead (0.86x for the whole step); larger weights lost from
    4 rows on (OPUS-MT's 512x1536 and up 0.65-0.87x, its 58101x512 output layer 0.56-0.78x) while
    512x512 held (0.99-1.14x). Whole searches of the shipped model's twin, 8 rows against 64: greedy
    batch 32 1.08-1.10x at 1 thread and 1.11x at 2, beam 4 batch 8 (32 rows) 1.12x and 1.10x, identical
    outputs (BENCHMARKS.md). On a 2-core AMD EPYC the packed weights were the faster from 2 rows on (the
    column blocks lost on most shapes at 2, 4 and 8 rows)."""
    return 64 if vendor == "GenuineIntel" else 1


FEW_ROWS_ELEMENTS = 512 * 512  # 1 MiB in float32: the weights for which a few rows take the lone row's layout


def block_columns(vendor: str) -> int:
    """The columns of each block of a small weight's lone-row layout on a CPU of this vendor, 0 for
    one block per thread. On a 2-core AMD EPYC (Zen 4) a row times blocks 32 columns wide ran 1.6-2.2x
    as fast as one block per thread at 2 threads and 1.4-2.5x as fast as the transposed copy at 1 (every
    weight of the shipped model's decoder, out of cache: 256x256 11 against 23 us at 2 threads, 256->1024
    27 against 52-69, 1024->256 29 against 48-66; OPUS-MT's 512x512 26 against 50): MKL's product of
    one row by a narrow block reads it at about the rate a sum of the weights does (40 GB/s here), where
    its wider products and its gemv reach 13-25. 16 columns ran as fast, 64 1.5x slower. The Intel Xeons
    of the sessions before were measured with one block per thread only, which they keep."""
    return 32 if vendor == "AuthenticAMD" else 0


def cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


FEW_ROWS = few_rows(cpu_vendor())
BLOCK_COLUMNS = block_columns(cpu_vendor())


def lone_row_blocks(out_features: int, in_features: int, threads: int, *, float32: bool = True) -> int:
    """How many blocks of output columns a weight's lone-row layout on `threads` threads has (1: the
    transposed weight, no blocks): a small float32 weight's are BLOCK_COLUMNS wide where that is set (MKL's
    products, measured; a bfloat16 one runs elsewhere), a large weight's (views of one transposed copy, where
    narrow blocks ran 3-5x slower) one per thread."""
    if BLOCK_COLUMNS and float32 and out_features * in_features <= FEW_ROWS_ELEMENTS:
        return max(threads, -(-out_features // BLOCK_COLUMNS))
    return threads


def reads_rows(out_features: int, in_features: int, threads: int, *, float32: bool = True) -> bool:
    """Whether a lone row reads the weight as it is, (C_out, C_in), through row_products' kernel (FloatLinear's
    `rows`): a float32 weight that no more rows than one read (`rows_of_lone_row`), laid out for one thread, or for
    more where the kernel splits its outputs over them (`row_products.splits`), where the kernel runs. The kernel
    streams W at the rate a sum of it does (1.6-1.8x the column blocks at one thread). Without the split, the blocks
    run side by side at two threads and were as fast as it (383-456 against 434-492 us for the shipped model's 19
    products of a step), so a runner laid out for more threads keeps them alone. Where a few rows read the layout
    (an Intel CPU's small weights) they keep the transposed copy, which the kernel does not replace from 3 rows on."""
    return (float32 and rows_of_lone_row(out_features * in_features) == 1 and row_products.available()
            and (threads == 1 or row_products.splits()))


def keeps_blocks(out_features: int, in_features: int, threads: int, *, float32: bool = True) -> int:
    """The column blocks a weight's lone-row layout holds (`lone_row_blocks`), 0 where none: a weight the kernel reads
    as it is (`reads_rows`) keeps them only where the kernel cannot split, for a lone row stepped on more threads
    (CpuRoom's lone search), where they run side by side (a whole greedy search of one sentence 1.12-1.19x the
    one-thread kernel's on 2 threads); where it splits, its two threads ran that search 1.06-1.38x the one-thread
    kernel's and the blocks' 1.1-1.3x (the shipped model, 2-core AMD EPYC, BENCHMARKS.md)."""
    blocks = lone_row_blocks(out_features, in_features, threads, float32=float32)
    if reads_rows(out_features, in_features, threads, float32=float32) and (blocks == 1 or row_products.splits()):
        return 0
    return blocks


def rows_of_lone_row(elements: int) -> int:
    """The most rows that read the lone row's layout of a weight of this many elements (`few_rows`)."""
    return FEW_ROWS if elements <= FEW_ROWS_ELEMENTS else 1


def lone_row_threads(threads: int, *, packed: bool, quantization: str) -> int:
    """The threads a lone row's own weights are laid out for, 0 for none: beside packed float weights
    (FloatLinear) at any thread count; the int8 engine's lone row reads its int8 weights. The runner and
    the memory plan both ask here."""
    return threads if packed and quantization == "none" else 0


def real_rows(src_mask: torch.Tensor) -> torch.Tensor | None:
    """src_mask (B, 1, 1, S) -> the flat indices (n,) of the real tokens' rows of (B * S, C), where the
    Linears of the encoder (and the cross-attention keys/values) skip the padding's rows; None where
    nothing is padded, and off the CPU. A batch of 32 Multi30k test sentences in their order is 47%
    padding; there the encoder and the keys/values took 24-27 against 35-39 ms a batch, and greedy
    batch 32 ran 1.06-1.09x (float32, outputs identical: a row's product does not depend on the
    others; BENCHMARKS.md). On CUDA the gather and scatter would be launches of their own, the check
    a wait for the device, and the captured encoder keeps its fixed shapes."""
    if src_mask.device.type != "cpu":
        return None
    flat = src_mask.reshape(-1)
    return None if bool(flat.all()) else flat.nonzero().squeeze(1)


class FloatLinear:
    """y = x W^T + b, W (C_out, C_in).

    On the CPU (onednn_runs) the product is oneDNN's, not ATen's BLAS call: on a 2-core AMD EPYC, MKL's
    sgemm ran the OPUS-MT shape's output layer (58,101 x 512) 2.5x slower at 1 row and gained nothing
    from a second thread, where oneDNN scales (BENCHMARKS.md). `packed`: the weight is copied once into
    oneDNN's blocked layout for this CPU (prepacked), which runs 1.5-3x faster again from 2 rows on; it
    costs a second copy of the weight, so the memory plan decides. Without it oneDNN reads the
    (C_out, C_in) weight as it is.

    `rows` (where row_products' kernel runs and only a lone row reads the layout, laid out for one thread or for
    any where the kernel splits over threads: `reads_rows`): one or two rows go through that kernel over W as it
    is, (C_out, C_in), W itself where it is contiguous, instead of the transposed copy or view below, their outputs
    split over torch's threads of the moment. Where the kernel cannot split, the column blocks of a small weight
    on AMD stay beside W (`keeps_blocks`), and a lone row stepped on more threads than one reads them.
    `lone_row` (the engine's thread count, 0 for none): a lone row (greedy search of one sentence),
    and on CPUs where it pays up to FEW_ROWS rows of a small weight (a beam, a batch of a few dozen
    sentences), reads W laid out for it. There oneDNN's fixed cost per call outweighs its kernel, and
    ATen's addmm on the transposed weight is 1.2-4.7x faster per layer of the shipped model at 1
    thread; from how many rows on the packed weight is the faster one depends on the CPU and the
    weight's size (`few_rows`). The layout has T blocks of output columns (`lone_row_blocks`): one per
    thread, or on CPUs where narrow blocks pay (`block_columns`) a small weight's are BLOCK_COLUMNS wide.
    - T = 1: W transposed, (C_in, C_out): a copy where the output is at least as wide as the input, else
      a view of W where only a lone row reads it (`lone_row_copies`; the runner's wider-input weights are
      never fused temporaries, so the view holds nothing the model does not).
    - T > 1: (T, C_in, block), W^T in T blocks of output columns, `block_step` apart and the last ending
      at C_out (where T does not divide C_out, neighbours share a few columns): ATen's gemv of one row
      runs on one thread, where a batched matmul of T blocks runs them side by side (one block per
      thread at 2 threads: 1.6x faster than the transposed copy on the shipped model's output layer,
      1.3-1.8x on its others). A large weight's blocks (past FEW_ROWS_ELEMENTS: only a lone row reads
      them) are views into one transposed copy, a small one's a copy of their own: views of a small
      weight ran 1.0-1.2x as long at 1 row, of a large one 0.9-1.2x (one block per thread; views of
      narrow blocks 3-5x, this 2-core VM, alternating runs).
    `transposed`: the (C_in, C_out) copy where there is one; W^T of it is W, which the runner's owner may
    hold as a view of it (ModelRunner's share_storage) instead of a copy of its own. The memory plan
    counts the copies (not the views)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool = False, lone_row: int = 0):
        self.out_features = weight.size(0)
        self.bias = bias
        self.onednn = onednn_runs(weight)
        pack = packed and self.onednn
        self.lone_row = self.lone_row_bias = self.transposed = None
        self.n_blocks, self.in_order = 0, False  # column blocks; whether one row's (T, 1, block) output is in order
        self.few_rows = rows_of_lone_row(weight.numel())  # rows that read the lone row's layout
        transposed = weight.detach().t()  # (C_in, C_out)
        C_in, C_out = transposed.shape
        float32 = weight.dtype == torch.float32
        n_blocks = keeps_blocks(C_out, C_in, lone_row, float32=float32) if lone_row and self.onednn else 0
        # W as it is for row_products' kernel (W itself where it is contiguous: no copy); it replaces a transposed copy
        # or view, and column blocks only where the kernel cannot split its outputs over threads (keeps_blocks)
        self.rows = self.rows_bias = None
        if self.onednn and lone_row and reads_rows(C_out, C_in, lone_row, float32=float32):
            self.rows = weight.detach().contiguous()
            self.rows_bias = bias.detach().contiguous() if bias is not None else weight.new_zeros(C_out)
        # rows a thread the kernel takes past ROWS (row_products.FLOAT_ROWS_PER_THREAD)
        self.rows_per_thread = (row_products.FLOAT_ROWS_PER_THREAD if weight.numel() <= row_products.FLOAT_ROWS_ELEMENTS
                                else row_products.ROWS)
        if self.onednn and n_blocks == 1:
            if lone_row_copies(C_out, C_in):
                self.lone_row = self.transposed = transposed.contiguous()
            else:  # a view: reading W as it is pays
                self.lone_row = transposed
        elif self.onednn and n_blocks > 1:
            self.block_step = C_out // n_blocks
            block = C_out - (n_blocks - 1) * self.block_step
            self.n_blocks, self.in_order = n_blocks, block == self.block_step
            whole = transposed.contiguous()
            blocks = whole.as_strided((n_blocks, C_in, block), (self.block_step, C_out, 1))  # (T, C_in, block)
            if weight.numel() > FEW_ROWS_ELEMENTS:
                self.lone_row, self.transposed = blocks, whole
            else:
                self.lone_row = blocks.contiguous()
            if bias is not None:
                self.lone_row_bias = bias.detach().contiguous().as_strided((n_blocks, 1, block), (self.block_step, block, 1))
        # a packed weight replaces the plain one: a fused weight's plain copy is then dropped
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS) if pack else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is not None and x.is_contiguous() and not x.requires_grad:
            shape = x.shape
            rows = shape[0] if len(shape) == 2 else x.numel() // shape[-1]
            # the checks written out: a step calls this 19 times at a few microseconds each (rows hold float32); a lone
            # row on more threads reads the column blocks where they are kept (keeps_blocks), else the kernel splits;
            # a few more rows (a short source's encoder) go through it too, rows_per_thread a thread
            threads = torch.get_num_threads()
            if ((rows > 1 or threads == 1 or not self.n_blocks) if rows <= row_products.ROWS
                    else rows <= self.rows_per_thread * (threads if row_products.splits() else 1)):
                y = row_products.float_rows(x, self.rows, self.rows_bias, rows, threads)
                return y if len(shape) == 2 else y.view(*shape[:-1], self.out_features)
        w = self.lone_row
        shape = x.shape
        if self.in_order and len(shape) == 2 and shape[0] == 1:
            # one row, blocks that hold its outputs in order: greedy search of one sentence calls this a few
            # dozen times a step, where every tensor call and check counts (a microsecond or two each)
            blocks = x.expand(self.n_blocks, 1, shape[-1])
            y = torch.bmm(blocks, w) if self.lone_row_bias is None else torch.baddbmm(self.lone_row_bias, blocks, w)
            return y.view(1, self.out_features)  # ints: view() parses a shape's tuple at 2-3x the cost
        rows = x.numel() // x.size(-1)
        if w is not None and 0 < rows <= self.few_rows:
            # x as (M, C_in) without a call where it already is (at batch 1 a step's hundreds of tensor calls cost as
            # much as its products)
            x2 = x if x.dim() == 2 else x.reshape(rows, x.size(-1))
            if w.dim() == 3:  # column blocks: (T, M, C_in) x (T, C_in, block)
                blocks = x2.expand(w.size(0), rows, x.size(-1))
                y = torch.bmm(blocks, w) if self.lone_row_bias is None else torch.baddbmm(self.lone_row_bias, blocks, w)
                step = self.block_step
                if self.in_order and rows == 1:  # (T, 1, block) holds the outputs in order
                    return y.view(*x.shape[:-1], self.out_features)
                if self.in_order:  # (T, M, block) -> (M, T * block): a copy
                    y = y.transpose(0, 1).reshape(rows, -1).contiguous()
                else:  # each block's first `step` columns, then the last block's rest
                    y = torch.cat((y[:, :, :step].transpose(0, 1).reshape(rows, -1), y[-1, :, step:]), dim=1)
                return y.reshape(*x.shape[:-1], self.out_features)
            y = torch.mm(x2, w) if self.bias is None else torch.addmm(self.bias, x2, w)
            return y if x2 is x else y.view(*x.shape[:-1], self.out_features)
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


# The output layer of the int8 engine (thousands of outputs) runs through oneDNN's u8 x s8 kernel from
# this many rows on; fbgemm stays ahead below, and on the narrower weights of the layers at every row
# count. Measured as a step sees it (`python -m bench.int8_kernels --sections step`: every weight once
# per step, so none is hot in cache), oneDNN's output layer made a step's products 0.92-0.96x as fast
# on the shipped shape at 32 rows, 0.94-1.01 at 64 and 1.9-2.1x at 256; at OPUS-MT's 0.91-1.07 at 32,
# 1.02-1.06 at 64, 1.4-1.9 from 128. Whole int8 searches, 64 against 32 here: greedy batch 32 (32 rows
# at the start) 1.01-1.04x on the shipped twin, 0.98 and 1.04 at OPUS-MT's shape; beam 4 batch 8 1.11x.
ONEDNN_INT8_MIN_ROWS = 64


@functools.cache
def onednn_int8_runs() -> bool:
    """Whether this PyTorch build has oneDNN's quantized linear (x86 builds with mkldnn) and it is exact on
    this CPU. Without VNNI (AVX2 only: AMD Zen 2 and 3, Intel before Cascade Lake) it sums the u8 x s8
    products in pairs into int16, which saturates with 8-bit activations: one step above the zero point
    against the largest weight already overflows (on an AMD EPYC with AVX2 a row of 130s against 127s came
    out 8,160 for 16,256, and the output layer's logits were off by up to a third of their range). fbgemm's
    7-bit activations (reduce_range) do not overflow, so there it serves every row count."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_pointwise")):
        return False
    width = 64
    weight = torch.ops.onednn.qlinear_prepack(torch.full((8, width), 127, dtype=torch.int8), None)
    x = torch.full((ONEDNN_INT8_MIN_ROWS, width), 130, dtype=torch.uint8)  # 2 above the zero point
    y = torch.ops.onednn.qlinear_pointwise(x, 1.0, 128, weight, torch.ones(8), torch.zeros(8, dtype=torch.long), None,
                                           1.0, 0, torch.float32, "none", [], "")
    return bool((y == 2 * 127 * width).all())


class Int8Linear:
    """y = x W^T + b with W in int8 (one scale per output channel) and x quantized on the fly, however
    few the rows: in a decoder step the weights come from the CPU's last-level cache or memory, not from
    a hot L2, and reading a quarter of the bytes outweighs fbgemm's cost per call even for one row of
    a 256x256 weight (BENCHMARKS.md: greedy batch 1 of the shipped model 1.2-1.6x over running the calls
    below 2M multiply-adds on the float32 weights, beam 4 batch 1 1.8-2.1x). Timed alone, its weight
    hot in cache, one row of a small layer is faster in float32: not what a step sees.
    `wide` (the output layer): from ONEDNN_INT8_MIN_ROWS rows on, oneDNN's kernel with the same int8
    weights, x quantized per call to uint8 around 128 (symmetric, 8 bits: fbgemm's reduce_range uses 7).
    `step` (the decoder step's Linears): one or two rows read the int8 values as they are through
    row_products' kernel, x in float32, which streams them at about the rate a sum of them does where
    fbgemm spends 12 us a call before reading a byte (the shipped model's 19 products of a step at one
    thread: 222-228 against 374-397 us; greedy batch 1 1.56x, BENCHMARKS.md). It holds the int8 values a
    second time, plainly (fbgemm's packed copy is opaque), which the memory plan counts. Weights past
    row_products.INT8_MAX_BYTES (a large output layer) stay with fbgemm, whose threads split them."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, wide: bool = False, step: bool = False):
        """step: a Linear of the decoder step, which a lone row (or two) calls."""
        self.out_features = weight.size(0)
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError("int8 quantization needs PyTorch's fbgemm engine (x86 CPUs); it is not available here")
        weight = weight.detach().float().cpu()
        scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-8)
        zero = torch.zeros(weight.size(0), dtype=torch.long)
        with warnings.catch_warnings():
            # quantized tensors are deprecated in favor of torchao; the fbgemm kernels are what we use
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
        b = bias.detach().float().cpu() if bias is not None else None
        self.packed = torch.ops.quantized.linear_prepack(qweight, b)
        # a row or two read the int8 values as they are, with the row in float32 (row_products): a plain copy
        # beside fbgemm's packed one, which the memory plan counts
        self.rows = self.rows_scale = self.rows_bias = None
        if step and weight.numel() <= row_products.INT8_MAX_BYTES and row_products.available():
            self.rows = qweight.int_repr().contiguous()
            self.rows_scale = scale.float().contiguous()
            self.rows_bias = b.contiguous() if b is not None else torch.zeros(self.out_features)
        self.onednn = None
        if wide and onednn_int8_runs():
            # the same int8 values as fbgemm's, in oneDNN's layout (a second copy: the memory plan counts it)
            self.onednn = torch.ops.onednn.qlinear_prepack(qweight.int_repr(), None)
            self.scale, self.zero, self.bias = scale.float(), zero, b

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            shape = x.shape
            if len(shape) == 2 and shape[0] <= row_products.ROWS and x.is_contiguous() and not x.requires_grad:
                return row_products.int8_rows(x, self.rows, self.rows_scale, self.rows_bias, shape[0],
                                              torch.get_num_threads())
        rows = x.numel() // x.size(-1)
        if self.onednn is not None and rows >= ONEDNN_INT8_MIN_ROWS:
            x2 = x.reshape(rows, x.size(-1))
            x_scale = float(x2.abs().amax()) / 127.0 or 1.0
            qx = torch.round(x2 / x_scale).add_(128).clamp_(0, 255).to(torch.uint8)
            y = torch.ops.onednn.qlinear_pointwise(qx, x_scale, 128, self.onednn, self.scale, self.zero, self.bias,
                                                   1.0, 0, torch.float32, "none", [], "")
            return y.view(*x.shape[:-1], self.out_features)
        # reduce_range: 7-bit activations, which fbgemm needs on CPUs without VNNI to avoid overflow
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


Linear = FloatLinear | Int8Linear


@dataclass
class Norm:
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    eps: float
    shape: tuple[int, ...]  # the normalized trailing dims

    @classmethod
    def of(cls, module: nn.Module) -> "Norm | None":
        if not isinstance(module, nn.LayerNorm):
            return None
        return cls(module.weight, module.bias, module.eps, tuple(module.normalized_shape))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # torch.layer_norm itself: F.layer_norm's Python checks cost about as much as a lone row's norm
        return torch.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


@dataclass
class FeedForwardWeights:
    fc1: Linear
    fc2: Linear
    norm: Norm


@dataclass
class EncoderLayerWeights:
    qkv: Linear  # (3C, C): q, k, v stacked
    out: Linear
    attn_norm: Norm
    ffn: FeedForwardWeights


@dataclass
class DecoderLayerWeights:
    self_qkv: Linear  # (3C, C): q, k, v stacked
    self_out: Linear
    self_norm: Norm
    cross_q: Linear
    cross_out: Linear
    cross_norm: Norm
    ffn: FeedForwardWeights


def view_into(modules: tuple[nn.Linear, ...], weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """The modules' weights (and biases) become views of their rows of `weight` (C_out of all, C_in), `bias`."""
    start = 0
    for m in modules:
        rows = m.weight.size(0)
        m.weight.data = weight[start:start + rows]
        if bias is not None:
            m.bias.data = bias[start:start + rows]
        start += rows


def weights_key(model: nn.Module) -> tuple:
    """Changes whenever any parameter or buffer is replaced or modified in place. Read off the modules'
    own tables, each module once: parameters() and buffers() took 0.15-0.27 ms on the shipped model (this:
    0.09), which an owner asking for its runner before each sentence paid each time."""
    key = []
    stack, seen = [model], set()
    while stack:
        module = stack.pop()
        if module is None or id(module) in seen:  # a submodule slot left empty, or a module shared (tied)
            continue
        seen.add(id(module))
        for t in module._parameters.values():
            if t is not None:
                key.append((t.data_ptr(), t._version))
        for t in module._buffers.values():
            if t is not None:
                key.append((t.data_ptr(), t._version))
        stack.extend(module._modules.values())
    return tuple(key)


class ModelRunner:
    # plain tensors even when built under inference_mode, so that they may be used outside it too
    @torch.inference_mode(False)
    @torch.no_grad()
    def __init__(self, model: Transformer, quantization: str = "none", *, share_storage: bool = False,
                 packed_weights: bool = True):
        """share_storage: the model's fused parameters become views of the runner's tensors (no copy;
        the values are unchanged, so the model computes what it did). packed_weights: on the CPU, every
        float Linear weight also gets oneDNN's packed copy (FloatLinear), faster and held beside the
        model's own."""
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        if quantization == "int8" and model.output_proj.weight.device.type != "cpu":
            raise ValueError("int8 quantization runs on CPU only")
        cfg = model.config
        self.model = model  # the reference path (search without cache) and the staleness check
        self.config = cfg
        self.quantization = quantization
        self.device = model.output_proj.weight.device
        self.n_heads, self.head_dim, self.d_model = cfg.n_heads, cfg.head_dim, cfg.d_model
        self.pre_norm = cfg.norm_placement == "pre"
        # a few rows' attention through numba's kernel (row_attention): on the CPU, in float32
        self.row_attention = (self.device.type == "cpu" and model.output_proj.weight.dtype == torch.float32
                              and row_attention.available())
        activation = model.decoder_layers[0].ffn.activation
        # torch.relu itself: F.relu's Python wrapper is a microsecond a call, a step has one per layer
        self.activation = torch.relu if activation is F.relu else activation
        pack = packed_weights and quantization == "none" and onednn_runs(model.output_proj.weight)
        self.packed_weights = pack
        lone_row = lone_row_threads(torch.get_num_threads(), packed=pack, quantization=quantization)

        def of(*modules: nn.Linear, bias: torch.Tensor | None = None, wide: bool = False, step: bool = False) -> Linear:
            """One Linear computing several that read the same input, outputs side by side; `bias`: the
            one Linear's bias where the module has none of its own (the output layer's logits bias); `step`: one
            the decoder step calls (step_linear_shapes)."""
            if len(modules) > 1:
                bias = torch.cat([m.bias for m in modules])
            elif bias is None:
                bias = modules[0].bias
            weight = modules[0].weight if len(modules) == 1 else torch.cat([m.weight for m in modules])  # one: no copy
            if share_storage and len(modules) > 1 and not pack:
                view_into(modules, weight, bias)  # the weights are held once
            if quantization == "int8":
                return Int8Linear(weight, bias, wide=wide, step=step)
            linear = FloatLinear(weight, bias, packed=pack, lone_row=lone_row)
            if share_storage and linear.rows is not None and len(modules) > 1:
                view_into(modules, linear.rows, bias)  # the fused weight the kernel reads holds the modules' weights
            if share_storage and linear.transposed is not None:
                # held once beside the packed copy: the model's weights become views of the lone row's transposed
                # copy (a tied output layer's too: the embedding's rows then come from a column of it, +2 us for one
                # row of a 16,000 x 256 table, +31 us of a 256,206 x 1,024 one, 0.3-0.4% of the row's output product)
                view_into(modules, linear.transposed.t())
            return linear

        def ffn(layer, step: bool = False) -> FeedForwardWeights:
            return FeedForwardWeights(of(layer.ffn.fc1, step=step), of(layer.ffn.fc2, step=step), Norm.of(layer.ffn_block.norm))

        self.embed_scale = model.embed_scale
        self.src_embedding = model.src_embed.weight  # (V_src, C), unscaled
        self.tgt_embedding = model.tgt_embed.weight
        self.src_positions = model.position_table("src").to(self.src_embedding.dtype)  # (P, C)
        self.tgt_positions = model.position_table("tgt").to(self.tgt_embedding.dtype)  # (P, C)
        self.src_embed_norm, self.tgt_embed_norm = Norm.of(model.src_embed_norm), Norm.of(model.tgt_embed_norm)
        self.encoder_layers = [
            EncoderLayerWeights(
                qkv=of(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                out=of(layer.self_attn.out_proj),
                attn_norm=Norm.of(layer.attn_block.norm),
                ffn=ffn(layer),
            )
            for layer in model.encoder_layers
        ]
        self.encoder_norm = Norm.of(model.encoder_norm)
        self.decoder_layers = [
            DecoderLayerWeights(
                self_qkv=of(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, step=True),
                self_out=of(layer.self_attn.out_proj, step=True),
                self_norm=Norm.of(layer.self_block.norm),
                cross_q=of(layer.cross_attn.q_proj, step=True),
                cross_out=of(layer.cross_attn.out_proj, step=True),
                cross_norm=Norm.of(layer.cross_block.norm),
                ffn=ffn(layer, step=True),
            )
            for layer in model.decoder_layers
        ]
        # keys and values of every decoder layer's cross-attention from one matmul: (n_layers * 2C, C)
        self.cross_kv = of(*[m for layer in model.decoder_layers for m in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)])
        self.decoder_norm = Norm.of(model.decoder_norm)
        self.output = of(model.output_proj, bias=model.logits_bias, wide=True, step=True)
        self.key = weights_key(model)  # after share_storage re-pointed the model's tensors
        self.shared_weights = None  # the file its tensors are mapped from, where the engines share them (shared_weights.py)
        self.row_step = row_step.RowStep.of(self)  # a step of a few rows in one kernel call, where it runs

    def is_current(self) -> bool:
        """False once any parameter or buffer of the model was replaced or changed in place (writes
        through `.data` bypass the version counters: remake the runner after those)."""
        return self.key == weights_key(self.model)

    def refresh_key(self) -> None:
        """The model's tensors were moved without a change of values (shared_weights): this runner stays current."""
        self.key = weights_key(self.model)
        self.row_step = row_step.RowStep.of(self)  # its table holds the tensors' addresses

    # ------------------------------------------------------------------ shared pieces
    def _residual(self, x: torch.Tensor, out: torch.Tensor, norm: Norm) -> torch.Tensor:
        """The residual sum after a sublayer; post-norm normalizes it here, pre-norm did so before."""
        return x + out if self.pre_norm else norm(x + out)

    def _feed_forward(self, x: torch.Tensor, w: FeedForwardWeights) -> torch.Tensor:
        h = w.norm(x) if self.pre_norm else x
        return self._residual(x, w.fc2(self.activation(w.fc1(h))), w.norm)

    # ------------------------------------------------------------------ encoder
    def encode(self, src: torch.Tensor, *, always_mask: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) right-padded ids -> encoder states (B, S, C) and the source mask (B, 1, 1, S).
        Attention skips the mask where nothing is padded, which asks the device; always_mask: it never
        asks (a captured program may not read the device back), the mask is always applied. On the
        CPU a padded batch runs its Linears on the real tokens' rows only (`real_rows`); the states of
        padding positions are then zeros, which attention masks out like any others."""
        B, S = src.shape
        C, H, D = self.d_model, self.n_heads, self.head_dim
        assert S <= self.src_positions.size(0), f"sequence longer than max_positions={self.src_positions.size(0)}"
        src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        attn_mask = src_mask if always_mask or not bool(src_mask.all()) else None
        x = torch.add(self.src_positions[:S], F.embedding(src, self.src_embedding), alpha=self.embed_scale)  # (B, S, C)
        if self.src_embed_norm is not None:
            x = self.src_embed_norm(x)
        real = real_rows(src_mask) if attn_mask is not None and not always_mask else None  # (n,) or None
        if real is not None:
            x = x.view(B * S, C).index_select(0, real)  # (n, C): the real tokens' rows
            # attention needs (B, S): every layer writes the real rows of one buffer, the padding's stay zeros
            padded = x.new_zeros(B * S, 3 * C)
        for w in self.encoder_layers:
            h = w.attn_norm(x) if self.pre_norm else x
            qkv = w.qkv(h)  # (B, S, 3C), or (n, 3C)
            if real is not None:  # the padding's rows as zeros, which attention masks out
                qkv = padded.index_copy_(0, real, qkv)
            q, k, v = qkv.view(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, S, D) each
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)  # (B, S, H, D)
            a = a.reshape(B, S, C) if real is None else a.reshape(B * S, C).index_select(0, real)
            x = self._residual(x, w.out(a), w.attn_norm)
            x = self._feed_forward(x, w.ffn)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        if real is not None:
            x = x.new_zeros(B * S, C).index_copy_(0, real, x).view(B, S, C)
        return x, src_mask

    # ------------------------------------------------------------------ decoder
    def new_cache(self, states: torch.Tensor, src_mask: torch.Tensor, capacity: int = 32, group_size: int = 1) -> KVCache:
        """Encoder states (B, S, C) and their mask -> a cache holding every layer's cross keys/values;
        group_size K > 1: beams of K rows for each of the B sentences (B * K rows), reordered by
        ancestry, the source held once per sentence (see cache.py)."""
        # a source without padding needs no mask, and attention without one is faster
        mask = None if bool(src_mask.all()) else src_mask
        return KVCache(self.source_kv(states, mask), mask, capacity, group_size)

    def source_kv(self, states: torch.Tensor, src_mask: torch.Tensor | None = None, *, contiguous: bool = True) -> torch.Tensor:
        """Encoder states (B, S, C) -> every decoder layer's cross-attention keys/values, (n_layers, 2, B, H, S, D).
        src_mask (B, 1, 1, S): on the CPU only the real tokens' rows are multiplied, the padding's keys
        and values are zeros (attention masks them out). contiguous=False: a permuted view of the projection's
        output, for a caller that copies it into a buffer of its own anyway."""
        B, S, C = states.shape
        real = real_rows(src_mask) if src_mask is not None else None
        if real is None:
            kv = self.cross_kv(states)  # (B, S, n_layers * 2 * C)
        else:
            kv = self.cross_kv(states.reshape(B * S, C).index_select(0, real))  # (n, n_layers * 2 * C)
            kv = kv.new_zeros(B * S, kv.size(-1)).index_copy_(0, real, kv)
        kv = kv.view(B, S, len(self.decoder_layers), 2, self.n_heads, self.head_dim).permute(2, 3, 0, 4, 1, 5)
        return kv.contiguous() if contiguous else kv

    def _grouped_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Self-attention of one new token per row when the cache reorders by ancestry.

        q (N, H, 1, D); k, v (G, H, T * K, D) as the cache holds them: the keys of each group of K rows,
        position by position, each row's history spread over its group. Each group's K queries attend to
        all of its keys in one product, and the cache's group bias leaves each query the positions of its
        own history. Returns (N, C)."""
        N, H, D = q.size(0), self.n_heads, self.head_dim
        K = cache.group_size
        queries = q.view(N // K, K, H, D).transpose(1, 2)  # (G, H, K, D)
        out = self._matmul_attention(queries, k, v, cache.group_bias())  # (G, H, K, D)
        return out.transpose(1, 2).reshape(N, H * D)

    @staticmethod
    def _matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
                          weights: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Attention of a step as two batched matmuls: q (E, H, Q, D), the Q queries of each of E entries
        (a row, or a group of rows that share the keys); k, v (E, H, S, D); bias (E, 1, 1, S) or (E, H, Q, S),
        0 or -inf, or None. Returns (E, H, Q, D). Faster on the CPU than scaled_dot_product_attention's kernel for
        many rows (see MATMUL_ATTENTION_MIN_ROWS) and for a group's K queries (32 groups of 4, 25 source
        tokens: 1.1-1.3x at 1 thread, 2-4x at 2). weights: a list that receives the attention weights,
        (E, H, Q, S)."""
        E, H, S, D = k.shape
        Q = q.size(2)
        probs = ModelRunner._attention_probs(q, k, bias)
        if weights is not None:
            weights.append(probs.view(E, H, Q, S))
        return batched_matmul(probs, v.reshape(E * H, S, D)).view(E, H, Q, D)

    @staticmethod
    def _attention_probs(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """q (E, H, Q, D), k (E, H, S, D), bias (E, 1, 1, S), (E, H, Q, S) or None -> softmax(q k^T / sqrt(D) + bias),
        (E * H, Q, S)."""
        E, H, S, D = k.shape
        Q = q.size(2)
        queries, keys = q.reshape(E * H, Q, D), k.reshape(E * H, S, D).transpose(1, 2)
        if bias is None:
            scores = batched_matmul(queries, keys).mul_(D ** -0.5)
        elif through_openblas(queries, keys):  # the bias added after the product, broadcast over heads where it can be
            scores = torch.add(bias, batched_matmul(queries, keys).view(E, H, Q, S), alpha=D ** -0.5).view(E * H, Q, S)
        else:
            scores = torch.baddbmm(bias.expand(E, H, Q, S).reshape(E * H, Q, S), queries, keys, alpha=D ** -0.5)
        return torch.softmax(scores, dim=-1)

    def _cross_weights(self, queries: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Every layer's cross-attention weights of a step of few rows, averaged over layers and heads: queries,
        (L, N, C), against the source keys of all layers at once, (N, S). Below MATMUL_ATTENTION_MIN_ROWS
        the step attends through the fused kernel, which keeps no weights; scoring them here, beside it, rather than
        attending through matmuls when they are asked for, leaves the translation what it is without them (the
        service asks for them for its quality check), and one product for all layers costs less (one sentence's
        step 1-2% less)."""
        L, N, H, D = queries.size(0), queries.size(1), self.n_heads, self.head_dim
        keys = cache.cross_kv.select(1, 0)  # (L, N, H, S, D): one entry per row (the few-rows step is never grouped)
        S = keys.size(-2)
        bias = cache.src_bias()  # (N, 1, 1, S) or None: the same for every layer
        if bias is not None:
            bias = bias.expand(L, N, 1, 1, S).reshape(L * N, 1, 1, S)
        probs = self._attention_probs(queries.view(L * N, H, 1, D), keys.reshape(L * N, H, S, D), bias)
        return probs.view(L, N, H, S).sum(dim=(0, 2)).mul_(1 / (L * H))

    def embed_target(self, tokens: torch.Tensor, positions: torch.Tensor | int) -> torch.Tensor:
        """Decoder input: tokens (N,) at their positions -> (N, C), scaled, positioned (and normalized)."""
        x = torch.add(self.tgt_positions[positions], F.embedding(tokens, self.tgt_embedding), alpha=self.embed_scale)
        return self.tgt_embed_norm(x) if self.tgt_embed_norm is not None else x

    def step(self, tokens: torch.Tensor, cache: KVCache, cross: list[torch.Tensor] | None = None) -> torch.Tensor:
        """tokens (N,): the newest token of each row -> logits (N, V) of the token after it. cross: a
        list that receives each row's cross-attention over the cache's source positions, (N, S),
        averaged over layers and heads (what the attention maps' alignment and source entropy read)."""
        N, C, H, D = tokens.size(0), self.d_model, self.n_heads, self.head_dim
        assert N == cache.batch_size, f"{N} tokens for a cache of {cache.batch_size} rows"
        P = self.tgt_positions.size(0)
        assert cache.start is not None or cache.length < P, f"target longer than max_positions={P}"
        pre = self.pre_norm
        threads = self.row_step.threads(tokens, cache) if self.row_step is not None else 0
        if threads:  # the whole step in one kernel call (the embedding and the output layer too, where it can)
            x = None if self.row_step.embeds else self.embed_target(tokens, self._positions(cache))
            weights = torch.zeros(N, cache.cross_kv.size(4)) if cross is not None else None
            x, logits = self.row_step(tokens, x, cache, threads, weights)
            if weights is not None:
                cross.append(weights)
            return logits if logits is not None else self._logits(x)
        x = self.embed_target(tokens, self._positions(cache))  # (N, C)
        self_mask = cache.self_mask()  # None unless rows joined a running batch
        matmuls = N >= MATMUL_ATTENTION_MIN_ROWS and not cache.grouped
        self_bias = None
        if matmuls and self_mask is not None:
            self_bias = additive_bias(self_mask, x.dtype)
        weights = [] if cross is not None else None  # every layer's cross-attention weights (where matmuls give them)
        queries = []  # with `cross` and few rows: every layer's cross-attention queries, scored after the step
        for i, w in enumerate(self.decoder_layers):
            # self-attention over every cached position and the new one
            h = w.self_norm(x) if pre else x
            qkv = w.self_qkv(h).view(N, 3, H, 1, D)
            k, v = cache.append(i, qkv[:, 1:])  # (N, H, t+1, D) each
            if cache.grouped:
                a = self._grouped_attention(qkv[:, 0], k, v, cache)
            elif matmuls:
                a = self._matmul_attention(qkv[:, 0], k, v, self_bias).view(N, C)
            elif self.row_attention and N <= row_attention.ROWS and self_mask is None:
                a = row_attention.attend(qkv, k, v, None)  # each row's queries are its first C values
            else:
                a = F.scaled_dot_product_attention(qkv[:, 0], k, v, attn_mask=self_mask).view(N, C)
            x = self._residual(x, w.self_out(a), w.self_norm)
            # cross-attention over the source
            h = w.cross_norm(x) if pre else x
            ck, cv = cache.cross(i)  # (E, H, S, D) each: per row, or per group of K rows
            q = w.cross_q(h)  # (N, C)
            if cache.grouped:  # the K rows of a group share their source: its K queries attend to it at once
                K = cache.group_size
                q = q.view(N // K, K, H, D).transpose(1, 2)  # (G, H, K, D)
                a = self._matmul_attention(q, ck, cv, cache.src_bias(), weights).transpose(1, 2).reshape(N, C)
            elif matmuls:  # the weights are the matmuls' (the fused kernel keeps none)
                a = self._matmul_attention(q.view(N, H, 1, D), ck, cv, cache.src_bias(), weights).view(N, C)
            else:
                if self.row_attention and N <= row_attention.ROWS:
                    a = row_attention.attend(q, ck, cv, cache.src_mask)
                else:
                    a = F.scaled_dot_product_attention(q.view(N, H, 1, D), ck, cv, attn_mask=cache.src_mask).view(N, C)
                if cross is not None:
                    queries.append(q)
            x = self._residual(x, w.cross_out(a), w.cross_norm)
            x = self._feed_forward(x, w.ffn)
        cache.advance()
        if queries:
            cross.append(self._cross_weights(torch.stack(queries), cache))
        elif cross is not None:
            # (layers, E, H, Q, S), Q queries per entry: (G, H, K, S) grouped, else (N, H, 1, S) -> (N, S); one
            # reduction for all (a mean per layer costs more than the rest of it on a few rows)
            summed = torch.stack(weights).sum(dim=(0, 2))  # (E, Q, S)
            cross.append(summed.view(N, -1).mul_(1 / (len(weights) * weights[0].size(1))))
        return self._logits(x)

    def _positions(self, cache: KVCache) -> torch.Tensor | int:
        """The position of each row's new token (KVCache.positions), within the position table: rows that left a
        running batch and wait for reuse may run past it (the kernel clamps as this does)."""
        positions = cache.positions()
        return positions if isinstance(positions, int) else positions.clamp(max=self.tgt_positions.size(0) - 1)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """The last decoder layer's output (N, C) -> logits (N, V)."""
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output(x)
