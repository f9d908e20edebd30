"""Engine benchmarks, measured side by side in one run on the same machine, threads and inputs.

    python -m bench.engines [--threads N] [--sentences-b1 N] [--sentences-b32 N] [--shape opus-mt] [--rounds N]

1. ours vs Hugging Face `generate` on the same weights (a MarianMT twin of the shipped model,
   converted to our format): sentences/s and target tokens/s, greedy and beam 4, batch 1 and 32;
   the outputs are compared token by token.
2. ours vs CTranslate2 float32 and int8 on those weights (converted by CTranslate2's own converter),
   and our int8 option (`quantization="int8"`) beside CTranslate2's int8.
Every engine runs in a fresh process of its own (see run_engine), one after the other; with `--rounds N`
they take N turns and each setting keeps its fastest run (this VM's speed drifts from process to process).
3. KV cache vs recomputation (`use_cache=False`) on the shipped model, short and long outputs.
Prints markdown tables; --output also writes them to a file.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.common import ROOT, SHAPES, emit, machine, marian_twin, table, test_sources, timed
from nmt_serve.convert.marian import import_marian
from nmt_serve.engine.weights_dir import make_weights_dir, remove_weights_dir
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.inference.shared_weights import share_weights
from nmt_serve.inference.translator import Translator


def batches(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def run_ours(translator: Translator, ids: list[list[int]], batch: int, beam: int, max_new: int, use_cache: bool = True):
    outputs = []
    for chunk in batches(ids, batch):
        src = translator._pad(chunk)
        for hyps in generate(translator.runner, src, SearchOptions(beam_size=beam, max_length=max_new, use_cache=use_cache)):
            outputs.append(hyps[0].tokens)
    return outputs


def run_ours_in_lanes(translator: Translator, ids: list[list[int]], batch: int, beam: int, max_new: int, lanes: int):
    """The batches split between `lanes` threads of one torch thread each, as the service's lanes run (a lane per
    core by default): each thread takes the next batch as it finishes one."""
    with ThreadPoolExecutor(lanes) as pool:
        done = pool.map(lambda chunk: run_ours(translator, chunk, batch, beam, max_new), list(batches(ids, batch)))
        return [tokens for outputs in done for tokens in outputs]


_ENGINE: Translator | None = None  # an engine process's model (run_ours_in_engines)


def _load_engine(path: Path, quantization: str, weights_dir: str = "") -> None:
    global _ENGINE
    torch.set_num_threads(1)
    _ENGINE = Translator.load(path, device="cpu", dtype="float32", quantization=quantization)
    if weights_dir:
        share_weights(_ENGINE.runner, weights_dir, "ours")
    for beam in (1, 4):  # first calls pay for allocations and lazy set-up, in every process
        run_ours(_ENGINE, [[5, 6, 7, 8]] * 4, 4, beam, 8)


def _engine_batch(job: tuple[list[list[int]], int, int, int]) -> list[list[int]]:
    chunk, batch, beam, max_new = job
    return run_ours(_ENGINE, chunk, batch, beam, max_new)


def run_ours_in_engines(pool, ids: list[list[int]], batch: int, beam: int, max_new: int):
    """The batches shared between engine processes of one thread each (a pool of _load_engine's), as the CPU chart
    deploys them (NMT_ENGINES=2, one lane each): each process takes the next batch as it finishes one."""
    jobs = [(chunk, batch, beam, max_new) for chunk in batches(ids, batch)]
    return [tokens for outputs in pool.map(_engine_batch, jobs, chunksize=1) for tokens in outputs]


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


ENGINES = ["ours", "ours, 1 thread", "Hugging Face generate", "CTranslate2 float32", "CTranslate2 float32, 1 thread",
           "ours int8", "ours int8, 1 thread", "CTranslate2 int8", "CTranslate2 int8, 1 thread",
           "ours, lanes", "ours, engines", "CTranslate2 float32, workers",
           "ours int8, lanes", "ours int8, engines", "CTranslate2 int8, workers",
           "ours, engines, own weights", "ours int8, engines, own weights"]
# Ours and CTranslate2 are also measured with one thread: on a 2-core VM CTranslate2's two-thread decoding of small
# batches was 5x slower than one thread (measured), so the ratios below compare each engine's better setting.
# "lanes" / "engines" / "workers": --threads decoders of one thread each side by side, batches shared between them:
# our engine's lanes (threads of one process, its default: a lane per core), our engine processes (the CPU chart's
# setting: NMT_ENGINES=2 of one lane each), CTranslate2's inter_threads x intra_threads=1. They are left out by default
# (the throughput of concurrent batches, not one batch's speed); `--engines` names them. Our engine processes map one
# copy of the weights, as the service's do (inference/shared_weights.py); "own weights": a copy each.
SIDE_BY_SIDE = ("lanes", "engines", "workers")


def side_by_side(engine: str) -> bool:
    return any(kind in engine.split(", ") for kind in SIDE_BY_SIDE)


DEFAULT_ENGINES = [e for e in ENGINES if not side_by_side(e)]
SETTINGS = [(1, 1), (1, 4), (32, 1), (32, 4)]  # (batch size, beam size)


def run_engine(engine: str, work: Path, threads: int) -> dict:
    """In a fresh process (see main's --child): one engine decodes every setting; times and outputs.

    Each engine gets a process of its own because CTranslate2 and torch each bring an OpenMP thread
    pool: once CTranslate2 has run in a process, its idle threads slow torch there about 3x on 2
    cores (measured), which would distort every comparison made in that process."""
    spec = json.loads((work / "inputs.json").read_text())
    parallel = threads if side_by_side(engine) else 1  # decoders side by side, one thread each
    threads = 1 if engine.endswith("1 thread") or parallel > 1 else threads
    torch.set_num_threads(threads)
    ids, pieces, vocab, max_new = spec["ids"], spec["pieces"], spec["vocab"], spec["max_new"]
    pool, weights_dir = None, ""
    if engine.startswith("ours") and "engines" in engine.split(", "):
        weights_dir = make_weights_dir(parallel, "cpu", enabled=not engine.endswith("own weights"))
        pool = multiprocessing.get_context("spawn").Pool(
            parallel, initializer=_load_engine, initargs=(work / "ours", "int8" if "int8" in engine else "none", weights_dir))
        run = lambda n, batch, beam: run_ours_in_engines(pool, ids[:n], batch, beam, max_new)  # noqa: E731
    elif engine.startswith("ours"):
        translator = Translator.load(work / "ours", device="cpu", dtype="float32",
                                     quantization="int8" if "int8" in engine else "none")
        if parallel > 1:
            run = lambda n, batch, beam: run_ours_in_lanes(translator, ids[:n], batch, beam, max_new, parallel)  # noqa: E731
        else:
            run = lambda n, batch, beam: run_ours(translator, ids[:n], batch, beam, max_new)  # noqa: E731
    elif engine == "Hugging Face generate":
        from transformers import MarianMTModel

        model = MarianMTModel.from_pretrained(work / "marian").eval()
        run = lambda n, batch, beam: run_hf(model, ids[:n], batch, beam, max_new, spec["pad"], spec["eos"])  # noqa: E731
    else:
        import ctranslate2

        quant = engine.split()[1].rstrip(",")
        ct2 = ctranslate2.Translator(str(work / f"ct2-{quant}"), device="cpu", compute_type=quant,
                                     intra_threads=threads, inter_threads=parallel)
        run = lambda n, batch, beam: run_ct2(ct2, pieces[:n], batch, beam, max_new, vocab)  # noqa: E731
    results = {}
    for batch, beam in SETTINGS:
        n = spec["sentences"][str(batch)]
        run(batch, batch, beam)  # one untimed batch first: first calls pay for allocations and lazy set-up
        seconds, outputs = timed(lambda: run(n, batch, beam))
        results[f"{batch},{beam}"] = {"seconds": seconds, "outputs": outputs}
    if pool is not None:
        pool.close()
        pool.join()
    remove_weights_dir(weights_dir)
    return results


# (column, the engine measured, the engines compared with it): on each side the fastest of those the run measured
# counts, each engine at its better thread count; a column is left out when a run leaves out either side (--engines)
RATIOS = [
    ("ours / HF generate", ["ours", "ours, 1 thread"], ["Hugging Face generate"]),
    ("ours / CT2 float32", ["ours", "ours, 1 thread", "ours, lanes", "ours, engines", "ours, engines, own weights"],
     ["CTranslate2 float32", "CTranslate2 float32, 1 thread", "CTranslate2 float32, workers"]),
    ("ours int8 / HF generate", ["ours int8", "ours int8, 1 thread"], ["Hugging Face generate"]),
    ("ours int8 / CT2 int8", ["ours int8", "ours int8, 1 thread", "ours int8, lanes", "ours int8, engines",
                              "ours int8, engines, own weights"],
     ["CTranslate2 int8", "CTranslate2 int8, 1 thread", "CTranslate2 int8, workers"]),
]


def engine_tables(threads: int, n_b1: int, n_b32: int, max_new: int, shape: str | None = None,
                  engines: list[str] = DEFAULT_ENGINES, rounds: int = 1) -> str:
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    twin = marian_twin(ROOT / "checkpoints" / "de-en", work / "marian", shape=shape)
    ours_dir = import_marian(twin, work / "ours", "de", "en")
    for quant in ("float32", "int8"):  # CTranslate2's own converter, as its command (no CTranslate2 in this process)
        subprocess.run([str(Path(sys.executable).parent / "ct2-transformers-converter"), "--model", str(twin),
                        "--output_dir", str(work / f"ct2-{quant}")] + (["--quantization", "int8"] if quant == "int8" else []),
                       check=True, capture_output=True)
    ours = Translator.load(ours_dir, device="cpu", dtype="float32")
    cfg = ours.config
    sources = test_sources("de")[: max(n_b1, n_b32)]
    ids = [ours.encode_source(t) for t in sources]
    spec = {
        "ids": ids, "pieces": [ours.src_tokenizer.pieces(s) for s in ids],  # eos included, as the Marian tokenizer does
        "vocab": ours.src_tokenizer.vocab, "max_new": max_new, "pad": cfg.pad_id, "eos": cfg.eos_id,
        "sentences": {"1": n_b1, "32": n_b32},
    }
    (work / "inputs.json").write_text(json.dumps(spec))
    measured: dict[str, dict] = {}
    for round_ in range(rounds):  # engines take turns, so that drift in the machine's load hits them alike
        for engine in engines:
            print(f"  round {round_ + 1}/{rounds}: {engine} ...", file=sys.stderr)
            out = subprocess.run([sys.executable, "-m", "bench.engines", "--child", engine, "--work", str(work), "--threads", str(threads)],
                                 cwd=ROOT, check=True, capture_output=True, text=True).stdout
            kept = measured.setdefault(engine, {})
            for key, r in json.loads(out.strip().splitlines()[-1]).items():  # the fastest run of each setting
                if key not in kept or r["seconds"] < kept[key]["seconds"]:
                    kept[key] = r
    ratios = [(name, [m for m in mine if m in engines], [o for o in others if o in engines]) for name, mine, others in RATIOS]
    ratios = [r for r in ratios if r[1] and r[2]]
    rows, ratio_rows = [], []
    for batch, beam in SETTINGS:
        key, n = f"{batch},{beam}", n_b1 if batch == 1 else n_b32
        label = f"{'greedy' if beam == 1 else 'beam 4'}, batch {batch}, {n} sentences"
        reference = measured[engines[0]][key]["outputs"]
        for engine in engines:
            r = measured[engine][key]
            n_tok = sum(len(o) + 1 for o in r["outputs"])
            rows.append([label, engine, n / r["seconds"], n_tok / r["seconds"],
                         compare(reference, r["outputs"]) if engine != engines[0] else "reference"])
        t = {engine: measured[engine][key]["seconds"] for engine in engines}
        ratio_rows.append([label] + [f"{min(t[o] for o in others) / min(t[m] for m in mine):.2f}" for _, mine, others in ratios])
    out = f"### Ours vs Hugging Face and CTranslate2, same weights ({shape or 'the shipped model'}'s shape)\n\n"
    if rounds > 1:
        out += f"Each engine's fastest of {rounds} alternating rounds, each round a fresh process per engine.\n\n"
    out += table(["setting", "engine", "sentences/s", "target tokens/s", f"outputs vs {engines[0]}"], rows)
    out += "\n\nSpeed ratios (> 1: ours is faster):\n\n"
    out += table(["setting"] + [name for name, *_ in ratios], ratio_rows)
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
                    outs += [h[0].tokens for h in generate(translator.runner, translator._pad(chunk), opts)]
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
    parser.add_argument("--engines", default=";".join(DEFAULT_ENGINES),
                        help="';'-separated engines to run, the first the reference for outputs (default: all but the "
                             f"lanes, engines and workers); known: {'; '.join(ENGINES)}")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="random weights at a deployed model's real shape (default: the shipped model's)")
    parser.add_argument("--skip-cache", action="store_true", help="leave out the KV cache table")
    parser.add_argument("--rounds", type=int, default=1, help="engines run this many times in turn; each keeps its fastest")
    parser.add_argument("--output")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)  # internal: one engine, in its own process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_engine(args.child, args.work, args.threads)))
        return 0
    torch.set_num_threads(args.threads)
    parts = [f"Machine: {machine()}; {args.threads} thread(s) for every engine.\n"]
    if not args.skip_engines:
        engines = [e.strip() for e in args.engines.split(";") if e.strip()]
        unknown = [e for e in engines if e not in ENGINES]
        if unknown or not engines:
            parser.error(f"--engines: unknown {unknown}; known: {'; '.join(ENGINES)}")
        parts.append(engine_tables(args.threads, args.sentences_b1, args.sentences_b32, args.max_new_tokens, args.shape, engines,
                                   args.rounds))
    if not args.skip_cache:
        parts.append(cache_table(args.cache_sentences))
    report = "\n\n".join(parts) + "\n"
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
