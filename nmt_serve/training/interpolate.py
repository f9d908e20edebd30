"""A fine-tuned model's weights interpolated with those it started from (WiSE-FT: Wortsman et al., 2022,
"Robust fine-tuning of zero-shot models").

    python -m nmt_serve.training.interpolate --base runs/debian-stage3/final \
        --tuned runs/debian-stage5/final --weight 0.5 --output checkpoints/debian-multi30k

Fine-tuning a small model on a new kind of text gains some of it and gives a little back elsewhere (the
stages in BENCHMARKS.md). A model fine-tuned from another lies in the same basin of the loss, so the points
on the line between the two are models too: each weight is (1 - w) x base + w x tuned. Part-way along,
such a model keeps most of the gain and most of what the base could do, often more of both than training
less would give. The two must have one architecture and one vocabulary: the same config, tokenizers and
directions, as `init_from` makes them.

The result keeps the tuned model's training record (what it learned from, for its card) and records the
interpolation: the weight and each parent's weights' SHA-256 and training config. Scores, quality flags
and speed describe other weights, so they are left out: measure them again (`nmt_serve.training.model_card`,
`nmt_serve.training.flag_calibration`) before the model is served.
"""
from __future__ import annotations

import argparse
import hashlib
from dataclasses import replace
from pathlib import Path

import torch

from nmt_serve.cli.common import fail, user_errors
from nmt_serve.network.checkpoint import WEIGHTS_FILE, CheckpointError, CheckpointInfo, load_checkpoint, read_info, save_checkpoint
from nmt_serve.network.transformer import Transformer

MEASURED_KEYS = ("scores", "quality_flags", "speed")  # metadata of the parents' weights, not of the interpolation


class IncompatibleModels(ValueError):
    """The two checkpoints are not one architecture with one vocabulary."""


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_compatible(base: CheckpointInfo, tuned: CheckpointInfo, base_dir: Path, tuned_dir: Path) -> None:
    """Raise IncompatibleModels unless a weight of one means what the same weight of the other does."""
    if base.config != tuned.config:
        raise IncompatibleModels(f"{base_dir} and {tuned_dir} have different model configs")
    same = {
        "directions": base.directions == tuned.directions and base.target_tags == tuned.target_tags,
        "languages": (base.source_lang, base.target_lang) == (tuned.source_lang, tuned.target_lang),
        "language codes": base.language_codes == tuned.language_codes,
        "tokenizers": all((base_dir / a).read_bytes() == (tuned_dir / b).read_bytes()
                          for a, b in ((base.src_tokenizer, tuned.src_tokenizer), (base.tgt_tokenizer, tuned.tgt_tokenizer))),
    }
    differ = [name for name, ok in same.items() if not ok]
    if differ:
        raise IncompatibleModels(f"{base_dir} and {tuned_dir} differ in their {', '.join(differ)}")


@torch.no_grad()
def interpolate(base: Transformer, tuned: Transformer, weight: float) -> Transformer:
    """A model whose every floating-point tensor is (1 - weight) x base's + weight x tuned's, computed in
    float32; other tensors are the tuned model's. `tuned` itself is returned, changed in place."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight {weight}: expected 0 (the base) to 1 (the tuned model)")
    base_state = base.state_dict()
    mixed = {}
    for name, t in tuned.state_dict().items():
        b = base_state[name]
        mixed[name] = torch.lerp(b.float(), t.float(), weight).to(t.dtype) if t.is_floating_point() else t
    tuned.load_state_dict(mixed)
    return tuned


def interpolate_checkpoints(base_dir: str | Path, tuned_dir: str | Path, weight: float, output: str | Path) -> Path:
    """Write the interpolation of two checkpoint directories to `output` (float16, like a training export)."""
    base_dir, tuned_dir, output = Path(base_dir), Path(tuned_dir), Path(output)
    check_compatible(read_info(base_dir), read_info(tuned_dir), base_dir, tuned_dir)  # before reading any weights
    base_model, base_info, _, _ = load_checkpoint(base_dir)
    tuned_model, tuned_info, _, _ = load_checkpoint(tuned_dir)
    # hashed before writing: output may be one of the parents' directories
    parents = {role: {"path": str(d), "weights_sha256": _file_sha256(d / WEIGHTS_FILE),
                      "training": info.metadata.get("training", {})}
               for role, d, info in (("base", base_dir, base_info), ("tuned", tuned_dir, tuned_info))}
    model = interpolate(base_model, tuned_model, weight)
    metadata = {k: v for k, v in tuned_info.metadata.items() if k not in MEASURED_KEYS}
    metadata["interpolation"] = {"weight": weight, **parents}
    tokenizers = {name: tuned_dir / name for name in {tuned_info.src_tokenizer, tuned_info.tgt_tokenizer}}
    return save_checkpoint(output, model, replace(tuned_info, metadata=metadata), tokenizer_files=tokenizers,
                           dtype=torch.float16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-interpolate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, type=Path, help="the checkpoint fine-tuning started from")
    parser.add_argument("--tuned", required=True, type=Path, help="the fine-tuned checkpoint")
    parser.add_argument("--weight", required=True, type=float, help="0 gives the base, 1 the tuned model")
    parser.add_argument("--output", required=True, type=Path, help="checkpoint directory to write")
    args = parser.parse_args(argv)
    if not 0.0 <= args.weight <= 1.0:
        fail(parser, f"--weight {args.weight}: expected 0 (the base) to 1 (the tuned model)")
    with user_errors(parser, CheckpointError, IncompatibleModels, OSError):
        written = interpolate_checkpoints(args.base, args.tuned, args.weight, args.output)
    print(f"wrote {written}: weight {args.weight} of {args.tuned}, {1 - args.weight:g} of {args.base}. "
          "Measure its card and quality flags before serving it.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
