"""M2M100 and NLLB-200 (Hugging Face `model_type` "m2m_100") as our Transformer.

Pre-norm layers with a LayerNorm after each stack, embeddings scaled by sqrt(d_model), fairseq's
sinusoidal positions (sin then cos at frequencies 10000^(-i/(C/2-1)); a token at index t sits at
position t + pad id + 1), relu, the output tied to the shared embedding, `</s>` as the decoder start.
"""
from __future__ import annotations

import torch

from nmt_serve.convert.huggingface import (
    ACTIVATION_FROM_HF,
    UnsupportedModel,
    build,
    check_symmetric,
    sharing,
    stack_weights,
)
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer

FAMILY = "M2M100"


def config_from_m2m_100(hf: dict, hf_state: dict[str, torch.Tensor], unk_id: int) -> ModelConfig:
    check_symmetric(hf)
    activation = hf.get("activation_function", "relu")
    if activation not in ACTIVATION_FROM_HF:
        raise UnsupportedModel(f"activation {activation!r} is not supported")
    shared, tied = sharing(hf_state, FAMILY)
    if not tied:
        raise UnsupportedModel("an M2M100 output layer not tied to the target embedding is not supported")
    return ModelConfig(
        src_vocab_size=hf["vocab_size"], tgt_vocab_size=hf["vocab_size"],
        d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation=ACTIVATION_FROM_HF[activation], norm_placement="pre",
        positional_layout="fairseq", position_offset=hf["pad_token_id"] + 1, max_positions=hf["max_position_embeddings"],
        scale_embeddings=bool(hf.get("scale_embedding", True)), share_embeddings=shared, tie_output=True,
        final_logits_bias=False, pad_id=hf["pad_token_id"], unk_id=unk_id, bos_id=hf.get("bos_token_id", 0),
        eos_id=hf["eos_token_id"], decoder_start_id=hf.get("decoder_start_token_id", hf["eos_token_id"]),
        append_eos_to_source=True,
    )


def m2m_100_to_model(hf_config: dict, hf_state: dict[str, torch.Tensor], unk_id: int = 3) -> Transformer:
    cfg = config_from_m2m_100(hf_config, hf_state, unk_id)
    return build(cfg, stack_weights(cfg, hf_state, FAMILY))
