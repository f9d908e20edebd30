"""`nmt-convert HF_DIR OUT_DIR`: a Hugging Face translation model directory -> our checkpoint, exactly.

    nmt-convert opus-mt-de-en/ checkpoints/opus-de-en --source-lang de --target-lang en   # marian
    nmt-convert opus-mt-en-ROMANCE/ checkpoints/opus-en-romance --source-lang en            # marian, >>fr<< ...
    nmt-convert nllb-200-distilled-600M/ checkpoints/nllb-600m --dtype float16          # m2m_100
    nmt-convert mbart-large-50-many-to-many-mmt/ checkpoints/mbart-50                   # mbart
    nmt-convert mbart-large-50-one-to-many-mmt/ checkpoints/mbart-50-en --source-lang en_XX
    nmt-convert mbart-large-en-ro/ checkpoints/mbart-en-ro --source-lang en --target-lang ro   # mbart, mBART-25

The family is read from config.json's `model_type`: marian (OPUS-MT; the pair is in the model's
name, so name it; one with `>>xx<<` target tokens serves each target they name, the token put
first in the source), m2m_100 (M2M100 and NLLB-200) and mbart (mBART-50; mBART-25's fine-tunes, as
mbart-large-en-ro, serve their one pair: name it, mbart_25.py). Many-to-many models serve
every ordered pair of their language codes (`deu_Latn`, `__de__`, `de_DE`): the source starts with
its language's code and the translation is forced to start with the target's. A model trained on some
of those pairs only (mBART-50's one-to-many and many-to-one) is served on those: name its sources
(`--source-lang en_XX`) or its targets (`--target-lang en_XX`), comma-separated.

The converted model is loaded back and translates one sentence before the command succeeds: a
conversion that exits 0 is one the service can serve.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from nmt_serve.cli.common import user_errors
from nmt_serve.convert.card import write_card
from nmt_serve.convert.fairseq_vocab import (
    fairseq_vocab,
    language_of,
    language_tokens,
    m2m100_vocab,
)
from nmt_serve.convert.huggingface import UnsupportedModel, read_config, read_directory
from nmt_serve.convert.load_check import checked
from nmt_serve.convert.m2m_100 import m2m_100_to_model
from nmt_serve.convert.marian import import_marian
from nmt_serve.convert.mbart import mbart_to_model
from nmt_serve.convert.mbart_25 import import_mbart_25, is_mbart_25
from nmt_serve.network.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    read_info,
    save_checkpoint,
)
from nmt_serve.text.language_codes import iso_aliases

FAMILIES = ("marian", "m2m_100", "mbart")
DTYPES = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}
SPM = "sentencepiece.bpe.model"
VOCAB = "vocab.json"


def convert(hf_dir: str | Path, out_dir: str | Path, *, source_lang: str | None = None, target_lang: str | None = None,
            dtype: str = "float32") -> Path:
    """Convert, check that the result loads and translates, then keep the upstream card and license beside it
    and write its own card (card.py: no scores until training/model_card.py measures it)."""
    path = _convert(hf_dir, out_dir, source_lang=source_lang, target_lang=target_lang, dtype=dtype)
    write_card(Path(hf_dir), path)
    return path


def _convert(hf_dir: str | Path, out_dir: str | Path, *, source_lang: str | None, target_lang: str | None,
             dtype: str) -> Path:
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    if dtype not in DTYPES:
        raise UnsupportedModel(f"--dtype {dtype!r} is not supported ({', '.join(DTYPES)})")
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json (is it a Hugging Face model directory?)")
    check_output(hf_dir, out_dir)
    family = read_config(hf_dir).get("model_type")
    if family not in FAMILIES:
        raise UnsupportedModel(f"model_type {family!r} is not supported (supported: {', '.join(FAMILIES)})")
    if family == "marian":
        if not source_lang:
            raise UnsupportedModel("a MarianMT (OPUS-MT) model serves the pair in its name: give --source-lang and --target-lang")
        return checked(out_dir, lambda: import_marian(hf_dir, out_dir, source_lang, target_lang, dtype=DTYPES[dtype]))
    if family == "mbart" and is_mbart_25(hf_dir):
        return checked(out_dir, lambda: import_mbart_25(hf_dir, out_dir, source_lang, target_lang, dtype=DTYPES[dtype]))
    check_fairseq_tokenizer(hf_dir)
    hf_config, hf_state = read_directory(hf_dir)
    if family == "m2m_100" and (hf_dir / VOCAB).is_file():  # M2M100: its own vocab.json, __xx__ tokens
        codes = language_tokens(hf_dir, "m2m100")
        vocab = m2m100_vocab(hf_dir / VOCAB, codes)
    else:  # NLLB-200, mBART-50: fairseq's layout over the sentencepiece model
        codes = language_tokens(hf_dir, "nllb" if family == "m2m_100" else "mbart50")
        vocab = fairseq_vocab(hf_dir / SPM, codes)
    if max(vocab.values()) >= hf_config["vocab_size"]:
        raise ValueError(f"the tokenizer has ids up to {max(vocab.values())}, past the model's vocab_size {hf_config['vocab_size']}")
    languages = {language_of(c): c for c in codes}
    directions = served_pairs(hf_dir, hf_config, list(languages), source_lang, target_lang)
    to_model = m2m_100_to_model if family == "m2m_100" else mbart_to_model
    model = to_model(hf_config, hf_state, unk_id=vocab["<unk>"])

    def save() -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / VOCAB).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        info = CheckpointInfo(
            model.config, "mul", "mul", SPM, SPM, {"imported_from": family, "source_dir": str(hf_dir)},
            src_vocab=VOCAB, tgt_vocab=VOCAB, language_codes=languages, directions=directions,
        )
        return save_checkpoint(out_dir, model, info, {SPM: hf_dir / SPM}, dtype=DTYPES[dtype])

    return checked(out_dir, save)


def check_fairseq_tokenizer(hf_dir: Path) -> None:
    """Refuse a directory whose tokenizer the conversion cannot reproduce, saying what to do."""
    if not (hf_dir / SPM).is_file():
        hint = (" (transformers 5 saves only tokenizer.json: copy sentencepiece.bpe.model from the model this one was "
                "fine-tuned from)") if (hf_dir / "tokenizer.json").is_file() else ""
        raise FileNotFoundError(f"{hf_dir}: missing {SPM}{hint}")


ONE_SIDED = {"one-to-many": "--source-lang", "many-to-one": "--target-lang"}


def served_pairs(hf_dir: Path, hf_config: dict, languages: list[str], source_lang: str | None,
                 target_lang: str | None) -> list[str] | None:
    """The directions a model with language codes serves: None for every pair of them, else those from the
    sources or into the targets named (each a code or its ISO 639-1 name)."""
    if not source_lang and not target_lang:
        # the directory's path (a Hugging Face cache keeps the name a level up: models--facebook--mbart-...
        # /snapshots/<hash>) or the name the config was saved under
        name = f"{hf_dir.resolve()} {hf_config.get('_name_or_path', '')}"
        if flag := next((flag for kind, flag in ONE_SIDED.items() if kind in name), None):
            raise UnsupportedModel(f"{hf_dir} looks like a {next(k for k in ONE_SIDED if k in name)} model, trained on some pairs of "
                                   f"its languages only: name them with {flag} (for example {flag} en_XX)")
        return None
    aliases = iso_aliases(languages)

    def named(flag: str, given: str | None) -> list[str]:
        if not given:
            return languages
        chosen = [aliases.get(x.strip(), x.strip()) for x in given.split(",") if x.strip()]
        if unknown := [x for x in chosen if x not in languages]:
            raise UnsupportedModel(f"{flag} {','.join(unknown)}: not among this model's {len(languages)} language codes "
                                   f"({', '.join(languages[:8])}{', ...' if len(languages) > 8 else ''})")
        return chosen

    pairs = [f"{s}-{t}" for s in named("--source-lang", source_lang) for t in named("--target-lang", target_lang) if s != t]
    if not pairs:
        raise UnsupportedModel("--source-lang and --target-lang leave no pair of two different languages")
    return pairs


def check_output(hf_dir: Path, out_dir: Path) -> None:
    """Refuse to write where the checkpoint would overwrite what it is made from, or files that are not
    ours (a typo for another directory); an empty directory or an earlier checkpoint of ours is fine."""
    if not out_dir.exists():
        return
    if out_dir.resolve() == hf_dir.resolve():
        raise UnsupportedModel(f"{out_dir} is the model directory itself: name another for the checkpoint")
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        return
    try:
        read_info(out_dir)
    except CheckpointError:
        raise UnsupportedModel(f"{out_dir} exists and is not one of our checkpoints: name a new or empty directory") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hf_dir", help="a Hugging Face model directory (config.json, weights, tokenizer files)")
    parser.add_argument("out_dir", help="where to write our checkpoint")
    parser.add_argument("--source-lang", help="a MarianMT model's source language; a model with language codes: the sources "
                                              "it serves, comma-separated (default: all)")
    parser.add_argument("--target-lang", help="a MarianMT model's target language; a multi-target one's (>>xx<< tokens) or a "
                                              "model with language codes: the targets it serves, comma-separated (default: all)")
    parser.add_argument("--dtype", default="float32", help="weights as stored: float32 (default), float16 or bfloat16")
    args = parser.parse_args(argv)
    # OSError: a missing directory or file; ValueError/KeyError: a model the conversion cannot express
    with user_errors(parser, CheckpointError, OSError, ValueError, KeyError):
        print(convert(args.hf_dir, args.out_dir, source_lang=args.source_lang, target_lang=args.target_lang, dtype=args.dtype))
    # routing goes by recorded test scores, and a converted model has none on this project's sets
    print(f"to serve it where another checkpoint of the models directory has its directions: "
          f"NMT_PREFER={Path(os.path.abspath(args.out_dir)).name}, or measure it on the test sets routing compares "
          f"(python -m nmt_serve.training.model_card --model {args.out_dir} --data ...; README, \"Languages\")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
