"""SentencePiece wrapper: text <-> ids, with special ids checked against the model config.

Ids are the sentencepiece model's own, unless a vocabulary file (JSON piece -> id, as Marian/OPUS-MT
models ship it) is given: then pieces are looked up there and missing ones become <unk>.
"""
from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from nmt_serve.network.config import ModelConfig


class TokenizerMismatch(ValueError):
    pass


class Tokenizer:
    def __init__(self, model_file: str | Path, vocab_file: str | Path | None = None, symbols: Iterable[str] = ()):
        """symbols: pieces that stand for no text (language codes, target tags, `<mask>`): decode() drops
        them, as it drops pad, bos and eos."""
        self.model_file = Path(model_file)
        if not self.model_file.is_file():
            raise FileNotFoundError(f"sentencepiece model not found: {self.model_file}")
        self.sp = spm.SentencePieceProcessor(model_file=str(self.model_file))
        self.vocab: dict[str, int] | None = None
        self.vocab_file = Path(vocab_file) if vocab_file is not None else None
        if vocab_file is not None:
            self.vocab = json.loads(Path(vocab_file).read_text(encoding="utf-8"))
            self.id_to_piece_table = {i: p for p, i in self.vocab.items()}
            self.pad_id = self.vocab.get("<pad>", -1)
            self.unk_id = self.vocab.get("<unk>", -1)
            self.bos_id = self.vocab.get("<s>", -1)
            self.eos_id = self.vocab.get("</s>", -1)
        else:
            self.pad_id = self.sp.pad_id()
            self.unk_id = self.sp.unk_id()
            self.bos_id = self.sp.bos_id()
            self.eos_id = self.sp.eos_id()
        known = self.vocab if self.vocab is not None else {p: self.sp.piece_to_id(p) for p in symbols}
        self.silent = {self.pad_id, self.bos_id, self.eos_id} | {known[p] for p in symbols if known.get(p, self.unk_id) != self.unk_id}

    @property
    def vocab_size(self) -> int:
        if self.vocab is not None:
            return max(self.vocab.values()) + 1
        return self.sp.get_piece_size()

    def check_against(self, config: ModelConfig, vocab_size: int, side: str) -> None:
        """Fail clearly when this tokenizer cannot be the one the model was trained with."""
        # a vocabulary file may hold fewer ids than the model has rows: converted models pad their tables
        # (NLLB-200: 256,204 ids for 256,206 rows); the rows past it are never fed nor decoded to text
        fits = self.vocab_size <= vocab_size if self.vocab is not None else self.vocab_size == vocab_size
        if not fits:
            raise TokenizerMismatch(
                f"{side} tokenizer {self.model_file.name} has {self.vocab_size} pieces, model expects {vocab_size}"
            )
        for name in ("pad_id", "unk_id", "bos_id", "eos_id"):
            ours, theirs = getattr(self, name), getattr(config, name)
            if ours != theirs:
                raise TokenizerMismatch(f"{side} tokenizer {name}={ours} but model config {name}={theirs}")

    def symbol_ids(self, symbols: dict[str, str]) -> dict[str, int]:
        """{key: piece} -> {key: id of that piece}, for symbols that must each be one whole piece
        (a multilingual model's target tags); ValueError naming the ones this tokenizer lacks."""
        if self.vocab is not None:
            ids = {key: self.vocab.get(piece, self.unk_id) for key, piece in symbols.items()}
        else:
            ids = {key: self.sp.piece_to_id(piece) for key, piece in symbols.items()}
        missing = sorted(symbols[key] for key, i in ids.items() if i == self.unk_id)
        if missing:
            raise ValueError(f"tokenizer {self.model_file.name} has no piece for {missing}")
        return ids

    def encode(self, text: str, add_eos: bool = False) -> list[int]:
        """Text -> ids. Empty or whitespace-only text gives [] (plus eos when asked); unknown
        characters become unk_id."""
        text = plain_fractions(visible(text.strip()))
        if not text:
            ids = []
        elif self.vocab is not None:
            ids = [self.vocab.get(p, self.unk_id) for p in self.sp.encode(text, out_type=str)]
        else:
            ids = self.sp.encode(text, out_type=int)
        return ids + [self.eos_id] if add_eos else ids

    def decode(self, ids: list[int]) -> str:
        """Ids -> text; special ids (pad, bos, eos) and symbols are dropped."""
        kept = [i for i in ids if i not in self.silent]
        if self.vocab is not None:
            return self.sp.decode_pieces(self.pieces(kept))
        return self.sp.decode(kept)

    def unknown_spans(self, text: str) -> list[str]:
        """The characters of a text this tokenizer has no piece for, as the runs it encodes to <unk>,
        in order: what restore_unknowns puts back into a translation (a model trained on captions has
        no `+`, `{` or `~`)."""
        text = plain_fractions(visible(text.strip()))
        if not text or self.unk_id < 0:
            return []
        if self.vocab is not None:
            pieces = self.sp.encode(text, out_type=str)
            return [p.replace("\u2581", " ").strip() for p in pieces if p not in self.vocab]
        # a normalized piece may have no source characters of its own (they went to its neighbour): its
        # own text then, rather than nothing
        return [piece.surface or piece.piece for piece in self.sp.encode(text, return_type="proto").pieces if piece.id == self.unk_id]

    def pieces(self, ids: list[int]) -> list[str]:
        """Ids -> surface pieces, for attention-map labels."""
        if self.vocab is not None:
            return [self.id_to_piece_table.get(i, "<unk>") for i in ids]
        return [self.sp.id_to_piece(i) for i in ids]


