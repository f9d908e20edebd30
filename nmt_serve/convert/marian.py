"""Convert between Hugging Face MarianMT checkpoints (the OPUS-MT format) and ours.

    python -m nmt_serve.convert.marian import HF_DIR OUT_DIR --source-lang de --target-lang en
    python -m nmt_serve.convert.marian export OUR_DIR OUT_DIR

A MarianMT directory holds config.json, model.safetensors (or pytorch_model.bin), source.spm,
target.spm and vocab.json (piece -> id; target_vocab.json too when the vocabularies are separate).
Marian is post-norm with sin-half/cos-half positions, scaled embeddings, swish activation, a final
logits bias, pad as the decoder start token and eos appended to the source; all of these are options
of ModelConfig, so the import is exact. Export needs a model of that shape (post-norm, "halves"
positions); a pre-norm model has no MarianMT equivalent and is refused.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from nmt_serve.cli.common import user_errors
from nmt_serve.convert.card import write_card
from nmt_serve.convert.huggingface import (
    UnsupportedModel,
    activation_of,
    build,
    check_symmetric,
    embedding_tables,
    layer_name_pairs,
    read_directory,
    read_json,
    reading,
    sharing,
    stack_weights,
)
from nmt_serve.convert.load_check import checked
from nmt_serve.network.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    load_checkpoint,
    save_checkpoint,
)
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer, sinusoidal_table


def config_from_marian(hf: dict, unk_id: int, hf_state: dict[str, torch.Tensor]) -> ModelConfig:
    """ModelConfig of a MarianMT model. Which tables are shared is read off the weights themselves:
    the config flags alone do not say it (an untied model may still store equal tables)."""
    check_symmetric(hf)
    if hf.get("normalize_before") or hf.get("add_final_layer_norm") or hf.get("normalize_embedding"):
        raise UnsupportedModel("only post-norm MarianMT models without embedding norms are supported")
    enc, dec, _ = embedding_tables(hf_state, FAMILY)
    shared, tied = sharing(hf_state, FAMILY)
    return ModelConfig(
        src_vocab_size=enc.size(0), tgt_vocab_size=dec.size(0),
        d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation=activation_of(hf, "gelu"),
        norm_placement="post", positional_layout="halves", max_positions=hf["max_position_embeddings"],
        scale_embeddings=bool(hf.get("scale_embedding", False)), share_embeddings=shared,
        tie_output=tied, final_logits_bias=True,
        pad_id=hf["pad_token_id"], unk_id=unk_id, bos_id=-1, eos_id=hf["eos_token_id"],
        decoder_start_id=hf.get("decoder_start_token_id", hf["pad_token_id"]), append_eos_to_source=True,
    )


FAMILY = "MarianMT"


def state_from_marian(cfg: ModelConfig, hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    ours = stack_weights(cfg, hf_state, FAMILY)
    if "final_logits_bias" not in hf_state:
        raise KeyError("MarianMT weights lack final_logits_bias")
    ours["logits_bias"] = hf_state["final_logits_bias"].reshape(-1)
    # Marian's position tables are fixed sinusoids: make sure they are the ones we compute
    for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if name in hf_state:
            table = hf_state[name].float()
            expected = sinusoidal_table(table.size(0), cfg.d_model, "halves")
            if (table - expected).abs().max() > 1e-3:
                raise ValueError(f"{name} is not the sin-half/cos-half sinusoid table")
    return ours


def marian_to_model(hf_config: dict, hf_state: dict[str, torch.Tensor], unk_id: int = 1) -> Transformer:
    hf_state = {k: v.float() for k, v in hf_state.items()}
    cfg = config_from_marian(hf_config, unk_id, hf_state)
    return build(cfg, state_from_marian(cfg, hf_state))


def marian_config_from(cfg: ModelConfig) -> dict:
    activation = {"swish": "swish", "gelu": "gelu", "relu": "relu"}[cfg.activation]
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"],
        "vocab_size": cfg.src_vocab_size, "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model, "encoder_layers": cfg.n_encoder_layers, "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.n_heads, "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff, "activation_function": activation,
        "max_position_embeddings": cfg.max_positions, "scale_embedding": cfg.scale_embeddings,
        "share_encoder_decoder_embeddings": cfg.share_embeddings, "tie_word_embeddings": cfg.tie_output,
        "pad_token_id": cfg.pad_id, "eos_token_id": cfg.eos_id, "decoder_start_token_id": cfg.decoder_start_id,
        "forced_eos_token_id": cfg.eos_id, "bad_words_ids": [[cfg.pad_id]],
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout, "activation_dropout": 0.0,
        "is_encoder_decoder": True, "num_beams": 4, "max_length": 512,
    }


def model_to_marian_state(model: Transformer) -> dict[str, torch.Tensor]:
    cfg = model.config
    if cfg.norm_placement != "post":
        raise ValueError("MarianMT is post-norm: a pre-norm model cannot be exported to it")
    if cfg.positional_layout != "halves":
        raise ValueError("MarianMT uses sin-half/cos-half positions: this model was trained with interleaved ones")
    ours = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()}
    positions = sinusoidal_table(cfg.max_positions, cfg.d_model, "halves")
    hf = {
        "model.shared.weight": ours["src_embed.weight"],
        "model.encoder.embed_tokens.weight": ours["src_embed.weight"],
        "model.decoder.embed_tokens.weight": ours["tgt_embed.weight"],
        "model.encoder.embed_positions.weight": positions,
        "model.decoder.embed_positions.weight": positions.clone(),
        "lm_head.weight": ours["output_proj.weight"],
        "final_logits_bias": (ours["logits_bias"] if cfg.final_logits_bias else torch.zeros(cfg.tgt_vocab_size)).reshape(1, -1),
    }
    for o, t in layer_name_pairs(cfg.n_encoder_layers, cfg.n_decoder_layers):
        hf[t] = ours[o]
    # safetensors stores no shared memory: give every tensor its own storage
    return {k: v.clone() for k, v in hf.items()}


def sentencepiece_vocab(spm_file: Path) -> dict[str, int]:
    import sentencepiece as spm

    with reading(spm_file):
        sp = spm.SentencePieceProcessor(model_file=str(spm_file))
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


# ---------------------------------------------------------------------------------------- commands


TARGET_TOKEN = re.compile(r">>(\w+)<<")  # a multi-target OPUS-MT model's choice of target, first in the source


def target_languages(src_vocab: dict[str, int]) -> dict[str, str]:
    """{language: its token} of a model that translates into several languages (opus-mt-en-ROMANCE,
    opus-mt-tc-big-en-roa: `>>fra<< Hello`); empty for a model of one target language."""
    return {m.group(1): piece for piece in src_vocab if (m := TARGET_TOKEN.fullmatch(piece))}


def import_marian(hf_dir: str | Path, out_dir: str | Path, source_lang: str, target_lang: str | None,
                  dtype: torch.dtype | None = None) -> Path:
    """target_lang: the model's one target language; for a multi-target model, its targets to serve
    (comma-separated; None: every one its `>>xx<<` tokens name)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    hf_config, hf_state = read_directory(hf_dir)
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (hf_dir / name).is_file():
            raise FileNotFoundError(f"{hf_dir}: missing {name}")
    src_vocab = dict(read_json(hf_dir / "vocab.json"))
    tokens = target_languages(src_vocab)
    targets = target_lang.split(",") if target_lang else sorted(tokens)
    if not tokens and not target_lang:
        raise UnsupportedModel("a MarianMT (OPUS-MT) model serves the pair in its name: give --source-lang and --target-lang")
    if tokens and (unknown := [t for t in targets if t not in tokens]):
        raise UnsupportedModel(f"--target-lang {','.join(unknown)}: this model translates into the languages of its >>xx<< tokens "
                               f"({', '.join(sorted(tokens))})")
    if not tokens and len(targets) > 1:
        raise UnsupportedModel(f"--target-lang {target_lang}: this model has no >>xx<< tokens, so one target language only")
    model = marian_to_model(hf_config, hf_state, unk_id=src_vocab.get("<unk>", 1))
    tgt_vocab_name = "target_vocab.json" if (hf_dir / "target_vocab.json").is_file() else "vocab.json"
    files = {"source.spm": hf_dir / "source.spm", "target.spm": hf_dir / "target.spm", "vocab.json": hf_dir / "vocab.json"}
    if tgt_vocab_name != "vocab.json":
        files[tgt_vocab_name] = hf_dir / tgt_vocab_name
    # a multi-target model is served as our multilingual ones are: its target's token first in the source
    multi = dict(directions=[f"{source_lang}-{t}" for t in targets], target_tags={t: tokens[t] for t in targets}) if tokens else {}
    info = CheckpointInfo(
        model.config, "mul" if tokens else source_lang, "mul" if tokens else target_lang, "source.spm", "target.spm",
        {"imported_from": "MarianMT", "source_dir": str(hf_dir)}, src_vocab="vocab.json", tgt_vocab=tgt_vocab_name, **multi,
    )
    return save_checkpoint(out_dir, model, info, files, dtype=dtype)


