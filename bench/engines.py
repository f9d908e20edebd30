"""Engine benchmarks, measured side by side in one run on the same machine, threads and inputs.

    python -m bench.engines [--threads N] [--sentences-b1 N] [--sentences-b32 N]

1. ours vs Hugging Face `generate` on the same weights (a MarianMT twin of the shipped model,
   converted to our format): sentences/s and target tokens/s, greedy and beam 4, batch 1 and 32;
   the outputs are compared token by token.
2. ours vs CTranslate2 float32 and int8 on those weights (converted by CTranslate2's own converter),
   and our int8 option (`quantization="int8"`) beside CTranslate2's int8.
3. KV cache vs recomputation (`use_cache=False`) on the shipped model, short and long outputs.
Prints markdown tables; --output also writes them to a file.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from bench.common import ROOT, machine, table, test_sources, timed, marian_twin
from model.marian import import_marian
from model.search import SearchOptions, generate
from model.translator import Translator


def batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def run_ours(translator: Translator, ids: list[list[int]], batch: int, beam: int, max_new: int, use_cache: bool = True):
    outputs = []
    for chunk in batches(ids, batch):
        src = translator._pad(chunk)
        for hyps in generate(translator.model, src, SearchOptions(beam_size=beam, max_length=max_new, use_cache=use_cache)):
            outputs.append(hyps[0].tokens)
    return outputs


def run_hf(model, ids: list[list[int]], batch: int, beam: int, max_new: int, pad: int, eos: int):
    outputs = []
    for chunk in batches(ids, batch):
        width = max(len(s) for s in chunk)
        src = torch.full((len(chunk), width), pad, dtype=torch.long)
        for i, s in enumerate(chunk):
            src[i, : len(s)] = torch.tensor(s)
        with torch.inference_mode():
            out = model.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=beam, do_sample=False,
                                 max_new_tokens=max_new, early_stopping=True, bad_words_ids=[[pad]])
        for row in out.tolist():
            tokens = []
            for t in row[1:]:
                if t == eos:
                    break
                tokens.append(t)
            outputs.append(tokens)
    return outputs


def run_ct2(translator, pieces: list[list[str]], batch: int, beam: int, max_new: int, vocab: dict[str, int]):
    # CTranslate2's cap counts tokens before eos; ours (like generate's max_new_tokens) counts eos too
    results = translator.translate_batch(pieces, max_batch_size=batch, beam_size=beam, max_decoding_length=max_new - 1,
                                         return_scores=False)
    return [[vocab[p] for p in r.hypotheses[0]] for r in results]


def compare(reference: list[list[int]], other: list[list[int]]) -> str:
    same = sum(a == b for a, b in zip(reference, other))
    return "identical" if same == len(reference) else f"{same}/{len(reference)} identical"


def engine_tables(threads: int, n_b1: int, n_b32: int, max_new: int) -> str:
    import ctranslate2
    from transformers import MarianMTModel

    work = Path(tempfile.mkdtemp(prefix="bench-"))
    twin = marian_twin(ROOT / "checkpoints" / "de-en", work / "marian")
    ours_dir = import_marian(twin, work / "ours", "de", "en")
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    ours_int8 = Translator.load(ours_dir, device="cpu", dtype="float32", quantization="int8")
    hf = MarianMTModel.from_pretrained(twin).eval()
    ct2_dirs = {}
    for quant in ("float32", "int8"):
        converter = ctranslate2.converters.TransformersConverter(str(twin))
        ct2_dirs[quant] = converter.convert(str(work / f"ct2-{quant}"), quantization=None if quant == "float32" else "int8")
    ct2 = {q: ctranslate2.Translator(d, device="cpu", compute_type=q, intra_threads=threads, inter_threads=1) for q, d in ct2_dirs.items()}
    cfg = ours.config
    vocab = ours.src_tokenizer.vocab  # the twin's JSON vocabulary (piece -> id)
    sources_all = test_sources("de")
    rows, ratio_rows = [], []
    for batch, n in ((1, n_b1), (32, n_b32)):
        texts = sources_all[:n]
        ids = [ours.encode_source(t) for t in texts]
        pieces = [ours.src_tokenizer.pieces(s) for s in ids]  # eos included, as the Marian tokenizer does
        for beam in (1, 4):
            label = f"{'greedy' if beam == 1 else 'beam 4'}, batch {batch}, {n} sentences"
            # one untimed batch per engine first: first calls pay for allocations and lazy set-up
            run_ours(ours, ids[:batch], batch, beam, max_new)
            run_ours(ours_int8, ids[:batch], batch, beam, max_new)
            run_hf(hf, ids[:batch], batch, beam, max_new, cfg.pad_id, cfg.eos_id)
            for quant in ("float32", "int8"):
                run_ct2(ct2[quant], pieces[:batch], batch, beam, max_new, vocab)
            t_ours, out_ours = timed(lambda: run_ours(ours, ids, batch, beam, max_new))
            t_hf, out_hf = timed(lambda: run_hf(hf, ids, batch, beam, max_new, cfg.pad_id, cfg.eos_id))
            t_f32, out_f32 = timed(lambda: run_ct2(ct2["float32"], pieces, batch, beam, max_new, vocab))
            t_i8, out_i8 = timed(lambda: run_ct2(ct2["int8"], pieces, batch, beam, max_new, vocab))
            t_oi8, out_oi8 = timed(lambda: run_ours(ours_int8, ids, batch, beam, max_new))
            for engine, t, out in (("ours", t_ours, out_ours), ("Hugging Face generate", t_hf, out_hf),
                                   ("CTranslate2 float32", t_f32, out_f32), ("ours int8", t_oi8, out_oi8),
                                   ("CTranslate2 int8", t_i8, out_i8)):
                n_tok = sum(len(o) + 1 for o in out)
                rows.append([label, engine, n / t, n_tok / t, compare(out_ours, out) if engine != "ours" else "reference"])
            ratio_rows.append([label] + [f"{r:.2f}" for r in (t_hf / t_ours, t_f32 / t_ours, t_hf / t_oi8, t_i8 / t_oi8)])
            print(f"  {label}: ours {n / t_ours:.1f} sent/s, HF {n / t_hf:.1f}, CT2 f32 {n / t_f32:.1f}, "
                  f"ours int8 {n / t_oi8:.1f}, CT2 int8 {n / t_i8:.1f}", file=sys.stderr)
    out = "### Ours vs Hugging Face and CTranslate2, same weights\n\n"
    out += table(["setting", "engine", "sentences/s", "target tokens/s", "outputs vs ours"], rows)
    out += "\n\nSpeed ratios (> 1: ours is faster):\n\n"
    out += table(["setting", "ours / HF generate", "ours / CT2 float32", "ours int8 / HF generate", "ours int8 / CT2 int8"], ratio_rows)
    return out


def cache_table(n: int) -> str:
    translator = Translator.load(ROOT / "checkpoints" / "de-en", device="cpu", dtype="float32")
    texts = test_sources("de", n)
    ids = [translator.encode_source(t) for t in texts]
    rows = []
    for name, length in (("short (natural length)", None), ("long (120 tokens forced)", 120)):
        for beam in (1, 4):
            def run(use_cache):
                outs = []
                for chunk in batches(ids, 32):
                    opts = SearchOptions(beam_size=beam, use_cache=use_cache, max_length=length or None,
                                         min_length=(length - 1) if length else 0)
                    outs += [h[0].tokens for h in generate(translator.model, translator._pad(chunk), opts)]
                return outs

            t_cache, a = timed(lambda: run(True))
            t_full, b = timed(lambda: run(False))
            tokens = sum(len(o) + 1 for o in a)
            rows.append([name, "greedy" if beam == 1 else "beam 4", tokens / t_cache, tokens / t_full, f"{t_full / t_cache:.2f}", compare(a, b)])
            print(f"  cache {name} beam {beam}: {t_full / t_cache:.2f}x", file=sys.stderr)
    return "### KV cache vs recomputing the prefix (shipped de-en model, batch 32)\n\n" + table(
        ["outputs", "search", "tokens/s with cache", "tokens/s recomputing", "speed-up", "outputs"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sentences-b1", type=int, default=100, help="sentences for batch-1 runs")
    parser.add_argument("--sentences-b32", type=int, default=500, help="sentences for batch-32 runs")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="length cap (the random twin decodes to it)")
    parser.add_argument("--cache-sentences", type=int, default=128)
    parser.add_argument("--skip-engines", action="store_true")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    parts = [f"Machine: {machine()}; {args.threads} thread(s) for every engine.\n"]
    if not args.skip_engines:
        parts.append(engine_tables(args.threads, args.sentences_b1, args.sentences_b32, args.max_new_tokens))
    parts.append(cache_table(args.cache_sentences))
    report = "\n\n".join(parts) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
