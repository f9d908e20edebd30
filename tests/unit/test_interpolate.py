"""A fine-tuned model interpolated with its starting point (nmt_serve/training/interpolate.py): the weights
on the line between the two, the record it keeps, and the pairs it refuses."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from conftest import random_model

from nmt_serve.network.checkpoint import CheckpointInfo, load_checkpoint, save_checkpoint
from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.training.interpolate import IncompatibleModels, interpolate, interpolate_checkpoints, main


def parent(directory, spm_model, seed: int, metadata: dict, **overrides):
    tok = Tokenizer(spm_model)
    model = random_model(seed=seed, **{"src_vocab_size": tok.vocab_size, "tgt_vocab_size": tok.vocab_size, **overrides})
    info = CheckpointInfo(model.config, "de", "en", "spm.model", "spm.model", metadata)
    return save_checkpoint(directory, model, info, {"spm.model": spm_model}, dtype=torch.float16)


@pytest.fixture
def parents(tmp_path, spm_model):
    base = parent(tmp_path / "base", spm_model, 1, {"training": {"steps": 800}, "scores": [{"bleu": 1.0}]})
    tuned = parent(tmp_path / "tuned", spm_model, 2, {"training": {"steps": 500, "config": {"lr": 2e-4}},
                                                       "scores": [{"bleu": 2.0}], "quality_flags": {"x": 1},
                                                       "speed": {"threads": 1}})
    return base, tuned


def test_the_ends_of_the_line_are_the_two_models_and_the_middle_is_between():
    src = torch.randint(4, 64, (2, 7))
    tgt = torch.randint(4, 64, (2, 5))
    with torch.no_grad():
        base_out, tuned_out = random_model(seed=1)(src, tgt), random_model(seed=2)(src, tgt)
        torch.testing.assert_close(interpolate(random_model(seed=1), random_model(seed=2), 0.0)(src, tgt), base_out)
        torch.testing.assert_close(interpolate(random_model(seed=1), random_model(seed=2), 1.0)(src, tgt), tuned_out)
        middle = interpolate(random_model(seed=1), random_model(seed=2), 0.25)
        a, b = random_model(seed=1), random_model(seed=2)
        for name, w in middle.state_dict().items():
            torch.testing.assert_close(w, 0.75 * a.state_dict()[name] + 0.25 * b.state_dict()[name])
        out = middle(src, tgt)
    assert not torch.allclose(out, base_out) and not torch.allclose(out, tuned_out)
    with pytest.raises(ValueError, match="expected 0"):
        interpolate(random_model(seed=1), random_model(seed=2), 1.5)


def test_the_checkpoint_keeps_the_tuned_models_training_and_names_both_parents(parents, tmp_path):
    base, tuned = parents
    out = interpolate_checkpoints(base, tuned, 0.5, tmp_path / "mixed")
    model, info, _, _ = load_checkpoint(out)
    base_model, _, _, _ = load_checkpoint(base)
    tuned_model, _, _, _ = load_checkpoint(tuned)
    for name, w in model.state_dict().items():
        expected = (0.5 * base_model.state_dict()[name] + 0.5 * tuned_model.state_dict()[name]).half().float()
        torch.testing.assert_close(w, expected, rtol=0, atol=0)
    # what the tuned model learned from stays (its card describes it); what was measured on either goes
    assert info.metadata["training"] == {"steps": 500, "config": {"lr": 2e-4}}
    assert not info.metadata.keys() & {"scores", "quality_flags", "speed"}
    record = info.metadata["interpolation"]
    assert record["weight"] == 0.5
    assert record["base"]["path"] == str(base) and record["tuned"]["path"] == str(tuned)
    assert record["base"]["training"] == {"steps": 800}
    assert record["tuned"]["weights_sha256"] == hashlib.sha256((tuned / "model.safetensors").read_bytes()).hexdigest()
    assert (out / "spm.model").read_bytes() == (tuned / "spm.model").read_bytes()


def test_writing_over_a_parent_records_the_parents_weights_not_the_result(parents):
    base, tuned = parents
    before = hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest()
    interpolate_checkpoints(base, tuned, 0.5, base)
    record = json.loads((base / "config.json").read_text())["metadata"]["interpolation"]
    assert record["base"]["weights_sha256"] == before
    assert hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest() != before


def test_models_of_another_shape_or_vocabulary_are_refused(parents, tmp_path, spm_model, tagged_spm):
    base, _ = parents
    wider = parent(tmp_path / "wider", spm_model, 2, {}, d_ff=128)
    with pytest.raises(IncompatibleModels, match="model configs"):
        interpolate_checkpoints(base, wider, 0.5, tmp_path / "out")
    # the same shape with another tokenizer: piece 7 of one is not piece 7 of the other
    other = parent(tmp_path / "other", tagged_spm, 2, {}, src_vocab_size=Tokenizer(spm_model).vocab_size,
                   tgt_vocab_size=Tokenizer(spm_model).vocab_size)
    with pytest.raises(IncompatibleModels, match="tokenizers"):
        interpolate_checkpoints(base, other, 0.5, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_command_says_in_one_line_what_is_wrong(parents, tmp_path, spm_model, capsys):
    base, tuned = parents
    with pytest.raises(SystemExit) as exit_:
        main(["--base", str(base), "--tuned", str(tuned), "--weight", "2", "--output", str(tmp_path / "o")])
    assert exit_.value.code == 2 and "--weight 2.0: expected 0" in capsys.readouterr().err
    wider = parent(tmp_path / "wider", spm_model, 2, {}, d_ff=128)
    with pytest.raises(SystemExit) as exit_:
        main(["--base", str(base), "--tuned", str(wider), "--weight", "0.5", "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "different model configs" in err and "Traceback" not in err
    assert main(["--base", str(base), "--tuned", str(tuned), "--weight", "0.5", "--output", str(tmp_path / "o")]) == 0
    assert "Measure its card" in capsys.readouterr().out


def test_the_card_says_how_the_weights_were_mixed():
    from nmt_serve.training.model_card import checkpoint_row

    trained = {"training": {"averaged": [400, 500]}}
    assert checkpoint_row(trained) == "average of steps 400, 500"
    row = checkpoint_row({**trained, "interpolation": {"weight": 0.25, "base": {"path": "runs/a"}, "tuned": {"path": "runs/b"}}})
    assert row.startswith("average of steps 400, 500, then interpolated")
    assert "0.75 x `runs/a` + 0.25 x `runs/b`" in row
