"""Hugging Face checkpoints of the families people deploy, converted exactly: tiny random M2M100 /
NLLB-200 and mBART models built from transformers' own config classes (nothing downloaded), their
logits compared with transformers' on the same inputs, through the nn.Module path and the model runner."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nmt_serve.convert.m2m_100 import m2m_100_to_model  # noqa: E402
from nmt_serve.convert.mbart import mbart_to_model  # noqa: E402
from nmt_serve.inference.model_runner import ModelRunner  # noqa: E402

SHAPE = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
             dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def randomized(model):
    """Every parameter random (norms and biases too), so that a wrong mapping cannot hide."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.5 if "norm" not in name else 0.2).add_(1.0 if name.endswith("norm.weight") or name.endswith("layer_norm.weight") else 0.0)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_()
    return model.eval()


def inputs(pad: int, eos: int, start: int):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 90, (3, 9), generator=g)
    src[:, -1] = eos
    src[1, 6:] = pad  # right-padded, as we batch
    src[1, 5] = eos
    tgt = torch.randint(4, 90, (3, 7), generator=g)
    tgt[:, 0] = start
    return src, tgt


def hf_logits(hf, src, tgt, pad):
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits


def runner_logits(ours, src, tgt):
    """The fused-weight path the searches use: encode once, then one token at a time with the KV cache."""
    runner = ModelRunner(ours)
    with torch.no_grad():
        states, mask = runner.encode(src)
        cache = runner.new_cache(states, mask, capacity=tgt.size(1))
        return torch.stack([runner.step(tgt[:, t], cache) for t in range(tgt.size(1))], dim=1)


@pytest.mark.parametrize("family", ["m2m_100", "nllb", "mbart"])
def test_logits_equal_transformers(family):
    if family == "mbart":
        config = transformers.MBartConfig(**SHAPE, scale_embedding=True, activation_function="gelu")
        hf = randomized(transformers.MBartForConditionalGeneration(config))
        convert = mbart_to_model
    else:
        config = transformers.M2M100Config(**SHAPE, scale_embedding=True, activation_function="relu")
        hf = randomized(transformers.M2M100ForConditionalGeneration(config))
        convert = m2m_100_to_model
    ours = convert(config.to_dict(), {k: v.clone() for k, v in hf.state_dict().items()})
    src, tgt = inputs(config.pad_token_id, config.eos_token_id, config.eos_token_id)
    expected = hf_logits(hf, src, tgt, config.pad_token_id)
    with torch.no_grad():
        got = ours(src, tgt)
    assert (got - expected).abs().max().item() < 1e-4
    assert (runner_logits(ours, src, tgt) - expected).abs().max().item() < 1e-4
