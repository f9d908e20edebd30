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
source has tokens, and rows moving to the front of a shrinking bucket copy one cache position each (the
same calls, no volume). What is counted is everything else: screening, queues, the joins' tables, the
searches' bookkeeping, reads of which sentences finished, collecting their hypotheses, detokenizing,
replies. Reported per sentence: CPU time, and with `--callgrind` the instructions (valgrind's callgrind,
from the first call counted to the last: deterministic to a few percent, where CPU time on a shared VM
moves by 10-30%). `--compare TREE` (repeatable) runs other checkouts' code in alternating rounds.

`--offline BATCH` measures the offline search instead, what `bench.gpu`'s throughput rows time on a GPU (greedy
batch 2,048 24-28% busy on the H200: the host sets its pace): `Translator.generate` over batches of BATCH test
sentences in their natural order, each padded as there, with the same stand-in steps and the encoder replaced
by a stand-in that only loads the sources' lengths. Counted: padding, the search's set-up, checks, rows leaving,
collecting the hypotheses. Reported per sentence as above.

`--process` measures the engine process itself instead: `process.run` with the same stand-in programs, its
I/O thread, queues and ZeroMQ sockets, called by the API's own client (`EngineConnection`, in a second
process, `--concurrency` calls in flight). Reported per sentence: the engine process's CPU time (all its
threads, ZeroMQ's included), the calling process's, and with `--callgrind` the engine process's instructions
from the first counted call's arrival to the last's.
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


def instant_device(lookahead: str = "auto") -> None:
    """Replace the device search's step and join programs by stand-ins: a joining sentence's rows start at
    position 0 with its source length as the steps it runs (kept in src_len, which the stand-in step reads
    instead of choosing tokens); a step writes one token for every row, moves the live rows on and ends
    the rows that reached their length. The encoder of an offline search is replaced by a stand-in that
    loads the sources' lengths and starts every row. Greedy search only (rows are groups). Rows moved to the front of
    a shrinking bucket are copied as they are, but one cache position of each. lookahead: on | off: the
    device searches take their reads in a step later or at once (DeviceSearch's lookahead), whatever the
    device; auto: its default (on CUDA)."""
    import inspect

    from nmt_serve.inference import device_search, static_decoder

    if lookahead != "auto":
        init = device_search.DeviceSearch.__init__
        if "lookahead" not in inspect.signature(init).parameters:
            raise SystemExit(f"--lookahead {lookahead}: this tree's device search has no lookahead")
        device_search.DeviceSearch.__init__ = lambda self, *a, **k: init(self, *a, **{**k, "lookahead": lookahead == "on"})

    def program(self, K, G, L, terms=None, attention=False):
        dec, slots = self.decoder, self.slots(K)

        def step():
            pos, alive = dec.pos[:G], slots.alive[:G]
            slots.history[dec.rows[:G], pos] = 7
            pos.add_(alive)
            alive.logical_and_(pos < dec.src_len[:G])
        return ("instant", K, G, L), step

    def join_program(self, K, n, W, min_length):
        dec, slots, table = self.decoder, self.slots(K), self.join_tables.table(n, W)

        def join():
            info = table[:, :device_search.JOIN_INFO]
            groups = info[:, 0]
            dec.pos.index_fill_(0, groups, 0)
            dec.src_len[groups] = info[:, 1]
            slots.score.index_fill_(0, groups, 0.0)
            slots.alive.index_fill_(0, groups, True)
        return ("instant-join", K, n, W), join

    device_search.DeviceSearch.program = program
    device_search.DeviceSearch.join_program = join_program
    def load_sources(self, src, repeat=1, bucket_rows=None):
        B, S = src.shape
        n = B * repeat
        self.src_len[:n] = (src != self.config.pad_id).sum(1).repeat_interleave(repeat)
        end = max(n, bucket_rows or n)
        self.pos[:end] = 0
        self.tokens[:end] = self.config.decoder_start_id
        self.src_len[n:end] = 1
        return n

    static_decoder.StaticDecoder.load_sources = load_sources
    # rows leaving a shrinking bucket: the same copies, of one cache position (a GPU's copy is launched, not waited for)
    keep_rows = static_decoder.StaticDecoder.keep_rows
    static_decoder.StaticDecoder.keep_rows = lambda self, rows, positions=None: keep_rows(self, rows, 1)


def child(tree: str, requests: int, concurrency: int, cache: int, freeze: bool, device: str = "cpu", lookahead: str = "auto") -> None:
    """In the child: the engine core of `tree`, driven in one process; prints one JSON line."""
    sys.path.insert(0, tree)
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    instant_device(lookahead)
    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import DecodeOptions, Translate, dumps, loads
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(CHECKPOINT, device=device, step_mode="static", static_rows=256, static_length=128, warmup=False)
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


