"""One request at a time through the engine: a search stepped alone on one torch thread against on the cores the
other processes leave idle (engine/cpu_room.py), in one process, alternating request by request.

    python -m bench.lone_search [--beams 1,4] [--sentences 64] [--rounds 3]

Two EngineCores of two lanes (the CPU engine's defaults, `threads` 0) share the shipped de-en model; one has its
room, the other a room that always says one core. Each request is one test sentence with the service's default
options (the translation's source entropy kept: the `detached` check's number), sent to both in turn, the order
alternating; its time is from the call handed in to its reply. Reported per beam size: p50 and mean milliseconds of
each, the median of the per-request ratios, whether the translations are the same, and the steps the room ran on
more than one thread. Run it with GOMP_SPINCOUNT=10000 to match the engine process (supervisor.OPENMP_SPINCOUNT).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from bench.common import ROOT, emit, machine, table, test_sources


class OneCore:
    """A CpuRoom that always says one core: the engine as it was, every search on one thread."""

    others = 0.0

    def refresh(self) -> None:
        pass

    def free_cores(self) -> int:
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output")
    args = parser.parse_args(argv)

    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import DecodeOptions, Translate
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(ROOT / "checkpoints" / "de-en", device="cpu", dtype="float32")
    sources = [translator.src_tokenizer.encode(t) for t in test_sources("de", args.sentences)]
    cores = {"one thread": EngineCore({"de-en": translator}, EngineConfig(admission=False, lanes=2)),
             "room": EngineCore({"de-en": translator}, EngineConfig(admission=False, lanes=2))}
    cores["one thread"]._room = OneCore()
    if cores["room"]._room is None:
        raise SystemExit("this engine has no room to measure (threads set, or one lane and one engine)")
    calls = [0]

    def request(core: EngineCore, i: int, beam: int) -> tuple[float, str]:
        calls[0] += 1
        message = Translate(f"c{calls[0]}", "de-en", [sources[i]], DecodeOptions(beam_size=beam, return_source_entropy=True),
                            time.monotonic() + 60)
        started = time.perf_counter()
        replies = core.screen(message) or core.handle(message)
        while not replies:
            replies = core.work()
        return time.perf_counter() - started, replies[0].value[0][0].text

    rows = []
    for beam in (int(b) for b in args.beams.split(",")):
        for i in range(min(8, len(sources))):  # first runs: allocations, the room's first window
            for core in cores.values():
                request(core, i, beam)
        wide_before = cores["room"].stats["wide_steps"]
        seconds: dict[str, list[float]] = {name: [] for name in cores}
        same = 0
        for r in range(args.rounds):
            for i in range(len(sources)):
                order = list(cores) if (i + r) % 2 else list(cores)[::-1]
                texts = set()
                for name in order:
                    took, text = request(cores[name], i, beam)
                    seconds[name].append(took)
                    texts.add(text)
                same += len(texts) == 1
        ratios = [a / b for a, b in zip(seconds["one thread"], seconds["room"])]
        room = cores["room"]._room
        rows.append(["greedy" if beam == 1 else f"beam {beam}",
                     *(f"{statistics.median(v) * 1e3:.1f} / {statistics.mean(v) * 1e3:.1f}" for v in seconds.values()),
                     f"{statistics.median(ratios):.3f}", f"{same}/{len(ratios)}",
                     f"{cores['room'].stats['wide_steps'] - wide_before:.0f}", f"{room.free_cores()} ({room.others:.2f} busy)"])
        print(f"  {rows[-1]}", file=sys.stderr)
    emit(f"{machine()}\n\n### One request at a time: a search stepped alone on one thread and on the room's threads "
         f"({args.sentences} test sentences x {args.rounds} rounds, alternating)\n\n"
         + table(["search", "one thread p50 / mean ms", "room's threads p50 / mean ms", "one / room (median per request)",
                  "same translations", "steps on more threads", "room now (others' cores)"], rows) + "\n", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
