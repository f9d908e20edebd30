"""Encoder-decoder Transformer ("Attention Is All You Need"), written bottom-up.

Mask convention, everywhere: a bool tensor where True means "may attend". Masks are built only by
`padding_mask` and `causal_mask` (masks.py) and broadcast against attention scores of shape (B, H, Tq, Tk).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nmt_serve.network.config import ModelConfig
from nmt_serve.network.masks import causal_mask, padding_mask

# ----------------------------------------------------------------------------------------------
# building blocks


def sinusoidal_table(n_positions: int, dim: int, layout: str, offset: int = 0) -> torch.Tensor:
    """(n_positions, dim) table of sin/cos of (position + offset) * 10000^(-2i/dim).

    layout "interleaved" puts sin in even and cos in odd channels (the paper); "halves" puts all sins
    first and all cosines after (Marian); "fairseq" is halves at frequencies 10000^(-i/(dim/2-1))
    (fairseq's and M2M100's SinusoidalPositionalEmbedding).
    """
    position = torch.arange(offset, offset + n_positions, dtype=torch.float64)[:, None]  # (P, 1)
    if layout == "fairseq":
        half = dim // 2
        inv_freq = torch.exp(-math.log(10000.0) / (half - 1) * torch.arange(half, dtype=torch.float64))  # (dim/2,)
    else:
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = position * inv_freq[None, :]  # (P, dim/2)
    table = torch.zeros(n_positions, dim, dtype=torch.float64)
    if layout == "interleaved":
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles)
    else:
        table[:, : dim // 2] = torch.sin(angles)
        table[:, dim // 2 :] = torch.cos(angles)
    return table.float()


def activation_fn(name: str):
    return {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}[name]


# A model built on the meta device (load_checkpoint) takes every weight from its file: random values for
# meta tensors are nothing, and torch draws them in Python refs whose first call imports torch._dynamo,
# 1.1 s of an engine's 2.7 s start. Built anywhere else, the layers initialize as torch's own do.
class Linear(nn.Linear):
    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate q/k/v projections.

    Keys/values are projected by `project_kv` so that callers can cache them (cross-attention keys
    are computed once per source; self-attention keys grow by one step at a time).
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.head_dim
        self.q_proj = Linear(config.d_model, config.d_model)
        self.k_proj = Linear(config.d_model, config.d_model)
        self.v_proj = Linear(config.d_model, config.d_model)
        self.out_proj = Linear(config.d_model, config.d_model)
        self.attention_dropout = config.attention_dropout

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S, C) -> keys and values, each (B, H, S, D)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def attend(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Queries from x (B, T, C) over k, v (B, H, S, D); returns (B, T, C) and optionally (B, H, T, S)."""
        B, T, C = x.shape
        q = self.split_heads(self.q_proj(x))  # (B, H, T, D)
        dropout_p = self.attention_dropout if self.training else 0.0
        if need_weights:
            # explicit path: the probabilities are part of the result
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, S)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = scores.softmax(dim=-1)
            out = F.dropout(probs, dropout_p, self.training) @ v  # (B, H, T, D)
        else:
            # fast path; its default scale is 1/sqrt(head_dim), as the paper's
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            probs = None
        out = out.transpose(1, 2).reshape(B, T, C)
        return self.out_proj(out), probs


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fc1 = Linear(config.d_model, config.d_ff)
        self.fc2 = Linear(config.d_ff, config.d_model)
        self.activation = activation_fn(config.activation)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


