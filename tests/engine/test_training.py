"""A tiny end-to-end training run: tokenizer, a few steps, validation, save, resume, export, evaluate."""
import json
import subprocess
import sys
from pathlib import Path

from nmt_serve.inference.translator import Translator
from nmt_serve.training.evaluate import evaluate
from nmt_serve.training.train import TrainConfig, Trainer, inverse_sqrt_lr

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def tiny_run(run_dir: Path, **overrides) -> TrainConfig:
    values = dict(
        train_src=str(FIXTURES / "train300.de"), train_tgt=str(FIXTURES / "train300.en"),
        valid_src=str(FIXTURES / "val40.de"), valid_tgt=str(FIXTURES / "val40.en"),
        source_lang="de", target_lang="en", run_dir=str(run_dir), output=str(run_dir / "exported"),
        vocab_size=300, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1, n_decoder_layers=1,
        max_tokens=600, warmup_steps=5, lr=3e-3, validate_every=4, keep_best=2, average_best=2,
    )
    values.update(overrides)
    return TrainConfig(**values)


def test_learning_rate_schedule():
    assert inverse_sqrt_lr(50, 1e-3, 100) == 5e-4
    assert inverse_sqrt_lr(100, 1e-3, 100) == 1e-3
    assert abs(inverse_sqrt_lr(400, 1e-3, 100) - 5e-4) < 1e-12


def test_train_save_resume_export_evaluate(tmp_path):
    run_dir = tmp_path / "run"
    first = Trainer(tiny_run(run_dir, max_steps=6))
    first.run()
    assert first.step == 6 and (run_dir / "state.pt").exists() and (run_dir / "spm.model").exists()
    assert (run_dir / "exported" / "model.safetensors").exists()  # max_steps reached: exported
    # validated at step 4, and at step 6 before the export: steps since the last validation are a candidate too
    assert sorted(b["step"] for b in first.best) == [4, 6]
    log = (run_dir / "train.log").read_text()
    assert "validation at step 4" in log and "validation at step 6" in log

    # the same run asked to go further resumes at step 6 instead of starting again
    second = Trainer(tiny_run(run_dir, max_steps=10))
    assert second.step == 6 and second.batch_in_epoch == first.batch_in_epoch
    second.run()
    assert second.step == 10 and "resumed from step 6" in (run_dir / "train.log").read_text()
    assert len(second.best) == 2

    exported = run_dir / "exported"
    meta = json.loads((exported / "config.json").read_text())["metadata"]["training"]
    assert meta["steps"] == 10
    translator = Translator.load(exported, device="cpu")
    report = evaluate(
        translator, (FIXTURES / "val40.de").read_text().splitlines()[:8],
        (FIXTURES / "val40.en").read_text().splitlines()[:8], beam_size=2,
    )
    assert report["sentences"] == 8 and "nrefs:1|case:mixed|eff:no|tok:13a" in report["bleu_signature"]


def test_training_command_line(tmp_path):
    run_dir = tmp_path / "cli"
    cfg = tiny_run(run_dir, max_steps=3)
    args = []
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt", "run_dir", "output"):
        args += ["--" + key.replace("_", "-"), getattr(cfg, key)]
    args += ["--vocab-size", "300", "--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
             "--n-decoder-layers", "1", "--max-tokens", "600", "--max-steps", "3", "--validate-every", "3"]
    proc = subprocess.run([sys.executable, "-m", "nmt_serve.training.train", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "exported" in proc.stderr and (Path(cfg.output) / "config.json").exists()
    assert "epoch 1/" in proc.stderr  # the progress bar
