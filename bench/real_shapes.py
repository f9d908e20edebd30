"""Ours vs transformers `generate` and CTranslate2 at the real shape of the models people deploy.

    python -m bench.real_shapes --shape nllb-600m|mbart-50|opus-mt [--threads N] [--sentences-b1 N] [--batch N[,N...]]
                                [--max-new-tokens N] [--device cpu|cuda] [--memory] [--server N]

No weights can be downloaded here, so the model is random in the real configuration (transformers'
own config class, its config.json values), saved as a Hugging Face directory with a small
sentencepiece model laid out as the family's (NLLB's BPE, mBART's unigram) and its tokenizer_config,
converted by `nmt-convert` for us and by CTranslate2's own converter (float32 and int8) for it. Every
engine runs in a process of its own (OpenMP pools of two libraries in one process slow each other,
and each engine's load time and peak memory are its own) on the same source ids (German
test_2016_flickr sentences, the source code first, the target's code forced): greedy and beam 4, at
batch 1 and at `--batch`; sentences/s and whether the outputs are identical to ours. Random weights
rarely say eos, so every engine decodes to the length cap: equal work, not translation quality.

On a GPU (`--device cuda`, float16 by default) the engines are ours and transformers (CTranslate2 is not
installed there), at batch 1 and at each `--batch`; batch 1 greedy also gives one sentence's latency (p50,
p99). `--memory`: ours serving 256 rows of up to 256 positions as the engine serves them (a static decoder of
that size, its greedy steps and joins captured; 512 sentences joining as rows free, each decoding 255 tokens),
the GPU memory it held at its peak and what the decoder's buffers and graphs take. `--server N`: the service on the converted model (4 API
workers), N one-sentence greedy requests at concurrency 256, each capped at `--max-new-tokens`: requests/s.

OPUS-MT (`opus-mt`) is a MarianMT twin of Helsinki-NLP/opus-mt-de-en's configuration (bench.common.marian_twin):
ours and transformers only (bench.engines compares it with CTranslate2).

CTranslate2's converter takes the vocabulary from transformers' tokenizer, which, built from the
sentencepiece model alone (no tokenizer.json here), puts <mask> before the language codes; the shipped
tokenizer.json, fairseq and our vocab.json put it after them. Its vocabulary file is rewritten in our
(the shipped) order, so that both engines read the same embedding row for every token.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import ROOT, emit, machine, percentile, table, test_sources, timed

SHAPES = {
    # facebook/nllb-200-distilled-600M
    "nllb-600m": dict(family="m2m_100", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=256206, max_positions=1024,
                      activation="relu", scale_embedding=True, codes=["deu_Latn", "eng_Latn", "fra_Latn"],
                      tokenizer_class="NllbTokenizer", spm_type="bpe"),
    # facebook/mbart-large-50-many-to-many-mmt
    "mbart-50": dict(family="mbart", d_model=1024, layers=12, heads=16, ffn=4096, vocab_size=250054, max_positions=1024,
                     activation="gelu", scale_embedding=True, codes=["de_DE", "en_XX", "fr_XX"],
                     tokenizer_class="MBart50Tokenizer", spm_type="unigram"),
    # Helsinki-NLP/opus-mt-de-en (bench.common.SHAPES): a bilingual model, no language codes
    "opus-mt": dict(family="marian", codes=None),
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
    if s["family"] == "marian":
        from bench.common import marian_twin

        out.mkdir(parents=True, exist_ok=True)
        return marian_twin(ROOT / "checkpoints" / "de-en", out, shape=shape)
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


def settings(batches: list[int]) -> list[tuple[int, int]]:
    return [(1, 1), (1, 4)] + [(batch, beam) for batch in batches for beam in (1, 4)]


def peak_rss_gib() -> float:
    """This process's peak resident memory since it started its program (the kernel's VmHWM: getrusage's
    ru_maxrss keeps the high-water mark of the process before its exec, here the parent that built the model)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20  # kB


