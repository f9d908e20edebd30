"""A load generator for the HTTP server that is cheap enough not to be the bottleneck on the same machine.

Python threads with urllib cost about a millisecond of CPU per request and hold the GIL while they
parse; on a 2-core machine that steals a noticeable share of the cores from the server being
measured. Here each client process runs one asyncio event loop with aiohttp (C HTTP parser,
keep-alive connections, one JSON POST per request), so a request costs a fraction of that, and the
client processes report how much CPU they spent so a benchmark can show it was small.

    from bench.loadgen import run_load

    result = run_load("http://127.0.0.1:8000/v1/translate", bodies, concurrency=16)
    result.counts()                    # {200: 195, 503: 5}
    result.throughput()                # 200s per second of the run
    result.latencies(503)              # seconds, in request order
    result.client_cpu_seconds          # user+sys CPU of all client processes during the run

Two modes:
- "closed": `concurrency` workers in total, spread over the processes; each sends its next request
  only after its previous answer, and together they send every body exactly once, in index order.
- "burst": every request at once (a flood test), split over the processes; `concurrency` is ignored.

The client processes are started with the "spawn" context (the parent may hold torch and its
threads, which must not be forked), import only the standard library and aiohttp, open their
sessions, and then wait for a common start signal: process start-up is not part of the run, and every
time in the result counts from that common start. Non-2xx answers are outcomes, not exceptions; a
connection error or a timeout is an outcome with status 0.

From the command line:

    python -m bench.loadgen --url http://127.0.0.1:8000/v1/translate \\
        --body '{"text": "Hallo", "source": "de", "target": "en"}' --requests 200 --concurrency 16 --processes 2
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import sys
import time
import traceback
import types
from collections import Counter
from dataclasses import dataclass
from typing import Iterable

MODES = ("closed", "burst")
STARTUP_TIMEOUT = 120.0  # seconds for the client processes to import aiohttp and open their sessions


@dataclass
class Outcome:
    """One request's answer."""

    index: int                # the request's index in the list of bodies given to run_load
    status: int               # HTTP status, or 0 for a connection error or a timeout
    started: float            # seconds from the common start of the run until the request was sent
    latency: float            # seconds from sending the request until its whole answer was read
    retry_after: str | None   # the Retry-After header of the answer, if it had one
    error: str | None = None  # what went wrong when status is 0


@dataclass
class LoadResult:
    outcomes: list[Outcome]    # one per request, sorted by index
    elapsed: float             # seconds from the common start until the last answer
    client_cpu_seconds: float  # user+sys CPU all client processes spent during the run

    def counts(self) -> dict[int, int]:
        """How many answers had each status (0: no answer), by status."""
        return dict(sorted(Counter(o.status for o in self.outcomes).items()))

    def throughput(self, status: int | None = 200) -> float:
        """Answers with `status` (any status when None) per second of the run."""
        if self.elapsed <= 0:
            return 0.0
        return sum(1 for o in self.outcomes if status is None or o.status == status) / self.elapsed

    def latencies(self, status: int | None = 200, indices: Iterable[int] | None = None) -> list[float]:
        """Latencies in seconds of the answers with `status` (any when None), in request order,
        optionally only those of the requests at `indices`."""
        wanted = None if indices is None else set(indices)
        return [o.latency for o in self.outcomes
                if (status is None or o.status == status) and (wanted is None or o.index in wanted)]


