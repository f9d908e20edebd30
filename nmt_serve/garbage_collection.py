"""Python's cyclic garbage collector in the service's processes: young collections rarer, the engine's start-up heap
out of its reach, its pauses counted.

A young collection comes whenever the tracked objects allocated since the last one outnumber those freed by
Python's threshold (700). A one-sentence request makes and drops a few thousand (FastAPI's and pydantic's,
ours), so with a few dozen in flight the count crosses 700 over and over with nothing to collect: an API
process ran about one young collection every nine requests and, from what they promoted, a full collection
every thousand (~35 ms each, a stall of every request it holds), ~10% of its CPU in the collector in all.
`rarer_young_collections()` raises the threshold to YOUNG_THRESHOLD: objects that live for one request die
before a collection sees them, and none came in 5,000 such requests (BENCHMARKS.md). Real cyclic garbage
still goes at the next collection, with at most that many more tracked objects alive meanwhile (about a
megabyte).

A full (oldest-generation) collection walks every tracked object of the process and stops every thread
meanwhile. Most of them are what start-up built and what lives as long as the process: modules,
tokenizers, the models' modules, captured programs (the engine process holds ~170,000 after loading the
shipped model). On this project's 2-core VM a full collection took ~100 ms in the engine, and one comes
whenever enough objects have outlived the younger generations: its translation cache filling up, for one. That
is a stall of every running sentence (`bench.engine_host --cache`: the longest pause 225-236 ms as the cache
filled, 108-113 ms with the start-up heap frozen; BENCHMARKS.md, "The engine's garbage collection").

Once the engine is ready (its programs run and captured), `freeze_startup_heap()` collects what start-up left
behind and moves everything alive into the permanent generation (`gc.freeze`), which collections never walk;
what is made later is collected as before. The price: a start-up object that later becomes part of unreachable
cycles is not freed (start-up objects live as long as the process here, and an engine that is restarted is a
new process). vLLM, SGLang and TensorRT-LLM freeze their serving processes' heaps the same way.

The API processes do not: with distinct one-sentence requests filling the API's translation cache (8,000 at
concurrency 32, one worker, this project's 2-core VM), no full collection came either way, and the collector's time
was 21 ms in all against 8-9 ms with the start-up heap (~67,000 objects) frozen, for ~49 s of requests.
(A worker frozen at its first readiness once looked as if it never finished starting up beside busy neighbours. It
had: the test's first request came between the worker's `ready` line and its listening, which the freeze's
collection had made ~100 ms longer, and was refused; the test now waits for the port.)
"""
from __future__ import annotations

import gc
import time

YOUNG_THRESHOLD = 10_000  # tracked objects allocated (net of those freed) between young collections; Python's is 700


def rarer_young_collections(threshold: int = YOUNG_THRESHOLD) -> None:
    """Young collections once `threshold` objects outlive their allocation's neighbours, not 700 (the older
    generations' thresholds as they are); a higher threshold set before is kept."""
    young, older, oldest = gc.get_threshold()
    if 0 < young < threshold:
        gc.set_threshold(threshold, older, oldest)


def freeze_startup_heap() -> int:
    """Collect start-up's garbage, then take every live object out of the collector's reach; how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class CollectorClock:
    """Time this process spends in the collector and how many full collections it ran, from the moment
    start() registers it in gc.callbacks (collections run in whichever thread triggers them, under the GIL)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full_collections = 0
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._began
        if info.get("generation") == 2:
            self.full_collections += 1

    def start(self) -> CollectorClock:
        gc.callbacks.append(self)
        return self

    def stop(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)
