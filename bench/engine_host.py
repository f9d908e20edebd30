"""The engine process's host work per sentence, with a device that takes no time.

    python -m bench.engine_host [--compare TREE] [--rounds 3] [--callgrind]

On a GPU the engine's main loop spends most of a greedy step's wall time on the host: taking calls in,
preparing joins, reading back which sentences finished, making replies (BENCHMARKS.md, "The server on
the H200": 1.39 ms a step for 0.36 ms of GPU). That work is Python and small torch calls, the same on
any machine, so it can be measured here: a child process drives the EngineCore of `tree` in one process
as the engine process does (each call unpickled and screened as on the I/O thread, handled, the core's
work run until every call is answered, each reply pickled), one-sentence greedy calls of the test
sentences `--concurrency` at a time, over the device search (the continuous search over the static
decoder, the GPU's path, run op by op on this CPU).

The device's share is taken out: the step and join programs are replaced by stand-ins of a few tensor
operations each (a replayed CUDA graph is one launch), in which every sentence runs as many steps as its
source has tokens. What is counted is everything else: screening, queues, the joins' tables, the
searches' bookkeeping, reads of which sentences finished, collecting their hypotheses, detokenizing,
replies. Reported per sentence: CPU time, and with `--callgrind` the instructions (valgrind's callgrind,
from the first call counted to the last: deterministic to a few percent, where CPU time on a shared VM
moves by 10-30%). `--compare TREE` runs another checkout's code in alternating rounds.
"""
from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "de-en"


def instant_device() -> None:
    """Replace the device search's step and join programs by stand-ins: a joining sentence's rows start at
    position 0 with its source length as the steps it runs (kept in min_len, which the stand-in step reads
    instead of choosing tokens); a step writes one token for every row, moves the live rows on and ends
    the rows that reached their length. Greedy search only (rows are groups)."""
    from nmt_serve.inference import device_search

    def program(self, K, G, L, terms=None, attention=False):
        dec, slots = self.decoder, self.slots(K)

        def step():
            pos, alive = dec.pos[:G], slots.alive[:G]
            slots.history[dec.rows[:G], pos] = 7
            pos.add_(alive)
            alive.logical_and_(pos < slots.min_len[:G])
        return ("instant", K, G, L), step

    def join_program(self, K, n, W, min_length):
        dec, slots, table = self.decoder, self.slots(K), self.join_tables.table(n, W)

        def join():
            info = table[:, :device_search.JOIN_INFO]
            groups = info[:, 0]
            dec.pos.index_fill_(0, groups, 0)
            slots.min_len[groups] = info[:, 1]
            slots.score.index_fill_(0, groups, 0.0)
            slots.alive.index_fill_(0, groups, True)
        return ("instant-join", K, n, W), join

    device_search.DeviceSearch.program = program
    device_search.DeviceSearch.join_program = join_program


