"""What every converter of a Hugging Face checkpoint shares: reading its directory (config.json and the
weights, safetensors or a weights-only torch file, whole or in shards) and the layer layout of the BART family, which
MarianMT, M2M100 / NLLB-200 and mBART all use (self_attn, encoder_attn, fc1/fc2 and their norms)."""
from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from nmt_serve.network.config import ModelConfig
from nmt_serve.network.transformer import Transformer

ACTIVATION_FROM_HF = {"swish": "swish", "silu": "swish", "gelu": "gelu", "relu": "relu"}

# our parameter name -> Hugging Face name, per layer ({p} = q, k, v, out)
ENCODER_LAYER = {
    "self_attn.{p}_proj": "self_attn.{p}_proj",
    "attn_block.norm": "self_attn_layer_norm",
    "ffn.fc1": "fc1",
    "ffn.fc2": "fc2",
    "ffn_block.norm": "final_layer_norm",
}
DECODER_LAYER = {
    "self_attn.{p}_proj": "self_attn.{p}_proj",
    "self_block.norm": "self_attn_layer_norm",
    "cross_attn.{p}_proj": "encoder_attn.{p}_proj",
    "cross_block.norm": "encoder_attn_layer_norm",
    "ffn.fc1": "fc1",
    "ffn.fc2": "fc2",
    "ffn_block.norm": "final_layer_norm",
}


class UnsupportedModel(ValueError):
    """A model family or option the conversion cannot express exactly."""