class Sublayer(nn.Module):
    """Residual connection + LayerNorm around one sublayer, post-norm (paper) or pre-norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)
        self.pre_norm = config.norm_placement == "pre"

    def forward(self, x: torch.Tensor, fn) -> tuple[torch.Tensor, object]:
        """fn maps the (normalized) input to (output, extra); returns (new residual stream, extra)."""
        if self.pre_norm:
            out, extra = fn(self.norm(x))
            return x + self.dropout(out), extra
        out, extra = fn(x)
        return self.norm(x + self.dropout(out)), extra


class EncoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.ffn = FeedForward(config)
        self.attn_block = Sublayer(config)
        self.ffn_block = Sublayer(config)

    def forward(self, x, src_mask, need_weights=False):
        def self_attention(h):
            k, v = self.self_attn.project_kv(h)
            return self.self_attn.attend(h, k, v, src_mask, need_weights)

        x, probs = self.attn_block(x, self_attention)
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, probs


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.ffn = FeedForward(config)
        self.self_block = Sublayer(config)
        self.cross_block = Sublayer(config)
        self.ffn_block = Sublayer(config)

    def forward(self, x, tgt_mask, cross_k, cross_v, src_mask, need_weights=False):
        """The whole target prefix at once (teacher forcing); one-token decoding is in engine.py."""

        def self_attention(h):
            k, v = self.self_attn.project_kv(h)
            return self.self_attn.attend(h, k, v, tgt_mask, need_weights)

        def cross_attention(h):
            return self.cross_attn.attend(h, cross_k, cross_v, src_mask, need_weights)

        x, self_probs = self.self_block(x, self_attention)
        x, cross_probs = self.cross_block(x, cross_attention)
        x, _ = self.ffn_block(x, lambda h: (self.ffn(h), None))
        return x, self_probs, cross_probs


# ----------------------------------------------------------------------------------------------
# the model


@dataclass
class EncoderOutput:
    states: torch.Tensor  # (B, S, C)
    src_mask: torch.Tensor  # (B, 1, 1, S) bool
    self_attention: list[torch.Tensor] | None = None  # per layer (B, H, S, S), when asked


@dataclass
class DecoderOutput:
    logits: torch.Tensor | None  # (B, T, V); None when not asked for
    self_attention: list[torch.Tensor] | None = None  # per layer (B, H, T, T_total), when asked
    cross_attention: list[torch.Tensor] | None = None  # per layer (B, H, T, S), when asked


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.src_embed = Embedding(config.src_vocab_size, config.d_model, padding_idx=config.pad_id)
        if config.share_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = Embedding(config.tgt_vocab_size, config.d_model, padding_idx=config.pad_id)
        if config.positional_layout == "learned":
            self.src_positions = nn.Parameter(torch.zeros(config.max_positions, config.d_model))
            self.tgt_positions = nn.Parameter(torch.zeros(config.max_positions, config.d_model))
        else:  # one fixed table for both stacks, computed (on the meta device, by finish_load), not stored
            table = (torch.empty(config.max_positions, config.d_model) if self.src_embed.weight.is_meta else
                     sinusoidal_table(config.max_positions, config.d_model, config.positional_layout, config.position_offset))
            self.register_buffer("positions", table, persistent=False)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0
        norm = lambda: nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.embedding_norm else nn.Identity()  # noqa: E731
        self.src_embed_norm, self.tgt_embed_norm = norm(), norm()
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        pre = config.norm_placement == "pre"
        # pre-norm leaves the residual stream unnormalized: one final LayerNorm per stack
        self.encoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if pre else nn.Identity()
        self.output_proj = Linear(config.d_model, config.tgt_vocab_size, bias=False)
        self._tie()
        if config.final_logits_bias:
            self.register_buffer("logits_bias", torch.zeros(config.tgt_vocab_size))
        else:
            self.logits_bias = None
        self.reset_parameters()

    def _tie(self) -> None:
        if self.config.tie_output:
            self.output_proj.weight = self.tgt_embed.weight

    def finish_load(self) -> None:
        """After `load_state_dict(..., assign=True)` into a model built on the meta device: tie the
        weights stored once again, and compute the fixed position table, which is not stored."""
        self._tie()
        if self.config.positional_layout != "learned":
            c = self.config
            self.positions = sinusoidal_table(c.max_positions, c.d_model, c.positional_layout, c.position_offset).to(
                self.output_proj.weight.device)

    def reset_parameters(self) -> None:
        if self.output_proj.weight.is_meta:  # to be loaded (Linear above)
            return
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # embeddings are scaled up by sqrt(d_model): start them small so the sum with positions is balanced
        nn.init.normal_(self.src_embed.weight, std=self.config.d_model**-0.5)
        if not self.config.share_embeddings:
            nn.init.normal_(self.tgt_embed.weight, std=self.config.d_model**-0.5)
        with torch.no_grad():
            self.src_embed.weight[self.config.pad_id].zero_()
            self.tgt_embed.weight[self.config.pad_id].zero_()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def position_table(self, side: str) -> torch.Tensor:
        """(max_positions, C): the encoder's ("src") or the decoder's ("tgt") positions."""
        if self.config.positional_layout == "learned":
            return self.src_positions if side == "src" else self.tgt_positions
        return self.positions

    def embed(self, side: str, tokens: torch.Tensor) -> torch.Tensor:
        table, norm = (self.src_embed, self.src_embed_norm) if side == "src" else (self.tgt_embed, self.tgt_embed_norm)
        T = tokens.size(1)
        assert T <= self.config.max_positions, f"sequence longer than max_positions={self.config.max_positions}"
        x = table(tokens) * self.embed_scale + self.position_table(side)[:T].to(table.weight.dtype)
        return self.embed_dropout(norm(x))

    def encode(self, src: torch.Tensor, need_weights: bool = False) -> EncoderOutput:
        """src (B, S) token ids, right-padded -> encoder states (B, S, C)."""
        src_mask = padding_mask(src, self.config.pad_id)  # (B, 1, 1, S)
        x = self.embed("src", src)
        attentions = [] if need_weights else None
        for layer in self.encoder_layers:
            x, probs = layer(x, src_mask, need_weights)
            if need_weights:
                attentions.append(probs)
        return EncoderOutput(self.encoder_norm(x), src_mask, attentions)

    def decode(self, tgt_in: torch.Tensor, encoder_out: EncoderOutput, need_weights: bool = False,
               logits: bool = True) -> DecoderOutput:
        """Decoder inputs (B, T), the whole prefix -> next-token logits (B, T, V), under a causal mask
        (logits=False: only the attention, without the output layer, the largest product of a short
        sentence). Decoding one token at a time with a KV cache is the inference engine's (nmt_serve/inference/)."""
        T = tgt_in.size(1)
        x = self.embed("tgt", tgt_in)
        tgt_mask = causal_mask(T, tgt_in.device)  # (1, 1, T, T)
        self_attns = [] if need_weights else None
        cross_attns = [] if need_weights else None
        for layer in self.decoder_layers:
            cross_k, cross_v = layer.cross_attn.project_kv(encoder_out.states)
            x, self_probs, cross_probs = layer(x, tgt_mask, cross_k, cross_v, encoder_out.src_mask, need_weights)
            if need_weights:
                self_attns.append(self_probs)
                cross_attns.append(cross_probs)
        if not logits:
            return DecoderOutput(None, self_attns, cross_attns)
        out = self.output_proj(self.decoder_norm(x))
        if self.logits_bias is not None:
            out = out + self.logits_bias
        return DecoderOutput(out, self_attns, cross_attns)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: (B, S), (B, T) -> logits (B, T, V)."""
        return self.decode(tgt_in, self.encode(src)).logits