def run_load(url: str, bodies: list[dict], *, concurrency: int, processes: int = 2, mode: str = "closed",
             timeout: float = 300.0, headers: dict | None = None) -> LoadResult:
    """POST each of `bodies` as JSON to `url` once, from `processes` client processes; see the module
    docstring for the modes. `timeout` bounds each request (connecting, sending and reading the answer);
    `headers` are added to every request."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if processes < 1:
        raise ValueError("processes must be at least 1")
    if mode == "closed" and concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if not bodies:
        return LoadResult([], 0.0, 0.0)

    # Encoded once here, so that the clients only send bytes.
    jobs = [(i, json.dumps(body).encode()) for i, body in enumerate(bodies)]
    ctx = multiprocessing.get_context("spawn")
    if mode == "closed":
        # Every process holds every body, and its workers claim the next unsent index from one shared
        # counter: the run stays at `concurrency` requests in flight until the last ones, however
        # unevenly the answers come back, which a fixed split per process or per worker would not.
        workers_total = min(concurrency, len(jobs))
        count = min(processes, workers_total)
        workers = [workers_total // count + (k < workers_total % count) for k in range(count)]
        shares = [jobs] * count
        claim = (ctx.RawValue("q", 0), ctx.Lock())
    else:
        count = min(processes, len(jobs))
        shares = [jobs[k::count] for k in range(count)]
        workers = [len(share) for share in shares]
        claim = None
    all_headers = {"Content-Type": "application/json", **(headers or {})}

    start = ctx.Event()
    clients, connections = [], []
    try:
        with _without_parent_main():
            for k in range(count):
                receiver, sender = ctx.Pipe(duplex=False)
                client = ctx.Process(target=_client, name=f"loadgen-client-{k}", daemon=True,
                                     args=(sender, start, url, shares[k], workers[k], claim, all_headers, timeout))
                client.start()
                sender.close()  # the child holds the only writer now, so its exit reads as EOF here
                clients.append(client)
                connections.append(receiver)
        _receive_all(connections, clients, "ready", STARTUP_TIMEOUT)
        # Taken before the signal, so no request can be stamped before it. time.monotonic() is
        # CLOCK_MONOTONIC on Linux (and system-wide on the other platforms too), so stamps taken in
        # the client processes compare with it.
        t0 = time.monotonic()
        start.set()
        reports = _receive_all(connections, clients, "done", None)
    finally:
        for client in clients:
            client.join(timeout=5)
            if client.is_alive():
                client.terminate()
                client.join()
        for connection in connections:
            connection.close()

    outcomes = []
    cpu = 0.0
    for report in reports:
        cpu += report[1]
        outcomes += [Outcome(index, status, sent - t0, latency, retry_after, error)
                     for index, status, sent, latency, retry_after, error in report[2]]
    outcomes.sort(key=lambda o: o.index)
    if [o.index for o in outcomes] != list(range(len(jobs))):
        raise RuntimeError("the client processes did not answer every request exactly once")
    elapsed = max(o.started + o.latency for o in outcomes)
    return LoadResult(outcomes, elapsed, cpu)


@contextlib.contextmanager
def _without_parent_main():
    """Spawned children re-import the parent's __main__ module (bench.server_load, say, which imports
    torch through bench.common) before they run their target. The clients need nothing from it, so
    while they are started __main__ is a bare module, which spawn leaves alone."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _receive_all(connections, clients, expected: str, timeout: float | None) -> list[tuple]:
    """One message from each client process, which must be `expected`; a client's error or early exit
    is raised here."""
    deadline = None if timeout is None else time.monotonic() + timeout
    messages: dict[int, tuple] = {}
    while len(messages) < len(connections):
        pending = [c for k, c in enumerate(connections) if k not in messages]
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = multiprocessing.connection.wait(pending, timeout=left)
        if not ready:
            raise RuntimeError(f"the client processes were not {expected} within {timeout:.0f} s")
        for connection in ready:
            k = connections.index(connection)
            try:
                message = connection.recv()
            except EOFError:
                raise RuntimeError(f"client process {k} exited (code {clients[k].exitcode}) before it was {expected}") from None
            if message[0] == "error":
                raise RuntimeError(f"client process {k} failed:\n{message[1]}")
            if message[0] != expected:
                raise RuntimeError(f"client process {k} sent {message[0]!r}, expected {expected!r}")
            messages[k] = message
    return [messages[k] for k in range(len(connections))]


