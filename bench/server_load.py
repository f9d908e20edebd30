"""The server under load against the offline engine, side by side in one run (loopback, CPU).

    python -m bench.server_load [--sections throughput,mixed,single,flood] [--workers 1,2]

The load comes from bench/loadgen.py: client processes with aiohttp, one sentence per request, so
the server is measured and not the client (its CPU time is reported). Sections:
- engine: the continuous-batching search alone (no HTTP), fed as the server feeds it, against the
  offline engine on the same 256 sentences. `--long-first N`: the first sentence is N test sentences
  joined into one long one, and the eager search also runs with its source side never narrowed after
  that sentence left (`continuous.NARROW_SOURCE_AT` 0), as it was before it narrowed.
- throughput: 256 test sentences at concurrency 64, greedy and beam 4: the server's requests/s
  against the offline engine (Translator.translate, batches of 64) on the same sentences;
  with each API worker count asked for. `--replicas N`: N servers side by side on the device, the load
  split between them (their engine shares then summed: each engine its own loop). `--engines N`: the
  server's engine processes (each section's server).
- mixed: concurrency 32, 10% long texts (60+ tokens) and 90% short ones (<= 12 tokens), beam 4:
  the short ones' p50 latency against their latency alone (concurrency 1).
- single: concurrency 1: p50 against the offline engine's single-sentence latency.
- flood: N requests at once, each four of the longest test sentences at beam 5, default settings:
  status counts, how fast refusals come back, what was delivered as 200s against the offline
  engine's capacity for that time, and the worst /health latency meanwhile.
- api: the API processes alone: the engine answers every sentence from its result cache (each was
  translated once before the count, `--workers` 2 or more so that the engine keeps it), so what is
  measured is the HTTP and pipeline work of a request in the API processes, and the engine's own per
  request bookkeeping: requests/s and CPU milliseconds per request of each (read from /proc). On a GPU
  the API processes are what limits the server; this measures their cost on any machine. `--compare
  TREE` serves another checkout in alternating rounds (`--rounds`), to measure a change.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import ROOT, emit, machine, percentile, start_service, table, test_sources
from bench.loadgen import LoadResult, run_load

SOURCE = {"source": "de", "target": "en"}
# the server and the offline engine run the same checkpoint, so the ratios measure the serving alone (the
# whole checkpoints/ directory would route de-en to the multilingual model)
CHECKPOINT = ROOT / "checkpoints" / "de-en"


def start_server(args, *extra: str, port: int | None = None) -> subprocess.Popen:
    device = ["--device", args.device] + (["--dtype", args.dtype] if args.dtype else [])
    threads = args.threads if args.lanes == 1 else 0  # the service's default with its lanes: one thread each
    engines = ["--engines", str(args.engines)] if args.engines != 1 else []  # (a tree from before the setting has none)
    return start_service(port or args.port, CHECKPOINT, [*device, "--threads", str(threads), "--lanes", str(args.lanes),
                                                 "--max-batch-sentences", str(args.batch), *engines, *extra],
                         root=Path(args.tree) if args.tree else ROOT)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=60)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_processes(root: int) -> tuple[list[int], list[int]]:
    """(API processes, engine processes) of the server whose first process is `root`: it and its
    descendants, the engine's by its command line (the others are the API and its helpers)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        children = Path(f"/proc/{pid}/task/{pid}/children")
        todo += [int(c) for c in children.read_text().split()] if children.exists() else []
    engine = [p for p in pids if b"nmt_serve.engine.process" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return [p for p in pids if p not in engine], engine


def engine_counters(port: int) -> dict[str, float]:
    """The engine's counters from /metrics (busy seconds, steps, rows, joins), to difference around a run."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        for name in ("busy_seconds", "step_seconds", "join_seconds", "attention_seconds", "attention_calls", "call_seconds",
                     "result_seconds", "io_seconds", "steps", "rows_live", "rows_computed", "joins", "sentences_joined"):
            if line.startswith(f"nmt_engine_{name}_total "):
                out[name] = float(line.split()[1])
    return out


def engine_shares(d: dict[str, float], elapsed: float) -> str:
    join = d.get("join_seconds", d["busy_seconds"] - d["step_seconds"])  # a revision without the counter: the rest
    return " / ".join(f"{v / elapsed:.2f}" for v in (join, d["step_seconds"], d.get("attention_seconds", 0.0), d["call_seconds"],
                                                   d["result_seconds"], d["io_seconds"]))


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Offline:
    """The offline engine in this process, measured before any server starts (never beside one): translate() in
    batches of --batch, which on CUDA past one batch runs the continuous search the engine runs (earlier runs of
    this benchmark, before that, compared the server with batches one after another: 1.5-1.8x slower there)."""

    def __init__(self, args):
        import torch

        from nmt_serve.inference.translator import Translator

        torch.set_num_threads(args.threads)
        self.translator = Translator.load(CHECKPOINT, device=args.device, dtype=args.dtype)
        self.batch = args.batch

    def rate(self, texts: list[str], beam: int, batch: int | None = None) -> float:
        """Sentences per second, best of two runs after a warm-up (five on a GPU: a run there takes a fraction of
        a second, and the H200's read 7,717-11,940 greedy in three runs of one lease, where the host sets the pace)."""
        batch = batch or self.batch
        self.translator.translate(texts[:batch], beam_size=beam, max_batch_size=batch)
        best = 0.0
        for _ in range(5 if self.translator.device.type == "cuda" else 2):
            started = time.perf_counter()
            self.translator.translate(texts, beam_size=beam, max_batch_size=batch)
            best = max(best, len(texts) / (time.perf_counter() - started))
        return best

    def latency(self, texts: list[str], beam: int) -> float:
        """p50 seconds to translate one sentence alone."""
        self.translator.translate(texts[:4], beam_size=beam)
        seconds = []
        for text in texts:
            started = time.perf_counter()
            self.translator.translate([text], beam_size=beam)
            seconds.append(time.perf_counter() - started)
        return p50(seconds)

    def count(self, text: str) -> int:
        return self.translator.inputs.count(text)


def health_prober(url: str):
    """Probe /health every 50 ms in a thread; returns (stop, latencies)."""
    stop, latencies = threading.Event(), []

    def probe():
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    r.read()
            except OSError:
                pass
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.05)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()

    def finish() -> list[float]:
        stop.set()
        thread.join()
        return latencies

    return finish


def run_replicas(urls: list[str], bodies: list[dict], *, concurrency: int, processes: int) -> LoadResult:
    """The bodies split evenly over the servers at `urls`, each loaded at its share of the concurrency from its
    share of the client processes, all at once; one result: every answer, the longest run's time."""
    if len(urls) == 1:
        return run_load(urls[0], bodies, concurrency=concurrency, processes=processes)
    n = len(urls)
    results: list[LoadResult | None] = [None] * n

    def load(i: int) -> None:
        results[i] = run_load(urls[i], bodies[i::n], concurrency=max(1, concurrency // n), processes=max(1, processes // n))

    threads = [threading.Thread(target=load, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return LoadResult([o for r in results for o in r.outcomes], max(r.elapsed for r in results),
                      sum(r.client_cpu_seconds for r in results))


def throughput(args, offline: Offline) -> str:
    texts = (test_sources("de") * (1 + args.requests // 1000))[:args.requests]
    rates = {beam: offline.rate(texts, beam) for beam in (1, 4)}
    rows = []
    ports = [args.port + i for i in range(args.replicas)]
    for workers in [int(w) for w in args.workers.split(",")]:
        procs = []
        try:
            for port in ports:  # one after another: each plans its memory beside the ones already running
                procs.append(start_server(args, "--workers", str(workers), port=port))
            urls = [f"http://127.0.0.1:{port}/v1/translate" for port in ports]
            label = str(workers) if args.replicas == 1 else f"{workers} x {args.replicas} servers"
            label += "" if args.engines == 1 else f", {args.engines} engines"
            for beam in (1, 4):
                bodies = [{"text": t, "beam_size": beam, **SOURCE} for t in texts]
                run_replicas(urls, bodies[:args.concurrency], concurrency=args.concurrency, processes=args.clients)  # warm-up
                api = [pid for proc in procs for pid in server_processes(proc.pid)[0]]
                before, api_before = [engine_counters(port) for port in ports], sum(map(cpu_seconds, api))
                result = run_replicas(urls, bodies, concurrency=args.concurrency, processes=args.clients)
                after, api_cpu = [engine_counters(port) for port in ports], sum(map(cpu_seconds, api)) - api_before
                d = {k: sum(a[k] - b.get(k, 0.0) for a, b in zip(after, before)) for k in after[0]}
                served = result.throughput()
                # with several servers the engine shares are summed over their engines (each its own loop)
                rows.append([label, "greedy" if beam == 1 else f"beam {beam}", f"{served:.1f}", f"{rates[beam]:.1f}",
                             f"{served / rates[beam]:.2f}", f"{p50(result.latencies()) * 1000:.0f}",
                             f"{percentile(result.latencies(), 99) * 1000:.0f}", result.counts().get(200, 0),
                             f"{1000 * result.client_cpu_seconds / len(bodies):.2f}", f"{1000 * api_cpu / len(bodies):.2f}",
                             f"{d['busy_seconds'] / result.elapsed:.2f}", engine_shares(d, result.elapsed),
                             f"{d['rows_live'] / max(d['steps'], 1):.0f}", f"{1000 * result.elapsed * len(ports) * args.engines / max(d['steps'], 1):.2f}"])
                print(f"  throughput workers={label} beam={beam}: {rows[-1]}", file=sys.stderr)
        finally:
            for proc in procs:
                stop_server(proc)
    return (f"### Server vs offline engine: {len(texts)} sentences, one per request, concurrency {args.concurrency}\n\n"
            f"Machine: {machine()}; {device_line(args)}; {engine_line(args)}, up to {args.batch} "
            f"sentences per batch; {args.clients} client processes.\n\n"
            + table(["API workers", "search", "server req/s", f"offline sent/s (batch {args.batch})", "server / offline", "p50 ms",
                     "p99 ms", "200s", "client CPU ms/request", "API CPU ms/request", "engine busy share", "join / step / attention / calls / results / io", "rows per step", "ms per step"], rows)
            + "\n\nEngine busy share: engine time in joins and steps over the run's time; then the shares of the run's time "
              "the engine spent joining sentences (their encoder), stepping, on attention calls (the `detached` check's "
              "forced decodings; beside the steps, on a thread of their own, where the engine has lanes), taking calls in, making replies and passing them to its I/O thread "
              "(the engine's own counters, from /metrics); rows per step: running rows per decoder step.\n")


def engine_line(args) -> str:
    if args.lanes == 1:
        return f"engine and offline engine with {args.threads} torch thread(s)"
    return f"engine with {args.lanes or 'one per core'} lane(s) of 1 torch thread, offline engine with {args.threads}"


def device_line(args) -> str:
    if args.device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name()}, {args.dtype or 'float16'}"
    return "CPU"


def long_and_short(offline: Offline) -> tuple[list[str], list[str]]:
    sources = test_sources("de")
    short = [t for t in sources if offline.count(t) <= 12]
    long = []
    for i in range(0, len(sources) - 4, 4):  # a few test sentences joined: one long text of 60+ tokens
        text = " ".join(sources[i:i + 4])
        if offline.count(text) >= 60:
            long.append(text)
    return short, long


def mixed(args, offline: Offline) -> str:
    short, long = long_and_short(offline)
    bodies, is_short = [], []
    for i in range(320):
        kind_short = i % 10 != 0
        bodies.append({"text": short[i % len(short)] if kind_short else long[i % len(long)], "beam_size": 4, **SOURCE})
        is_short.append(kind_short)
    proc = start_server(args, "--workers", str(args.mixed_workers))
    try:
        url = f"http://127.0.0.1:{args.port}/v1/translate"
        alone_bodies = [{"text": t, "beam_size": 4, **SOURCE} for t in short[:48]]
        run_load(url, alone_bodies[:8], concurrency=1, processes=1)
        alone = p50(run_load(url, alone_bodies, concurrency=1, processes=1).latencies())
        # the same short requests at the same concurrency without the long ones: what sharing the
        # steps costs by itself (on a CPU a step's time grows with its rows)
        only_short = p50(run_load(url, [b for b, k in zip(bodies, is_short) if k], concurrency=32, processes=args.clients).latencies())
        result = run_load(url, bodies, concurrency=32, processes=args.clients)
    finally:
        stop_server(proc)
    short_lat = result.latencies(indices=[i for i, s in enumerate(is_short) if s])
    long_lat = result.latencies(indices=[i for i, s in enumerate(is_short) if not s])
    row = [f"{alone * 1000:.0f}", f"{p50(short_lat) * 1000:.0f}", f"{p50(short_lat) / alone:.2f}", f"{only_short * 1000:.0f}",
           f"{p50(short_lat) / only_short:.2f}", f"{p50(long_lat) * 1000:.0f}", result.counts().get(200, 0)]
    print(f"  mixed: {row}", file=sys.stderr)
    return ("### Mixed traffic: 10% long (60+ tokens), 90% short (<= 12 tokens), beam 4, concurrency 32, "
            f"{args.mixed_workers} API worker(s)\n\n"
            + table(["short alone p50 ms", "short p50 ms in the mix", "ratio (goal <= 2)", "short only, concurrency 32, p50 ms",
                     "mix / short only", "long p50 ms", "200s of 320"], [row]) + "\n")


def single(args, offline: Offline) -> str:
    texts = test_sources("de")[:64]
    rows = []
    offline_latency = {beam: offline.latency(texts, beam) for beam in (1, 4)}
    proc = start_server(args)
    try:
        url = f"http://127.0.0.1:{args.port}/v1/translate"
        for beam in (1, 4):
            bodies = [{"text": t, "beam_size": beam, **SOURCE} for t in texts]
            run_load(url, bodies[:8], concurrency=1, processes=1)
            result = run_load(url, bodies, concurrency=1, processes=1)
            served = p50(result.latencies())
            rows.append(["greedy" if beam == 1 else f"beam {beam}", f"{offline_latency[beam] * 1000:.1f}", f"{served * 1000:.1f}",
                         f"{served / offline_latency[beam]:.2f}", f"{percentile(result.latencies(), 99) * 1000:.1f}"])
            print(f"  single: {rows[-1]}", file=sys.stderr)
    finally:
        stop_server(proc)
    return ("### Concurrency 1: one sentence at a time\n\n"
            + table(["search", "offline p50 ms", "server p50 ms", "server / offline (goal <= 1.3)", "server p99 ms"], rows) + "\n")


def flood(args, offline: Offline) -> str:
    texts = sorted(test_sources("de"), key=offline.count)[-64:]  # the longest sentences of the set
    bodies = [{"text": [texts[(4 * i + j) % len(texts)] for j in range(4)], "beam_size": args.flood_beam, **SOURCE}
              for i in range(args.flood)]
    offline_rate = offline.rate([t for b in bodies[:32] for t in b["text"]], args.flood_beam)
    rows = []
    for admission in (True, False):
        proc = start_server(args, "--admission", str(admission).lower())
        try:
            url = f"http://127.0.0.1:{args.port}/v1/translate"
            run_load(url, bodies[:1], concurrency=1, processes=1)  # warm-up
            floor = burst_floor(args, len(bodies)) if admission else None
            finish = health_prober(f"http://127.0.0.1:{args.port}/health")
            result = run_load(url, bodies, concurrency=len(bodies), processes=args.clients, mode="burst")
            health = finish()
        finally:
            stop_server(proc)
        counts = result.counts()
        refused = sorted(o.latency for o in result.outcomes if o.status in (429, 503))
        delivered = 4 * counts.get(200, 0)
        rows.append(["on" if admission else "off", counts.get(200, 0), counts.get(503, 0) + counts.get(429, 0), counts.get(504, 0),
                     len(bodies) - sum(counts.get(c, 0) for c in (200, 429, 503, 504)),
                     f"{p50(refused) * 1000:.0f}" if refused else "-", f"{result.elapsed:.1f}",
                     f"{delivered / (offline_rate * result.elapsed):.2f}", f"{max(health) * 1000:.0f}",
                     f"{floor * 1000:.0f}" if floor is not None else "-"])
        print(f"  flood, admission {'on' if admission else 'off'}: {rows[-1]}", file=sys.stderr)
    return (f"### A flood: {args.flood} requests at once, 4 long sentences each, beam {args.flood_beam}, default settings\n\n"
            f"Offline engine on the same sentences (batch {offline.batch}): {offline_rate:.1f} sentences/s.\n\n"
            + table(["admission", "200", "503/429", "504", "other", "median refusal ms", "seconds until the last answer",
                     "delivered / offline capacity for that time", "worst /health ms",
                     "floor: median of as many trivial requests at once, engine busy, ms"], rows)
            + "\n\nThe floor: the same number of requests at once that the server answers without any work (POST /health, "
              "405 from the router), while the engine runs other requests (concurrency 64, beam 4): what a burst of this "
              "size costs the API process and the clients on this machine before any translation work.\n")


def burst_floor(args, n: int) -> float:
    """Median latency of n trivial requests at once (POST /health: 405 from the router, no work),
    with the engine kept busy meanwhile by a closed loop of ordinary requests."""
    base = f"http://127.0.0.1:{args.port}"
    busy = [{"text": t, "beam_size": 4, **SOURCE} for t in test_sources("de")[:400]]
    background = threading.Thread(target=run_load, args=(base + "/v1/translate", busy), kwargs=dict(concurrency=64, processes=1))
    background.start()
    time.sleep(1.0)
    floor = p50(run_load(base + "/health", [{}] * n, concurrency=n, processes=args.clients, mode="burst").latencies(None))
    background.join()
    return floor


def engine(args, offline: Offline) -> str:
    """Without HTTP: the continuous-batching searches fed like the server at this concurrency (a new
    sentence joins as soon as one leaves) against the offline engine's batches: the eager
    ContinuousSearch, and on CUDA also ContinuousDeviceSearch (the one the engine runs there)."""
    import torch

    from nmt_serve.inference import continuous as continuous_search
    from nmt_serve.inference.continuous import ContinuousSearch, Sentence
    from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
    from nmt_serve.inference.device_search import JOIN_TOKENS, DeviceSearch
    from nmt_serve.inference.search import SearchOptions, max_lengths_for
    from nmt_serve.inference.static_decoder import StaticDecoder

    t = offline.translator
    texts = (test_sources("de") * (1 + args.requests // 1000))[:args.requests]
    if args.long_first:
        texts = [" ".join(test_sources("de")[900:900 + args.long_first])] + texts[1:]
    shipped_narrowing = continuous_search.NARROW_SOURCE_AT
    rows = []
    for beam in (1, 4):
        rate = offline.rate(texts, beam)
        want = [r.text for r in t.translate(texts, beam_size=beam, max_batch_size=args.batch)]
        srcs = [t.encode_source(x) for x in texts]
        caps = [int(max_lengths_for(torch.tensor([s]), t.config.pad_id, SearchOptions(beam_size=beam), t.config.max_positions - 1)[0])
                for s in srcs]
        searches = {"eager": lambda: ContinuousSearch(t.runner, beam_size=beam)}
        if args.long_first:
            searches["eager, never narrowed"] = searches["eager"]
        if t.uses_static_decoder:
            group = 1 if args.ungrouped else beam  # the engine's: a sentence's beams share its source's keys and values
            device_search = DeviceSearch(StaticDecoder(t.runner, max_rows=args.concurrency * beam, max_length=t.static_length, group=group))
            device_search.warmup(beam_sizes=(beam,), join_tokens=JOIN_TOKENS)  # as the engine warms up
            searches["device"] = lambda: ContinuousDeviceSearch(device_search, beam_size=beam)
        for kind, make in searches.items():
            continuous_search.NARROW_SOURCE_AT = 0 if kind == "eager, never narrowed" else shipped_narrowing
            for attempt in range(2):  # the first run warms up (allocator, kernels), the second counts
                search = make()
                started, joined, done = time.perf_counter(), 0, {}
                while len(done) < len(srcs):
                    room = min(args.concurrency - len(search), len(srcs) - joined)
                    if room > 0 and search.joinable():  # as the engine joins
                        search.add([Sentence(i, srcs[i], caps[i]) for i in range(joined, joined + room)])
                        joined += room
                    done.update(dict(search.step()))
                continuous = len(srcs) / (time.perf_counter() - started)
            same = sum(t.tgt_tokenizer.decode(done[i][0].tokens) == want[i] for i in range(len(srcs)))
            rows.append(["greedy" if beam == 1 else f"beam {beam}", kind, f"{rate:.1f}", f"{continuous:.1f}",
                         f"{continuous / rate:.2f}", f"{same}/{len(srcs)}"])
            print(f"  engine: {rows[-1]}", file=sys.stderr)
    continuous_search.NARROW_SOURCE_AT = shipped_narrowing
    first = f", the first sentence {args.long_first} test sentences in one" if args.long_first else ""
    return (f"### The engine alone: continuous batching ({args.concurrency} in flight) vs offline batches of {args.batch}, "
            f"no HTTP ({device_line(args)}{first})\n\n"
            + table(["search", "continuous search", "offline sent/s", "continuous sent/s", "continuous / offline",
                     "same translations as offline"], rows) + "\n")


def api(args, offline: Offline) -> str:
    """The API processes' cost per request, the engine answering from its result cache (see the module's
    docstring); with --compare, this checkout and the other in alternating rounds."""
    texts = (test_sources("de") * (1 + args.requests // 1000))[:args.requests]
    workers = max(2, max(int(w) for w in args.workers.split(",")))  # the engine keeps results where there are several
    trees = [("this checkout", Path(args.tree) if args.tree else ROOT)] + ([("compared", Path(args.compare))] if args.compare else [])
    rows = []
    for round_ in range(args.rounds):
        for name, root in trees:
            proc = start_service(args.port, CHECKPOINT, ["--device", args.device, "--workers", str(workers),
                                                         "--translation-cache-entries", str(2 * len(texts))], root=root)
            try:
                url = f"http://127.0.0.1:{args.port}/v1/translate"
                api_pids, engine_pids = server_processes(proc.pid)
                for beam in (1, 4):
                    bodies = [{"text": t, "beam_size": beam, **SOURCE} for t in texts]
                    run_load(url, bodies, concurrency=args.concurrency, processes=args.clients)  # every sentence into the cache
                    api0, engine0 = sum(map(cpu_seconds, api_pids)), sum(map(cpu_seconds, engine_pids))
                    result = run_load(url, bodies, concurrency=args.concurrency, processes=args.clients)
                    api_ms = 1000 * (sum(map(cpu_seconds, api_pids)) - api0) / len(bodies)
                    engine_ms = 1000 * (sum(map(cpu_seconds, engine_pids)) - engine0) / len(bodies)
                    rows.append([round_ + 1, name, "greedy" if beam == 1 else f"beam {beam}", f"{result.throughput():.1f}",
                                 f"{api_ms:.3f}", f"{engine_ms:.3f}", f"{1000 * result.client_cpu_seconds / len(bodies):.3f}",
                                 result.counts().get(200, 0)])
                    print(f"  api: {rows[-1]}", file=sys.stderr)
            finally:
                stop_server(proc)
    return (f"### The API processes alone: {len(texts)} one-sentence requests at concurrency {args.concurrency}, the engine "
            f"answering from its result cache\n\n"
            f"Machine: {machine()}; {workers} API workers; {args.clients} client processes.\n\n"
            + table(["round", "server", "search", "requests/s", "API CPU ms/request", "engine CPU ms/request",
                     "client CPU ms/request", "200s"], rows)
            + "\n\nCPU per request: user + system time of the API processes (the server's process, its workers and "
              "their helpers) and of the engine process over the run, from /proc, over the requests.\n")


SECTIONS = {"engine": engine, "throughput": throughput, "mixed": mixed, "single": single, "flood": flood, "api": api}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default="engine,throughput,mixed,single,flood")
    parser.add_argument("--workers", default="1,2", help="API worker counts to measure throughput with")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the engine's lane (and the offline engine)")
    parser.add_argument("--lanes", type=int, default=1, help="the engine's lanes (1: one loop with --threads threads, as the "
                                                           "offline engine; 0: the service's default, one per core, "
                                                           "one thread each)")
    parser.add_argument("--mixed-workers", type=int, default=1, help="API workers in the mixed-traffic section (on a GPU the "
                        "API is the bottleneck: 4 is the documented setting there)")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--ungrouped", action="store_true", help="engine section: decoders whose rows each hold their own copy "
                        "of the source's keys and values (as the engine's did before its beams shared them)")
    parser.add_argument("--replicas", type=int, default=1, help="throughput section: this many servers (each with its own "
                        "engine) on one device, the load split evenly between them: whether engine loops side by side "
                        "serve more than one (on a GPU, one engine's host work leaves the device idle)")
    parser.add_argument("--engines", type=int, default=1, help="the server's engine processes (--engines): the engine shares "
                        "are then summed over them (each its own loop), the step time is per engine")
    parser.add_argument("--long-first", type=int, default=0, metavar="N",
                        help="engine section: the first sentence is N test sentences joined into one (see above)")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--flood", type=int, default=400)
    parser.add_argument("--flood-beam", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (the engine's and the offline engine's)")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, float16 on CUDA")
    parser.add_argument("--concurrency", type=int, default=64, help="throughput and engine sections (GPU goal: 256)")
    parser.add_argument("--batch", type=int, default=64, help="the offline batch size and the server's max_batch_sentences")
    parser.add_argument("--requests", type=int, default=256, help="sentences in the throughput and engine sections")
    parser.add_argument("--tree", help="serve another checkout's code (a worktree of an older revision), to compare with it")
    parser.add_argument("--compare", help="api section: another checkout served in alternating rounds with this one")
    parser.add_argument("--rounds", type=int, default=1, help="api section: rounds (each serves every tree once)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    offline = Offline(args)
    parts = [f"Machine: {machine()}.\n"]
    for name in args.sections.split(","):
        parts.append(SECTIONS[name](args, offline))
    return emit("\n".join(parts), args.output)


if __name__ == "__main__":
    raise SystemExit(main())
