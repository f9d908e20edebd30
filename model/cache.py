"""Key/value cache for incremental decoding.

Per decoder layer it holds the self-attention keys/values of every generated position (preallocated,
grown by doubling, so a step writes in place instead of concatenating) and the cross-attention
keys/values of the source, computed once. Batch is dim 0 of every tensor: `reorder(indices)` follows
beam search's choice of parents and also drops finished rows (pass the indices of the rows to keep).
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self,
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        src_mask: torch.Tensor,
        initial_capacity: int = 32,
    ):
        assert cross_kv, "a cache needs at least one decoder layer"
        k0 = cross_kv[0][0]
        self.batch_size, self.n_heads, _, self.head_dim = k0.shape  # (B, H, S, D)
        self.cross_kv = cross_kv  # per layer ((B, H, S, D), (B, H, S, D))
        self.src_mask = src_mask  # (B, 1, 1, S) bool
        self.capacity = max(1, initial_capacity)
        shape = (self.batch_size, self.n_heads, self.capacity, self.head_dim)
        self.self_k = [k0.new_empty(shape) for _ in cross_kv]  # per layer (B, H, capacity, D)
        self.self_v = [k0.new_empty(shape) for _ in cross_kv]
        self.length = 0  # positions already stored (the same for every layer)

    @property
    def n_layers(self) -> int:
        return len(self.cross_kv)

    def _grow(self, needed: int) -> None:
        new_capacity = self.capacity
        while new_capacity < needed:
            new_capacity *= 2
        for buffers in (self.self_k, self.self_v):
            for i, old in enumerate(buffers):
                new = old.new_empty(old.size(0), self.n_heads, new_capacity, self.head_dim)
                new[:, :, : self.length] = old[:, :, : self.length]
                buffers[i] = new
        self.capacity = new_capacity

    def append_self_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' k, v (B, H, T, D) of one layer; return all keys/values so far."""
        end = self.length + k.size(2)
        if end > self.capacity:
            self._grow(end)
        self.self_k[layer][:, :, self.length : end] = k
        self.self_v[layer][:, :, self.length : end] = v
        return self.self_k[layer][:, :, :end], self.self_v[layer][:, :, :end]

    def advance(self, steps: int) -> None:
        """Called once per decoder call, after every layer appended its new positions."""
        self.length += steps

    def reorder(self, indices: torch.Tensor, *, cross: bool = True) -> None:
        """Row i of the cache becomes old row indices[i] (beam parents, or the rows still running).

        cross=False leaves the cross-attention keys/values and source mask as they are: right when every
        row i and indices[i] hold the same source (beams of one sentence), and it saves copying them.
        """
        indices = indices.to(self.src_mask.device)
        if cross:
            self.cross_kv = [(k.index_select(0, indices), v.index_select(0, indices)) for k, v in self.cross_kv]
            self.src_mask = self.src_mask.index_select(0, indices)
        else:
            assert indices.numel() == self.batch_size, "a reorder that changes the batch size must include cross"
        for buffers in (self.self_k, self.self_v):
            for i, old in enumerate(buffers):
                new = old.new_empty(indices.numel(), self.n_heads, self.capacity, self.head_dim)
                new[:, :, : self.length] = old[:, :, : self.length].index_select(0, indices)
                buffers[i] = new
        self.batch_size = indices.numel()
