"""GPU benchmark: latency, throughput, precision, Hugging Face, busy share, captured vs eager, in one run.

    python -m bench.gpu [--quick] [--output FILE] [--json FILE]

Everything runs in this one process on one CUDA device, on the shipped de-en model and Multi30k
test_2016_flickr sentences (natural lengths, the set repeated where a batch needs more), so every
ratio compares runs made side by side. Sections:
1. attention backends: the encoder's and the one-token step's attention, each backend timed alone;
2. one sentence at a time through `Translator.translate` (tokenization included): p50/p90/p99, the
   static decoder (CUDA graphs) vs the eager search, and the first request after load;
3. throughput at batch 1..2048, greedy and beam 4, static vs eager, float16, and bfloat16/float32;
4. ours vs Hugging Face `generate` on identical weights (a MarianMT twin with random weights, which
   decodes to the 40-token cap), float16, both with the same attention backends, outputs compared;
5. GPU busy share (kernel time / wall time, torch profiler), beam 4 batch 64, static vs eager;
6. static vs eager on all of test_2016_flickr (float16): identical outputs and sacreBLEU;
7. warm-up time and the static decoder's memory;
8. joins: n sentences joining a continuous search of 256 running (ContinuousDeviceSearch, its joins
   captured per bucket), the join's host and GPU time against a replayed step's;
9. kernels: one batch's static search under the profiler, its GPU time by kernel name.
Timings use CUDA events around work whose results are read back to the host.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import ROOT, emit, machine, marian_twin, percentile, table, test_sources
from nmt_serve.convert.marian import import_marian
from nmt_serve.inference.search import SearchOptions
from nmt_serve.inference.translator import Translator

CHECKPOINT = ROOT / "checkpoints" / "de-en"


def cuda_time(fn, repeat: int = 1):
    """Best of `repeat` runs, in seconds, by CUDA events (fn reads its results back, so they bracket it)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return best, result


def load(step_mode: str, dtype: str = "float16", rows: int = 2048, checkpoint: Path = CHECKPOINT) -> tuple[Translator, float]:
    started = time.perf_counter()
    translator = Translator.load(checkpoint, device="cuda", dtype=dtype, step_mode=step_mode, static_rows=rows)
    torch.cuda.synchronize()
    return translator, time.perf_counter() - started


def batches_of(ids: list[list[int]], size: int, count: int) -> list[list[list[int]]]:
    """`count` batches of `size` sentences, the test set repeated as needed, in its natural order."""
    out, i = [], 0
    for _ in range(count):
        batch = [ids[(i + j) % len(ids)] for j in range(size)]
        i += size
        out.append(batch)
    return out


def run_batches(translator: Translator, batches: list, beam: int, max_length: int | None = None) -> list[list[int]]:
    outputs = []
    for batch in batches:
        src = translator._pad(batch)
        outputs += [h[0].tokens for h in translator.generate(src, SearchOptions(beam_size=beam, max_length=max_length))]
    return outputs


# ---------------------------------------------------------------------------------------------- sections
def attention_section(quick: bool) -> str:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    H, D = 4, 64
    cases = [("encoder, batch 64 x 24 tokens, padded", (64, H, 24, D), (64, H, 24, D), True),
             ("encoder, batch 64 x 24 tokens, no padding", (64, H, 24, D), (64, H, 24, D), False),
             ("decoder step, 1024 rows x 64 positions, masked", (1024, H, 1, D), (1024, H, 64, D), True),
             ("decoder step, 2048 rows x 48 positions, masked", (2048, H, 1, D), (2048, H, 48, D), True)]
    for name, qs, ks, masked in cases:
        q, k, v = (torch.randn(s, device="cuda", dtype=torch.float16) for s in (qs, ks, ks))
        mask = (torch.rand(ks[0], 1, 1, ks[2], device="cuda") > 0.2) if masked else None
        if mask is not None:
            mask[..., 0] = True
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    torch.cuda.synchronize()
                    seconds, _ = cuda_time(lambda: [F.scaled_dot_product_attention(q, k, v, attn_mask=mask) for _ in range(100)], 3)
                rows.append([name, backend.name, f"{seconds * 1e4:.1f}"])  # per call, microseconds
            except RuntimeError:
                rows.append([name, backend.name, "not supported"])
        if qs[2] == 1:  # the static decoder's alternative for one query per row (STEP_ATTENTION "matmul")
            from nmt_serve.inference import static_decoder

            shipped, static_decoder.STEP_ATTENTION = static_decoder.STEP_ATTENTION, "matmul"
            try:
                static_decoder.attend(q, k, v, mask)
                seconds, _ = cuda_time(lambda: [static_decoder.attend(q, k, v, mask) for _ in range(100)], 3)
                rows.append([name, "matmul, softmax, matmul", f"{seconds * 1e4:.1f}"])
            finally:
                static_decoder.STEP_ATTENTION = shipped
    return "### Attention backends (float16, per call, microseconds)\n\n" + table(["attention", "backend", "µs"], rows)


