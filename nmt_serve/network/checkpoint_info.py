"""A checkpoint's description, read from its config.json alone: what a checkpoint serves and how, without
torch (the API process reads it too; checkpoint.py loads the weights)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from nmt_serve.network.config import ModelConfig

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
