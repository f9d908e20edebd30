"""The attention endpoint's work, done in the engine process: translate (or force-decode a given
translation) with attention maps, and select the layers and heads asked for as plain lists; and the one
number of a map that the quality flags read (source_entropy)."""
from __future__ import annotations

import math

import torch

from nmt_serve.engine.protocol import Attention
from nmt_serve.inference.translator import AttentionMaps, Translator


def select(maps: torch.Tensor, layers: list[int], heads: list[int], average: bool) -> list:
    """(L, H, T, S) -> nested lists [layer][head][T][S] for the chosen layers/heads (head mean if asked)."""
    chosen = maps[layers][:, heads]
    if average:
        chosen = chosen.mean(dim=1, keepdim=True)
    return chosen.tolist()


def source_entropy(translator: Translator, maps: AttentionMaps) -> float:
    """How spread the decoder's attention is over the source's own pieces: 0 when each target token
    looks at one source piece, 1 when it looks at all of them alike. Per target token (the end of
    sentence's row left out), the entropy of the cross-attention averaged over layers and heads, over the
    source's pieces (the language tag or code and </s> left out, the rest renormalised: they draw mass in
    short sentences however well those are translated), divided by its maximum log(pieces); the mean over
    target tokens. An output the source does not ground, a model out of its domain writing what its
    decoder expects, spreads it (text/quality_flags.py: `detached`); a source of one piece gives 0."""
    cross = maps.cross.mean(dim=(0, 1))  # (T, S)
    rows = cross[:-1] if cross.shape[0] > 1 else cross
    first, last = own_pieces(translator, cross.shape[1])
    own = rows[:, first:last]
    if own.shape[1] < 2:
        return 0.0
    p = own / own.sum(dim=-1, keepdim=True).clamp_min(1e-9)
    entropy = -(p * p.clamp_min(1e-9).log()).sum(dim=-1)
    return float(entropy.mean() / math.log(own.shape[1]))


def own_pieces(translator: Translator, source_length: int) -> tuple[int, int]:
    """Source positions [first, last) of a source's own pieces: its language tag or code, </s> and suffix left out."""
    inputs = translator.inputs
    return 1 if inputs.multilingual else 0, source_length - (1 if inputs.append_eos else 0) - len(inputs.suffix)


def searched_entropy(entropies: list[float], span: tuple[int, int]) -> float:
    """source_entropy of a translation from what the search kept of its cross-attention (per target row,
    eos's included, the entropy over the own pieces `span`), as source_entropy() reads it from a forced
    decoding of it."""
    first, last = span
    kept = entropies[:-1] if len(entropies) > 1 else entropies
    return sum(kept) / len(kept) / math.log(last - first) if last - first >= 2 and kept else 0.0


def attention_maps(translator: Translator, call: Attention) -> dict:
    """One call's maps: of its target_text by forced decoding, else of the translation it makes."""
    if call.target_text is not None:
        [maps] = forced_attention_maps(translator, [call])
        return maps
    include = _include(call)
    [result] = translator.translate(sources=[_source(translator, call)], beam_size=call.beam_size, return_scores=True,
                                    return_attention=True, attention_include=include, target_prefix=call.target_prefix)
    return _maps_of(translator, call, result.text, result.hypotheses[0].score, result.attention)


def forced_attention_maps(translator: Translator, calls: list[Attention]) -> list[dict]:
    """The maps of calls that give their target_text, by one forced decoding of them all (their
    include, and whether they want the score, as the first call's: the caller groups them)."""
    sources = [_source(translator, call) for call in calls]
    first = calls[0]
    forced = translator.force_decode_many(sources, [call.target_text for call in calls], attention_include=_include(first),
                                          target_prefixes=[call.target_prefix for call in calls], scores=first.score)
    return [_maps_of(translator, call, call.target_text, f.score, f.attention) for call, f in zip(calls, forced)]


def _include(call: Attention) -> tuple[str, ...]:
    return tuple(dict.fromkeys(["cross", *call.include]))


def _source(translator: Translator, call: Attention) -> list[int]:
    if not call.source:
        raise ValueError("the text is empty")
    return translator.inputs.source_ids(call.source)


def _maps_of(translator: Translator, call: Attention, text: str, score: float | None, maps: AttentionMaps) -> dict:
    layers, heads, average = call.layers, call.heads, call.average_heads
    return dict(
        translation=text, score=score, source_tokens=maps.source_tokens, target_tokens=maps.target_tokens,
        cross=select(maps.cross, layers, heads, average) if "cross" in call.include else None,
        decoder_self=select(maps.decoder_self, layers, heads, average) if "decoder_self" in call.include else None,
        encoder_self=select(maps.encoder_self, call.encoder_layers, heads, average) if "encoder_self" in call.include else None,
        alignment=maps.cross[layers][:, heads].mean(dim=(0, 1)).argmax(dim=-1).tolist(),  # (T,) over (T, S)
        source_entropy=source_entropy(translator, maps),
    )