def child(tree: str, requests: int, concurrency: int, cache: int, freeze: bool) -> None:
    """In the child: the engine core of `tree`, driven in one process; prints one JSON line."""
    sys.path.insert(0, tree)
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    instant_device()
    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import DecodeOptions, Translate, dumps, loads
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(CHECKPOINT, device="cpu", step_mode="static", static_rows=256, static_length=128, warmup=False)
    data = Path(os.environ.get("NMT_DATA", ROOT.parent / "shared" / "data" / "multi30k")) / "test_2016_flickr.de.gz"
    with gzip.open(data, "rt", encoding="utf-8") as f:
        ids = [translator.src_tokenizer.encode(line.strip()) for line in f if line.strip()]
    core = EngineCore({"de-en": translator}, EngineConfig(admission=False, translation_cache_entries=cache))
    deadline = time.monotonic() + 3600

    def calls(first: int) -> list[bytes]:
        """`requests` one-sentence calls as the API sends them (pickled); with a cache, each source a new one
        (a test sentence and one more token), so that the cache keeps every sentence."""
        def source(i: int) -> list[int]:
            return ids[i % len(ids)] + ([4 + (first + i) // len(ids)] if cache else [])
        return [dumps(Translate(f"{first + i}", "de-en", [source(i)], DecodeOptions(beam_size=1), deadline)) for i in range(requests)]

    def drive(calls: list[bytes]) -> tuple[int, int]:
        """The calls through the core, at most `concurrency` unanswered; (sentences, reply bytes)."""
        sent = answered = size = 0
        while answered < requests:
            while sent < requests and sent - answered < concurrency:
                message = loads(calls[sent])
                sent += 1
                replies = core.screen(message) or core.handle(message)
                for reply in replies:
                    size += len(dumps(reply))
                    answered += 1
            for reply in core.work():
                assert reply.error is None, reply.message
                size += len(dumps(reply))
                answered += 1
        return answered, size

    if freeze:  # what the engine process does once it is ready (its programs run, before any call)
        from nmt_serve.garbage_collection import freeze_startup_heap

        freeze_startup_heap()
    drive(calls(0))  # the programs' first runs, the sentences' first trip
    counted = calls(requests)
    pauses: list[tuple[int, float]] = []  # (generation, seconds) of each collection in the counted pass
    began = [0.0]

    def clock(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0]))
    gc.callbacks.append(clock)
    usage0, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    os.getloadavg()  # callgrind starts counting here (--zero-before=os_getloadavg)
    answered, size = drive(counted)
    os.times()  # and stops here (--dump-before=os_times)
    gc.callbacks.remove(clock)
    elapsed, usage1 = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    print(json.dumps({"sentences": answered, "us": 1e6 * cpu / answered, "sentences_per_s": answered / elapsed,
                      "steps": core.stats["steps"], "reply_bytes": size / answered,
                      "gc_ms": 1e3 * sum(p for _, p in pauses), "gc_max_ms": 1e3 * max((p for _, p in pauses), default=0.0),
                      "full_collections": sum(g == 2 for g, _ in pauses)}), flush=True)


def measure(tree: Path, args, out_dir: Path) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree),
               "--requests", str(args.requests), "--concurrency", str(args.concurrency), "--cache", str(args.cache), *(["--no-freeze"] if args.no_freeze else [])]
    from bench.common import run_counted  # the parent only: bench.common imports torch

    return run_counted(command, tree, args.callgrind, out_dir, "sentences")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=4000, help="calls counted, one sentence each (1000 is plenty with --callgrind)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--cache", type=int, default=0, help="the engine's translation cache entries (several API workers' "
                                                             "setting; each call's source then a new one)")
    parser.add_argument("--no-freeze", action="store_true", help="leave the start-up heap in the garbage collector's reach "
                                                                 "(the engine process freezes it once ready: garbage_collection.py)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--compare", help="another checkout, run in alternating rounds with this one")
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind (50x slower)")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.requests, args.concurrency, args.cache, not args.no_freeze)
        return 0
    import tempfile

    from bench.common import emit, machine, table

    trees = [("this checkout", ROOT)] + ([("compared", Path(args.compare).resolve())] if args.compare else [])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, tree in trees:
                r = measure(tree, args, Path(scratch))
                rows.append([round_ + 1, name, f"{r['us']:.1f}", f"{r['instructions'] / 1e3:.0f}" if "instructions" in r else "",
                             f"{r['gc_ms']:.0f}", f"{r['gc_max_ms']:.1f}", r["full_collections"], f"{r['steps']:.0f}", f"{r['sentences']}"])
                print(f"  {rows[-1]}", file=sys.stderr)
    report = (f"### The engine's host work: {args.requests} one-sentence greedy calls at concurrency {args.concurrency}, "
              f"an instant device{f', a cache of {args.cache}' if args.cache else ''}"
              f"{', the start-up heap left to the collector' if args.no_freeze else ''}\n\n"
              f"Machine: {machine()}{'; under callgrind' if args.callgrind else ''}.\n\n"
              + table(["round", "code", "CPU us/sentence", "instructions/sentence (k)", "garbage collection ms", "longest collection ms",
                       "full collections", "steps (both passes)", "sentences"], rows) + "\n")
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
