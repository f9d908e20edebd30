"""Model configuration: one dataclass, saved as config.json next to the weights."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

ACTIVATIONS = ("relu", "gelu", "swish")
NORM_PLACEMENTS = ("post", "pre")
POSITIONAL_LAYOUTS = ("interleaved", "halves", "fairseq", "learned")


@dataclass
class ModelConfig:
    src_vocab_size: int = 8000  # source vocabulary size (equals tgt when share_embeddings)
    tgt_vocab_size: int = 8000  # target vocabulary size
    d_model: int = 256  # width of every residual stream
    n_heads: int = 4  # attention heads; d_model must divide evenly
    d_ff: int = 1024  # hidden width of the position-wise feed-forward block
    n_encoder_layers: int = 3  # encoder depth
    n_decoder_layers: int = 3  # decoder depth
    dropout: float = 0.1  # dropout on embeddings, sublayer outputs and FFN hidden
    attention_dropout: float = 0.0  # dropout on attention probabilities
    activation: str = "relu"  # relu (paper) | gelu | swish (Marian)
    norm_placement: str = "post"  # post: LayerNorm after the residual add (paper, Marian); pre: before
    # interleaved sin/cos (paper) | halves: sin then cos (Marian) | fairseq: sin then cos at frequencies
    # 10000^(-i/(C/2-1)) (M2M100, NLLB) | learned: a table per stack stored with the weights (mBART)
    positional_layout: str = "interleaved"
    position_offset: int = 0  # the sinusoid of token t is taken at position t + offset (fairseq: pad id + 1)
    max_positions: int = 1024  # longest sequence the positional table covers
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    embedding_norm: bool = False  # LayerNorm over token embedding + position, per stack (mBART's layernorm_embedding)
    share_embeddings: bool = True  # one embedding table for source and target (joint vocabulary)
    tie_output: bool = True  # output projection reuses the target embedding matrix
    final_logits_bias: bool = False  # learned per-token bias added to logits (Marian)
    layer_norm_eps: float = 1e-5
    pad_id: int = 0  # padding token; never attended to, never generated
    unk_id: int = 1
    bos_id: int = 2  # beginning-of-sentence id in the vocabulary (-1 if none)
    eos_id: int = 3  # end-of-sentence id; ends a hypothesis
    decoder_start_id: int = 2  # first decoder input (bos here; pad for Marian)
    append_eos_to_source: bool = True  # encoder input ends with eos

    def __post_init__(self) -> None:
        assert self.d_model % self.n_heads == 0, "d_model must be divisible by n_heads"
        assert self.activation in ACTIVATIONS, f"activation must be one of {ACTIVATIONS}"
        assert self.norm_placement in NORM_PLACEMENTS, f"norm_placement must be one of {NORM_PLACEMENTS}"
        assert self.positional_layout in POSITIONAL_LAYOUTS, f"positional_layout must be one of {POSITIONAL_LAYOUTS}"
        assert self.d_model % 2 == 0, "sinusoidal positions need an even d_model"
        if self.share_embeddings:
            assert self.src_vocab_size == self.tgt_vocab_size, "shared embeddings need one vocabulary size"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown model config keys: {unknown}")
        return cls(**data)