def latency_section(quick: bool, results: dict) -> str:
    sentences = test_sources("de")[: 100 if quick else 300]
    rows = []
    for mode in ("auto", "eager"):
        translator, load_s = load(mode, rows=1024)
        first = time.perf_counter()
        translator.translate([sentences[0]], beam_size=1)
        first_ms = (time.perf_counter() - first) * 1000
        for beam in (1, 4):
            times = []
            for s in sentences:
                t0 = time.perf_counter()
                translator.translate([s], beam_size=beam)
                times.append((time.perf_counter() - t0) * 1000)
            label = "static (CUDA graphs)" if mode == "auto" else "eager"
            rows.append([label, "greedy" if beam == 1 else "beam 4", f"{percentile(times, 50):.2f}", f"{percentile(times, 90):.2f}",
                         f"{percentile(times, 99):.2f}", f"{max(times):.2f}", f"{first_ms:.1f}" if beam == 1 else "", f"{load_s:.1f}"])
            results[f"latency,{mode},{beam}"] = {"p50": percentile(times, 50), "p99": percentile(times, 99)}
        del translator
        torch.cuda.empty_cache()
    return (f"### One sentence at a time (`Translator.translate([s])`, {len(sentences)} sentences, float16, ms)\n\n"
            + table(["decoder", "search", "p50", "p90", "p99", "max", "first request after load", "load + warm-up (s)"], rows))


PLANS = "float16:auto,float16:eager,bfloat16:auto,float32:auto"  # the throughput section's dtype:step_mode runs


