"""The decoder's state in fixed-address buffers, and a one-token step whose shapes come from a few buckets.

A decoder step of this model is ~80 small kernels whose work takes microseconds; launched one by one
from Python, the launches cost more than the work. Here every tensor a step touches lives at a fixed
address, sized once for `max_rows` rows and `max_length` positions:

    self_kv   (n_layers, 2, max_rows, H, max_length, D)             keys/values of the target
    cross_kv  (n_layers, 2, max_rows // group, H, max_length, D)    keys/values of the source
    tokens, pos, src_len  (max_rows,)   each row's newest token, its position, its source length

A decoder for one beam size K (`group=K`) holds a sentence's source keys and values once for its K rows (beams
of one sentence are adjacent rows and share the source): its cross-attention reads them once for K queries,
and the buffer is K times smaller (for beam 4, 38% of all the keys and values a row holds). With group=1 (one
decoder for several beam sizes) every row holds its own copy.

and a step reads the first B rows and the first L positions, B and L rounded up to buckets (B to powers of
two, L to length_buckets: powers of two and the sizes halfway between them). Rows past the real ones and
positions past each row's own length are masked, so a row's result does not depend on the bucket. Each row
carries its own position and source length: rows that joined at different times can decode in one step
(continuous batching builds on this).

`run(key, fn)` runs a function of these buffers. On CUDA the first call of each key runs it eagerly
(the real step, which also warms cuBLAS up) and captures it as a CUDA graph; later calls replay the
graph: one launch per step instead of dozens. All graphs share one memory pool, which holds the
intermediates of the largest, so graph memory is bounded by the largest bucket, not by their number
(`memory()` reports it). Elsewhere (CPU) `fn` runs eagerly every time: the same arithmetic, which
the tests compare with the eager reference search.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nmt_serve.inference.attention import attention_backends
from nmt_serve.inference.model_runner import ModelRunner

REORDER_CHUNK_BYTES = 256 * 2**20  # the largest gathered copy of beam search's reordering
# the largest temporary of a batch's cross-attention keys and values on their way into the buffer: every
# layer's at once, for all of a batch's sentences, is as large as the buffer's share of them (3.2 GB for
# 256 sentences of 256 tokens at NLLB-200 600M's shape in half precision), and K times that with beams
LOAD_CHUNK_BYTES = 256 * 2**20
# how a step's one query per row attends: "sdpa" (scaled_dot_product_attention, the memory-efficient kernel on
# CUDA where a mask is given, whose 64-query tiles hold one query here) or "matmul" (two batched products around
# a float32 softmax). On an H200 the step's attention took 52% of greedy batch 2,048's kernel time, 65 us a call;
# gpu-rows.sh's step-attention stage compares the two whole searches before either is preferred.
STEP_ATTENTION = "sdpa"


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q (B, H, Q, D) (one query per row, or a group's K rows' queries) against k, v (B, H, L, D) where mask
    (B, 1, 1, L) is True -> (B, H, Q, D)."""
    if STEP_ATTENTION == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-1, -2))  # (B, H, Q, L), the query scaled first as the kernel does
    # the lowest float rather than -inf: a row with nothing to attend (a free slot's) gets numbers, not NaN
    weights = scores.float().masked_fill_(~mask, torch.finfo(torch.float32).min).softmax(dim=-1)
    return torch.matmul(weights.to(v.dtype), v)


def buckets(limit: int, first: int = 1) -> list[int]:
    """Powers of two from `first` below `limit`, then `limit` itself."""
    out = []
    size = first
    while size < limit:
        out.append(size)
        size *= 2
    return out + [limit]


