"""mBART-25 models (Hugging Face `model_type` "mbart" with `MBartTokenizer`: mbart-large-en-ro and the
fine-tunes of mbart-large-cc25) as a checkpoint that serves one direction.

Their layers are mBART-50's (mbart.py); their tokenizer is laid out otherwise: the source is
`pieces </s> src_code` (the language's code last, after eos) and the decoder starts with the target's
code, then writes the translation and `</s>` (MBartTokenizer's suffix tokens; generate's
decoder_start_token_id). Ids are fairseq's over `sentence.bpe.model` (fairseq_vocab.py) with mBART's
25 codes. A fine-tune serves the pair it was trained on: name it (--source-lang en_XX --target-lang
ro_XX, or en and ro); where config.json starts the decoder with a language's code (mbart-large-en-ro:
ro_RO) that code must be the target's.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from nmt_serve.convert.fairseq_vocab import fairseq_vocab, language_tokens
from nmt_serve.convert.huggingface import UnsupportedModel, read_config, read_directory, read_json
from nmt_serve.convert.mbart import mbart_to_model
from nmt_serve.network.checkpoint import CheckpointInfo, save_checkpoint
from nmt_serve.text.language_codes import iso_639_1, iso_aliases

TOKENIZERS = ("MBartTokenizer", "MBartTokenizerFast")
SPM_FILES = ("sentence.bpe.model", "sentencepiece.bpe.model")  # mBART-25's own name, and the one mBART-50 uses
VOCAB = "vocab.json"


def is_mbart_25(hf_dir: Path) -> bool:
    """An mBART directory with mBART-25's tokenizer: its class named in config.json or tokenizer_config.json,
    or (no class named) its sentencepiece model under mBART-25's file name alone."""
    saved = read_json(hf_dir / "tokenizer_config.json") if (hf_dir / "tokenizer_config.json").is_file() else {}
    named = read_config(hf_dir).get("tokenizer_class") or saved.get("tokenizer_class")
    if named:
        return named in TOKENIZERS
    return (hf_dir / SPM_FILES[0]).is_file() and not (hf_dir / SPM_FILES[1]).is_file()


def import_mbart_25(hf_dir: str | Path, out_dir: str | Path, source_lang: str | None, target_lang: str | None,
                    dtype: torch.dtype | None = None) -> Path:
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    spm_name = next((name for name in SPM_FILES if (hf_dir / name).is_file()), None)
    if spm_name is None:
        raise FileNotFoundError(f"{hf_dir}: missing {SPM_FILES[0]}")
    codes = language_tokens(hf_dir, "mbart25")
    if not source_lang or not target_lang or "," in source_lang + target_lang:
        raise UnsupportedModel(f"an mBART-25 model serves the one pair it was fine-tuned on: give --source-lang and --target-lang "
                               f"(its codes: {', '.join(codes[:8])}{', ...' if len(codes) > 8 else ''})")
    aliases = iso_aliases(codes)
    source, target = (aliases.get(x, x) for x in (source_lang, target_lang))
    if unknown := [x for x in (source, target) if x not in codes]:
        raise UnsupportedModel(f"{', '.join(unknown)}: not among this model's language codes ({', '.join(codes)})")
    hf_config, hf_state = read_directory(hf_dir)
    vocab = fairseq_vocab(hf_dir / spm_name, codes)
    if max(vocab.values()) >= hf_config["vocab_size"]:
        raise ValueError(f"the tokenizer has ids up to {max(vocab.values())}, past the model's vocab_size {hf_config['vocab_size']}")
    start = hf_config.get("decoder_start_token_id")
    code_of = {i: c for c, i in vocab.items() if c in codes}
    if start in code_of and code_of[start] != target:
        raise UnsupportedModel(f"this model starts its translations with {code_of[start]} (config.json's decoder_start_token_id): "
                               f"its target is {code_of[start]}, not {target}")
    model = mbart_to_model({**hf_config, "decoder_start_token_id": vocab[target]}, hf_state, unk_id=vocab["<unk>"])
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / VOCAB).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    info = CheckpointInfo(
        model.config, iso_639_1(source) or source, iso_639_1(target) or target, spm_name, spm_name,
        # every code and <mask> stand for no text, should the model write one
        {"imported_from": "mbart-25", "source_dir": str(hf_dir), "symbols": codes},
        src_vocab=VOCAB, tgt_vocab=VOCAB, source_suffix=[source],
    )
    return save_checkpoint(out_dir, model, info, {spm_name: hf_dir / spm_name}, dtype=dtype)
