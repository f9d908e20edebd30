"""A model's source side in one place: text -> the ids its encoder reads.

Every path into a model goes through an InputProcessor: the API process (which tokenizes each text
once, counts its limits on the ids and sends them to the engine), the engine (which finishes them
and checks them against the model), the offline Translator and the benchmarks. It holds

- tokenization (sentencepiece, or a Marian vocabulary file: network/tokenizer.py);
- the language tag: a multilingual model's source starts with the tag of the target language
  (`<2fr> A dog runs .</s>`), a bilingual model takes none (and only its own target); a model of the
  fairseq families (NLLB-200, M2M100, mBART-50) starts the source with the source language's code
  (`deu_Latn Ein Hund .</s>`) and its target with the target language's code (`target_prefix`);
- eos, appended where the model was trained with it (`append_eos_to_source`), and after it the model's
  source suffix where it has one (mBART-25: `pieces </s> en_XX`, the source language's code last);
- the length limit: at most `max_positions` ids reach the encoder.

`tokens()` is what crosses the process boundary (tag first, eos excluded: what the API's limits count);
`source_ids()` finishes such ids for the encoder and is where the model's own limit is checked.
It imports no torch: the API process uses it too.
"""
from __future__ import annotations

from collections.abc import Mapping

from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.text.language_codes import iso_aliases


class InputProcessor:
    def __init__(self, tokenizer: Tokenizer, *, target_lang: str, directions: list[str], target_tags: Mapping[str, str] | None,
                 append_eos: bool = True, max_positions: int | None = None, language_codes: Mapping[str, str] | None = None,
                 code_pairs: list[str] | None = None, source_suffix: list[str] | None = None):
        """target_lang: a bilingual model's target ("mul" for a multilingual one); directions: "de-en", ...;
        target_tags: {language: its tag piece} of a multilingual model, None for a bilingual one;
        language_codes: {language: its code's piece} of a fairseq-family model; code_pairs: the pairs of
        its codes it serves ("en_XX-de_DE", ...) where it does not serve every pair; source_suffix: the pieces
        after the source's eos (mBART-25's source language code)."""
        self.tokenizer = tokenizer
        self.codes: dict[str, int] = tokenizer.symbol_ids(dict(language_codes)) if language_codes else {}
        self.code_pairs = set(code_pairs) if self.codes and code_pairs else None
        self.suffix: list[int] = list(tokenizer.symbol_ids(dict(enumerate(source_suffix))).values()) if source_suffix else []
        self.aliases = iso_aliases(self.codes)  # users may name a language by ISO 639-1 ("de" for "deu_Latn")
        self.target_lang = target_lang
        self.append_eos = append_eos
        self.max_positions = max_positions
        self.tags: dict[str, int] = {}
        if target_tags is not None:
            missing = sorted({d.split("-")[1] for d in directions} - set(target_tags))
            if missing:
                raise ValueError(f"multilingual checkpoint: no target tag for {missing}")
            self.tags = tokenizer.symbol_ids(dict(target_tags))

    @property
    def multilingual(self) -> bool:
        return bool(self.tags) or bool(self.codes)

    def code_of(self, language: str | None) -> str | None:
        """The model's own code for a language named by it or by its ISO 639-1 code; None if it has none."""
        return language if language in self.codes else self.aliases.get(language)

    def _code(self, language: str | None, side: str) -> int:
        language = self.code_of(language)
        if language not in self.codes:
            known = sorted(self.codes)
            raise ValueError(f"this model needs the {side} language, one of its {len(known)} codes "
                             f"({', '.join(known[:8])}{', ...' if len(known) > 8 else ''}); got {language!r}")
        return self.codes[language]

    def prefix(self, target_lang: str | None = None, source_lang: str | None = None) -> list[int]:
        """What goes before the source ids: a multilingual model's tag of the target language (required),
        a fairseq-family model's code of the source language (required), nothing for a bilingual model
        (target_lang, if given, must be its own)."""
        if self.codes:
            self._code(target_lang, "target")
            source = self._code(source_lang, "source")
            if self.code_pairs is not None and (pair := f"{self.code_of(source_lang)}-{self.code_of(target_lang)}") not in self.code_pairs:
                raise ValueError(f"this model does not translate {pair}: it serves {', '.join(sorted(self.code_pairs)[:8])}"
                                 f"{', ...' if len(self.code_pairs) > 8 else ''}")
            return [source]
        if not self.tags:
            if target_lang not in (None, self.target_lang):
                raise ValueError(f"this model translates into {self.target_lang!r}, not {target_lang!r}")
            return []
        if target_lang not in self.tags:
            raise ValueError(f"a multilingual model needs target_lang, one of {sorted(self.tags)}; got {target_lang!r}")
        return [self.tags[target_lang]]

    def count(self, text: str) -> int:
        """Source pieces of a text, no tag and no eos (what sentence segmentation compares to its limit)."""
        return len(self.tokenizer.encode(text))

    def target_prefix(self, target_lang: str | None = None) -> list[int]:
        """The tokens the translation is forced to start with: a fairseq-family model's code of the target
        language, nothing for other models (the search drops them from what it returns)."""
        return [self._code(target_lang, "target")] if self.codes else []

    def tokens(self, text: str, target_lang: str | None = None, source_lang: str | None = None) -> list[int]:
        """Text -> tag + pieces, eos excluded ([] for an empty text: it is not translated at all)."""
        pieces = self.tokenizer.encode(text)
        return self.prefix(target_lang, source_lang) + pieces if pieces else []

    def source_ids(self, tokens: list[int]) -> list[int]:
        """tokens() -> the ids the encoder reads: eos appended if the model wants it, then its suffix, the
        length checked (ValueError past max_positions)."""
        ids = (tokens + [self.tokenizer.eos_id] if self.append_eos else list(tokens)) + self.suffix
        if self.max_positions is not None and len(ids) > self.max_positions:
            raise ValueError(f"source has {len(ids)} tokens; this model accepts at most {self.max_positions}")
        return ids

    def encode(self, text: str, target_lang: str | None = None, source_lang: str | None = None) -> list[int]:
        """Text -> the encoder's ids (tokens() then source_ids())."""
        return self.source_ids(self.prefix(target_lang, source_lang) + self.tokenizer.encode(text))
