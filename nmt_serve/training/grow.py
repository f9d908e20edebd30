"""A deeper model that starts out computing exactly what a trained one does (function-preserving growth).

Each new layer is a copy of the layer below it whose output projections (attention `out_proj`, feed-forward
`fc2`) are zero. In a pre-norm stack a layer adds its sublayers' outputs to the residual stream, so a
layer whose outputs are zero passes the stream through unchanged, and the final norm sees what it saw
before: the grown model's logits equal the original's. Training then moves the zeroed projections first
(their gradients are not zero), and the copied weights give the new layers a trained starting point
instead of noise. A post-norm layer normalises the stream after the residual, so no layer of it is an
identity: growth refuses it.

The deep-encoder / shallow-decoder split it is meant for (Kasai et al., 2021, "Deep Encoder, Shallow
Decoder") adds capacity where it is paid once per sentence, not once per generated token.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer


def new_layer_slots(old: int, new: int) -> list[int]:
    """For each layer of the grown stack, the old layer it copies, new copies right above their source,
    spread from the bottom: 3 -> 6 gives [0, 0, 1, 1, 2, 2]; 3 -> 5 gives [0, 0, 1, 1, 2]."""
    if new < old:
        raise ValueError(f"cannot grow {old} layers into {new}: growth only adds layers")
    per = [new // old + (i < new % old) for i in range(old)]
    return [i for i, n in enumerate(per) for _ in range(n)]


def _silence(layer: nn.Module) -> nn.Module:
    """The layer with every projection that writes into the residual stream set to zero."""
    for name, module in layer.named_modules():
        if name.endswith(("out_proj", "fc2")):
            nn.init.zeros_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    return layer


def _grow_stack(layers: nn.ModuleList, new: int) -> nn.ModuleList:
    slots = new_layer_slots(len(layers), new)
    grown = []
    for k, source in enumerate(slots):
        first_copy = k == 0 or slots[k - 1] != source
        grown.append(layers[source] if first_copy else _silence(copy.deepcopy(layers[source])))
    return nn.ModuleList(grown)


@torch.no_grad()
def grow(model: Transformer, *, n_encoder_layers: int = 0, n_decoder_layers: int = 0) -> Transformer:
    """A new model with `n_encoder_layers`/`n_decoder_layers` (0 = as it is), equal in output to `model`."""
    config: ModelConfig = model.config
    if config.norm_placement != "pre":
        raise ValueError(f"growing a {config.norm_placement}-norm model: only pre-norm layers can start as identities")
    n_enc = n_encoder_layers or config.n_encoder_layers
    n_dec = n_decoder_layers or config.n_decoder_layers
    source = copy.deepcopy(model)
    grown = Transformer(dataclasses.replace(config, n_encoder_layers=n_enc, n_decoder_layers=n_dec))
    source.encoder_layers = _grow_stack(source.encoder_layers, n_enc)
    source.decoder_layers = _grow_stack(source.decoder_layers, n_dec)
    grown.load_state_dict(source.state_dict())
    return grown.to(next(model.parameters()).device)