def throughput_section(quick: bool, results: dict, plans: str = PLANS) -> str:
    ids_cache = {}
    rows = []
    sizes = [1, 8, 32, 128, 512, 2048]
    for dtype, mode in (plan.split(":") for plan in plans.split(",")):
        translator, _ = load(mode, dtype)
        if "ids" not in ids_cache:
            ids_cache["ids"] = [translator.encode_source(t) for t in test_sources("de")]
        ids = ids_cache["ids"]
        for beam in (1, 4):
            for size in sizes if dtype == "float16" else [32, 2048 if beam == 1 else 256]:
                if beam == 4 and size > 512:
                    continue
                total = max(size, 64 if size == 1 else 2048 if quick else 4096)
                count = max(1, total // size)
                if size == 1:
                    count = 32 if quick else 64
                work = batches_of(ids, size, count)
                run_batches(translator, work[:1], beam)  # warm-up (also captures new buckets on first use)
                seconds, _ = cuda_time(lambda: run_batches(translator, work, beam), 2)
                n = size * count
                label = "static (CUDA graphs)" if mode == "auto" else "eager"
                rows.append([dtype, label, "greedy" if beam == 1 else "beam 4", size, f"{n / seconds:,.0f}"])
                results[f"throughput,{dtype},{mode},{beam},{size}"] = n / seconds
        if dtype == "float16" and mode == "auto":
            # the user's offline path: translate() past one batch runs the engine's continuous search, sentences
            # joining by source length as others leave, not batches one after another
            for beam, size in ((1, 2048), (4, 256)):
                n = 4096 if quick else 16384
                sources = (ids * (1 + n // len(ids)))[:n]
                translator.translate(sources=sources[:2 * size], beam_size=beam, max_batch_size=size)  # warm-up
                seconds, _ = cuda_time(lambda: translator.translate(sources=sources, beam_size=beam, max_batch_size=size), 2)
                rows.append([dtype, "static, translate() (continuous)", "greedy" if beam == 1 else "beam 4", size, f"{n / seconds:,.0f}"])
                results[f"throughput,{dtype},translate,{beam},{size}"] = n / seconds
        del translator
        torch.cuda.empty_cache()
    return "### Throughput (sentences/s, natural lengths)\n\n" + table(["dtype", "decoder", "search", "batch", "sentences/s"], rows)


def hugging_face_section(quick: bool, results: dict) -> str:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import MarianMTModel

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))
    twin = marian_twin(CHECKPOINT, work / "marian")
    ours_dir = import_marian(twin, work / "ours", "de", "en")
    ours, _ = load("auto", checkpoint=ours_dir, rows=1024)
    hf = MarianMTModel.from_pretrained(twin, dtype=torch.float16).to("cuda").eval()
    cfg = ours.config
    ids = [ours.encode_source(t) for t in test_sources("de")]
    max_new = 40
    rows = []

    def run_hf(batches, beam):
        outputs = []
        for batch in batches:
            src = ours._pad(batch)
            with torch.inference_mode(), sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
                out = hf.generate(input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam, do_sample=False,
                                  max_new_tokens=max_new, early_stopping=True, bad_words_ids=[[cfg.pad_id]])
            for row in out.tolist():
                tokens = []
                for t in row[1:]:
                    if t == cfg.eos_id:
                        break
                    tokens.append(t)
                outputs.append(tokens)
        return outputs

    for beam in (1, 4):
        for size in (1, 32, 256):
            count = {1: 10 if quick else 20, 32: 4, 256: 2}[size]
            work_batches = batches_of(ids, size, count)
            run_batches(ours, work_batches[:1], beam, max_new)
            run_hf(work_batches[:1], beam)
            t_ours, a = cuda_time(lambda: run_batches(ours, work_batches, beam, max_new))
            t_hf, b = cuda_time(lambda: run_hf(work_batches, beam))
            same = sum(x == y for x, y in zip(a, b))
            n = size * count
            rows.append(["greedy" if beam == 1 else "beam 4", size, f"{n / t_ours:,.0f}", f"{n / t_hf:,.0f}", f"{t_hf / t_ours:.1f}",
                         f"{same}/{n}"])
            results[f"hf,{beam},{size}"] = t_hf / t_ours
    return ("### Ours vs Hugging Face `generate` (Marian twin, float16, 40-token cap, same attention backends)\n\n"
            + table(["search", "batch", "ours sentences/s", "HF sentences/s", "ours / HF", "identical outputs"], rows))


def busy_section(quick: bool, results: dict) -> str:
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for mode in ("auto", "eager"):
        translator, _ = load(mode, rows=1024)
        ids = [translator.encode_source(t) for t in test_sources("de")]
        work = batches_of(ids, 64, 4 if quick else 8)
        run_batches(translator, work[:2], 4)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            run_batches(translator, work, 4)
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e6  # microseconds -> seconds
        label = "static (CUDA graphs)" if mode == "auto" else "eager"
        rows.append([label, f"{wall * 1000:.1f}", f"{busy * 1000:.1f}", f"{100 * busy / wall:.0f}%", len(kernels)])
        results[f"busy,{mode}"] = busy / wall
        del translator
        torch.cuda.empty_cache()
    return ("### GPU busy share, beam 4, batch 64 (torch profiler: kernel time / wall time; the profiler's own overhead "
            "is in the wall time)\n\n" + table(["decoder", "wall ms", "kernel ms", "busy", "kernels"], rows))


def kernels_section(quick: bool, results: dict, checkpoint: Path = CHECKPOINT, max_length: int | None = None) -> str:
    """Where a static search's GPU time goes: the offline search of one batch under the torch profiler
    (CUDA graphs' kernels are reported one by one), its kernels grouped by name, the largest first.
    checkpoint: another model (a real shape's random twin, bench.real_shapes --engines ''); max_length: a cap on
    its output (random weights rarely say eos)."""
    from torch.profiler import ProfilerActivity, profile

    translator, _ = load("auto", rows=2048, checkpoint=checkpoint)
    ids = [translator.encode_source(t) for t in test_sources("de")]
    out = []
    for beam, size in ((1, 2048), (1, 256), (4, 256)):
        work = batches_of(ids, size, 1)
        run_batches(translator, work, beam, max_length)  # warm-up: every bucket this batch meets is captured
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            run_batches(translator, work, beam, max_length)
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
        by_name: dict[str, list[float]] = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                by_name.setdefault(e.name, []).append(e.device_time)
        total = sum(sum(v) for v in by_name.values())
        launches = sum(e.name == "cudaGraphLaunch" for e in prof.events())  # one per replayed step or join
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]
        search = "greedy" if beam == 1 else f"beam {beam}"
        results[f"kernels,{beam},{size}"] = {"wall_ms": wall * 1000, "kernel_ms": total / 1000,
                                             "graph_launches": launches, "top": [(name[:120], sum(v) / 1000, len(v)) for name, v in top]}
        rows = [[name[:90].replace("|", "/"), f"{sum(v) / 1000:.2f}", f"{100 * sum(v) / max(total, 1e-9):.0f}%", len(v),
                 f"{sum(v) / len(v):.1f}"] for name, v in top]
        out.append(f"#### {search}, batch {size}: wall {wall * 1000:.1f} ms, kernels {total / 1000:.1f} ms "
                   f"({100 * total / 1000 / (wall * 1000):.0f}% busy, profiler overhead in the wall time), "
                   f"{launches} graph launches (steps and joins)\n\n"
                   + table(["kernel", "ms", "share", "calls", "us per call"], rows))
    # one replayed step by (rows, positions): the buffers hold the last search's finished rows, so a step
    # changes nothing; its cost does not depend on the values (every position of the bucket is computed)
    searcher = translator.device_search()
    steps = []
    for K, G in ((1, 256), (1, 512), (1, 1024), (1, 2048), (4, 64), (4, 128), (4, 256), (4, 512)):
        for L in (32, 48, 64):
            key, fn = searcher.program(K, G, L)
            searcher.decoder.run(key, fn)  # captured on first use
            seconds, _ = cuda_time(lambda: [searcher.decoder.run(key, fn) for _ in range(20)], 3)
            steps.append(["greedy" if K == 1 else f"beam {K}", G * K, L, f"{seconds / 20 * 1000:.3f}"])
            results[f"step,{K},{G},{L}"] = seconds / 20
    del translator, searcher
    torch.cuda.empty_cache()
    return ("### Where a static search's GPU time goes (torch profiler, float16, one batch)\n\n" + "\n\n".join(out)
            + "\n\n#### One replayed step by rows and positions (CUDA events, best of 3 x 20 replays)\n\n"
            + table(["search", "rows", "positions", "ms per step"], steps))


