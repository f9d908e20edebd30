"""Growing a trained model deeper without changing what it computes (nmt_serve/training/grow.py), and the
fine-tuning schedule and data weights that go with it (train.py, multiway.py)."""
from __future__ import annotations

import pytest
import torch
from conftest import random_model

from nmt_serve.training.data import ParallelData
from nmt_serve.training.grow import grow, new_layer_slots
from nmt_serve.training.multiway import repeated
from nmt_serve.training.train import linear_lr


def test_new_layers_sit_above_the_layer_they_copy():
    assert new_layer_slots(3, 6) == [0, 0, 1, 1, 2, 2]
    assert new_layer_slots(3, 5) == [0, 0, 1, 1, 2]
    assert new_layer_slots(2, 2) == [0, 1]
    with pytest.raises(ValueError, match="only adds"):
        new_layer_slots(3, 2)


def test_a_grown_model_computes_what_the_original_did_until_it_is_trained():
    model = random_model(seed=1, norm_placement="pre").eval()
    # trained-looking weights: every parameter non-zero, so that a zero output is the growth's doing
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    deeper = grow(model, n_encoder_layers=2 * model.config.n_encoder_layers,
                  n_decoder_layers=model.config.n_decoder_layers + 1).eval()
    assert len(deeper.encoder_layers) == 2 * len(model.encoder_layers)
    assert len(deeper.decoder_layers) == len(model.decoder_layers) + 1
    assert deeper.num_parameters() > model.num_parameters()
    src = torch.randint(4, model.config.src_vocab_size, (3, 9))
    tgt = torch.randint(4, model.config.tgt_vocab_size, (3, 7))
    with torch.no_grad():
        torch.testing.assert_close(deeper(src, tgt), model(src, tgt), rtol=0, atol=1e-6)
    # the new layers are the ones below them with their writes into the residual stream silenced
    new = deeper.encoder_layers[1]
    assert torch.equal(new.self_attn.q_proj.weight, model.encoder_layers[0].self_attn.q_proj.weight)
    assert not new.self_attn.out_proj.weight.any() and not new.ffn.fc2.weight.any()
    # and they learn: one step moves the model away from the original
    loss = deeper.train()(src, tgt).logsumexp(-1).mean()
    loss.backward()
    assert new.self_attn.out_proj.weight.grad.abs().sum() > 0 and new.ffn.fc2.weight.grad.abs().sum() > 0


def test_a_post_norm_model_is_not_grown():
    with pytest.raises(ValueError, match="pre-norm"):
        grow(random_model(seed=1, norm_placement="post"), n_encoder_layers=4)


def test_the_linear_schedule_warms_up_then_ends_at_zero():
    assert linear_lr(50, 1e-3, 100, 1100) == pytest.approx(5e-4)
    assert linear_lr(100, 1e-3, 100, 1100) == pytest.approx(1e-3)
    assert linear_lr(600, 1e-3, 100, 1100) == pytest.approx(5e-4)
    assert linear_lr(1100, 1e-3, 100, 1100) == 0.0 and linear_lr(1200, 1e-3, 100, 1100) == 0.0


def test_multiway_pairs_are_repeated_by_their_weight():
    data = ParallelData([[i] for i in range(1000)], [[i + 1] for i in range(1000)])
    assert len(repeated(data, 2.0, seed=1)) == 2000
    half = repeated(data, 1.5, seed=1)
    assert 1400 < len(half) < 1600 and half.src == repeated(data, 1.5, seed=1).src  # seeded: the same every run
    assert all(t == [s[0] + 1] for s, t in zip(half.src, half.tgt))  # pairs stay pairs
    assert len(repeated(data, 0.0, seed=1)) == 0