def length_buckets(limit: int, first: int = 32) -> list[int]:
    """The positions a step may attend over: powers of two from `first` and the sizes halfway between them
    (32, 48, 64, 96, 128, 192, ...), then `limit` itself. A step's attention, self and cross, and beam search's
    reordering cost what its bucket holds; over Multi30k's test sentences, batches of 256-2,048 in natural
    order, powers of two alone held 1.60-1.68x the positions the rows needed, these 1.20-1.26x, for 1.75x the
    programs to capture."""
    sizes, size = [], first
    while size < limit:
        sizes.append(size)
        if size % 2 == 0 and size * 3 // 2 < limit:
            sizes.append(size * 3 // 2)
        size *= 2
    return sizes + [limit]


def as_words(t: torch.Tensor) -> torch.Tensor:
    """The same memory seen as the widest integers its last dimension's bytes divide into: the gathers
    and copies that move rows of the cache (beam reordering, rows leaving) are element-wise kernels, and
    move 8 bytes an element this way instead of 2 (half precision): fewer, wider accesses, the same bits."""
    row_bytes = t.size(-1) * t.element_size()
    for dtype in (torch.int64, torch.int32):
        if dtype.itemsize > t.element_size() and row_bytes % dtype.itemsize == 0:
            return t.view(dtype)
    return t


def bucket_of(n: int, sizes: list[int]) -> int:
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"{n} is past the largest bucket {sizes[-1]}")


