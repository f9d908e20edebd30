"""Ours vs transformers `generate` and CTranslate2 at the real shape of the many-to-many models people deploy.

    python -m bench.real_shapes --shape nllb-600m|mbart-50 [--threads N] [--sentences-b1 N] [--batch N] [--max-new-tokens N]

No weights can be downloaded here, so the model is random in the real configuration (transformers'
own config class, its config.json values), saved as a Hugging Face directory with a small
sentencepiece model laid out as the family's (NLLB's BPE, mBART's unigram) and its tokenizer_config,
converted by `nmt-convert` for us and by CTranslate2's own converter (float32 and int8) for it. Every
engine runs in a process of its own (OpenMP pools of two libraries in one process slow each other,
and each engine's load time and peak memory are its own) on the same source ids (German
test_2016_flickr sentences, the source code first, the target's code forced): greedy and beam 4, at
batch 1 and at `--batch`; sentences/s and whether the outputs are identical to ours. Random weights
rarely say eos, so every engine decodes to the length cap: equal work, not translation quality.

CTranslate2's converter takes the vocabulary from transformers' tokenizer, which, built from the
sentencepiece model alone (no tokenizer.json here), puts <mask> before the language codes; the shipped
tokenizer.json, fairseq and our vocab.json put it after them. Its vocabulary file is rewritten in our
(the shipped) order, so that both engines read the same embedding row for every token.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, emit, machine, table, test_sources, timed

SHAPES = {
    # facebook/nllb-200-distilled-600M
    "nllb-600m": dict(family="m2m_100", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=256206, max_positions=1024,
                      activation="relu", scale_embedding=True, codes=["deu_Latn", "eng_Latn", "fra_Latn"],
                      tokenizer_class="NllbTokenizer", spm_type="bpe"),
    # facebook/mbart-large-50-many-to-many-mmt
    "mbart-50": dict(family="mbart", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=250054, max_positions=1024,
                     activation="gelu", scale_embedding=True, codes=["de_DE", "en_XX", "fr_XX"],
                     tokenizer_class="MBart50Tokenizer", spm_type="unigram"),
}
ENGINES = ["ours", "ours int8", "transformers", "CTranslate2 float32", "CTranslate2 int8"]
# CTranslate2's own converter (its command's main), with one change: a vocabulary shorter than the
# model's embedding table is padded with placeholder words, as it does itself for M2M100/NLLB. Here the
# tokenizer is a small stand-in (the real mBART-50 one has all 250,054 tokens), which its mBART loader
# would otherwise refuse.
CT2_CONVERT = """
import sys
from ctranslate2.converters import transformers as ct2
original = ct2.BartLoader.get_vocabulary
def padded(self, model, tokenizer):
    tokens = original(self, model, tokenizer)
    return tokens + [f"madeupword{i}" for i in range(model.config.vocab_size - len(tokens))]
