"""What the API process knows of the models the engine serves: their ids and languages, what the
engine reports of them, and their source tokenizer (sentencepiece only, no torch) for the limits."""
from __future__ import annotations

from dataclasses import dataclass

from model.tokenizer import Tokenizer

LANGUAGE_NAMES = {"de": "German", "en": "English", "fr": "French", "cs": "Czech"}


@dataclass
class ServedModel:
    id: str  # "de-en"
    info: dict  # as the engine reports it: source, target, parameters, device, dtype, path, ...
    tokenizer: Tokenizer

    @classmethod
    def of(cls, info: dict) -> "ServedModel":
        return cls(info["id"], info, Tokenizer(info["src_tokenizer"]))

    @property
    def source(self) -> str:
        return self.info["source"]

    @property
    def target(self) -> str:
        return self.info["target"]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))
