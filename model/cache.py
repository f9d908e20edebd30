"""Key/value cache for incremental decoding.

Self-attention keys/values of every decoder layer live in one preallocated buffer
(B, n_layers, 2, H, capacity, D): a step writes its new position in place, and a beam reorder is a
single index_select for all layers into a second buffer of the same size that is kept for the
purpose (no allocation per step; the two buffers swap roles). Cross-attention keys/values of the
source are computed once, as one (B, n_layers, 2, H, S, D) tensor.

Batch is dim 0 of every tensor. `reorder(indices)` follows beam search's choice of parents and also
drops finished rows (pass the indices of the rows to keep); dropping rows only narrows views of the
buffers, it never reallocates them.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, cross_kv: torch.Tensor, src_mask: torch.Tensor | None, capacity: int = 32):
        """cross_kv (B, n_layers, 2, H, S, D); src_mask (B, 1, 1, S) bool, or None when nothing is padded
        (attention then skips masking); capacity: decoder positions to preallocate (grows by doubling)."""
        assert cross_kv.dim() == 6 and cross_kv.size(2) == 2, "cross_kv must be (B, n_layers, 2, H, S, D)"
        self.batch_size, self.n_layers, _, self.n_heads, _, self.head_dim = cross_kv.shape
        self.cross_kv = cross_kv
        self.src_mask = src_mask
        self.capacity = max(1, capacity)
        self._self_kv = self._new_buffer(self.batch_size, self.capacity)  # (B, L, 2, H, capacity, D)
        self._spare = self._new_buffer(self.batch_size, self.capacity)  # target of the next reorder
        self.length = 0  # positions already stored (the same for every layer)
        self._make_views()

    def _new_buffer(self, batch: int, capacity: int) -> torch.Tensor:
        return self.cross_kv.new_empty(batch, self.n_layers, 2, self.n_heads, capacity, self.head_dim)

    def _make_views(self) -> None:
        """Per-layer views of the running rows, made once per reorder rather than once per step and layer."""
        rows = self._self_kv[: self.batch_size]
        # select, not unbind: autograd forbids in-place writes to unbind's views outside no_grad
        self._layer_kv = [rows.select(1, layer) for layer in range(self.n_layers)]  # per layer (B, 2, H, capacity, D)
        self._cross = [kv.unbind(1) for kv in self.cross_kv.unbind(1)]  # per layer ((B, H, S, D), (B, H, S, D))

    @property
    def self_kv(self) -> torch.Tensor:
        """(B, n_layers, 2, H, capacity, D): the running rows of the self-attention buffer."""
        return self._self_kv[: self.batch_size]

    def cross(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of one layer, each (B, H, S, D)."""
        return self._cross[layer]

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        grown = self._new_buffer(self._self_kv.size(0), capacity)
        grown[..., : self.length, :] = self._self_kv[..., : self.length, :]
        self._self_kv = grown
        self._spare = self._new_buffer(self._spare.size(0), capacity)
        self.capacity = capacity
        self._make_views()

    def append(self, layer: int, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one new position's keys/values kv (B, 2, H, 1, D) of one layer; return all keys and
        values so far, each (B, H, length + 1, D). Call advance() once every layer has appended."""
        if self.length == self.capacity:
            self._grow(self.length + 1)
        seen = self._layer_kv[layer].narrow(3, 0, self.length + 1)  # (B, 2, H, length + 1, D)
        seen.narrow(3, self.length, 1).copy_(kv)
        return seen.unbind(1)

    def advance(self, steps: int = 1) -> None:
        self.length += steps

    def reorder(self, indices: torch.Tensor, *, cross: bool = True) -> None:
        """Row i of the cache becomes old row indices[i] (beam parents, or the rows still running).

        cross=False leaves the cross-attention keys/values and source mask as they are: right when every
        row i and indices[i] hold the same source (beams of one sentence), and it saves copying them.
        """
        indices = indices.to(self.cross_kv.device)
        n = indices.numel()
        if cross:
            self.cross_kv = self.cross_kv.index_select(0, indices)
            if self.src_mask is not None:
                self.src_mask = self.src_mask.index_select(0, indices)
        else:
            assert n == self.batch_size, "a reorder that changes the batch size must include cross"
        if n > self._spare.size(0):  # more rows than ever before (the first beam expansion)
            self._spare = self._new_buffer(n, self.capacity)
        if self.length > 0:
            torch.index_select(
                self.self_kv[..., : self.length, :], 0, indices, out=self._spare[:n, ..., : self.length, :]
            )
        self._self_kv, self._spare = self._spare, self._self_kv
        self.batch_size = n
        self._make_views()
