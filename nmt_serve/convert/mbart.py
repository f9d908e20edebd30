"""mBART and mBART-50 (Hugging Face `model_type` "mbart") as our Transformer.

Pre-norm layers with a LayerNorm after each stack, a LayerNorm over the embeddings of each stack
(`layernorm_embedding`), learned positions stored per stack (a token at index t reads row t + 2 of
Hugging Face's table: we keep the rows from 2 on), gelu, embeddings scaled when `scale_embedding`
says so, a final logits bias, the output tied to the shared embedding, `</s>` as the decoder start.
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

FAMILY = "mBART"
POSITION_OFFSET = 2  # MBartLearnedPositionalEmbedding's


def config_from_mbart(hf: dict, hf_state: dict[str, torch.Tensor], unk_id: int) -> ModelConfig:
    check_symmetric(hf)
    activation = hf.get("activation_function", "gelu")
    if activation not in ACTIVATION_FROM_HF:
        raise UnsupportedModel(f"activation {activation!r} is not supported")
    if hf.get("add_bias_logits") or hf.get("normalize_before") is False:
        raise UnsupportedModel("only mBART's standard layout (pre-norm, no logits bias layer) is supported")
    shared, tied = sharing(hf_state, FAMILY)
    if not tied:
        raise UnsupportedModel("an mBART output layer not tied to the target embedding is not supported")
    return ModelConfig(
        src_vocab_size=hf["vocab_size"], tgt_vocab_size=hf["vocab_size"],
        d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation=ACTIVATION_FROM_HF[activation], norm_placement="pre",
        positional_layout="learned", max_positions=hf["max_position_embeddings"],
        scale_embeddings=bool(hf.get("scale_embedding", False)), embedding_norm=True,
        share_embeddings=shared, tie_output=True, final_logits_bias=True,
        pad_id=hf["pad_token_id"], unk_id=unk_id, bos_id=hf.get("bos_token_id", 0), eos_id=hf["eos_token_id"],
        decoder_start_id=hf.get("decoder_start_token_id") if hf.get("decoder_start_token_id") is not None else hf["eos_token_id"],
        append_eos_to_source=True,
    )


def mbart_to_model(hf_config: dict, hf_state: dict[str, torch.Tensor], unk_id: int = 3) -> Transformer:
    cfg = config_from_mbart(hf_config, hf_state, unk_id)
    state = stack_weights(cfg, hf_state, FAMILY)
    P = cfg.max_positions
    for side, stack in (("src", "encoder"), ("tgt", "decoder")):
        table = hf_state[f"model.{stack}.embed_positions.weight"]
        if table.size(0) < P + POSITION_OFFSET:
            raise ValueError(f"model.{stack}.embed_positions.weight has {table.size(0)} rows, fewer than max_position_embeddings + 2")
        state[f"{side}_positions"] = table[POSITION_OFFSET : POSITION_OFFSET + P]
        for leaf in ("weight", "bias"):
            state[f"{side}_embed_norm.{leaf}"] = hf_state[f"model.{stack}.layernorm_embedding.{leaf}"]
    state["logits_bias"] = hf_state["final_logits_bias"].reshape(-1)
    return build(cfg, state)