class UnreadableFile(ValueError):
    """A file of the model directory that its reader rejects (truncated, corrupt, not what its name says)."""


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """A damaged file's reader error (safetensors' SafetensorError, sentencepiece's or torch's RuntimeError, a
    JSON error) as an UnreadableFile naming the file: the readers' own messages do not say which file it was."""
    try:
        yield
    except (SafetensorError, RuntimeError, pickle.UnpicklingError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UnreadableFile(f"{path}: cannot be read ({str(exc).strip() or type(exc).__name__})") from None


class ConfigFile(dict):
    """A JSON object read from a file: a key it lacks is an error naming the file and the key, where a
    bare KeyError would say only the key's name."""

    def __init__(self, path: Path, values: dict):
        super().__init__(values)
        self.path = path

    def __missing__(self, key):
        raise UnreadableFile(f"{self.path}: no {key!r}, which this model's conversion needs")


def read_json(path: Path) -> ConfigFile:
    """A JSON object file of a model directory (config.json, tokenizer_config.json, vocab.json)."""
    with reading(path):
        values = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        raise UnreadableFile(f"{path}: not a JSON object")
    return ConfigFile(path, values)


def read_config(hf_dir: Path) -> ConfigFile:
    """config.json of a Hugging Face model directory."""
    return read_json(Path(hf_dir) / "config.json")


def read_directory(hf_dir: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config.json as a dict, the weights in float32) of a Hugging Face model directory."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise FileNotFoundError(f"Hugging Face model directory not found: {hf_dir}")
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(f"{hf_dir}: no config.json")
    config = read_config(hf_dir)
    for name in WEIGHT_FILES:
        if (hf_dir / name).is_file():
            return config, read_weights(hf_dir / name)
        index = hf_dir / f"{name}.index.json"
        if index.is_file():  # large models (NLLB-200 3.3B) come in shards that an index names
            weight_map = read_json(index)["weight_map"]
            if not isinstance(weight_map, dict):
                raise UnreadableFile(f"{index}: weight_map is not an object of tensor name -> shard")
            state = {}
            for shard in sorted(set(weight_map.values())):
                if not (hf_dir / shard).is_file():
                    raise FileNotFoundError(f"{hf_dir}: no {shard}, a shard that {index.name} names")
                state.update(read_weights(hf_dir / shard))
            if missing := sorted(set(weight_map) - set(state)):
                raise UnreadableFile(f"{index}: {len(missing)} weights it names are in none of its shards ({missing[0]}, ...)")
            return config, state
    raise FileNotFoundError(f"{hf_dir}: no model.safetensors or pytorch_model.bin (nor a sharded one's index)")


WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors or weights-only torch file, in float32."""
    with reading(path):
        if path.name.endswith(".safetensors"):
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)  # no arbitrary pickle code
    return {k: v.float() for k, v in state.items()}


def layer_name_pairs(n_encoder: int, n_decoder: int):
    """(ours, theirs) for every weight and bias inside the layers."""
    for ours_prefix, theirs_prefix, table, n in (
        ("encoder_layers", "model.encoder.layers", ENCODER_LAYER, n_encoder),
        ("decoder_layers", "model.decoder.layers", DECODER_LAYER, n_decoder),
    ):
        for i in range(n):
            for ours, theirs in table.items():
                for p in ("q", "k", "v", "out") if "{p}" in ours else (None,):
                    o, t = ours.format(p=p), theirs.format(p=p)
                    for leaf in ("weight", "bias"):
                        yield f"{ours_prefix}.{i}.{o}.{leaf}", f"{theirs_prefix}.{i}.{t}.{leaf}"


def embedding_tables(hf_state: dict[str, torch.Tensor], family: str):
    """(encoder table, decoder table, output matrix) as stored; tied tensors may be stored once."""
    shared = hf_state.get("model.shared.weight")
    enc = hf_state.get("model.encoder.embed_tokens.weight", shared)
    dec = hf_state.get("model.decoder.embed_tokens.weight", shared)
    if enc is None or dec is None:
        raise KeyError(f"{family} weights lack the token embeddings")
    return enc, dec, hf_state.get("lm_head.weight", dec)


def activation_of(hf: dict, default: str) -> str:
    """Our name of the model's activation function, or UnsupportedModel naming it."""
    activation = hf.get("activation_function", default)
    if activation not in ACTIVATION_FROM_HF:
        raise UnsupportedModel(f"activation {activation!r} is not supported ({', '.join(ACTIVATION_FROM_HF)} are)")
    return ACTIVATION_FROM_HF[activation]


def check_symmetric(hf: dict) -> None:
    if hf.get("encoder_attention_heads") != hf.get("decoder_attention_heads") or hf.get("encoder_ffn_dim") != hf.get("decoder_ffn_dim"):
        raise UnsupportedModel("encoder and decoder must have the same heads and FFN width")


def sharing(hf_state: dict[str, torch.Tensor], family: str) -> tuple[bool, bool]:
    """(one table for source and target, output tied to the target table), read off the weights themselves:
    the config flags alone do not say it (an untied model may still store equal tables)."""
    enc, dec, out = embedding_tables(hf_state, family)
    return (enc.shape == dec.shape and torch.equal(enc, dec)), (out.shape == dec.shape and torch.equal(out, dec))


def stack_weights(cfg: ModelConfig, hf_state: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """Our state dict's embeddings and layers from theirs (what every family shares)."""
    def get(name):
        if name not in hf_state:
            raise KeyError(f"{family} weights lack {name}")
        return hf_state[name]

    src_embed, tgt_embed, output = embedding_tables(hf_state, family)
    ours = {"src_embed.weight": src_embed}
    if not cfg.share_embeddings:
        ours["tgt_embed.weight"] = tgt_embed
    if not cfg.tie_output:
        ours["output_proj.weight"] = output
    for o, t in layer_name_pairs(cfg.n_encoder_layers, cfg.n_decoder_layers):
        ours[o] = get(t)
    if cfg.norm_placement == "pre":  # the stacks' final norms
        for ours_name, theirs in (("encoder_norm", "model.encoder.layer_norm"), ("decoder_norm", "model.decoder.layer_norm")):
            for leaf in ("weight", "bias"):
                ours[f"{ours_name}.{leaf}"] = get(f"{theirs}.{leaf}")
    return ours


def build(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> Transformer:
    """A Transformer holding exactly these weights (every parameter accounted for)."""
    model = Transformer(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False)
    aliases = {"tgt_embed.weight", "output_proj.weight"}
    if [k for k in missing if k not in aliases] or unexpected:
        raise ValueError(f"conversion left missing {missing} / unexpected {unexpected}")
    return model.eval()


def fairseq_config(hf: dict, hf_state: dict[str, torch.Tensor], family: str, unk_id: int, *, activation: str,
                   scale_embeddings: bool, **layout) -> ModelConfig:
    """ModelConfig of a pre-norm model of the fairseq families (M2M100 / NLLB-200, mBART): what they share,
    checked; `layout` is what sets each family apart (positions, embedding norm, logits bias)."""
    check_symmetric(hf)
    shared, tied = sharing(hf_state, family)
    if not tied:
        raise UnsupportedModel(f"a {family} output layer not tied to the target embedding is not supported")
    start, bos = hf.get("decoder_start_token_id"), hf.get("bos_token_id")
    return ModelConfig(
        src_vocab_size=hf["vocab_size"], tgt_vocab_size=hf["vocab_size"],
        d_model=hf["d_model"], n_heads=hf["encoder_attention_heads"], d_ff=hf["encoder_ffn_dim"],
        n_encoder_layers=hf["encoder_layers"], n_decoder_layers=hf["decoder_layers"],
        dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("attention_dropout", 0.0),
        activation=activation_of(hf, activation), norm_placement="pre", max_positions=hf["max_position_embeddings"],
        scale_embeddings=bool(hf.get("scale_embedding", scale_embeddings)), share_embeddings=shared, tie_output=True,
        pad_id=hf["pad_token_id"], unk_id=unk_id, bos_id=bos if bos is not None else 0, eos_id=hf["eos_token_id"],
        decoder_start_id=start if start is not None else hf["eos_token_id"], append_eos_to_source=True, **layout,
    )