def _client(connection, start, url: str, jobs: list[tuple[int, bytes]], workers: int, claim,
            headers: dict, timeout: float) -> None:
    """A client process: runs its share of the requests and sends back ("done", cpu seconds, records),
    or ("error", traceback)."""
    try:
        asyncio.run(_drive(connection, start, url, jobs, workers, claim, headers, timeout))
    except BaseException:
        connection.send(("error", traceback.format_exc()))
    finally:
        connection.close()


async def _drive(connection, start, url, jobs, workers, claim, headers, timeout) -> None:
    import aiohttp  # here, so that importing this module needs no aiohttp (the parent never uses it)
    from yarl import URL

    target = URL(url)  # parsed once, not per request
    records: list[tuple] = []

    connector = aiohttp.TCPConnector(limit=0)  # no cap on connections: the workers are the cap
    session = aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout),
        cookie_jar=aiohttp.DummyCookieJar(),  # no cookie bookkeeping per answer
    )
    async with session:
        async def send(index: int, payload: bytes) -> None:
            sent = time.monotonic()
            try:
                async with session.post(target, data=payload) as response:
                    await response.read()  # the whole body, so the latency covers it and the connection is reusable
                    status, retry_after = response.status, response.headers.get("Retry-After")
                error = None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                status, retry_after, error = 0, None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            records.append((index, status, sent, time.monotonic() - sent, retry_after, error))

        connection.send(("ready",))
        # Blocking the loop here is fine: nothing runs on it yet. Checked in slices so that a parent
        # that died does not leave this process waiting forever.
        while not start.wait(0.5):
            parent = multiprocessing.parent_process()
            if parent is not None and not parent.is_alive():
                return
        cpu_before = time.process_time()  # this process, all threads: user + sys

        if claim is None:  # burst: all of this process's share at once
            await asyncio.gather(*(send(index, payload) for index, payload in jobs))
        else:
            counter, lock = claim

            def next_position() -> int:
                with lock:  # uncontended almost always: a few hundred nanoseconds
                    position = counter.value
                    counter.value = position + 1
                return position

            async def worker() -> None:
                while (position := next_position()) < len(jobs):
                    await send(*jobs[position])

            await asyncio.gather(*(worker() for _ in range(workers)))
        cpu = time.process_time() - cpu_before
    connection.send(("done", cpu, records))


def _percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated between the nearest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", required=True, help="the JSON body of every request")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--mode", choices=MODES, default="closed")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    args = parser.parse_args(argv)

    body = json.loads(args.body)
    result = run_load(args.url, [body] * args.requests, concurrency=args.concurrency, processes=args.processes,
                      mode=args.mode, timeout=args.timeout)
    setting = f"concurrency {args.concurrency}" if args.mode == "closed" else "all at once"
    print(f"{args.requests} requests, {args.mode} ({setting}), {args.processes} client process(es): "
          f"{result.elapsed:.3f} s until the last answer")
    print("statuses: " + ", ".join(f"{status}: {n}" for status, n in result.counts().items()))
    print(f"throughput: {result.throughput():.1f} answers/s with status 200, {result.throughput(None):.1f} answers/s in all")
    for status in result.counts():
        latencies = result.latencies(status)
        print(f"latency of {status}s: p50 {_percentile(latencies, 50) * 1000:.1f} ms, p99 {_percentile(latencies, 99) * 1000:.1f} ms")
    errors = Counter(o.error for o in result.outcomes if o.error)
    for error, n in errors.most_common(3):
        print(f"  {n} x {error}")
    print(f"client CPU: {result.client_cpu_seconds:.3f} s, {result.client_cpu_seconds / args.requests * 1000:.3f} ms per request")
    return 0


if __name__ == "__main__":
    # Run as `python -m bench.loadgen`, this file is __main__, which the client processes do not import
    # (see _without_parent_main); the importable copy's functions are the ones they can find.
    from bench.loadgen import main as importable_main

    raise SystemExit(importable_main())
