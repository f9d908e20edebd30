"""Ours vs transformers `generate` at the real shape of the many-to-many models people deploy.

    python -m bench.real_shapes --shape nllb-600m|mbart-50 [--threads N] [--sentences N] [--max-new-tokens N]

No weights can be downloaded here, so the model is random in the real configuration (transformers'
own config class, its config.json values), saved as a Hugging Face directory with a small
sentencepiece model laid out as the family's, converted by `nmt-convert`, and run by both engines on
the same source ids (German test_2016_flickr sentences, the source code first, the target's forced):
float32 on CPU, greedy and beam 4, batch 1 and 8; sentences/s and whether the outputs are identical.
Random weights rarely say eos, so both decode to the length cap: equal work, not translation quality.
Load time and resident memory of our model are reported too.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, emit, machine, table, test_sources, timed

SHAPES = {
    # facebook/nllb-200-distilled-600M
    "nllb-600m": dict(family="m2m_100", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=256206, max_positions=1024,
                      activation="relu", scale_embedding=True, codes=["deu_Latn", "eng_Latn", "fra_Latn"]),
    # facebook/mbart-large-50-many-to-many-mmt
    "mbart-50": dict(family="mbart", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=250054, max_positions=1024,
                     activation="gelu", scale_embedding=True, codes=["de_DE", "en_XX", "fr_XX"]),
}
SETTINGS = [(1, 1), (1, 4), (8, 1), (8, 4)]


def build_hf_dir(shape: str, out: Path):
    import sentencepiece as spm
    import transformers

    s = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    text = out / "joint.txt"
    text.write_text("".join((ROOT / "tests" / "fixtures" / f"train300.{lang}").read_text() for lang in ("de", "en", "fr")))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(out / "sentencepiece.bpe"), vocab_size=2000, model_type="bpe",
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    shape_args = dict(vocab_size=s["vocab_size"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
                      encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
                      decoder_ffn_dim=s["ffn"], max_position_embeddings=s["max_positions"], activation_function=s["activation"],
                      scale_embedding=s["scale_embedding"], decoder_start_token_id=2, forced_eos_token_id=2)
    if s["family"] == "m2m_100":
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**shape_args))
    else:
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**shape_args))
    torch.manual_seed(0)
    model.eval().save_pretrained(out)
    (out / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": s["codes"]}))
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sentences", type=int, default=8, help="sentences per setting")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    work = Path(tempfile.mkdtemp(prefix="bench-shape-"))
    print(f"  building a random {args.shape} ...", file=sys.stderr)
    hf = build_hf_dir(args.shape, work / "hf")
    convert(work / "hf", work / "ours")
    started = time.perf_counter()
    ours = Translator.load(work / "ours", device="cpu", dtype="float32")
    load_seconds = time.perf_counter() - started
    source, target = SHAPES[args.shape]["codes"][0], SHAPES[args.shape]["codes"][2]
    ids = [ours.encode_source(t, target, source) for t in test_sources("de", args.sentences)]
    forced = ours.inputs.target_prefix(target)
    pad = ours.config.pad_id
    rows = []
    for batch, beam in SETTINGS:
        def run_ours():
            out = []
            for i in range(0, len(ids), batch):
                results = ours.translate(sources=ids[i : i + batch], beam_size=beam, max_length=args.max_new_tokens, target_prefix=forced)
                out += [r.hypotheses[0].tokens for r in results]
            return out

        def run_hf():
            out = []
            for i in range(0, len(ids), batch):
                chunk = ids[i : i + batch]
                src = torch.full((len(chunk), max(map(len, chunk))), pad, dtype=torch.long)
                for j, s in enumerate(chunk):
                    src[j, : len(s)] = torch.tensor(s)
                with torch.inference_mode():
                    gen = hf.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=beam, do_sample=False,
                                      max_new_tokens=args.max_new_tokens, forced_bos_token_id=forced[0], forced_eos_token_id=2,
                                      early_stopping=True, suppress_tokens=[0, 1])
                out += [ours.tgt_tokenizer.pieces([t for t in row[2:] if t not in (2, pad)]) for row in gen.tolist()]
            return out

        run_ours(), run_hf()  # untimed first: allocations and lazy set-up
        t_ours, a = timed(run_ours)
        t_hf, b = timed(run_hf)
        same = sum(x == y for x, y in zip(a, b))
        label = f"{'greedy' if beam == 1 else 'beam 4'}, batch {batch}, {len(ids)} sentences"
        rows.append([label, len(ids) / t_ours, len(ids) / t_hf, f"{t_hf / t_ours:.2f}", "identical" if same == len(a) else f"{same}/{len(a)} identical"])
        print(f"  {label}: ours/HF {t_hf / t_ours:.2f}", file=sys.stderr)
    rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    report = (f"Machine: {machine()}; {args.threads} thread(s); random {args.shape} ({ours.num_parameters() / 1e6:.0f}M parameters), "
              f"float32, {args.max_new_tokens}-token cap; our load {load_seconds:.1f} s; peak RSS of both models {rss_gib:.1f} GiB.\n\n")
    report += table(["setting", "ours sentences/s", "transformers sentences/s", "ours / transformers", "outputs"], rows)
    return emit(report + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