ct2.BartLoader.get_vocabulary = padded
sys.argv[0] = "ct2-transformers-converter"
ct2.main()
"""


def build_hf_dir(shape: str, out: Path):
    import sentencepiece as spm
    import transformers

    s = SHAPES[shape]
    out.mkdir(parents=True, exist_ok=True)
    text = out / "joint.txt"
    text.write_text("".join((ROOT / "tests" / "fixtures" / f"train300.{lang}").read_text() for lang in ("de", "en", "fr")))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(out / "sentencepiece.bpe"), vocab_size=2000, model_type=s["spm_type"],
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    shape_args = dict(vocab_size=s["vocab_size"], d_model=s["d_model"], encoder_layers=s["layers"], decoder_layers=s["layers"],
                      encoder_attention_heads=s["heads"], decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ffn"],
                      decoder_ffn_dim=s["ffn"], max_position_embeddings=s["max_positions"], activation_function=s["activation"],
                      scale_embedding=s["scale_embedding"], decoder_start_token_id=2, forced_eos_token_id=2)
    if s["family"] == "m2m_100":
        model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(**shape_args))
    else:
        # the real config.json says these too (CTranslate2's converter reads normalize_before)
        model = transformers.MBartForConditionalGeneration(transformers.MBartConfig(**shape_args, normalize_before=True,
                                                                                    add_final_layer_norm=True))
    torch.manual_seed(0)
    model.eval().save_pretrained(out)
    # the special tokens and the tokenizer's class as the real repositories name them (CTranslate2's converter reads them)
    specials = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", sep_token="</s>",
                    cls_token="<s>")
    (out / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": s["codes"], "tokenizer_class": s["tokenizer_class"],
                                                           **specials}))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, tokenizer_class=s["tokenizer_class"]), indent=2))
    return model


def settings(batch: int) -> list[tuple[int, int]]:
    return [(1, 1), (1, 4), (batch, 1), (batch, 4)]


def run_engine(engine: str, work: Path, threads: int) -> dict:
    """In a fresh process: load one engine, decode every setting; load time, peak RSS, times, outputs (as pieces)."""
    spec = json.loads((work / "inputs.json").read_text())
    torch.set_num_threads(threads)
    ids, forced, pad, cap = spec["ids"], spec["forced"], spec["pad"], spec["max_new"]
    pieces_of = spec["pieces_of"]  # id -> piece, our (the shipped) vocabulary; ids past it are <unk> to ours
    started = time.perf_counter()
    if engine.startswith("ours"):
        from nmt_serve.inference.translator import Translator

        ours = Translator.load(work / "ours", device="cpu", dtype="float32", quantization="int8" if engine.endswith("int8") else "none")

        def run(chunk, beam):
            results = ours.translate(sources=chunk, beam_size=beam, max_length=cap, target_prefix=forced)
            return [r.hypotheses[0].tokens for r in results]
    elif engine == "transformers":
        import transformers

        cls = transformers.M2M100ForConditionalGeneration if spec["family"] == "m2m_100" else transformers.MBartForConditionalGeneration
        hf = cls.from_pretrained(work / "hf").eval()

        def run(chunk, beam):
            src = torch.full((len(chunk), max(map(len, chunk))), pad, dtype=torch.long)
            for j, s in enumerate(chunk):
                src[j, : len(s)] = torch.tensor(s)
            with torch.inference_mode():
                gen = hf.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=beam, do_sample=False,
                                  max_new_tokens=cap, forced_bos_token_id=forced[0], forced_eos_token_id=2,
                                  early_stopping=True, suppress_tokens=[0, 1])
            return [[pieces_of.get(str(t), "<unk>") for t in row[2:] if t not in (2, pad)] for row in gen.tolist()]
    else:
        import ctranslate2

        quant = engine.split()[1]
        ct2 = ctranslate2.Translator(str(work / f"ct2-{quant}"), device="cpu", compute_type=quant, intra_threads=threads, inter_threads=1)
        code = pieces_of[str(forced[0])]

        def run(chunk, beam):
            # its cap counts the prefix and the tokens before eos, ours (as generate's max_new_tokens) the eos too
            results = ct2.translate_batch([[pieces_of[str(t)] for t in s] for s in chunk], target_prefix=[[code]] * len(chunk),
                                          beam_size=beam, max_decoding_length=cap - 1, return_scores=False)
            # rows past the tokenizer's ids are padding words to it, "<unk>" to ours (Tokenizer.pieces)
            return [["<unk>" if p.startswith("madeupword") else p for p in r.hypotheses[0][1:]] for r in results]
    load_seconds = time.perf_counter() - started
    out = {"load_seconds": load_seconds, "settings": {}}
    for batch, beam in settings(spec["batch"]):
        n = spec["sentences_b1"] if batch == 1 else batch
        run(ids[:1], beam)  # untimed: first calls pay for allocations and lazy set-up

        def all_batches():
            done = []
            for i in range(0, n, batch):
                done += run(ids[i : i + batch], beam)
            return done

        seconds, outputs = timed(all_batches)
        out["settings"][f"{batch},{beam}"] = {"seconds": seconds, "outputs": outputs, "sentences": n}
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sentences-b1", type=int, default=4, help="sentences of the batch-1 settings")
    parser.add_argument("--batch", type=int, default=32, help="the batched settings' batch (and sentences)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--work", help="a directory of an earlier run to reuse (its models are kept)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_engine(args.child, Path(args.work), args.threads)))
        return 0
    from nmt_serve.convert.command import convert
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.network.tokenizer import Tokenizer

    s = SHAPES[args.shape]
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-shape-"))
    if not (work / "ours" / "model.safetensors").is_file():
        print(f"  building a random {args.shape} in {work} ...", file=sys.stderr)
        build_hf_dir(args.shape, work / "hf")
        convert(work / "hf", work / "ours")
    info = read_info(work / "ours")
    tokenizer = Tokenizer(work / "ours" / info.src_tokenizer, work / "ours" / info.src_vocab)
    pieces_of = {i: p for p, i in tokenizer.vocab.items()}
    rows = info.config.tgt_vocab_size
    for quant in ("float32", "int8"):  # CTranslate2's own converter, as its command
        target = work / f"ct2-{quant}"
        if not (target / "model.bin").is_file():
            subprocess.run([sys.executable, "-c", CT2_CONVERT, "--model", str(work / "hf"), "--output_dir", str(target),
                            "--quantization", quant, "--force"], check=True, capture_output=True)
            theirs = json.loads((target / "shared_vocabulary.json").read_text())
            assert len(theirs) == rows, (len(theirs), rows)
            ours = [pieces_of.get(i, f"madeupword{i}") for i in range(rows)]
            (target / "shared_vocabulary.json").write_text(json.dumps(ours))
    source, target_code = s["codes"][0], s["codes"][2]
    vocab = tokenizer.vocab
    ids = [[vocab[source]] + [vocab.get(p, vocab["<unk>"]) for p in tokenizer.sp.encode(t, out_type=str)] + [vocab["</s>"]]
           for t in test_sources("de", max(args.sentences_b1, args.batch))]
    spec = {"ids": ids, "forced": [vocab[target_code]], "pad": info.config.pad_id, "max_new": args.max_new_tokens,
            "pieces_of": {str(i): p for i, p in pieces_of.items()}, "family": s["family"], "batch": args.batch,
            "sentences_b1": args.sentences_b1}
    (work / "inputs.json").write_text(json.dumps(spec))
    engines = [e for e in args.engines.split(",") if e]
    measured = {}
    for engine in engines:
        print(f"  {engine} ...", file=sys.stderr)
        out = subprocess.run([sys.executable, "-m", "bench.real_shapes", "--shape", args.shape, "--child", engine, "--work", str(work),
                              "--threads", str(args.threads)], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        measured[engine] = json.loads(out.strip().splitlines()[-1])
    reference = measured[engines[0]]
    table_rows = []
    for batch, beam in settings(args.batch):
        key = f"{batch},{beam}"
        label = f"{'greedy' if beam == 1 else 'beam 4'}, batch {batch}, {reference['settings'][key]['sentences']} sentences"
        for engine in engines:
            r = measured[engine]["settings"][key]
            same = sum(a == b for a, b in zip(reference["settings"][key]["outputs"], r["outputs"]))
            ratio = reference["settings"][key]["seconds"] / r["seconds"]
            table_rows.append([label, engine, r["sentences"] / r["seconds"], f"{1 / ratio:.2f}",
                               "reference" if engine == engines[0] else ("identical" if same == len(r["outputs"]) else f"{same}/{len(r['outputs'])} identical")])
    load_rows = [[e, f"{measured[e]['load_seconds']:.1f}", f"{measured[e]['peak_rss_gib']:.2f}"] for e in engines]
    report = (f"Machine: {machine()}; {args.threads} thread(s) for every engine; random {args.shape} "
              f"({info.config.tgt_vocab_size:,} vocabulary rows), {args.max_new_tokens}-token cap.\n\n")
    report += table(["setting", "engine", "sentences/s", f"{engines[0]} / engine (> 1: {engines[0]} faster)", "outputs"], table_rows)
    report += "\n\n" + table(["engine", "load s", "peak RSS GiB (its process)"], load_rows)
    return emit(report + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