def run_engine(engine: str, work: Path, threads: int) -> dict:
    """In a fresh process: load one engine, decode every setting; load time, peak memory (RSS on the CPU, the GPU's
    on CUDA), times (and each batch-1 sentence's), outputs (as pieces)."""
    spec = json.loads((work / "inputs.json").read_text())
    torch.set_num_threads(threads)
    ids, forced, pad, cap, eos = spec["ids"], spec["forced"], spec["pad"], spec["max_new"], spec["eos"]
    device, dtype = spec["device"], spec["dtype"]
    pieces_of = spec["pieces_of"]  # id -> piece, our (the shipped) vocabulary; ids past it are <unk> to ours
    started = time.perf_counter()
    if engine.startswith("ours"):
        from nmt_serve.inference.translator import Translator

        # the static decoder (on CUDA) as large as the largest setting needs: rows for its beams, positions for the
        # longest source and the cap
        rows = 4 * max(spec["batches"])
        ours = Translator.load(work / "ours", device=device, dtype=dtype, quantization="int8" if engine.endswith("int8") else "none",
                               static_rows=rows, static_length=max(map(len, ids)) + cap + 1)

        def run(chunk, beam):
            results = ours.translate(sources=chunk, beam_size=beam, max_length=cap, target_prefix=forced, max_batch_size=len(chunk),
                                     max_batch_tokens=1 << 30)  # one batch, as generate gets it
            return [r.hypotheses[0].tokens for r in results]
    elif engine == "transformers":
        import transformers

        cls = {"m2m_100": transformers.M2M100ForConditionalGeneration, "mbart": transformers.MBartForConditionalGeneration,
               "marian": transformers.MarianMTModel}[spec["family"]]
        hf = cls.from_pretrained(work / "hf", dtype=getattr(torch, dtype)).to(device).eval()
        # the decoder's start, and the target's code after it where the family forces one: what generate's rows begin with
        start = 1 + len(forced)
        forcing = dict(forced_bos_token_id=forced[0]) if forced else {}
        banned = [t for t in (0, 1) if t != eos] if forced else [pad]

        def run(chunk, beam):
            src = torch.full((len(chunk), max(map(len, chunk))), pad, dtype=torch.long)
            for j, s in enumerate(chunk):
                src[j, : len(s)] = torch.tensor(s)
            src = src.to(device)
            with torch.inference_mode():
                gen = hf.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=beam, do_sample=False,
                                  max_new_tokens=cap, forced_eos_token_id=eos, early_stopping=True, suppress_tokens=banned,
                                  **forcing)
            return [[pieces_of.get(str(t), "<unk>") for t in row[start:] if t not in (eos, pad)] for row in gen.tolist()]
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
    for batch, beam in settings(spec["batches"]):
        n = spec["sentences_b1"] if batch == 1 else batch
        run(ids[:batch], beam)  # untimed: first calls pay for allocations and lazy set-up (and new buckets' graphs)
        each: list[float] = []

        def all_batches():
            done = []
            for i in range(0, n, batch):
                t0 = time.perf_counter()
                done += run(ids[i : i + batch], beam)  # lists on the host: the device's work is done
                each.append(time.perf_counter() - t0)
            return done

        seconds, outputs = timed(all_batches)
        out["settings"][f"{batch},{beam}"] = {"seconds": seconds, "outputs": outputs, "sentences": n,
                                              "p50_ms": 1000 * percentile(each, 50), "p99_ms": 1000 * percentile(each, 99)}
    out["peak_gib"] = torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else peak_rss_gib()
    return out


def run_memory(work: Path, device: str = "cuda") -> dict:
    """In a fresh process: ours serving 256 rows of up to 256 positions as the engine does (a static decoder of that
    size, its greedy steps and joins captured first; sentences joining as rows free, each decoding to the positions'
    end: 255 tokens, random weights rarely saying eos), 512 sentences; the GPU memory held at the peak, and what the
    decoder reports of its own."""
    spec = json.loads((work / "inputs.json").read_text())
    from nmt_serve.inference.continuous import Sentence
    from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
    from nmt_serve.inference.device_search import JOIN_TOKENS, DeviceSearch
    from nmt_serve.inference.static_decoder import StaticDecoder
    from nmt_serve.inference.translator import Translator

    ours = Translator.load(work / "ours", device=device, dtype=spec["dtype"], static_rows=0)  # no decoder of its own
    forcing = bool(spec["forced"])
    search = DeviceSearch(StaticDecoder(ours.runner, max_rows=256, max_length=256), forced_first_token=forcing)
    search.warmup(beam_sizes=(1,), join_tokens=JOIN_TOKENS)  # as the engine warms up
    loaded = torch.cuda.max_memory_reserved() if device == "cuda" else 0
    sources = [spec["ids"][i % len(spec["ids"])] for i in range(512)]
    continuous, joined, done = ContinuousDeviceSearch(search, beam_size=1), 0, 0
    with torch.inference_mode():
        while done < len(sources):
            room = min(256 - len(continuous), len(sources) - joined)
            if room > 0 and continuous.joinable():
                continuous.add([Sentence(i, sources[i], 255, prefix=tuple(spec["forced"])) for i in range(joined, joined + room)])
                joined += room
            done += len(continuous.step())
    return {"weights_gib": sum(t.numel() * t.element_size() for t in ours.model.state_dict().values()) / 2**30,
            "after_load_gib": loaded / 2**30, "peak_gib": torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else 0.0,
            "static": search.decoder.memory(), "sentences": len(sources)}


