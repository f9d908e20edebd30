"""Checkpoint format: a directory holding

    config.json        {"format": ..., "model": ModelConfig fields, "source_lang", "target_lang",
                        "src_tokenizer", "tgt_tokenizer", "metadata": {...}}
    model.safetensors  weights (no pickle); tied tensors stored once
    *.model            sentencepiece model(s) named in config.json
    README.md          model card (optional for loading)

Loading is strict: a missing file, unknown or missing tensor, wrong shape, or a tokenizer that does not
match the config raises CheckpointError with a message saying what is wrong.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nmt_serve.network.checkpoint_info import CONFIG_FILE, FORMAT, WEIGHTS_FILE, CheckpointError, CheckpointInfo, read_info
from nmt_serve.network.tokenizer import Tokenizer, TokenizerMismatch
from nmt_serve.network.transformer import Transformer


def _first_names(model: Transformer) -> dict[str, str]:
    """Every state-dict name -> the first name of the same tensor: tied weights are stored once. By
    identity, not address, so that it holds for a model on the meta device too."""
    first: dict[int, str] = {}
    return {name: first.setdefault(id(t), name) for name, t in model.state_dict(keep_vars=True).items()}


def _unique_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """State dict with tied tensors kept once, each owning its storage (safetensors refuses shared
    storage, and a served model's fused weights are views into one tensor: model_runner.py)."""
    names = _first_names(model)
    out = {}
    for name, tensor in model.state_dict().items():
        if names[name] == name:
            tensor = tensor.detach().cpu().contiguous()
            shares = tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()
            out[name] = tensor.clone() if shares else tensor
    return out


def save_checkpoint(
    directory: str | Path,
    model: Transformer,
    info: CheckpointInfo,
    tokenizer_files: dict[str, Path] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a checkpoint directory. tokenizer_files maps the names in info to files to copy in."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, src in (tokenizer_files or {}).items():
        if Path(src).resolve() != (directory / name).resolve():
            shutil.copyfile(src, directory / name)
    tensors = _unique_state_dict(model)
    if dtype is not None:
        tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    tmp = directory / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": FORMAT})
    tmp.chmod(0o644)  # readable by a service running as another user
    tmp.replace(directory / WEIGHTS_FILE)
    payload = {
        "format": FORMAT,
        "source_lang": info.source_lang,
        "target_lang": info.target_lang,
        "src_tokenizer": info.src_tokenizer,
        "tgt_tokenizer": info.tgt_tokenizer,
        **({"src_vocab": info.src_vocab, "tgt_vocab": info.tgt_vocab} if info.src_vocab or info.tgt_vocab else {}),
        **({"directions": info.directions, "target_tags": info.target_tags} if info.directions else {}),
        **({"language_codes": info.language_codes} if info.language_codes else {}),
        **({"source_suffix": info.source_suffix} if info.source_suffix else {}),
        "model": info.config.to_dict(),
        "metadata": info.metadata,
    }
    (directory / CONFIG_FILE).write_text(json.dumps(payload, indent=2) + "\n")
    return directory


# the CPU's vector loads of a weight: a 64-byte vector that crosses a cache line costs two
ALIGNMENT = 64


def aligned(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A file's tensor in `dtype` (floating point ones), at an address that is a multiple of ALIGNMENT. safetensors
    hands a file's tensors back at the offsets they had in it, and a float32 file's kept them there (float16 ones
    are converted into new storage, which torch aligns): one row times every weight of the shipped model's twin took
    334-348 us at one thread from those, against 256-257 from aligned copies (2-core AMD EPYC)."""
    t = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


def load_checkpoint(directory: str | Path, dtype: torch.dtype = torch.float32) -> tuple[Transformer, CheckpointInfo, Tokenizer, Tokenizer]:
    """Load model (CPU, eval mode, float32 unless dtype says otherwise), info and (source, target)
    tokenizers, strictly."""
    directory = Path(directory)
    info = read_info(directory)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"{directory}: missing {WEIGHTS_FILE}")
    tokenizers = []
    for side, name, vocab_name, vocab in (
        ("source", info.src_tokenizer, info.src_vocab, info.config.src_vocab_size),
        ("target", info.tgt_tokenizer, info.tgt_vocab, info.config.tgt_vocab_size),
    ):
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{directory}: missing {side} tokenizer {name}")
        if vocab_name and not (directory / vocab_name).is_file():
            raise CheckpointError(f"{directory}: missing {side} vocabulary {vocab_name}")
        try:
            tok = Tokenizer(path, directory / vocab_name if vocab_name else None, symbols=info.symbols())
        except (OSError, RuntimeError, ValueError) as e:
            raise CheckpointError(f"{directory}: cannot read {side} tokenizer {name} ({e})") from e
        try:
            tok.check_against(info.config, vocab, side)
        except TokenizerMismatch as e:
            raise CheckpointError(f"{directory}: {e}") from e
        tokenizers.append(tok)

    # built on the meta device and given the file's tensors themselves: no random initialization to
    # overwrite and no second copy (a 600M model loads in seconds, at its own size in memory)
    with torch.device("meta"):
        model = Transformer(info.config)
    names = _first_names(model)
    expected = {name: t for name, t in model.state_dict(keep_vars=True).items() if names[name] == name}
    try:
        tensors = load_file(str(weights_path))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise CheckpointError(f"{weights_path}: cannot read weights ({e})") from e
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"{weights_path}: tensor {name} has shape {tuple(tensor.shape)}, "
                f"config needs {tuple(expected[name].shape)}"
            )
    state = {name: aligned(tensors.pop(name), dtype) for name in list(tensors)}
    model.load_state_dict(state, strict=False, assign=True)  # tied names are filled by finish_load
    model.finish_load()
    if left := [name for name, t in model.state_dict(keep_vars=True).items() if t.is_meta]:
        raise CheckpointError(f"{weights_path}: nothing in the file for {left}")
    model.eval()
    return model, info, tokenizers[0], tokenizers[1]
