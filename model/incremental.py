"""The incremental decoder: one new target token per row over a KVCache, for greedy and beam search.

It computes what `Transformer.decode` computes for the newest position, with the per-step work cut
down. At batch 1 a step is a few hundred small tensor operations, so their number matters more than
their size:
- q/k/v of self-attention come from one matmul on a fused (3C, C) weight, and the cross-attention
  keys/values of every layer from one matmul over the source (done once per search);
- the target embedding table is pre-scaled by sqrt(d_model), and the logits bias is the output
  matmul's bias;
- layers call tensor functions directly rather than through nn.Module calls and closures;
- the new keys/values of a layer are written to the cache in one copy, and attention needs no mask
  for one new token (nor for the source when no row is padded).

The fused weights are copies, made on first use and remade whenever a parameter or buffer of the
model changes (they are keyed on each tensor's storage and version counter), so a model that is
trained between searches never decodes with stale weights.

Linear layers may run in int8 (`quantization="int8"`, CPU only): weights quantized per output
channel, activations quantized dynamically per call (fbgemm). It is an option with a measured BLEU
cost (see the model cards and BENCHMARKS.md), never the default.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

from .cache import KVCache

if TYPE_CHECKING:  # the Transformer imports this module
    from .transformer import Transformer

QUANTIZATIONS = ("none", "int8")


class FloatLinear:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Int8Linear:
    """y = x W^T + b with W in int8 (one scale per output channel) and x quantized on the fly."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError("int8 quantization needs PyTorch's fbgemm engine (x86 CPUs); it is not available here")
        weight = weight.detach().float().cpu()
        scale = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-8).double()
        zero = torch.zeros(weight.size(0), dtype=torch.long)
        with warnings.catch_warnings():
            # quantized tensors are deprecated in favor of torchao; the fbgemm kernels are what we use
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale, zero, 0, torch.qint8)
        b = bias.detach().float().cpu() if bias is not None else None
        self.packed = torch.ops.quantized.linear_prepack(qweight, b)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # reduce_range: 7-bit activations, which fbgemm needs on CPUs without VNNI to avoid overflow
        return torch.ops.quantized.linear_dynamic(x, self.packed, True)


@dataclass
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float

    @classmethod
    def of(cls, module: nn.Module) -> "Norm | None":
        return cls(module.weight, module.bias, module.eps) if isinstance(module, nn.LayerNorm) else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


@dataclass
class LayerWeights:
    self_qkv: FloatLinear | Int8Linear  # (3C, C): q, k, v stacked
    self_out: FloatLinear | Int8Linear
    cross_q: FloatLinear | Int8Linear
    cross_out: FloatLinear | Int8Linear
    fc1: FloatLinear | Int8Linear
    fc2: FloatLinear | Int8Linear
    self_norm: Norm
    cross_norm: Norm
    ffn_norm: Norm


def _fused(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the weights (and biases) of several Linear layers that read the same input."""
    return torch.cat([m.weight for m in linears]), torch.cat([m.bias for m in linears])


def weights_key(model: nn.Module) -> tuple:
    """Changes whenever any parameter or buffer is replaced or modified in place."""
    return tuple((t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))


class IncrementalDecoder:
    def __init__(self, model: "Transformer", quantization: str = "none"):
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        if quantization == "int8" and model.output_proj.weight.device.type != "cpu":
            raise ValueError("int8 quantization runs on CPU only")
        cfg = model.config
        self.config = cfg
        self.quantization = quantization
        self.key = weights_key(model)
        linear = Int8Linear if quantization == "int8" else FloatLinear
        self.n_heads, self.head_dim, self.d_model = cfg.n_heads, cfg.head_dim, cfg.d_model
        self.pre_norm = cfg.norm_placement == "pre"
        self.activation = model.decoder_layers[0].ffn.activation if model.decoder_layers else None
        self.embedding = model.tgt_embed.weight * model.embed_scale  # (V, C), scaled once
        self.positions = model.positions.to(self.embedding.dtype)  # (P, C)
        self.layers = []
        for layer in model.decoder_layers:
            sa, ca = layer.self_attn, layer.cross_attn
            self.layers.append(LayerWeights(
                self_qkv=linear(*_fused([sa.q_proj, sa.k_proj, sa.v_proj])),
                self_out=linear(sa.out_proj.weight, sa.out_proj.bias),
                cross_q=linear(ca.q_proj.weight, ca.q_proj.bias),
                cross_out=linear(ca.out_proj.weight, ca.out_proj.bias),
                fc1=linear(layer.ffn.fc1.weight, layer.ffn.fc1.bias),
                fc2=linear(layer.ffn.fc2.weight, layer.ffn.fc2.bias),
                self_norm=Norm.of(layer.self_block.norm),
                cross_norm=Norm.of(layer.cross_block.norm),
                ffn_norm=Norm.of(layer.ffn_block.norm),
            ))
        # keys and values of every layer's cross-attention from one matmul: (n_layers * 2C, C)
        cross_linears = [m for layer in model.decoder_layers for m in (layer.cross_attn.k_proj, layer.cross_attn.v_proj)]
        self.cross_kv = linear(*_fused(cross_linears))
        self.final_norm = Norm.of(model.decoder_norm)
        self.output = linear(model.output_proj.weight, model.logits_bias)

    def new_cache(self, states: torch.Tensor, src_mask: torch.Tensor, capacity: int = 32) -> KVCache:
        """Encoder states (B, S, C) and their mask -> a cache holding every layer's cross keys/values."""
        B, S, _ = states.shape
        kv = self.cross_kv(states)  # (B, S, n_layers * 2 * C)
        kv = kv.view(B, S, len(self.layers), 2, self.n_heads, self.head_dim).permute(0, 2, 3, 4, 1, 5)
        # a source without padding needs no mask, and attention without one is faster
        mask = None if bool(src_mask.all()) else src_mask
        return KVCache(kv.contiguous(), mask, capacity)  # (B, n_layers, 2, H, S, D)

    def step(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """tokens (N,): the newest token of each row -> logits (N, V) of the token after it."""
        N, C, H, D = tokens.size(0), self.d_model, self.n_heads, self.head_dim
        t = cache.length
        assert N == cache.batch_size, f"{N} tokens for a cache of {cache.batch_size} rows"
        assert t < self.positions.size(0), f"target longer than max_positions={self.positions.size(0)}"
        x = F.embedding(tokens, self.embedding) + self.positions[t]  # (N, C)
        pre = self.pre_norm
        for i, w in enumerate(self.layers):
            # self-attention over every cached position and the new one
            h = w.self_norm(x) if pre else x
            qkv = w.self_qkv(h).view(N, 3, H, 1, D)
            k, v = cache.append(i, qkv[:, 1:])  # (N, H, t+1, D) each
            a = F.scaled_dot_product_attention(qkv[:, 0], k, v)  # (N, H, 1, D)
            x = x + w.self_out(a.view(N, C))
            if not pre:
                x = w.self_norm(x)
            # cross-attention over the source
            h = w.cross_norm(x) if pre else x
            ck, cv = cache.cross(i)  # (N, H, S, D) each
            a = F.scaled_dot_product_attention(w.cross_q(h).view(N, H, 1, D), ck, cv, attn_mask=cache.src_mask)
            x = x + w.cross_out(a.view(N, C))
            if not pre:
                x = w.cross_norm(x)
            # feed-forward
            h = w.ffn_norm(x) if pre else x
            x = x + w.fc2(self.activation(w.fc1(h)))
            if not pre:
                x = w.ffn_norm(x)
        cache.advance()
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.output(x)  # (N, V)