def run_server(work: Path, requests: int, port: int = 18799) -> dict:
    """The service (this checkout, 4 API workers) on the converted model, on CUDA: `requests` one-sentence greedy
    requests at concurrency 256, each capped at the spec's tokens; requests/s and latency."""
    from bench.common import start_service
    from bench.loadgen import run_load

    spec = json.loads((work / "inputs.json").read_text())
    models = work / "served"
    models.mkdir(exist_ok=True)
    if not (models / spec["shape"]).exists():
        (models / spec["shape"]).symlink_to(work / "ours")
    proc = start_service(port, models, ["--device", "cuda", "--dtype", spec["dtype"], "--workers", "4", "--max-batch-sentences", "256"],
                         timeout=900)
    try:
        texts = test_sources("de")
        bodies = [{"text": texts[i % len(texts)], "source": "de", "target": "en", "beam_size": 1, "max_length": spec["max_new"]}
                  for i in range(requests)]
        url = f"http://127.0.0.1:{port}/v1/translate"
        run_load(url, bodies[:256], concurrency=256, processes=4)  # warm: the API workers' first requests, the engine's buckets
        result = run_load(url, bodies, concurrency=256, processes=4)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    latencies = result.latencies()
    return {"requests_per_s": result.throughput(), "statuses": result.counts(), "requests": requests,
            "p50_ms": 1000 * percentile(latencies, 50), "p99_ms": 1000 * percentile(latencies, 99)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sentences-b1", type=int, default=4, help="sentences of the batch-1 settings")
    parser.add_argument("--batch", default="32", help="the batched settings' batches, comma-separated (each also its sentences)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--engines", help=f"comma-separated, of {ENGINES}; default: all on the CPU, ours and transformers on "
                                          "CUDA or for opus-mt; '' for none (--memory, --server alone)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", help="default: float32 on the CPU, float16 on CUDA")
    parser.add_argument("--memory", action="store_true", help="CUDA: ours serving 256 rows of up to 256 positions, its peak memory")
    parser.add_argument("--server", type=int, default=0, metavar="N", help="CUDA: N requests to the service at concurrency 256")
    parser.add_argument("--work", help="a directory of an earlier run to reuse (its models are kept)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.child:
        work = Path(args.work)
        result = (run_memory(work) if args.child == "memory" else run_server(work, args.server) if args.child == "server"
                  else run_engine(args.child, work, args.threads))
        print(json.dumps(result))
        return 0
    from nmt_serve.convert.command import convert
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.network.tokenizer import Tokenizer

    s = SHAPES[args.shape]
    marian = s["family"] == "marian"
    dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    batches = [int(b) for b in args.batch.split(",") if b]
    default = ",".join(["ours", "transformers"] if args.device == "cuda" or marian else ENGINES)
    engines = [e for e in (default if args.engines is None else args.engines).split(",") if e]
    if (args.device == "cuda" or marian) and any(e.startswith("CTranslate2") for e in engines):
        raise SystemExit("CTranslate2 runs here on the CPU and for the fairseq families only (bench.engines: OPUS-MT against it)")
    if args.device == "cuda" and "ours int8" in engines:
        raise SystemExit("ours int8 runs on the CPU only")
    if (args.memory or args.server) and args.device != "cuda":
        raise SystemExit("--memory and --server measure on CUDA")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-shape-"))
    if not (work / "ours" / "model.safetensors").is_file():
        print(f"  building a random {args.shape} in {work} ...", file=sys.stderr)
        build_hf_dir(args.shape, work / "hf")
        convert(work / "hf", work / "ours", **(dict(source_lang="de", target_lang="en") if marian else {}))
    info = read_info(work / "ours")
    tokenizer = Tokenizer(work / "ours" / info.src_tokenizer, work / "ours" / info.src_vocab)
    pieces_of = {i: p for p, i in tokenizer.vocab.items()}
    rows = info.config.tgt_vocab_size
    for quant in ("float32", "int8") if any(e.startswith("CTranslate2") for e in engines) else ():  # its own converter, as its command
        target = work / f"ct2-{quant}"
        if not (target / "model.bin").is_file():
            subprocess.run([sys.executable, "-c", CT2_CONVERT, "--model", str(work / "hf"), "--output_dir", str(target),
                            "--quantization", quant, "--force"], check=True, capture_output=True)
            theirs = json.loads((target / "shared_vocabulary.json").read_text())
            assert len(theirs) == rows, (len(theirs), rows)
            ours = [pieces_of.get(i, f"madeupword{i}") for i in range(rows)]
            (target / "shared_vocabulary.json").write_text(json.dumps(ours))
    vocab = tokenizer.vocab
    # the source's code first and the target's forced, for the fairseq families; a bilingual Marian model has neither
    codes = [] if marian else [vocab[s["codes"][0]]]
    ids = [codes + [vocab.get(p, vocab["<unk>"]) for p in tokenizer.sp.encode(t, out_type=str)] + [vocab["</s>"]]
           for t in test_sources("de", max(args.sentences_b1, *batches))]
    spec = {"ids": ids, "forced": [] if marian else [vocab[s["codes"][2]]], "pad": info.config.pad_id, "eos": info.config.eos_id,
            "max_new": args.max_new_tokens, "pieces_of": {str(i): p for i, p in pieces_of.items()}, "family": s["family"],
            "batches": batches, "sentences_b1": args.sentences_b1, "device": args.device, "dtype": dtype, "shape": args.shape}
    (work / "inputs.json").write_text(json.dumps(spec))

    def child(name: str) -> dict:
        print(f"  {name} ...", file=sys.stderr)
        done = subprocess.run([sys.executable, "-m", "bench.real_shapes", "--shape", args.shape, "--child", name, "--work", str(work),
                               "--threads", str(args.threads), "--server", str(args.server)], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed: {done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    report = (f"Machine: {machine()}; {device}, {dtype}; {args.threads} thread(s) for every engine; random {args.shape} "
              f"({info.config.tgt_vocab_size:,} vocabulary rows), {args.max_new_tokens}-token cap.\n\n")
    if engines:  # none: only --memory or --server
        measured = {engine: child(engine) for engine in engines}
        reference = measured[engines[0]]
        table_rows, latency_rows = [], []
        for batch, beam in settings(batches):
            key = f"{batch},{beam}"
            label = f"{'greedy' if beam == 1 else 'beam 4'}, batch {batch}, {reference['settings'][key]['sentences']} sentences"
            for engine in engines:
                r = measured[engine]["settings"][key]
                same = sum(a == b for a, b in zip(reference["settings"][key]["outputs"], r["outputs"]))
                ratio = reference["settings"][key]["seconds"] / r["seconds"]
                table_rows.append([label, engine, r["sentences"] / r["seconds"], f"{1 / ratio:.2f}",
                                   "reference" if engine == engines[0] else ("identical" if same == len(r["outputs"]) else f"{same}/{len(r['outputs'])} identical")])
                if batch == 1:
                    latency_rows.append(["greedy" if beam == 1 else "beam 4", engine, f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}"])
        where = "the GPU's peak reserved" if args.device == "cuda" else "peak RSS"
        load_rows = [[e, f"{measured[e]['load_seconds']:.1f}", f"{measured[e]['peak_gib']:.2f}"] for e in engines]
        report += table(["setting", "engine", "sentences/s", f"{engines[0]} / engine (> 1: {engines[0]} faster)", "outputs"], table_rows)
        report += "\n\nOne sentence at a time (ms):\n\n" + table(["search", "engine", "p50", "p99"], latency_rows)
        report += "\n\n" + table(["engine", "load s", f"{where} GiB (its process)"], load_rows)
    if args.memory:
        m = child("memory")
        static = m["static"] or {}
        report += (f"\n\nOurs serving 256 rows of up to 256 positions ({dtype}; {m['sentences']} greedy sentences joining as rows "
                   f"free, each decoding 255 tokens): "
                   f"weights {m['weights_gib']:.2f} GiB, reserved after load and warm-up {m['after_load_gib']:.2f} GiB, "
                   f"peak reserved {m['peak_gib']:.2f} GiB; the static decoder: "
                   + ", ".join(f"{k} {v / 2**20:,.0f} MiB" if isinstance(v, (int, float)) and v > 2**20 else f"{k} {v}"
                               for k, v in static.items()) + ".")
    if args.server:
        r = child("server")
        report += (f"\n\nThe service (4 API workers) on it, {r['requests']} one-sentence greedy requests at concurrency 256, "
                   f"{args.max_new_tokens}-token cap: {r['requests_per_s']:,.0f} requests/s, p50 {r['p50_ms']:.0f} ms, "
                   f"p99 {r['p99_ms']:.0f} ms; statuses {r['statuses']}.")
    return emit(report + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