def offline_child(tree: str, batch: int, batches: int, device: str = "cpu", lookahead: str = "auto") -> None:
    """In the child: `Translator.generate` of `tree` over `batches` padded batches of `batch` test sentences (natural
    order, as bench.gpu's throughput rows); prints one JSON line."""
    sys.path.insert(0, tree)
    import resource
    import time

    import torch

    torch.set_num_threads(1)
    instant_device(lookahead)
    from nmt_serve.inference.search import SearchOptions
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(CHECKPOINT, device=device, step_mode="static", static_rows=batch, static_length=128, warmup=False)
    data = Path(os.environ.get("NMT_DATA", ROOT.parent / "shared" / "data" / "multi30k")) / "test_2016_flickr.de.gz"
    with gzip.open(data, "rt", encoding="utf-8") as f:
        ids = [translator.encode_source(line.strip()) for line in f if line.strip()]
    work = [[ids[(b * batch + j) % len(ids)] for j in range(batch)] for b in range(batches)]
    options = SearchOptions(beam_size=1)

    def run() -> int:
        tokens = 0
        for sources in work:
            for hyps in translator.generate(translator._pad(sources), options):
                tokens += len(hyps[0].tokens)
        return tokens

    run()  # the programs' first runs
    from nmt_serve.garbage_collection import freeze_startup_heap

    freeze_startup_heap()
    usage0, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    os.getloadavg()  # callgrind starts counting here (--zero-before=os_getloadavg)
    tokens = run()
    os.times()  # and stops here (--dump-before=os_times)
    elapsed, usage1 = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage1.ru_utime + usage1.ru_stime - usage0.ru_utime - usage0.ru_stime
    sentences = batch * batches
    print(json.dumps({"sentences": sentences, "us": 1e6 * cpu / sentences, "sentences_per_s": sentences / elapsed,
                      "tokens": tokens / sentences}), flush=True)


def engine_child(tree: str, socket_dir: str, models_dir: str, supervisor: int, device: str = "cpu", lookahead: str = "auto") -> int:
    """In the engine's child: the engine process of `tree` (process.run) over the stand-in programs; the calls
    with ids "mark-start" and "mark-end" bound what callgrind counts."""
    sys.path.insert(0, tree)
    import logging

    instant_device(lookahead)
    from nmt_serve.engine import core as engine_core
    from nmt_serve.engine import process

    handle = engine_core.EngineCore.handle

    def marked(self, message):
        if message.id == "mark-start":
            os.getloadavg()  # callgrind starts counting here
        elif message.id == "mark-end":
            os.times()  # and stops here
        return handle(self, message)
    engine_core.EngineCore.handle = marked
    engine_core.EngineCore.warmup = lambda self: 0  # the stand-ins: captured (on CUDA) at their first runs, in the warm pass
    logging.basicConfig(level="WARNING")
    return process.run(dict(models_dir=models_dir, device=device, threads=1, step_mode="static", admission=False,
                            socket_dir=socket_dir, supervisor_pid=supervisor))


