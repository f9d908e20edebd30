"""What the API process knows of the models the engine serves: their ids and languages, what the
engine reports of them, and their source tokenizer (sentencepiece only, no torch): the API tokenizes
each text once, checks the limits on the ids and sends them to the engine."""
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
        return cls(info["id"], info, Tokenizer(info["src_tokenizer"], info.get("src_vocab")))

    @property
    def source(self) -> str:
        return self.info["source"]

    @property
    def target(self) -> str:
        return self.info["target"]

    def encode(self, text: str) -> list[int]:
        """Source ids, without the eos the engine appends."""
        return self.tokenizer.encode(text)
