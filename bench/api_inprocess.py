"""The API's own cost per request, without HTTP: the app driven through ASGI in one process.

    python -m bench.api_inprocess [--compare TREE] [--rounds 3] [--callgrind]

A child process builds the app (create_app, its lifespan starting a real engine process) and sends it
one-sentence POST /v1/translate requests as ASGI calls, `--concurrency` at a time, from its own event
loop (uvloop, as uvicorn runs it). Every sentence goes through once before the count, so that the
engine answers from its translation cache and the count measures the API process: its routing,
middleware, validation, pipeline, engine client and response, and nothing of uvicorn's HTTP parsing or
the sockets. Two kinds of call:
- engine: the engine keeps the translations (two workers' setting), so each request makes a round trip
  to it;
- api cache: the API process keeps them itself (one worker's setting): no round trip.

Reported per request: the main thread's CPU time (user + system), the engine process's, and with
`--callgrind` the instructions the API process ran (valgrind's callgrind, counting from the first
request of the count to the last: deterministic to a few percent, where CPU time on a shared 2-core VM
moves by 10-30% from run to run). `--compare TREE` runs another checkout's code in alternating rounds
(a worktree of an older revision) to measure a change.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "de-en"


def child(tree: str, mode: str, requests: int, concurrency: int) -> None:
    """In the child: the app of `tree`, driven through ASGI; prints one JSON line."""
    sys.path.insert(0, tree)
    import asyncio
    import resource
    import time

    import uvloop

    from nmt_serve.service.app import create_app
    from nmt_serve.service.settings import Settings

    # the test sentences read here: bench.common would import torch, which the API process never does
    data = Path(os.environ.get("NMT_DATA", ROOT.parent / "shared" / "data" / "multi30k")) / "test_2016_flickr.de.gz"
    with gzip.open(data, "rt", encoding="utf-8") as f:
        sentences = [line.strip() for line in f if line.strip()]
    texts = (sentences * (1 + requests // len(sentences)))[:requests]
    app = create_app(Settings(models_dir=str(CHECKPOINT), device="cpu", translation_cache_entries=2 * len(texts),
                              workers=2 if mode == "engine" else 1, language_detection=False))

    async def request(body: dict) -> int:
        raw = json.dumps(body).encode()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/v1/translate", "raw_path": b"/v1/translate", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                             (b"content-length", str(len(raw)).encode())],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000), "app": app}
        answered, gone, sent = asyncio.Event(), [False], []

        async def receive():
            if not gone[0]:
                gone[0] = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await answered.wait()  # the client stays until its answer is in, as a real one does
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        await app(scope, receive, send)
        answered.set()
        return sent[0]["status"]

    async def run(bodies: list[dict]) -> list[int]:
        pending, statuses = iter(bodies), []

        async def client():
            for body in pending:
                statuses.append(await request(body))

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return statuses

    def engine_cpu() -> float:
        total = 0.0
        for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total

    async def main():
        async with app.router.lifespan_context(app):
            state = app.state.service
            while not state.models:
                await asyncio.sleep(0.1)
            bodies = [{"text": t, "beam_size": 1, "source": "de", "target": "en"} for t in texts]
            await run(bodies)  # every sentence into the cache
            engine0, usage0, started = engine_cpu(), resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            os.getloadavg()  # callgrind starts counting here (--zero-before=os_getloadavg)
            statuses = await run(bodies)
            os.times()  # and stops here (--dump-before=os_times)
            elapsed, usage1 = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_THREAD)
            cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
            print(json.dumps({"requests_per_s": len(bodies) / elapsed, "api_ms": 1000 * cpu / len(bodies),
                              "engine_ms": 1000 * (engine_cpu() - engine0) / len(bodies),
                              "ok": sum(s == 200 for s in statuses), "requests": len(bodies)}), flush=True)

    uvloop.run(main())


def measure(tree: Path, mode: str, args, out_dir: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--mode", mode,
               "--requests", str(args.requests), "--concurrency", str(args.concurrency)]
    from bench.common import run_counted  # the parent only: bench.common imports torch

    return run_counted(command, tree, args.callgrind, out_dir, "requests")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="engine,api cache", help="engine | api cache, comma-separated")
    parser.add_argument("--requests", type=int, default=2000, help="requests counted (300 is plenty with --callgrind)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare", help="another checkout, run in alternating rounds with this one")
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind (50x slower)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.mode, args.requests, args.concurrency)
        return 0
    import tempfile

    from bench.common import emit, machine, table

    trees = [("this checkout", ROOT)] + ([("compared", Path(args.compare).resolve())] if args.compare else [])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for mode in args.mode.split(","):
                for name, tree in trees:
                    r = measure(tree, mode, args, Path(scratch))
                    rows.append([round_ + 1, name, mode, f"{r['requests_per_s']:.0f}", f"{r['api_ms']:.3f}", f"{r['engine_ms']:.3f}",
                                 f"{r['instructions'] / 1e6:.2f}" if "instructions" in r else "", f"{r['ok']}/{r['requests']}"])
                    print(f"  {rows[-1]}", file=sys.stderr)
    report = (f"### The API in one process, through ASGI: {args.requests} one-sentence requests at concurrency {args.concurrency}\n\n"
              f"Machine: {machine()}{'; under callgrind' if args.callgrind else ''}.\n\n"
              + table(["round", "code", "calls", "requests/s", "API CPU ms/request", "engine CPU ms/request",
                       "API instructions/request (M)", "200s"], rows) + "\n")
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
