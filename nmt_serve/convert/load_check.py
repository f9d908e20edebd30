"""A conversion's last step: the checkpoint it wrote, loaded as the service loads it and made to translate
one sentence. The loader checks what a converter cannot see alone (a tokenizer whose special ids
disagree with the weights', a vocabulary file of another size), so a conversion that exits 0 is one the
service can serve, and one that cannot leaves nothing behind."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from nmt_serve.network.checkpoint import CheckpointError

TRIAL = "Hello."


def checked(out_dir: Path, save: Callable[[], Path]) -> Path:
    """save() the checkpoint into out_dir, then load it and translate TRIAL; CheckpointError if that fails,
    with out_dir removed when save() made it."""
    from nmt_serve.inference.translator import Translator

    existed = Path(out_dir).exists()
    path = save()
    try:
        translator = Translator.load(path, device="cpu", warmup=False)
        source, target = translator.directions[0].split("-", 1)
        translator.translate([TRIAL], source_lang=source, target_lang=target, beam_size=1, max_length=4)
    except (CheckpointError, ValueError, RuntimeError) as exc:
        if not existed:
            shutil.rmtree(out_dir, ignore_errors=True)
        raise CheckpointError(f"the converted model does not load: {exc}") from exc
    return path
