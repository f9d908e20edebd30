"""The server under load on loopback: throughput and p50/p95/p99 latency at several concurrency
levels, with cross-request batching on and off. Bounded: a fixed number of requests per level.

    python -m bench.server_load [--concurrency 1,8,32,64] [--requests-per-client 4]
    python -m bench.server_load --flood 400 [--flood-beam 5]

--flood N sends N requests at once, each four of the longest test sentences at beam 5, to a server
with default settings, with admission by predicted work on and off: status counts, how fast refusals
come back, what was delivered as 200s against the offline engine's capacity for the same time, and
the worst /health latency meanwhile.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench.common import emit, ROOT, machine, table, test_sources


def start_server(port: int, batching: bool, threads: int, *extra: str) -> subprocess.Popen:
    log = tempfile.TemporaryFile()
    args = list(extra) or ["--max-queue-sentences", "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--port", str(port), "--models-dir", str(ROOT / "checkpoints"), "--device", "cpu",
         "--batching", str(batching).lower(), "--threads", str(threads), "--log-level", "warning", *args],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def one_request(port: int, text: str, beam: int) -> float:
    body = json.dumps({"text": text, "source": "de", "target": "en", "beam_size": beam}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/translate", data=body, headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as r:
        r.read()
    return time.perf_counter() - t0


def post(port: int, body: dict, timeout: float = 120) -> tuple[int, float]:
    """(status, seconds) of one POST /v1/translate; errors are statuses too."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/translate", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    return status, time.perf_counter() - t0


def flood(args) -> str:
    """N heavy requests at once, admission on and off; the offline engine's rate on the same work."""
    import threading

    import torch

    from model.translator import Translator

    translator = Translator.load(ROOT / "checkpoints" / "de-en", device="cpu")
    texts = sorted(test_sources("de"), key=translator.count_tokens)[-64:]  # the longest sentences of the set
    bodies = [{"text": [texts[(4 * i + j) % len(texts)] for j in range(4)], "beam_size": args.flood_beam} for i in range(args.flood)]
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    translator.translate([t for b in bodies[:32] for t in b["text"]], beam_size=args.flood_beam, max_batch_size=64)
    offline_rate = 128 / (time.perf_counter() - started)  # sentences/s
    del translator
    rows = []
    for admission in (True, False):
        proc = start_server(args.port, True, args.threads, "--admission", str(admission).lower())
        try:
            post(args.port, bodies[0])  # warm-up
            health: list[float] = []
            stop = threading.Event()

            def probe():
                while not stop.is_set():
                    t0 = time.perf_counter()
                    with urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=30) as r:
                        r.read()
                    health.append(time.perf_counter() - t0)
                    time.sleep(0.05)

            prober = threading.Thread(target=probe)
            prober.start()
            started = time.perf_counter()
            with ThreadPoolExecutor(len(bodies)) as pool:
                results = list(pool.map(lambda b: post(args.port, b), bodies))
            elapsed = time.perf_counter() - started
            stop.set()
            prober.join()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        statuses = [s for s, _ in results]
        refused = sorted(t for s, t in results if s in (429, 503))
        delivered = 4 * statuses.count(200)
        rows.append(["on" if admission else "off", statuses.count(200), statuses.count(503) + statuses.count(429), statuses.count(504),
                     len(results) - sum(statuses.count(c) for c in (200, 429, 503, 504)),
                     f"{statistics.median(refused) * 1000:.0f}" if refused else "-", f"{elapsed:.1f}",
                     f"{delivered / (offline_rate * elapsed):.2f}", f"{max(health) * 1000:.0f}"])
        print(f"  flood, admission {'on' if admission else 'off'}: {rows[-1]}", file=sys.stderr)
    return (f"### A flood: {args.flood} requests at once, 4 long sentences each, beam {args.flood_beam}, default settings\n\n"
            f"Machine: {machine()}; server with {args.threads} torch thread(s); offline engine on the same sentences "
            f"(batch 64): {offline_rate:.1f} sentences/s.\n\n"
            + table(["admission", "200", "503/429", "504", "other", "median refusal ms", "seconds until the last answer",
                     "delivered / offline capacity for that time", "worst /health ms"], rows) + "\n")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--min-requests", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--flood", type=int, default=0, help="send this many heavy requests at once instead (see above)")
    parser.add_argument("--flood-beam", type=int, default=5)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.flood:
        return emit(flood(args), args.output)
    texts = test_sources("de")
    rows = []
    for batching in (True, False):
        proc = start_server(args.port, batching, args.threads)
        try:
            one_request(args.port, texts[0], args.beam_size)  # warm-up
            for c in [int(x) for x in args.concurrency.split(",")]:
                n = max(args.min_requests, c * args.requests_per_client)
                started = time.perf_counter()
                with ThreadPoolExecutor(c) as pool:
                    latencies = list(pool.map(lambda i: one_request(args.port, texts[i % len(texts)], args.beam_size), range(n)))
                elapsed = time.perf_counter() - started
                rows.append(["on" if batching else "off", c, n, n / elapsed, percentile(latencies, 50) * 1000,
                             percentile(latencies, 95) * 1000, percentile(latencies, 99) * 1000])
                print(f"  batching {'on' if batching else 'off'} c={c}: {n / elapsed:.1f} req/s, p50 {statistics.median(latencies) * 1000:.0f} ms", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    report = (f"### The server under load (loopback, one sentence per request, beam {args.beam_size})\n\n"
              f"Machine: {machine()}; server with {args.threads} torch thread(s).\n\n"
              + table(["batching", "concurrency", "requests", "requests/s", "p50 ms", "p95 ms", "p99 ms"], rows) + "\n")
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
