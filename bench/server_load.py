"""The server under load on loopback: throughput and p50/p95/p99 latency at several concurrency
levels, with cross-request batching on and off. Bounded: a fixed number of requests per level.

    python -m bench.server_load [--concurrency 1,8,32,64] [--requests-per-client 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from bench.common import emit, ROOT, machine, table, test_sources


def start_server(port: int, batching: bool, threads: int) -> subprocess.Popen:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "--port", str(port), "--models-dir", str(ROOT / "checkpoints"), "--device", "cpu",
         "--batching", str(batching).lower(), "--threads", str(threads), "--max-queue-sentences", "100000", "--log-level", "warning"],
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
    parser.add_argument("--output")
    args = parser.parse_args(argv)
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
