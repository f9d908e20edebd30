"""The service beside CPU-bound neighbours: how much of its quiet throughput it keeps, and whether it stays up.

    python -m bench.neighbours [--neighbours 0,1,2] [--configs "old:--threads 2 --lanes 1 --engine-nice 10;new:"]

A neighbour is a process spinning on one core (a pure-Python loop: it takes a core's time and no
memory bandwidth), started before the load and stopped after it, at nice 0 like any ordinary process
on a shared node. For each configuration of the server (its flags; "new" is the defaults) and each
number of neighbours, two loads from bench/loadgen.py, the shipped de-en model:
- scoring: one request of 32 test sentences at beam 4 at a time (how an evaluation script calls it),
  for `--rounds` requests;
- traffic: one sentence per request, greedy, at concurrency 16, 256 requests.
Reported: sentences/s, the share of the same configuration's quiet figure, and every answer that was
not 200 (a 503 `engine_unavailable` is a live engine taken for a dead one).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time

from bench.common import ROOT, emit, machine, server_log, start_service, table, test_sources
from bench.loadgen import run_load

CHECKPOINT = ROOT / "checkpoints" / "de-en"
SPIN = "while True: pass"


def loads(port: int, rounds: int) -> dict[str, tuple[float, dict]]:
    """{load: (sentences/s, status counts)}."""
    url = f"http://127.0.0.1:{port}/v1/translate"
    sentences = test_sources("de", 256)
    scoring = [{"text": sentences[i * 32 % 224:][:32], "source": "de", "target": "en", "beam_size": 4} for i in range(rounds)]
    traffic = [{"text": s, "source": "de", "target": "en", "beam_size": 1} for s in sentences]
    out = {}
    for name, bodies, concurrency, per_body in (("scoring", scoring, 1, 32), ("traffic", traffic, 16, 1)):
        result = run_load(url, bodies, concurrency=concurrency, processes=1 if concurrency == 1 else 2, timeout=120)
        out[name] = (result.throughput(200) * per_body, result.counts())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--neighbours", default="0,1,2")
    parser.add_argument("--configs", default="old defaults:--threads 2 --lanes 1 --engine-nice 10 --engine-heartbeat-timeout-s 3;new defaults:",
                        help="name:flags;name:flags ... (flags of python -m nmt_serve.service)")
    parser.add_argument("--rounds", type=int, default=8, help="scoring requests (32 sentences each)")
    parser.add_argument("--port", type=int, default=18777)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.neighbours.split(",")]
    configs = [(c.split(":", 1)[0], shlex.split(c.split(":", 1)[1])) for c in args.configs.split(";") if c]
    rows, errors = [], []
    for name, flags in configs:
        server = start_service(args.port, CHECKPOINT, ["--device", "cpu", *flags], timeout=120)
        try:
            loads(args.port, 1)  # untimed: first requests pay for lazy set-up
            quiet = None
            _, logged = server_log(server)
            for n in counts:
                spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(n)]
                try:
                    time.sleep(1.0)
                    measured = loads(args.port, args.rounds)
                finally:
                    for p in spinners:
                        p.kill()
                        p.wait()
                text, logged = server_log(server, logged)
                if any(status != 200 for _, statuses in measured.values() for status in statuses):
                    # why, from the server's own log, beside the report (an answer that is not 200 is a finding)
                    errors.append(f"{name}, {n} neighbours, the server's log:\n{text[-4000:] or '(nothing logged)'}")
                quiet = quiet or measured
                for load, (rate, statuses) in measured.items():
                    rows.append([name, n, load, rate, f"{rate / quiet[load][0]:.2f}",
                                 ", ".join(f"{k}: {v}" for k, v in statuses.items())])
                print(f"  {name}, {n} neighbours: " + ", ".join(f"{k} {v[0]:.1f}/s {v[1]}" for k, v in measured.items()), file=sys.stderr)
        finally:
            server.terminate()
            server.wait(30)
    report = (f"Machine: {machine()}, {os.cpu_count()} CPUs; neighbours spin one core each at nice 0.\n\n"
              + "\n".join(f"- {name}: `{' '.join(flags) or '(no flags)'}`" for name, flags in configs) + "\n\n")
    report += table(["server", "neighbours", "load", "sentences/s", "of quiet", "answers"], rows)
    if errors:
        report += "\n" + "\n\n".join(f"```\n{e}\n```" for e in errors) + "\n"
    return emit(report + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
