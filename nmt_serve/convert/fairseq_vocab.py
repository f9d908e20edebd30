"""The token ids of the fairseq families, as a vocabulary file our Tokenizer reads (piece -> id), so that
a converted model needs neither transformers nor `tokenizer.json` at run time.

- NLLB-200 and mBART-50 (a `sentencepiece.bpe.model` alone): `<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3,
  sentencepiece piece i -> i + 1 (its own unk, bos and eos are the four above), then the language codes
  in order (`deu_Latn`, `de_DE`: sentencepiece size + 1 + k), then `<mask>`.
- M2M100 (`vocab.json` beside the sentencepiece model): the ids of `vocab.json`, then the language
  tokens `__de__` in order (vocabulary size + k).

The language codes come from the model's own `tokenizer_config.json` or `special_tokens_map.json`
(`additional_special_tokens`; `extra_special_tokens` where transformers 5 saved it), else from the
family's standard list as transformers has it.
"""
from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

from nmt_serve.convert.huggingface import read_json, reading

FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
STANDARD_LISTS = {  # family -> where transformers keeps its list (read at conversion time only)
    "nllb": ("transformers.models.nllb.tokenization_nllb", None),
    "mbart50": ("transformers.models.mbart50.tokenization_mbart50", None),
    "mbart25": ("transformers.models.mbart.tokenization_mbart", None),
    "m2m100": ("transformers.models.m2m_100.tokenization_m2m_100", "m2m100"),
}


def language_tokens(hf_dir: Path, family: str) -> list[str]:
    """The language code tokens of a model directory, in id order."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = hf_dir / name
        if path.is_file():
            saved = read_json(path)
            tokens = saved.get("additional_special_tokens") or saved.get("extra_special_tokens") or []
            if isinstance(tokens, dict):  # transformers 5 may name them: {"name": token}
                tokens = list(tokens.values())
            tokens = [t["content"] if isinstance(t, dict) else t for t in tokens]
            if tokens:
                return tokens
    module, key = STANDARD_LISTS[family]
    try:
        import importlib

        codes = importlib.import_module(module).FAIRSEQ_LANGUAGE_CODES
    except (ImportError, AttributeError):
        raise FileNotFoundError(f"{hf_dir}: no language codes in tokenizer_config.json or special_tokens_map.json, "
                                f"and transformers is not installed to give {family}'s standard list") from None
    codes = codes[key] if key else codes
    return [f"__{c}__" for c in codes] if family == "m2m100" else list(codes)


def fairseq_vocab(spm_file: Path, codes: list[str]) -> dict[str, int]:
    """NLLB-200 / mBART-50 ids: the fairseq specials, sentencepiece pieces shifted by one, the codes, <mask>."""
    with reading(spm_file):
        sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    vocab = dict(FAIRSEQ_SPECIALS)
    for i in range(sp.get_piece_size()):
        if sp.is_control(i) or sp.is_unknown(i):  # sentencepiece's own <unk>, <s>, </s>: the specials above
            continue
        vocab.setdefault(sp.id_to_piece(i), i + 1)
    size = sp.get_piece_size()
    for k, code in enumerate(codes):
        vocab[code] = size + 1 + k
    vocab["<mask>"] = size + 1 + len(codes)
    return vocab


def m2m100_vocab(vocab_file: Path, codes: list[str]) -> dict[str, int]:
    """M2M100 ids: vocab.json's, then the language tokens."""
    vocab = dict(read_json(vocab_file))
    size = len(vocab)
    for k, code in enumerate(codes):
        vocab[code] = size + k
    return vocab


def language_of(token: str) -> str:
    """The language a code token names, as users write it: `__de__` -> `de`; `deu_Latn`, `de_DE` as they are."""
    return token[2:-2] if token.startswith("__") and token.endswith("__") else token