def export_marian(our_dir: str | Path, out_dir: str | Path) -> Path:
    our_dir, out_dir = Path(our_dir), Path(out_dir)
    model, info, _, _ = load_checkpoint(our_dir)
    state = model_to_marian_state(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(marian_config_from(model.config), indent=2) + "\n")
    shutil.copyfile(our_dir / info.src_tokenizer, out_dir / "source.spm")
    shutil.copyfile(our_dir / info.tgt_tokenizer, out_dir / "target.spm")
    if info.src_vocab:
        shutil.copyfile(our_dir / info.src_vocab, out_dir / "vocab.json")
    else:
        vocab = sentencepiece_vocab(our_dir / info.src_tokenizer)
        if info.tgt_tokenizer != info.src_tokenizer and sentencepiece_vocab(our_dir / info.tgt_tokenizer) != vocab:
            (out_dir / "target_vocab.json").write_text(json.dumps(sentencepiece_vocab(our_dir / info.tgt_tokenizer), ensure_ascii=False))
        (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "source_lang": info.source_lang, "target_lang": info.target_lang, "model_max_length": model.config.max_positions,
        "separate_vocabs": (out_dir / "target_vocab.json").exists(), "tokenizer_class": "MarianTokenizer",
    }) + "\n")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-marian", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="MarianMT directory -> our checkpoint")
    imp.add_argument("hf_dir")
    imp.add_argument("out_dir")
    imp.add_argument("--source-lang", required=True)
    imp.add_argument("--target-lang", help="the target language; a multi-target model's (>>xx<< tokens): "
                                           "those to serve, comma-separated (default: all)")
    exp = sub.add_parser("export", help="our checkpoint -> MarianMT directory")
    exp.add_argument("our_dir")
    exp.add_argument("out_dir")
    args = parser.parse_args(argv)
    # OSError: a missing directory or file; ValueError/KeyError: a model the conversion cannot express
    with user_errors(parser, CheckpointError, OSError, ValueError, KeyError):
        if args.command == "import":
            out_dir = Path(args.out_dir)
            print(checked(out_dir, lambda: import_marian(args.hf_dir, out_dir, args.source_lang, args.target_lang)))
            write_card(Path(args.hf_dir), out_dir)
        else:
            print(export_marian(args.our_dir, args.out_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
