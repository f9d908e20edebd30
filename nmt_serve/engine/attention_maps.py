"""The attention endpoint's work, done in the engine process: translate (or force-decode a given
translation) with attention maps, and select the layers and heads asked for as plain lists."""
from __future__ import annotations

import torch

from nmt_serve.engine.protocol import Attention
from nmt_serve.inference.translator import Translator


def select(maps: torch.Tensor, layers: list[int], heads: list[int], average: bool) -> list:
    """(L, H, T, S) -> nested lists [layer][head][T][S] for the chosen layers/heads (head mean if asked)."""
    chosen = maps[layers][:, heads]
    if average:
        chosen = chosen.mean(dim=1, keepdim=True)
    return chosen.tolist()


def attention_maps(translator: Translator, call: Attention) -> dict:
    include = tuple(dict.fromkeys(["cross", *call.include]))
    if not call.source:
        raise ValueError("the text is empty")
    source = translator.inputs.source_ids(call.source)
    if call.target_text is not None:
        forced = translator.force_decode_ids(source, call.target_text, attention_include=include, target_prefix=call.target_prefix)
        text, score, maps = call.target_text, forced.score, forced.attention
    else:
        [result] = translator.translate(sources=[source], beam_size=call.beam_size, return_scores=True,
                                        return_attention=True, attention_include=include, target_prefix=call.target_prefix)
        text, score, maps = result.text, result.hypotheses[0].score, result.attention
    layers, heads, average = call.layers, call.heads, call.average_heads
    return dict(
        translation=text, score=score, source_tokens=maps.source_tokens, target_tokens=maps.target_tokens,
        cross=select(maps.cross, layers, heads, average) if "cross" in call.include else None,
        decoder_self=select(maps.decoder_self, layers, heads, average) if "decoder_self" in call.include else None,
        encoder_self=select(maps.encoder_self, call.encoder_layers, heads, average) if "encoder_self" in call.include else None,
        alignment=maps.cross[layers][:, heads].mean(dim=(0, 1)).argmax(dim=-1).tolist(),  # (T,) over (T, S)
    )
