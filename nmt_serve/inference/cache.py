"""Key/value cache for incremental decoding.

Self-attention keys/values of every decoder layer live in one preallocated buffer
(n_layers, 2, B, H, capacity, D), and a step writes its new position in place. Cross-attention
keys/values of the source are computed once, as one (n_layers, 2, B, H, S, D) tensor. Within one
layer's keys the batch and head dims are adjacent, so attention can treat them as one batch dim.

`reorder(indices)` makes row i the old row indices[i]: beam search's choice of parents, or the rows
still running when finished ones leave. Dropping rows only narrows views of the buffers; rows leaving
where most of the others keep their places (the searches fill the places left with the last rows) move
only the rows that change places, within the buffers. Otherwise a reorder is carried out in one of two
ways:
- physically (the default): one index_select for all layers into a spare buffer of the same size,
  kept for the purpose; the two buffers then swap roles. Its cost grows with rows x positions. Beams
  following their parents on the CPU (`reorder(..., cross=False)`) move within the buffer instead, in one
  call of numba's kernel (row_kernels.move_rows), which copies only the rows that change.
- by ancestry, in a cache made with `group_size=K` (beam search, K beams per sentence, rows of one
  sentence adjacent): keys/values never move, and the source's keys/values and mask are held once
  per group (a group's rows share their source, so its K queries attend to it together). Row r
  writes position t into its own row, and `ancestors[r, t]` records which row of its group (0..K-1)
  holds position t of r's history. A beam reorder then re-indexes that small (B, capacity) table
  instead of copying the keys/values. When sentences leave, their groups leave whole (the groups that
  move are copied), and since the table holds positions within the group, it stays valid.
  The self-attention buffers of a grouped cache are laid out per group, (n_layers, 2, G, H, capacity, K, D):
  a group's K rows side by side at each position, so that one head's keys of a whole group up to the
  current position are one (positions x K, D) matrix. Each query attends to all of them through one
  product, and `group_bias()` (from the table: -inf where a key is not in the query's history) leaves it
  its own history (see ModelRunner._grouped_attention). Scoring each query against each row apart would
  take K x K small products per group and head and a gather and scatter of the scores: 1.3-2.6x as long
  (one layer at beam 4 batch 32, 2 threads).

Continuous batching adds rows to a running cache at a step boundary (`join`), appended or in the
rows of sentences that left (reusing rows saves copying the whole cache each time one leaves):
their history starts at the current length, so `start[r]` records where row r's own positions
begin; the positions before it are masked out of its self-attention (`self_mask()`), and its
position embedding counts from its own start (`positions()`). A cache whose rows all began together
has `start = None` and pays for none of it. Positions that no running row reads any more (before the
earliest start) are dropped by `drop_positions`, or by a reorder that copies the rows anyway, so the
length stays bounded under a steady stream of joins. Likewise the source side is as wide as the longest
source that joined, until the caller narrows it to the longest of the rows still running (`narrow_source`).
"""
from __future__ import annotations

import functools

import torch

from nmt_serve.inference import row_products
from nmt_serve.network.masks import additive_bias

BATCH = 2  # the batch dim of the buffers: rows, or groups of K rows in a grouped cache's self-attention buffers
POSITION = 4  # the position dim of the self-attention buffers, in either layout


def per_group(rows: torch.Tensor, group_size: int) -> torch.Tensor:
    """Self-attention keys/values of B rows, (L, 2, B, H, T, D), as a grouped cache lays them out:
    (L, 2, B / K, H, T, K, D), a view (copy it in)."""
    return rows.unflatten(BATCH, (-1, group_size)).permute(0, 1, 2, 4, 5, 3, 6)


@functools.cache
def _move_kernel():
    """row_kernels.move_rows compiled, or None where the row kernels are not available."""
    from nmt_serve.inference import row_kernels

    return row_products.compile_kernel(row_kernels.move_rows, "boolean(intp, intp, intp, intp, intp, intp, intp, intp, intp)")


MOVE_ROWS = True  # tests turn the kernel off to hold the index_select to the same results