def client_child(tree: str, socket_dir: str, engine_pid: int, ids_file: str, requests: int, concurrency: int) -> None:
    """In the calling child: the API's engine client of `tree` drives the engine process; prints one JSON line."""
    sys.path.insert(0, tree)
    import asyncio
    import time

    from nmt_serve.engine.process import addresses
    from nmt_serve.engine.protocol import DecodeOptions, Translate
    from nmt_serve.service.engine_connection import EngineConnection

    ids = json.loads(Path(ids_file).read_text())
    tick = os.sysconf("SC_CLK_TCK")

    def cpu_of(stat: str) -> float:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def engine_cpu() -> tuple[float, float]:
        """The engine process's CPU time: all its threads (ZeroMQ's included), and its main thread's (the loop
        that steps: on a host with cores to spare, the other threads' work runs beside it)."""
        return cpu_of(f"/proc/{engine_pid}/stat"), cpu_of(f"/proc/{engine_pid}/task/{engine_pid}/stat")

    async def drive() -> dict:
        connection = EngineConnection(*addresses(socket_dir), heartbeat_timeout_s=36000)
        await connection.start()
        waited = time.monotonic()
        while not connection.ready:
            status = connection.status
            if status is not None and status.load_error:
                raise RuntimeError(f"the engine could not load: {status.load_error}")
            gone = Path(f"/proc/{engine_pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
            if gone or time.monotonic() - waited > 3600:
                raise RuntimeError("the engine exited before it was ready" if gone else "the engine did not get ready")
            await asyncio.sleep(0.1)
        deadline = time.monotonic() + 36000

        async def one(call_id: str, i: int) -> None:
            reply = await connection.call(Translate(call_id, "de-en", [ids[i % len(ids)]], DecodeOptions(beam_size=1), deadline))
            assert reply.error is None, reply.message

        async def calls() -> None:
            order = iter(range(requests))

            async def caller() -> None:
                for i in order:
                    await one(connection.new_id(), i)
            await asyncio.gather(*(caller() for _ in range(concurrency)))

        async def steps() -> float:
            """The engine's steps so far, from the first status heard after this moment (sent after the replies
            this client has: the engine sends its status after a round's replies)."""
            asked = time.monotonic()
            while connection.last_status_at <= asked:
                if time.monotonic() - asked > 600:
                    raise RuntimeError("no status from the engine")
                await asyncio.sleep(0.01)
            return connection.status.stats["steps"]

        await calls()  # the programs' first runs, the sentences' first trip
        await one("mark-start", 0)
        steps0 = await steps()
        cpu0, mine0, started = engine_cpu(), time.process_time(), time.perf_counter()
        await calls()
        elapsed, mine = time.perf_counter() - started, time.process_time() - mine0
        cpu, main_cpu = (after - before for after, before in zip(engine_cpu(), cpu0))
        await one("mark-end", 0)
        stepped = await steps() - steps0
        await connection.stop()
        return {"sentences": requests, "us": 1e6 * cpu / requests, "main_us": 1e6 * main_cpu / requests, "client_us": 1e6 * mine / requests,
                "sentences_per_s": requests / elapsed, "steps": stepped}

    try:
        import uvloop  # the API processes' loop (uvicorn's)
    except ImportError:  # a machine without the service's packages
        uvloop = asyncio
    print(json.dumps(uvloop.run(drive())), flush=True)


def measure_process(tree: Path, args, scratch: Path) -> dict:
    """The engine process of `tree` started (under callgrind with --callgrind), driven by a calling child."""
    import signal
    import subprocess
    import tempfile

    from bench.common import CALLGRIND, counted_instructions, test_sources
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.network.tokenizer import Tokenizer

    work = Path(tempfile.mkdtemp(dir=scratch))
    (work / "models").mkdir()
    (work / "models" / "de-en").symlink_to(CHECKPOINT)
    info = read_info(CHECKPOINT)
    tokenizer = Tokenizer(CHECKPOINT / info.src_tokenizer, symbols=info.symbols())
    (work / "ids.json").write_text(json.dumps([tokenizer.encode(s) for s in test_sources("de")]))
    here = str(Path(__file__).resolve())
    command = [sys.executable, here, "--engine-child", str(tree), "--socket-dir", str(work), "--models-dir", str(work / "models"),
               "--supervisor", str(os.getpid()), "--device", args.device, "--lookahead", args.lookahead]
    if args.callgrind:
        command = [*CALLGRIND, f"--callgrind-out-file={work}/callgrind.%p", *command]
    with open(work / "engine.log", "w") as log:
        engine = subprocess.Popen(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    try:
        done = subprocess.run([sys.executable, here, "--client-child", str(tree), "--socket-dir", str(work), "--engine-pid", str(engine.pid),
                               "--ids", str(work / "ids.json"), "--requests", str(args.requests), "--concurrency", str(args.concurrency)],
                              cwd=tree, capture_output=True, text=True, timeout=7200)
    finally:
        engine.send_signal(signal.SIGTERM)
        engine.wait(timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the measurement failed: {done.stderr[-2000:]}\n{(work / 'engine.log').read_text()[-2000:]}")
    result = json.loads(lines[-1])
    if args.callgrind:
        [counted] = work.glob("callgrind.*.1")  # the dump at the end of the count
        result["instructions"] = counted_instructions(counted) / result["sentences"]
    return result


def measure(tree: Path, args, out_dir: Path) -> dict:
    if args.offline:
        command = [sys.executable, str(Path(__file__).resolve()), "--offline-child", str(tree), "--offline", str(args.offline),
                   "--batches", str(args.batches), "--device", args.device, "--lookahead", args.lookahead]
        from bench.common import run_counted

        return run_counted(command, tree, args.callgrind, out_dir, "sentences")
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree),
               "--requests", str(args.requests), "--concurrency", str(args.concurrency), "--cache", str(args.cache), "--device", args.device,
               "--lookahead", args.lookahead,
               *(["--no-freeze"] if args.no_freeze else [])]
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
    parser.add_argument("--compare", action="append", default=[], help="another checkout, run in alternating rounds with "
                                                                        "this one (repeatable)")
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind (50x slower)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda: where the search's buffers live and the stand-ins run "
                                                          "(on CUDA captured and replayed like the real programs, its reads back waited for)")
    parser.add_argument("--lookahead", choices=("auto", "on", "off"), default="auto",
                        help="the device search takes a check's reads in once the next step is queued (on), at once (off), "
                             "or as its default for the device (auto: on CUDA)")
    parser.add_argument("--process", action="store_true", help="the engine process itself over its sockets, called by the "
                                                                  "API's engine client (--cache and --no-freeze do not apply)")
    parser.add_argument("--offline", type=int, metavar="BATCH", help="the offline search over batches of BATCH sentences "
                                                                        "(Translator.generate, as bench.gpu's throughput rows)")
    parser.add_argument("--batches", type=int, default=4, help="with --offline: batches counted")
    parser.add_argument("--output")
    for hidden in ("--offline-child", "--engine-child", "--client-child", "--socket-dir", "--models-dir", "--ids"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--supervisor", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--engine-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.requests, args.concurrency, args.cache, not args.no_freeze, args.device, args.lookahead)
        return 0
    if args.offline_child:
        offline_child(args.offline_child, args.offline, args.batches, args.device, args.lookahead)
        return 0
    if args.engine_child:
        return engine_child(args.engine_child, args.socket_dir, args.models_dir, args.supervisor, args.device, args.lookahead)
    if args.client_child:
        client_child(args.client_child, args.socket_dir, args.engine_pid, args.ids, args.requests, args.concurrency)
        return 0
    import tempfile

    from bench.common import emit, machine, table

    trees = [("this checkout", ROOT)] + [(str(Path(tree).resolve()), Path(tree).resolve()) for tree in args.compare]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for name, tree in trees:
                if args.process:
                    r = measure_process(tree, args, Path(scratch))
                    rows.append([round_ + 1, name, f"{r['us']:.1f}", f"{r['main_us']:.1f}",
                                 f"{r['instructions'] / 1e3:.0f}" if "instructions" in r else "", f"{r['client_us']:.1f}", f"{r['sentences_per_s']:.0f}", f"{r['steps']:.0f}", f"{r['sentences']}"])
                elif args.offline:
                    r = measure(tree, args, Path(scratch))
                    rows.append([round_ + 1, name, f"{r['us']:.2f}", f"{r['instructions'] / 1e3:.1f}" if "instructions" in r else "",
                                 f"{r['sentences_per_s']:.0f}", f"{r['tokens']:.1f}", r["sentences"]])
                else:
                    r = measure(tree, args, Path(scratch))
                    rows.append([round_ + 1, name, f"{r['us']:.1f}", f"{r['instructions'] / 1e3:.0f}" if "instructions" in r else "",
                                 f"{r['gc_ms']:.0f}", f"{r['gc_max_ms']:.1f}", r["full_collections"], f"{r['steps']:.0f}", f"{r['sentences']}"])
                print(f"  {rows[-1]}", file=sys.stderr)
    if args.process:
        report = (f"### The engine process's host work: {args.requests} one-sentence greedy calls from the API's engine client at "
                  f"concurrency {args.concurrency}, an instant device\n\n"
                  f"Machine: {machine()}; device {args.device}, lookahead {args.lookahead}{'; the engine under callgrind' if args.callgrind else ''}.\n\n"
                  + table(["round", "code", "engine CPU us/sentence", "its main thread's", "engine instructions/sentence (k)",
                           "client CPU us/sentence",
                           "sentences/s", "engine steps", "sentences"], rows) + "\n")
        return emit(report, args.output)
    if args.offline:
        report = (f"### The offline search's host work: `Translator.generate` over {args.batches} batches of {args.offline} test "
                  f"sentences, greedy, an instant device\n\n"
                  f"Machine: {machine()}; device {args.device}, lookahead {args.lookahead}{'; under callgrind' if args.callgrind else ''}.\n\n"
                  + table(["round", "code", "CPU us/sentence", "instructions/sentence (k)", "sentences/s", "tokens/sentence",
                           "sentences"], rows) + "\n")
        return emit(report, args.output)
    report = (f"### The engine's host work: {args.requests} one-sentence greedy calls at concurrency {args.concurrency}, "
              f"an instant device{f', a cache of {args.cache}' if args.cache else ''}"
              f"{', the start-up heap left to the collector' if args.no_freeze else ''}\n\n"
              f"Machine: {machine()}; device {args.device}, lookahead {args.lookahead}{'; under callgrind' if args.callgrind else ''}.\n\n"
              + table(["round", "code", "CPU us/sentence", "instructions/sentence (k)", "garbage collection ms", "longest collection ms",
                       "full collections", "steps (both passes)", "sentences"], rows) + "\n")
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
