"""M2M100 and NLLB-200 (Hugging Face `model_type` "m2m_100") as our Transformer.

Pre-norm layers with a LayerNorm after each stack, embeddings scaled by sqrt(d_model), fairseq's
sinusoidal positions (sin then cos at frequencies 10000^(-i/(C/2-1)); a token at index t sits at
position t + pad id + 1), relu, the output tied to the shared embedding, `</s>` as the decoder start.
"""
from __future__ import annotations

import torch

from nmt_serve.convert.huggingface import build, fairseq_config, stack_weights
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer

FAMILY = "M2M100"


def config_from_m2m_100(hf: dict, hf_state: dict[str, torch.Tensor], unk_id: int) -> ModelConfig:
    return fairseq_config(hf, hf_state, FAMILY, unk_id, activation="relu", scale_embeddings=True,
                          positional_layout="fairseq", position_offset=hf["pad_token_id"] + 1, final_logits_bias=False)


def m2m_100_to_model(hf_config: dict, hf_state: dict[str, torch.Tensor], unk_id: int = 3) -> Transformer:
    cfg = config_from_m2m_100(hf_config, hf_state, unk_id)
    return build(cfg, stack_weights(cfg, hf_state, FAMILY))
