"""A large job against the server on the shipped CPU model: its progress and throughput, and what it costs
interactive requests meanwhile.

    python -m bench.jobs [--texts 20000] [--requests 60] [--kill-engine-at 0.5]

1. idle: `--requests` single-sentence /v1/translate requests, one at a time (test sentences, beam 4): p50, p90;
2. a job of `--texts` short sentences (Multi30k train, German), default options, polled every 50 ms
   from another thread: the longest wait between two increments of `done` and between two `updated_at`s;
3. while the job runs, the same interactive requests again;
4. optionally the engine is killed (SIGKILL) when the job is that far through: the job must still end
   done, with every text translated;
then the job's throughput, start to end.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench.common import DATA, ROOT, emit, machine, start_service, table, test_sources

CHECKPOINT = ROOT / "checkpoints" / "de-en"


def call(url: str, body: dict | None = None, method: str | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())


def interactive(base: str, sentences: list[str]) -> list[float]:
    latencies = []
    for sentence in sentences:
        started = time.perf_counter()
        call(base + "/v1/translate", {"text": sentence, "source": "de", "target": "en"})
        latencies.append(time.perf_counter() - started)
    return latencies


def engine_pid(server: int) -> int:
    """The engine process the server (its pid) started."""
    for entry in os.listdir("/proc"):
        try:
            if b"nmt_serve.engine.process" in Path(f"/proc/{entry}/cmdline").read_bytes() and \
                    int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == server:
                return int(entry)
        except (OSError, ValueError, IndexError):
            continue
    raise RuntimeError("no engine process found")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--job-beam", type=int, default=4, help="the job's beam size (interactive requests: 4)")
    parser.add_argument("--kill-engine-at", type=float, default=None, help="share of the job done at which the engine is killed")
    parser.add_argument("--flags", default="", help="more server flags, space-separated")
    parser.add_argument("--output")
    args = parser.parse_args()

    from nmt_serve.training.data import read_lines

    texts = read_lines(DATA / "train.de.gz")[: args.texts]
    probes = test_sources("de", args.requests)
    jobs_dir = tempfile.mkdtemp(prefix="bench-jobs-")
    proc = start_service(args.port, CHECKPOINT, ["--device", "cpu", "--jobs-dir", jobs_dir, *args.flags.split()])
    base = f"http://127.0.0.1:{args.port}"
    try:
        interactive(base, probes[:5])  # warm-up
        idle = interactive(base, probes)
        created = call(base + "/v1/jobs", {"q": texts, "source": "de", "target": "en", "beam_size": args.job_beam})
        job = created["id"]
        polls: list[tuple[float, dict]] = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                status = call(f"{base}/v1/jobs/{job}")
                polls.append((time.monotonic(), status))
                if status["state"] in ("done", "failed", "cancelled"):
                    return
                time.sleep(0.05)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        while not polls or polls[-1][1]["state"] != "running":
            time.sleep(0.05)
        while polls[-1][1]["done"] == 0:  # the first chunk is in: the job is in full flow
            time.sleep(0.05)
        during = interactive(base, probes)
        killed = False
        killed_at = None
        while poller.is_alive():
            if args.kill_engine_at is not None and not killed and polls[-1][1]["done"] >= args.kill_engine_at * len(texts):
                os.kill(engine_pid(proc.pid), signal.SIGKILL)
                killed, killed_at = True, time.monotonic()
            time.sleep(0.05)
        stop.set()
        final = polls[-1][1]
        result = call(f"{base}/v1/jobs/{job}/result") if final["state"] == "done" else {"translations": []}
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    running = [(t, s) for t, s in polls if s["state"] == "running"]
    gap_done = gap_updated = recovery = 0.0
    last_done = last_updated = None
    for t, s in running:
        if last_done is None or s["done"] != last_done[1]:
            if last_done and killed_at is not None and last_done[0] <= killed_at <= t:
                recovery = t - killed_at  # the engine's restart: counted apart
            elif last_done:
                gap_done = max(gap_done, t - last_done[0])
            last_done = (t, s["done"])
        if last_updated is None or s["updated_at"] != last_updated[1]:
            gap_updated = max(gap_updated, t - last_updated[0]) if last_updated else 0.0
            last_updated = (t, s["updated_at"])
    seconds = final["finished_at"] - final["started_at"] if final.get("finished_at") else float("nan")
    p = lambda xs, q: 1000 * statistics.quantiles(xs, n=100)[q - 1]
    report = "\n".join([
        f"# A {len(texts)}-text job (beam {args.job_beam}) on the shipped de-en model (CPU), {machine()}",
        "",
        table(["interactive /v1/translate (one sentence, beam 4)", "p50 ms", "p90 ms"],
              [["idle", p(idle, 50), p(idle, 90)], ["during the job", p(during, 50), p(during, 90)]]),
        "",
        table(["job", "value"], [
            ["state", final["state"]],
            ["texts translated (result)", len(result["translations"])],
            ["sentences", final["sentences_done"]],
            ["start to end (s)", seconds],
            ["texts/s", len(texts) / seconds if final.get("finished_at") else float("nan")],
            ["longest wait between progress increments (s), the engine's restart apart", gap_done],
            ["from the kill to the next progress (s)", recovery if killed else "-"],
            ["longest wait between record updates (s)", gap_updated],
            ["engine killed at", f"{args.kill_engine_at:.0%} done" if killed else "no"],
        ]),
        "",
        f"p50 during / idle: {statistics.median(during) / statistics.median(idle):.2f}x",
    ])
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
