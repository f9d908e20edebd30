"""The models an engine serves: one Translator per language pair, found in the models directory."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model.translator import Translator

log = logging.getLogger("engine.models")


def discover(models_dir: str | Path) -> list[Path]:
    """Checkpoint directories directly under models_dir (or models_dir itself if it is one)."""
    root = Path(models_dir)
    if (root / "config.json").is_file():
        return [root]
    if not root.is_dir():
        raise FileNotFoundError(f"models directory not found: {root}")
    found = sorted(p for p in root.iterdir() if (p / "config.json").is_file())
    if not found:
        raise FileNotFoundError(f"no checkpoints (subdirectories with config.json) in {root}")
    return found


def load_models(models_dir: str | Path, device: str, dtype: str | None, quantization: str = "none",
                step_mode: str = "auto") -> dict[str, tuple[Translator, float, str]]:
    """{"de-en": (translator, load seconds, checkpoint path)} for every checkpoint found."""
    from model.translator import Translator  # torch: only the engine process pays for it

    models: dict = {}
    for path in discover(models_dir):
        t0 = time.perf_counter()
        # no warm-up capture: the engine decodes with ContinuousSearch; the static decoder serves only
        # the attention endpoint's searches and captures a bucket when one first needs it
        translator = Translator.load(path, device=device, dtype=dtype, quantization=quantization, step_mode=step_mode,
                                     warmup=False)
        model_id = f"{translator.source_lang}-{translator.target_lang}"
        if model_id in models:
            raise ValueError(f"two checkpoints for {model_id}: {models[model_id][2]} and {path}")
        models[model_id] = (translator, time.perf_counter() - t0, str(path))
        log.info("loaded %s from %s on %s (%.2fs)", model_id, path, translator.device, models[model_id][1])
    return models