OFFLINE = "1:2048,4:256"  # the offline section's beam:batch runs


def offline_section(quick: bool, results: dict, runs: str = OFFLINE) -> str:
    """The offline search's pace, batch after batch as the throughput rows run it (natural order): sentences/s and
    wall time per batch, against the kernels' time of one batch under the profiler. Meant to run under py-spy
    (scripts/gpu-rows.sh offline-profile): the host's share of each batch, in the frames under `measured`."""
    from torch.profiler import ProfilerActivity, profile

    translator, _ = load("auto", rows=2048)
    ids = [translator.encode_source(t) for t in test_sources("de")]
    rows = []
    for beam, size in (tuple(int(x) for x in run.split(":")) for run in runs.split(",")):
        count = max(2, (4096 if quick else 16384) // size)
        work = batches_of(ids, size, count)
        run_batches(translator, work[:2], beam)  # warm-up: the buckets these batches meet are captured

        def measured():  # the frame py-spy's samples are read within (`bench.folded --within`)
            return run_batches(translator, work, beam)
        seconds, _ = cuda_time(measured, 2)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run_batches(translator, work[:1], beam)
            torch.cuda.synchronize()
        kernel_ms = sum(e.device_time for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA) / 1000
        wall_ms = seconds / count * 1000
        results[f"offline,{beam},{size}"] = {"sentences_per_s": size * count / seconds, "wall_ms": wall_ms, "kernel_ms": kernel_ms}
        rows.append(["greedy" if beam == 1 else f"beam {beam}", size, count, f"{size * count / seconds:,.0f}", f"{wall_ms:.1f}",
                     f"{kernel_ms:.1f}", f"{100 * kernel_ms / wall_ms:.0f}%"])
    del translator
    torch.cuda.empty_cache()
    return ("### The offline search's pace (float16, natural order; kernels: one batch under the profiler, "
            "against the wall time a batch takes without it)\n\n"
            + table(["search", "batch", "batches", "sentences/s", "wall ms a batch", "kernel ms a batch", "busy"], rows))


def parity_section(quick: bool, results: dict) -> str:
    import sacrebleu

    static, _ = load("auto", rows=1024)
    eager, _ = load("eager", rows=1024)
    sources, refs = test_sources("de"), test_sources("en")
    rows = []
    for beam in (1, 4):
        a = static.translate(sources, beam_size=beam)
        b = eager.translate(sources, beam_size=beam)
        same = sum([h.tokens for h in x.hypotheses] == [h.tokens for h in y.hypotheses] for x, y in zip(a, b))
        bleu_a = sacrebleu.corpus_bleu([r.text for r in a], [refs]).score
        bleu_b = sacrebleu.corpus_bleu([r.text for r in b], [refs]).score
        rows.append(["greedy" if beam == 1 else "beam 4", f"{same}/{len(sources)} ({100 * same / len(sources):.1f}%)", f"{bleu_a:.2f}", f"{bleu_b:.2f}"])
        results[f"parity,{beam}"] = {"identical": same / len(sources), "bleu_static": bleu_a, "bleu_eager": bleu_b}
    memory = static.static_memory()
    out = ("### Static (captured) vs eager on test_2016_flickr (float16, de-en)\n\n"
           + table(["search", "identical outputs", "sacreBLEU static", "sacreBLEU eager"], rows))
    out += (f"\n\nStatic decoder memory (1024 rows x 256 positions): buffers {memory['buffers_bytes'] / 2**20:.0f} MiB, "
            f"{memory['graphs']} graphs sharing a pool of {memory['graph_pool_bytes'] / 2**20:.0f} MiB.")
    results["memory"] = memory
    return out


def joins_section(quick: bool, results: dict, device: str = "cuda") -> str:
    """What a join costs the engine's loop next to a step: host time (the call, which must not wait for
    the GPU) and device time (CUDA events around it, the GPU idle before), greedy and beam 4, 256
    sentences running at natural lengths with room to run on (max_length 200); and a step that keeps
    the rows' attention (what the `detached` check and inline tags read), once one sentence asks for it."""
    from nmt_serve.inference.continuous import Sentence
    from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
    from nmt_serve.inference.device_search import JOIN_TOKENS, DeviceSearch
    from nmt_serve.inference.static_decoder import StaticDecoder

    cuda = device == "cuda"
    translator = Translator.load(CHECKPOINT, device=device, dtype="float16" if cuda else "float32", step_mode="eager")
    ids = [translator.encode_source(t) for t in test_sources("de")]
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def timed(fn) -> tuple[float, float]:
        """(host seconds of the call, device seconds of its work)."""
        sync()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        began = time.perf_counter()
        fn()
        host = time.perf_counter() - began
        if not cuda:
            return host, host
        end.record()
        end.synchronize()
        return host, start.elapsed_time(end) / 1000

    rows, repeat, running = [], 3 if quick else 7, 256
    sizes = (1, 8, 32) if quick else (1, 8, 32, 128)
    for K in (1, 4):
        device_search = DeviceSearch(StaticDecoder(translator.runner, max_rows=(running + 2 * max(sizes) * repeat) * K, max_length=256,
                                                   group=K))  # as the engine's decoder of one beam size
        device_search.warmup(beam_sizes=(K,), join_tokens=JOIN_TOKENS, attention=True)
        search = ContinuousDeviceSearch(device_search, beam_size=K, check_every=10**6)  # no reads back while timing
        count = iter(range(10**9))

        def sentences(n, keep=False):
            return [Sentence(next(count), ids[i % len(ids)], 200, attention_span=(0, len(ids[i % len(ids)])) if keep else None)
                    for i in range(n)]

        search.add(sentences(running))
        for _ in range(3):
            search.step()
        step_host, step_device = min(timed(search.step) for _ in range(repeat))
        these = []
        for n in sizes:
            joins = [timed(lambda: search.add(sentences(n))) for _ in range(repeat)]
            join_host, join_device = min(h for h, _ in joins), min(d for _, d in joins)
            these.append(["greedy" if K == 1 else "beam 4", n, f"{join_host * 1000:.2f}", f"{join_device * 1000:.2f}",
                          f"{step_host * 1000:.2f}", f"{step_device * 1000:.2f}", f"{join_device / step_device:.2f}"])
            results[f"join,{K},{n}"] = {"join_host": join_host, "join_device": join_device, "step_host": step_host,
                                        "step_device": step_device}
            search.step()
        search.add(sentences(1, keep=True))  # from here on every step keeps the rows' attention
        search.step()
        kept = min(timed(search.step) for _ in range(repeat))[1]
        results[f"step-attention,{K}"] = {"step_device": step_device, "step_attention_device": kept}
        rows += [row + [f"{kept * 1000:.2f}"] for row in these]
    return ("### Joins vs a replayed step: 256 sentences running, n join (ms; the goal: a join's device time "
            "<= 2 steps'); last, the step that keeps the rows' attention\n\n"
            + table(["search", "n joining", "join host", "join device", "step host", "step device", "join / step (device)",
                     "step keeping attention (device)"], rows))


SECTIONS = {"attention": attention_section, "latency": latency_section, "throughput": throughput_section,
            "hf": hugging_face_section, "busy": busy_section, "parity": parity_section, "joins": joins_section,
            "kernels": kernels_section, "offline": offline_section}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sentences per measurement")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {list(SECTIONS)}")
    parser.add_argument("--plans", default=PLANS, help="the throughput section's runs, dtype:step_mode (auto: the static "
                        "decoder on CUDA, eager: the eager search)")
    parser.add_argument("--offline-runs", default=OFFLINE, help="the offline section's runs, beam:batch")
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT, help="the kernels section's model (default: the "
                        "shipped de-en)")
    parser.add_argument("--max-length", type=int, help="the kernels section's output cap (a random model's searches run to it)")
    parser.add_argument("--output")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench.gpu needs a CUDA device")
    results: dict = {}
    parts = [f"GPU: {torch.cuda.get_device_name()}; {machine()}\n"]
    for name in args.sections.split(","):
        started = time.perf_counter()
        fn = {"throughput": partial(throughput_section, plans=args.plans),
              "offline": partial(offline_section, runs=args.offline_runs),
              "kernels": partial(kernels_section, checkpoint=args.checkpoint, max_length=args.max_length)}.get(name, SECTIONS[name])
        part = fn(args.quick) if name == "attention" else fn(args.quick, results)
        parts.append(part)
        print(part + f"\n\n({name}: {time.perf_counter() - started:.0f} s)\n", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    return emit("\n\n".join(parts) + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
