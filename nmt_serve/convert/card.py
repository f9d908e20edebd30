"""The model card of a checkpoint nmt-convert made: where it came from, its shape, and the scores measured
here on this project's test sets (training/model_card.py measures them; none as converted). The upstream
model's own card, which holds its license, data and scores, is kept beside it as UPSTREAM.md."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from safetensors import safe_open

from nmt_serve.network.checkpoint import read_info

UPSTREAM_CARD = "UPSTREAM.md"  # the upstream model's README.md, as nmt-convert found it
# kept beside the converted weights: the upstream model's card (its license, data and scores) and license files
UPSTREAM_FILES = ("README.md", "LICENSE", "LICENSE.txt", "LICENSE.md")


def write_card(hf_dir: Path, out_dir: Path) -> None:
    """Keep the upstream card and license files beside a converted checkpoint and write its own card."""
    for name in UPSTREAM_FILES:
        if (hf_dir / name).is_file():
            shutil.copyfile(hf_dir / name, out_dir / (UPSTREAM_CARD if name == "README.md" else name))
    payload = json.loads((out_dir / "config.json").read_text())
    (out_dir / "README.md").write_text(render_converted_card(out_dir, payload, payload["metadata"].get("scores", [])))


def render_converted_card(directory: Path, payload: dict, rows: list[dict], sections: str = "") -> str:
    """The card of a checkpoint nmt-convert made: what it is and what was measured here (rows, as
    training.model_card measures them; none as converted), then `sections` (model_card's speed and quality
    flags); its training is the upstream model's."""
    cfg = payload["model"]
    meta = payload.get("metadata", {})
    info = read_info(directory)
    dtype, params = stored_weights(directory)
    directions = info.served()
    languages = list(dict.fromkeys(lang for d in directions for lang in d.split("-")))
    names = " and ".join(languages)
    if len(languages) > 4:  # NLLB-200: every ordered pair of its codes
        names = f"{len(languages)} languages ({', '.join(languages[:4])}, ...), {len(directions)} directions"
    title = ", ".join(directions) if len(directions) <= 3 else "Multilingual"
    upstream = ("in `UPSTREAM.md`, the upstream model's card as it came" if (directory / UPSTREAM_CARD).is_file()
                else "in the upstream model's card")
    if rows:
        table = "\n".join(score_row(r, r.get("direction") or directions[0], r["split"]) for r in rows)
        scores = f"""sacreBLEU, cased, detokenized output, one reference, measured here with `python -m nmt_serve.training.model_card`
on this project's test sets: Multi30k's `test_2016_flickr` (image captions) and the held-out sets of its
Debian corpus where named. Routing compares models by these (README, "Languages").

| direction | test set | search | Linear layers | BLEU | chrF | outputs > 3x source |
| --- | --- | --- | --- | --- | --- | --- |
{table}

{signatures(rows)}"""
    else:
        scores = """None measured here yet. Routing compares models by their scores on this project's test sets, so beside
a checkpoint that has them this one serves only where the `prefer` setting names it, or once it is measured on
the same sets (`python -m nmt_serve.training.model_card`; README, "Languages")."""
    return f"""# {title} Transformer, converted from {meta['imported_from']}

Translates between {names}. Converted by `nmt-convert` from `{meta.get('source_dir', '?')}`: the published
weights and vocabulary, unchanged. What it was trained on, its license and its own scores are {upstream}.

## Scores

{scores}

## Model

| | |
| --- | --- |
| architecture | {architecture(cfg)} |
| parameters | {params:,} |
| vocabulary | {cfg['src_vocab_size']} pieces (source), {cfg['tgt_vocab_size']} (target) |
| weights | {dtype} safetensors |
{sections}"""


def score_row(r: dict, *lead: str) -> str:
    """One measured row of a card's score table (training.model_card's rows): the leading cells, then the
    search, the Linear layers, BLEU, chrF and the outputs over 3x their source."""
    search = "greedy" if r["beam_size"] == 1 else f"beam {r['beam_size']}"
    linear = "int8" if r.get("quantization") == "int8" else "float32"
    return "| " + " | ".join([*lead, search, linear, f"{r['bleu']:.2f}", f"{r['chrf']:.2f}", str(r["runaway_outputs"])]) + " |"


def signatures(rows: list[dict]) -> str:
    """sacreBLEU's signatures of the rows' scores (every row of a card is measured alike)."""
    return f"BLEU signature: `{rows[0]['bleu_signature']}`\nchrF signature: `{rows[0]['chrf_signature']}`"


def architecture(cfg: dict) -> str:
    """A checkpoint's shape in words, from its config.json's model fields."""
    return (f"encoder-decoder Transformer, {cfg['n_encoder_layers']}+{cfg['n_decoder_layers']} layers, d_model {cfg['d_model']}, "
            f"{cfg['n_heads']} heads, FFN {cfg['d_ff']}, {cfg['activation']}, {cfg['norm_placement']}-norm")


BUFFERS = ("logits_bias",)  # stored, but no parameter (Transformer.num_parameters leaves it out)


def stored_weights(directory: Path) -> tuple[str, int]:
    """(dtype, parameters) of a checkpoint's stored weights, read from the file's header without loading the
    model (tied weights are stored once); nmt-convert keeps float32 unless told otherwise."""
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        slices = {k: f.get_slice(k) for k in f.keys()}
        stored = next(iter(slices.values())).get_dtype()
        params = sum(math.prod(s.get_shape()) for k, s in slices.items() if k not in BUFFERS)
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}.get(stored, stored.lower()), params
