"""mBART and mBART-50 (Hugging Face `model_type` "mbart") as our Transformer.

Pre-norm layers with a LayerNorm after each stack, a LayerNorm over the embeddings of each stack
(`layernorm_embedding`), learned positions stored per stack (a token at index t reads row t + 2 of
Hugging Face's table: we keep the rows from 2 on), gelu, embeddings scaled when `scale_embedding`
says so, a final logits bias, the output tied to the shared embedding, `</s>` as the decoder start.
"""
from __future__ import annotations

import torch

from nmt_serve.convert.huggingface import UnsupportedModel, build, fairseq_config, stack_weights
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer

FAMILY = "mBART"
POSITION_OFFSET = 2  # MBartLearnedPositionalEmbedding's


def config_from_mbart(hf: dict, hf_state: dict[str, torch.Tensor], unk_id: int) -> ModelConfig:
    if hf.get("add_bias_logits") or hf.get("normalize_before") is False:
        raise UnsupportedModel("only mBART's standard layout (pre-norm, no logits bias layer) is supported")
    return fairseq_config(hf, hf_state, FAMILY, unk_id, activation="gelu", scale_embeddings=False,
                          positional_layout="learned", embedding_norm=True, final_logits_bias=True)


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