class StaticDecoder:
    def __init__(self, runner: ModelRunner, *, max_rows: int = 1024, max_length: int = 256, capture: bool | None = None,
                 group: int = 1):
        """max_rows: rows one step may hold (sentences x beams); max_length: positions of target and
        source; capture: use CUDA graphs (default: on CUDA devices); group: the one beam size this decoder
        serves, whose K rows share their sentence's source keys and values (1: any beam size, a copy per row)."""
        cfg = runner.config
        if runner.quantization != "none":
            raise ValueError("the static decoder runs float weights only")
        if max_length > cfg.max_positions:
            raise ValueError(f"max_length {max_length} is past the model's max_positions {cfg.max_positions}")
        self.runner, self.config = runner, cfg
        self.device = runner.device
        self.max_rows, self.max_length = max_rows, max_length
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.n_layers, self.n_heads, self.head_dim = len(runner.decoder_layers), cfg.n_heads, cfg.head_dim
        dtype, device = runner.tgt_embedding.dtype, self.device
        shape = (self.n_layers, 2, max_rows, self.n_heads, max_length, self.head_dim)
        # zeros, not empty: masked positions still enter attention's matmul with weight 0, and 0 x NaN is NaN
        self.self_kv = torch.zeros(shape, dtype=dtype, device=device)
        per_layer = self.self_kv[0].numel() * self.self_kv.element_size()
        self.reorder_layers = max(1, min(self.n_layers, REORDER_CHUNK_BYTES // max(per_layer, 1)))
        if group < 1 or max_rows % group:
            raise ValueError(f"max_rows ({max_rows}) must hold whole groups of {group} rows")
        self.group = group
        self.cross_kv = torch.zeros((self.n_layers, 2, max_rows // group, *shape[3:]), dtype=dtype, device=device)
        self._moved = (as_words(self.self_kv), as_words(self.cross_kv))  # what row moves copy (as_words)
        self.tokens = torch.full((max_rows,), cfg.decoder_start_id, dtype=torch.long, device=device)
        self.pos = torch.zeros(max_rows, dtype=torch.long, device=device)  # position of each row's newest token
        self.src_len = torch.ones(max_rows, dtype=torch.long, device=device)
        self.rows = torch.arange(max_rows, device=device)
        self.positions = torch.arange(max_length, device=device)
        self.length_buckets = length_buckets(max_length, first=min(32, max_length))
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._stream = torch.cuda.Stream(device) if self.capture else None
        self._pool_bytes = 0

    # ------------------------------------------------------------------ rows
    def load_sources(self, src: torch.Tensor, repeat: int = 1, bucket_rows: int | None = None) -> int:
        """Encode src (B, S) right-padded ids into rows [0, B * repeat), each sentence `repeat` times
        (beams), every row at position 0; rows up to bucket_rows are reset to harmless values.
        Returns the number of rows."""
        e, cfg = self.runner, self.config
        B, S = src.shape
        n = B * repeat
        assert n <= self.max_rows and S <= self.max_length
        assert self.group in (1, repeat), f"a decoder of groups of {self.group} rows loads {repeat} rows a sentence"
        copies = repeat // self.group  # rows of the cross-attention buffer a sentence fills
        with attention_backends(self.device):
            states, mask = e.encode(src)  # (B, S, C), (B, 1, 1, S)
        # a few sentences at a time (LOAD_CHUNK_BYTES), each one's keys and values written to its `repeat` rows
        per_sentence = S * self.n_layers * 2 * self.n_heads * self.head_dim * self.cross_kv.element_size()
        chunk = max(1, LOAD_CHUNK_BYTES // per_sentence)
        for start in range(0, B, chunk):
            c = min(chunk, B - start)
            kv = e.source_kv(states[start:start + c], contiguous=False)  # (n_layers, 2, c, H, S, D)
            rows = self.cross_kv[:, :, start * copies:(start + c) * copies, :, :S]  # (n_layers, 2, c * copies, H, S, D)
            rows.unflatten(2, (c, copies)).copy_(kv.unsqueeze(3).expand(-1, -1, -1, copies, -1, -1, -1))
        self.src_len[:n] = mask.view(B, S).sum(1).repeat_interleave(repeat)
        end = max(n, bucket_rows or n)
        self.pos[:end] = 0
        self.tokens[:end] = cfg.decoder_start_id
        self.src_len[n:end] = 1
        return n

    def keep_rows(self, rows: torch.Tensor, positions: int | None = None) -> None:
        """Rows [0, len(rows)) become the old rows `rows` (the ones still running; whole groups in order where
        the decoder has groups); the rest are left as they are and must be reset or masked by the caller.
        positions: how many of each row's cache positions hold anything (its source's and its target's so far;
        default all)."""
        n, P = rows.numel(), positions or self.max_length
        # the source's buffer moves by groups: rows come as whole groups, each group's first row leads it
        groups = rows if self.group == 1 else rows.view(-1, self.group)[:, 0] // self.group
        for buffer, moved in zip(self._moved, (rows, groups)):
            m = moved.numel()
            for layer in buffer:  # a layer at a time: the gathered copy is one layer's, not the whole buffer's
                layer[:, :m, :, :P] = layer[:, moved, :, :P]
        for buffer in (self.tokens, self.pos, self.src_len):
            buffer[:n] = buffer[rows]

    def reorder(self, parent: torch.Tensor, length: int) -> None:
        """Beam search: row i's self-attention history becomes row parent[i]'s (first `length` positions).
        A few layers at a time: the gathered copy (work space held by the graphs' pool) stays within
        REORDER_CHUNK_BYTES rather than a copy of every layer's history."""
        B = parent.numel()
        for start in range(0, self.n_layers, self.reorder_layers):
            chunk = self._moved[0][start:start + self.reorder_layers]
            chunk[:, :, :B, :, :length] = chunk[:, :, parent, :, :length]

    def length_bucket(self, positions: int) -> int:
        return bucket_of(positions, self.length_buckets)

    # ------------------------------------------------------------------ the step
    def step(self, B: int, L: int, weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Feed tokens[:B] at positions pos[:B] (their keys/values are stored there) -> logits (B, V).
        Self-attention sees positions <= pos, cross-attention the first src_len source positions; L
        must cover both. weights: also return each row's cross-attention over the L positions, (B, L)
        float32, averaged over layers and heads (0 past src_len), what the eager step's `cross` gives."""
        e = self.runner
        C, H, D = e.d_model, self.n_heads, self.head_dim
        pre = e.pre_norm
        tokens, pos, rows = self.tokens[:B], self.pos[:B], self.rows[:B]
        seen = self.positions[:L]
        self_mask = (seen[None, :] <= pos[:, None])[:, None, None, :]  # (B, 1, 1, L)
        cross_mask = (seen[None, :] < self.src_len[:B, None])[:, None, None, :]  # (B, 1, 1, L)
        K = self.group
        G = B // K  # (B is whole groups where the decoder has them: buckets of groups times K)
        group_mask = cross_mask[::K]  # (G, 1, 1, L): a group's rows share their source
        x = e.embed_target(tokens, pos)  # (B, C)
        scores = []  # with weights: each layer's cross-attention scores
        for i, w in enumerate(e.decoder_layers):
            h = w.self_norm(x) if pre else x
            qkv = w.self_qkv(h).view(B, 3, H, D)
            layer = self.self_kv[i]  # (2, max_rows, H, max_length, D)
            layer[:, rows, :, pos] = qkv[:, 1:]  # row r's new key/value at its own position pos[r]
            a = attend(qkv[:, 0, :, None], layer[0, :B, :, :L], layer[1, :B, :, :L], self_mask)
            x = e._residual(x, w.self_out(a.reshape(B, C)), w.self_norm)
            h = w.cross_norm(x) if pre else x
            # (G, H, K, D): a group's K queries against its one source (contiguous, as the fused kernels want it)
            q = w.cross_q(h).view(G, K, H, D).transpose(1, 2).contiguous()
            cross = self.cross_kv[i]
            a = attend(q, cross[0, :G, :, :L], cross[1, :G, :, :L], group_mask).transpose(1, 2)  # (G, K, H, D)
            if weights:
                # beside the fused kernel rather than instead of it (which keeps no weights), so that the
                # translation is the same with or without them; the query scaled first, as the kernel does,
                # so that half-precision scores stay in range
                group_scores = torch.matmul(q * D ** -0.5, cross[0, :G, :, :L].transpose(-1, -2))  # (G, H, K, L)
                scores.append(group_scores.transpose(1, 2).reshape(B, H, 1, L))
            x = e._residual(x, w.cross_out(a.reshape(B, C)), w.cross_norm)
            x = e._feed_forward(x, w.ffn)
        if e.decoder_norm is not None:
            x = e.decoder_norm(x)
        if not weights:
            return e.output(x)  # (B, V)
        # every layer's softmax at once, in float32, then the mean over layers and heads
        stacked = torch.stack(scores).float().masked_fill_(~cross_mask, float("-inf"))  # (layers, B, H, 1, L)
        return e.output(x), stacked.softmax(dim=-1).mean(dim=(0, 2, 3))  # (B, V), (B, L)

    # ------------------------------------------------------------------ running and capturing
    def run(self, key: tuple, fn) -> None:
        """Run fn(), a function of this decoder's buffers (and of other fixed-address tensors) whose work
        depends only on `key`; on CUDA by replaying the graph captured on its first run."""
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        with attention_backends(self.device):
            fn()
            if self.capture:
                self.graphs[key] = self._capture(fn)

    def _capture(self, fn) -> "torch.cuda.CUDAGraph":
        # capture_begin/end rather than torch.cuda.graph(): that one runs gc.collect() and empties the
        # allocator's cache on every capture, a stall we do not want when a new bucket shows up mid-request
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        before = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            graph.capture_begin(pool=self._pool)
            try:
                fn()
            finally:
                graph.capture_end()
        torch.cuda.current_stream(self.device).wait_stream(self._stream)
        self._pool_bytes += torch.cuda.memory_reserved(self.device) - before
        return graph

    def memory(self) -> dict:
        """Bytes held: the fixed buffers, and what graph capture added to the allocator (their shared pool)."""
        buffers = sum(t.numel() * t.element_size() for t in (self.self_kv, self.cross_kv, self.tokens, self.pos, self.src_len))
        return {"buffers_bytes": buffers, "graphs": len(self.graphs), "graph_pool_bytes": self._pool_bytes}