class KVCache:
    def __init__(self, cross_kv: torch.Tensor, src_mask: torch.Tensor | None, capacity: int = 32, group_size: int = 1):
        """cross_kv (n_layers, 2, E, H, S, D); src_mask (E, 1, 1, S) bool, or None when nothing is padded
        (attention then skips masking); capacity: decoder positions to preallocate (grows by doubling);
        group_size: K > 1 turns on reordering by ancestry for beams of K rows per sentence. E entries of
        the source: one per row (B = E rows), or with group_size K one per group (B = E * K rows)."""
        assert cross_kv.dim() == 6 and cross_kv.size(1) == 2, "cross_kv must be (n_layers, 2, E, H, S, D)"
        self.n_layers, _, entries, self.n_heads, _, self.head_dim = cross_kv.shape
        self.batch_size = entries * group_size
        self.cross_kv = cross_kv
        self._cross_base: torch.Tensor | None = None  # with spare entries for joins, cross_kv its first ones
        self.src_mask = src_mask
        self.group_size = group_size
        self.capacity = max(1, capacity)
        slots = entries if group_size > 1 else self.batch_size
        self._self_kv = self._new_buffer(slots, self.capacity)  # (L, 2, B, H, capacity, D), grouped (L, 2, G, H, capacity, K, D)
        self._spare = self._new_buffer(slots, self.capacity)  # target of the next physical reorder
        self.length = 0  # positions already stored (the same for every layer)
        # (B,) first position of each row's own history when rows joined later (see join); None: all 0
        self.start: torch.Tensor | None = None
        # grouped mode: (B, capacity) row within the group that holds each position of each row's history
        self.ancestors = torch.empty(self.batch_size, self.capacity, dtype=torch.long, device=cross_kv.device)
        self._forget_views()

    @property
    def grouped(self) -> bool:
        return self.group_size > 1

    def _new_buffer(self, slots: int, capacity: int) -> torch.Tensor:
        """Self-attention keys/values for `slots` rows, or groups of K rows in grouped mode."""
        if self.grouped:
            return self.cross_kv.new_empty(self.n_layers, 2, slots, self.n_heads, capacity, self.group_size, self.head_dim)
        return self.cross_kv.new_empty(self.n_layers, 2, slots, self.n_heads, capacity, self.head_dim)

    def _forget_views(self) -> None:
        """Forget the per-layer views of the running rows (remade on their first use after a change, once per change
        rather than once per step and layer: a step through row_step reads none of them, and a lone beam search's
        reorder made them again each step, 13 us of Python for 6 layers) and what is made from the rows."""
        self._layer_kv = None
        self._cross = None
        self._group_bias = None
        self._self_mask = None
        self._src_bias = None
        if self.grouped:  # grouped mode: each row's slot in its group, where its new positions go
            self._own_slots = torch.arange(self.batch_size, device=self.ancestors.device) % self.group_size

    @property
    def self_kv(self) -> torch.Tensor:
        """The running rows of the self-attention buffer: (n_layers, 2, B, H, capacity, D), in grouped mode
        (n_layers, 2, G, H, capacity, K, D)."""
        return self._self_kv.narrow(BATCH, 0, self.batch_size // self.rows_per_entry)

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of one layer, each (E, H, S, D): per row, or per group in
        grouped mode (src_mask is laid out the same way)."""
        if self._cross is None:
            self._cross = [kv.unbind(0) for kv in self.cross_kv.unbind(0)]  # per layer ((E, H, S, D), (E, H, S, D))
        return self._cross[layer]

    def _layer(self, layer: int) -> torch.Tensor:
        """One layer's self-attention buffer of the running rows, (2, B, H, capacity, D) (grouped: (2, G, H, capacity,
        K, D))."""
        if self._layer_kv is None:
            rows = self.self_kv
            # select, not unbind: autograd forbids in-place writes to unbind's views outside no_grad
            self._layer_kv = [rows.select(0, i) for i in range(self.n_layers)]
        return self._layer_kv[layer]

    @property
    def rows_per_entry(self) -> int:
        """Rows that share one entry of the source side: K in grouped mode, else 1."""
        return self.group_size if self.grouped else 1

    def positions(self) -> int | torch.Tensor:
        """The position of the token being decoded: one int for all rows, or (B,) when rows joined later."""
        return self.length if self.start is None else self.length - self.start

    def self_mask(self) -> torch.Tensor | None:
        """(B, 1, 1, length + 1) bool, true at the positions of each row's own history (those before its
        start belong to rows that ran before it joined); None when every row began at 0."""
        if self.start is None:
            return None
        if self._self_mask is None or self._self_mask.size(-1) != self.length + 1:
            span = torch.arange(self.length + 1, device=self.start.device)
            self._self_mask = (span >= self.start[:, None])[:, None, None, :]
        return self._self_mask

    def src_bias(self) -> torch.Tensor | None:
        """src_mask as an additive bias, (E, 1, 1, S) in the keys' dtype: 0 where attended, -inf at
        padding; None when nothing is padded. Made once per change of the rows, not per step and layer."""
        if self.src_mask is None:
            return None
        if self._src_bias is None:
            self._src_bias = additive_bias(self.src_mask, self.cross_kv.dtype)
        return self._src_bias

    def group_bias(self) -> torch.Tensor:
        """Grouped mode, for the step being decoded (positions 0..length): (G, H, K, (length + 1) * K), an
        additive bias on the scores of query row k of group g against the group's keys as append() returns
        them (key t * K + j: position t of the group's row j): 0 where row j holds position t of row k's
        history and t is at or after k's start, -inf elsewhere. Made once per step, shared by its layers (and
        laid out per head, so that the products add it without a copy)."""
        if self._group_bias is None:
            K, T = self.group_size, self.length + 1
            G = self.batch_size // K
            slots = torch.arange(K, device=self.ancestors.device)
            held = self.ancestors[: self.batch_size, :T].view(G, K, T, 1) == slots  # (G, K rows, T, K holders)
            mask = self.self_mask()  # (B, 1, 1, T) or None
            if mask is not None:
                held &= mask.view(G, K, T, 1)
            bias = additive_bias(held.view(G, 1, K, T * K), self.cross_kv.dtype)
            self._group_bias = bias.expand(G, self.n_heads, K, T * K).contiguous()
        return self._group_bias

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        grown = self._new_buffer(self._self_kv.size(BATCH), capacity)
        grown.narrow(POSITION, 0, self.length).copy_(self._self_kv.narrow(POSITION, 0, self.length))
        self._self_kv = grown
        self._spare = self._new_buffer(self._spare.size(BATCH), capacity)
        ancestors = self.ancestors.new_empty(self.ancestors.size(0), capacity)
        ancestors[:, : self.length] = self.ancestors[:, : self.length]
        self.ancestors = ancestors
        self.capacity = capacity
        self._forget_views()

    def append(self, layer: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one new position's keys/values kv (B, 2, H, 1, D) of one layer, each row in its own
        row; return all keys and values so far, each (B, H, length + 1, D). In grouped mode, each
        (G, H, (length + 1) * K, D), the group's keys: key t * K + j is position t of its row j (a row's
        history is spread over its group: attend through group_bias()). Call advance() once every layer
        has appended."""
        self._make_room()
        t = self.length
        if self.grouped:
            if layer == 0:  # the new position of every row is in the row itself: slot r mod K of its group
                self.ancestors[: self.batch_size, t] = self._own_slots
                self._group_bias = None
            K = self.group_size
            seen = self._layer(layer).narrow(3, 0, t + 1)  # (2, G, H, t + 1, K, D)
            seen.select(3, t).copy_(kv.reshape(-1, K, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4))
            return tuple(x.flatten(2, 3) for x in seen.unbind(0))
        seen = self._layer(layer).narrow(3, 0, t + 1)  # (2, B, H, t + 1, D)
        seen.narrow(3, t, 1).copy_(kv.transpose(0, 1))
        return seen.unbind(0)

    def with_room(self) -> torch.Tensor:
        """The self-attention buffer, (n_layers, 2, B', H, capacity, D) (B' >= B rows, the running ones first), with
        room for position `length` (grown where full): for a kernel that stores the new position itself (row_step;
        an ungrouped cache). Call advance() once it has."""
        assert not self.grouped
        self._make_room()
        return self._self_kv

    def _make_room(self) -> None:
        """Room for position `length` in the self-attention buffers."""
        if self.length == self.capacity:
            self._grow(self.length + 1)

    def advance(self, steps: int = 1) -> None:
        self.length += steps

    def join(self, cross_kv: torch.Tensor, src_mask: torch.Tensor | None, rows: torch.Tensor | None = None) -> None:
        """Add rows that start decoding now: cross_kv (n_layers, 2, n, H, S', D) and their source mask
        (n, 1, 1, S') or None, n entries laid out as the cache's (one per row, or per group in grouped
        mode); rows: existing rows to reuse (of sentences that left), else they are appended. In
        grouped mode rows come in whole groups (whole sentences)."""
        per = self.rows_per_entry
        n = cross_kv.size(BATCH)
        E, B, S = self.cross_kv.size(BATCH), self.batch_size, max(self.cross_kv.size(4), cross_kv.size(4))
        device = cross_kv.device
        if self.cross_kv.size(4) < S:  # a longer source than the source side holds: widen it
            pad = S - self.cross_kv.size(4)  # zeros (finite) under a false mask
            self.cross_kv = torch.nn.functional.pad(self.cross_kv, (0, 0, 0, pad))
            mask = self.src_mask if self.src_mask is not None else torch.ones(E, 1, 1, S - pad, dtype=torch.bool, device=device)
            self.src_mask = torch.nn.functional.pad(mask, (0, pad), value=False)
        new_mask = torch.ones(n, 1, 1, S, dtype=torch.bool, device=device)
        if src_mask is not None:
            new_mask[..., : src_mask.size(-1)] = src_mask
        new_mask[..., cross_kv.size(4) :] = False
        if self.start is None:
            self.start = torch.zeros(B, dtype=torch.long, device=device)
        if rows is None:  # appended
            rows = torch.arange(B, B + n * per, device=device)
            self._append_entries(n)
            if self.src_mask is not None:
                self.src_mask = torch.cat([self.src_mask, new_mask])
            self.start = torch.cat([self.start, self.start.new_zeros(n * per)])
            self._reserve_rows(B + n * per)
            self.batch_size = B + n * per
        assert rows.numel() == n * per, "grouped rows join in whole groups, one source each"
        entries = rows.view(n, per)[:, 0] // per
        if self.src_mask is None and not bool(new_mask.all()):
            self.src_mask = torch.ones(self.cross_kv.size(BATCH), 1, 1, S, dtype=torch.bool, device=device)
        self.cross_kv.index_copy_(BATCH, entries, torch.nn.functional.pad(cross_kv, (0, 0, 0, S - cross_kv.size(4))))
        if self.src_mask is not None:
            self.src_mask.index_copy_(0, entries, new_mask)
        self.start.index_fill_(0, rows, self.length)
        # the new rows never read their positions before start, but 0 x NaN would still be NaN
        if self.length:  # the positions from length on are written before they are read
            self._self_kv.narrow(POSITION, 0, self.length).index_fill_(BATCH, entries if self.grouped else rows, 0.0)
            self.ancestors.index_fill_(0, rows, 0)
        self._forget_views()

    def _append_entries(self, n: int) -> None:
        """n more entries on the source side: cross_kv becomes the first E + n entries of a buffer that
        keeps spare ones (doubling), so that a join after sentences left from the end (truncate) or
        after an earlier growth copies nothing; before, every append copied every running entry (a
        quarter of a ms per join at 24 rows on the CPU, 1 thread). The new entries are written by the
        caller."""
        E = self.cross_kv.size(BATCH)
        base = self._cross_base
        current = (base is not None and base.data_ptr() == self.cross_kv.data_ptr()
                   and base.stride() == self.cross_kv.stride() and base.shape[3:] == self.cross_kv.shape[3:])
        if not current or base.size(BATCH) < E + n:  # cross_kv was replaced (a reorder, a wider source) or is full
            shape = self.cross_kv.shape
            base = self.cross_kv.new_empty(*shape[:2], max(E + n, 2 * E), *shape[3:])
            base.narrow(BATCH, 0, E).copy_(self.cross_kv)
            self._cross_base = base
        self.cross_kv = base.narrow(BATCH, 0, E + n)

    def _select_entries(self, entries: torch.Tensor) -> None:
        """The source side keeps these entries, in this order, in a buffer as large as the one before:
        the spare entries stay for later joins."""
        n = entries.numel()
        shape = self.cross_kv.shape
        capacity = max(n, self._cross_base.size(BATCH) if self._cross_base is not None else 0)
        base = self.cross_kv.new_empty(*shape[:2], capacity, *shape[3:])
        torch.index_select(self.cross_kv, BATCH, entries, out=base.narrow(BATCH, 0, n))
        self._cross_base, self.cross_kv = base, base.narrow(BATCH, 0, n)

    def _move_rows(self, indices: torch.Tensor) -> bool:
        """Beams following their parents in an ungrouped cache on the CPU: the rows that change copied within the
        buffer by one kernel call (row_kernels.move_rows), those that keep their history untouched; nothing else
        changes (the source side, the starts and the views stay). False where the kernel does not run: the
        index_select into the spare buffer then takes it. A lone sentence's beam-4 step spent 18 us in the reorder,
        half of it the index_select (on torch's threads) and half the Python around it; at 20 positions of the shipped
        model's 3 layers the kernel takes 2-12 us against 15-34 for the index_select, and lone beam-4 searches of its
        twin ran 1.10-1.14x as fast at 2 threads, 1.04x at 1 (BENCHMARKS.md)."""
        kv = self._self_kv
        if not MOVE_ROWS or not indices.numel() or kv.device.type != "cpu" or kv.dtype != torch.float32 or _move_kernel() is None:
            return False
        s = kv.stride()
        if s[0] != 2 * s[1] or s[4] != self.head_dim or s[5] != 1:
            return False
        parents = indices if indices.dtype == torch.int64 and indices.is_contiguous() else indices.long().contiguous()
        return _move_kernel()(kv.data_ptr(), 2 * self.n_layers, s[1], s[2], self.n_heads, s[3],
                              self.length * self.head_dim, parents.data_ptr(), indices.numel())

    def _move_in_place(self, rows: torch.Tensor, entries: torch.Tensor) -> bool:
        """Rows leaving, where most of those that stay keep their places (the searches fill the places of the
        ones that left with the last ones, `search.survivors_order`): only the rows that change places are
        copied, within the buffers, and the rest narrows (a copy of every row's keys and values at each
        departure took 4.5-7% of a batch of 32 searches of natural lengths). False (nothing done) where more
        than half the rows would move: one copy of all of them is then the cheaper."""
        n = rows.numel()
        slots = entries if self.grouped else rows  # what the self-attention buffers hold: groups, or rows
        moved = (slots != torch.arange(slots.numel(), device=slots.device)).nonzero().squeeze(1)
        if 2 * moved.numel() > slots.numel():
            return False
        if moved.numel():
            # the right side is gathered before anything is written, so a row may come from a place that another takes
            seen = self._self_kv.narrow(POSITION, 0, self.length)
            seen.index_copy_(BATCH, moved, seen.index_select(BATCH, slots.index_select(0, moved)))
        e = entries.numel()
        moved = (entries != torch.arange(e, device=entries.device)).nonzero().squeeze(1)
        if moved.numel():
            self.cross_kv.index_copy_(BATCH, moved, self.cross_kv.index_select(BATCH, entries.index_select(0, moved)))
        self.cross_kv = self.cross_kv.narrow(BATCH, 0, e)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, entries)
        self.batch_size = n
        self._forget_views()
        return True

    @property
    def source_width(self) -> int:
        """The source positions every step's cross-attention reads (the longest source of the rows, or longer)."""
        return self.cross_kv.size(4)

    def narrow_source(self, width: int) -> None:
        """Read only the first `width` source positions from here on: the caller checked that no running
        row's source is longer (the rows with the longest left). Without this the source side keeps the width
        of the longest source that ever joined while anything ran, and every later step's cross-attention
        reads its padding. A view, no copy; a longer source joining later widens it again (join)."""
        if width >= self.source_width:
            return
        self.cross_kv = self.cross_kv.narrow(4, 0, width)
        if self._cross_base is not None:  # so that the spare entries stay usable for appended joins
            self._cross_base = self._cross_base.narrow(4, 0, width)
        if self.src_mask is not None:
            self.src_mask = self.src_mask[..., :width]
        self._forget_views()

    def truncate(self, rows: int) -> None:
        """Keep the first `rows` rows (the ones after them left; whole groups in grouped mode): views, no copy."""
        entries = rows // self.rows_per_entry
        self.cross_kv = self.cross_kv.narrow(BATCH, 0, entries)
        if self.src_mask is not None:
            self.src_mask = self.src_mask[:entries]
        if self.start is not None:
            self.start = self.start[:rows]
        self.batch_size = rows
        self._forget_views()

    def _reserve_rows(self, rows: int) -> None:
        """Make the self-attention buffers hold at least `rows` rows (doubling)."""
        slots = rows // self.rows_per_entry
        if self._self_kv.size(BATCH) < slots:
            size = max(slots, 2 * self._self_kv.size(BATCH))
            grown = self._new_buffer(size, self.capacity)
            running = self.self_kv.narrow(POSITION, 0, self.length)
            grown.narrow(BATCH, 0, running.size(BATCH)).narrow(POSITION, 0, self.length).copy_(running)
            self._self_kv, self._spare = grown, self._new_buffer(size, self.capacity)
        if self.ancestors.size(0) < rows:
            ancestors = self.ancestors.new_zeros(max(rows, 2 * self.ancestors.size(0)), self.capacity)
            ancestors[: self.batch_size] = self.ancestors[: self.batch_size]
            self.ancestors = ancestors

    def drop_positions(self, shift: int) -> None:
        """Forget the first `shift` positions of every row (no running row reads them: the caller checked
        that each running row started at or after `shift`); rows that do not run any more are clamped."""
        if shift <= 0:
            return
        kept = self.length - shift
        running = self.self_kv.narrow(POSITION, shift, kept)
        self._spare.narrow(BATCH, 0, running.size(BATCH)).narrow(POSITION, 0, kept).copy_(running)
        self._self_kv, self._spare = self._spare, self._self_kv
        if self.grouped:
            self.ancestors[: self.batch_size, :kept] = self.ancestors[: self.batch_size, shift : self.length].clone()
        if self.start is not None:
            self.start = (self.start - shift).clamp_(min=0)
        self.length = kept
        self._forget_views()

    def group(self, group_size: int) -> None:
        """Switch a physically reordered cache to reordering by ancestry, K = group_size rows per
        sentence (when a running batch has grown past the point where that pays): each row holds its
        own history, so every entry of the table is the row's own slot; the source side keeps the
        first row of each group (its K rows hold the same source)."""
        assert not self.grouped and self.batch_size % group_size == 0
        first = torch.arange(0, self.batch_size, group_size, device=self.cross_kv.device)
        self.cross_kv = self.cross_kv.index_select(BATCH, first)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, first)
        G = self.batch_size // group_size
        self._regroup(group_size, max(G, -(-self._self_kv.size(BATCH) // group_size)))  # the spare rows' room, in groups
        own = torch.arange(self.batch_size, device=self.ancestors.device) % group_size
        self.ancestors[: self.batch_size, : self.length] = own[:, None]
        self._forget_views()

    def _regroup(self, group_size: int, size: int, rows: torch.Tensor | None = None) -> None:
        """The self-attention buffers of a cache of one row per entry become a grouped cache's, K = group_size rows
        a group, room for `size` groups: the running rows in order, or these rows of them (their K copies adjacent).
        The old buffers and their views go first, so that no more than two buffers are held at once."""
        held = self.self_kv.narrow(POSITION, 0, self.length)  # (L, 2, B, H, length, D)
        if rows is not None:
            held = held.index_select(BATCH, rows)
        self.group_size = group_size
        self._spare, self._layer_kv, self._cross = None, None, None
        grouped = self._new_buffer(size, self.capacity)
        groups = held.size(BATCH) // group_size
        grouped.narrow(BATCH, 0, groups).narrow(POSITION, 0, self.length).copy_(per_group(held, group_size))
        del held
        self._self_kv = grouped
        self._spare = self._new_buffer(size, self.capacity)

    def expand(self, indices: torch.Tensor, group_size: int = 1) -> None:
        """A cache of one row per sentence becomes one of K rows per sentence (beam search after a first
        step in which only beam 0 was live): row i becomes old row indices[i], whose K copies are
        adjacent. With group_size K > 1 it reorders by ancestry from here on and holds each sentence's
        source once (its rows hold their own copies of the positions so far)."""
        assert not self.grouped and self.start is None, "expand a cache of one row per sentence"
        if group_size == 1:
            self.reorder(indices)
            return
        indices = indices.to(self.cross_kv.device)
        n = indices.numel()
        sentences = indices.view(-1, group_size)[:, 0]
        self.cross_kv = self.cross_kv.index_select(BATCH, sentences)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, sentences)
        self._regroup(group_size, sentences.numel(), indices)
        self.ancestors = self.ancestors.new_empty(n, self.capacity)
        self.ancestors[:, : self.length] = (torch.arange(n, device=indices.device) % group_size)[:, None]
        self.batch_size = n
        self._forget_views()

    def reorder(self, indices: torch.Tensor, *, cross: bool = True) -> None:
        """Row i of the cache becomes old row indices[i] (beam parents, or the rows still running).

        cross=False leaves the cross-attention keys/values and source mask as they are: right when every
        row i and indices[i] hold the same source (beams of one sentence), and it saves copying them.
        In grouped mode, indices must keep rows within their groups (beam parents) and, when sentences
        leave (cross=True), list the K rows of each group that stays together.
        """
        indices = indices.to(self.cross_kv.device)
        n = indices.numel()
        if not cross:
            assert n == self.batch_size, "a reorder that changes the batch size must include cross"
            if not self.grouped and self._move_rows(indices):
                return
        entries = rows = indices
        if self.grouped:
            # the keys/values stay where they are; only the table of where each history lies follows
            # (when rows leave, the positions no remaining row reads are dropped: see shift below)
            self.ancestors[:n, : self.length] = self.ancestors[:, : self.length].index_select(0, indices)
            if not cross:
                self._group_bias = None
                return
            # sentences left: whole groups move, in the order of the groups that stay
            K = self.group_size
            entries = indices.view(-1, K)[:, 0] // K
            rows = (entries[:, None] * K + torch.arange(K, device=indices.device)).view(-1)
        # positions before the earliest start of the rows that stay are read by none of them: drop them
        shift = 0
        if cross and self.start is not None:
            start = self.start.index_select(0, rows)
            shift = int(start.min())
            start -= shift
            self.start = start if bool(start.any()) else None
        if cross and shift == 0 and n <= self.batch_size and self._move_in_place(rows, entries):
            return
        if cross:
            self._select_entries(entries)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, entries)
        slots = entries if self.grouped else rows  # what the self-attention buffers hold: groups, or rows
        if slots.numel() > self._spare.size(BATCH):  # more rows than ever before (the first beam expansion)
            self._spare = self._new_buffer(slots.numel(), self.capacity)
        if self.ancestors.size(0) < n:
            self.ancestors = self.ancestors.new_empty(n, self.capacity)
        kept = self.length - shift
        if kept > 0:
            torch.index_select(
                self.self_kv.narrow(POSITION, shift, kept), BATCH, slots,
                out=self._spare.narrow(BATCH, 0, slots.numel()).narrow(POSITION, 0, kept),
            )
        if shift and self.grouped:
            self.ancestors[:n, :kept] = self.ancestors[:n, shift : self.length].clone()
        self._self_kv, self._spare = self._spare, self._self_kv
        self.length = kept
        self.batch_size = n
        self._forget_views()
