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
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from nmt_serve.network.config import ModelConfig
from nmt_serve.network.tokenizer import Tokenizer, TokenizerMismatch
from nmt_serve.network.transformer import Transformer

FORMAT = "nmt-checkpoint/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(RuntimeError):
    pass


@dataclass
class CheckpointInfo:
    config: ModelConfig
    source_lang: str
    target_lang: str
    src_tokenizer: str  # sentencepiece model file name inside the checkpoint directory
    tgt_tokenizer: str
    metadata: dict = field(default_factory=dict)
    src_vocab: str | None = None  # optional JSON piece -> id vocabulary (Marian models); None: sentencepiece ids
    tgt_vocab: str | None = None
    # a multilingual model: the directions it serves ("fr-cs", ...) and each target language's tag, the
    # piece put before the source (nmt_serve/training/multiway.py); source_lang and target_lang are then "mul"
    directions: list[str] | None = None
    target_tags: dict[str, str] | None = None
    # a model of the fairseq families (NLLB-200, M2M100, mBART-50): {language: its code's piece}; the
    # source starts with the source language's code, the target with the target's (forced). It serves
    # every pair of them, or `directions` where those are given (mBART-50 one-to-many: en_XX-xx only)
    language_codes: dict[str, str] | None = None
    # pieces after the source's eos: mBART-25's source language code (`pieces </s> en_XX`), its decoder
    # started by the target's (config.decoder_start_id)
    source_suffix: list[str] | None = None

    @property
    def multilingual(self) -> bool:
        return bool(self.directions) or bool(self.language_codes)

    def symbols(self) -> list[str]:
        """The pieces of this model's vocabulary that stand for no text: its language codes or target tags
        (a model may write one mid-sentence) and the fairseq families' `<mask>`."""
        return [*(self.language_codes or {}).values(), *(self.target_tags or {}).values(), "<mask>",
                *self.metadata.get("symbols", [])]

    def served(self) -> list[str]:
        """The directions served: "de-en", ... (one for a bilingual model; every ordered pair of a
        model with language codes)."""
        if self.language_codes and not self.directions:
            return [f"{s}-{t}" for s in self.language_codes for t in self.language_codes if s != t]
        return list(self.directions or [f"{self.source_lang}-{self.target_lang}"])

    def test_bleu(self) -> dict[str, float]:
        """{direction: sacreBLEU on test_2016_flickr, beam 4, float weights} as the model card recorded it."""
        return {d: sets["test_2016_flickr"] for d, sets in self.test_scores().items() if "test_2016_flickr" in sets}

    def flag_thresholds(self, direction: str | None = None) -> dict[str, float]:
        """The quality flags' thresholds measured on this model (training/flag_calibration.py): {name: value},
        a direction's own where they were measured for it, else those of all its directions pooled; empty
        when it has none (the service then uses the defaults of text/quality_flags.py)."""
        recorded = self.metadata.get("quality_flags") or {}
        own = (recorded.get("directions") or {}).get(direction) or {} if direction else {}
        return {k: v for k, v in {**recorded, **own}.items() if isinstance(v, (int, float))}

    def flag_threshold_table(self) -> dict:
        """{"default": the pooled thresholds, "directions": {direction: its own}} for what the engine reports:
        only the directions measured on their own are listed (a many-to-many model has thousands)."""
        measured = (self.metadata.get("quality_flags") or {}).get("directions") or {}
        return {"default": self.flag_thresholds(), "directions": {d: self.flag_thresholds(d) for d in measured}}

    def test_scores(self) -> dict[str, dict[str, float]]:
        """{direction: {test set: sacreBLEU, beam 4, float weights}} as the model card recorded them: every
        split but the validation one (routing.py compares models by them)."""
        out: dict[str, dict[str, float]] = {}
        for row in self.metadata.get("scores", []):
            if row.get("split", "val") != "val" and not row.get("pivot") and (row.get("beam_size"), row.get("quantization", "none")) == (4, "none"):
                out.setdefault(row.get("direction") or self.served()[0], {})[row["split"]] = row["bleu"]
        return out


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


def read_info(directory: str | Path) -> CheckpointInfo:
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: missing {CONFIG_FILE}")
    try:
        payload = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{config_path}: not valid JSON ({e})") from e
    if payload.get("format") != FORMAT:
        raise CheckpointError(f"{config_path}: format {payload.get('format')!r}, expected {FORMAT!r}")
    try:
        config = ModelConfig.from_dict(payload["model"])
        return CheckpointInfo(
            config=config,
            source_lang=payload["source_lang"],
            target_lang=payload["target_lang"],
            src_tokenizer=payload["src_tokenizer"],
            tgt_tokenizer=payload["tgt_tokenizer"],
            metadata=payload.get("metadata", {}),
            src_vocab=payload.get("src_vocab"),
            tgt_vocab=payload.get("tgt_vocab"),
            directions=payload.get("directions"),
            target_tags=payload.get("target_tags"),
            language_codes=payload.get("language_codes"),
            source_suffix=payload.get("source_suffix"),
        )
    except (KeyError, TypeError, ValueError, AssertionError) as e:
        raise CheckpointError(f"{config_path}: invalid model config ({e})") from e


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
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    model.load_state_dict(state, strict=False, assign=True)  # tied names are filled by finish_load
    model.finish_load()
    if left := [name for name, t in model.state_dict(keep_vars=True).items() if t.is_meta]:
        raise CheckpointError(f"{weights_path}: nothing in the file for {left}")
    model.eval()
    return model, info, tokenizers[0], tokenizers[1]