def train_sentencepiece(
    text_files: list[Path], model_prefix: Path, vocab_size: int, model_type: str = "bpe",
    character_coverage: float = 1.0, input_sentence_size: int = 2_000_000, user_defined_symbols: list[str] | None = None,
) -> Path:
    """Train a sentencepiece model with the project's fixed special ids: pad=0 unk=1 bos=2 eos=3, then
    the user-defined symbols (target-language tags: always one piece each)."""
    model_prefix.parent.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(
        input=",".join(str(f) for f in text_files),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
        user_defined_symbols=user_defined_symbols or [],
    )
    return model_prefix.with_suffix(".model")


# characters that show nothing and mean nothing to a translation: a soft hyphen (a hint where a word may
# break: "Fahr\u00adrad" would reach the model as "Fahr <unk> rad" and its <unk> come back as a stray
# soft hyphen), a word joiner, a zero-width no-break space (a byte-order mark); they are left out
_INVISIBLE = "\u00ad\u2060\ufeff"


def visible(text: str) -> str:
    """The text without the invisible characters above (looked for first: str.translate reads every
    character through a dict, 5 us for a sentence that holds none, as nearly all do)."""
    for char in _INVISIBLE:
        if char in text:
            text = text.replace(char, "")
    return text


# NFKC, which sentencepiece applies, writes "1½" as "11⁄2" with a fraction slash that the models have no
# piece for: the translation read "112". Written out first, a fraction keeps its value.
_FRACTION = re.compile(r"(\d?)([\u00bc-\u00be\u2150-\u215e\u2189])")


def plain_fractions(text: str) -> str:
    """Vulgar fractions as digits and a slash ("1½" -> "1 1/2"), the rest of the text as it is."""
    if not _FRACTION.search(text):
        return text

    def written(m: re.Match) -> str:
        numerator, denominator = unicodedata.normalize("NFKC", m.group(2)).split("\u2044")
        return f"{m.group(1)} {numerator}/{denominator}" if m.group(1) else f"{numerator}/{denominator}"

    return _FRACTION.sub(written, text)


UNKNOWN_MARK = "\u2047"  # how sentencepiece writes <unk> in decoded text, one space on either side
_UNKNOWN = re.compile(f"( *){UNKNOWN_MARK}( *)")


def restore_unknowns(translation: str, spans: list[str]) -> str:
    """A translation with each <unk> the model wrote replaced by the source's unknown character runs,
    in order (as OpenNMT's and CTranslate2's replace_unknowns do, without attention): the last run
    again once they are used up, nothing where the source had none. The space sentencepiece puts on
    either side of the mark goes with it; the text's own spaces stay (one, where the mark goes)."""
    if UNKNOWN_MARK not in translation:
        return translation
    runs = iter(spans)
    last = ""

    def fill(match: re.Match) -> str:
        nonlocal last
        last = next(runs, last)
        before, after = match.group(1)[1:], match.group(2)[1:]
        return before + last + after if last else (" " if before or after else "")

    return _UNKNOWN.sub(fill, translation).strip()
