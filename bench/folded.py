"""Where a process's time went, from py-spy's raw (folded) output: the frames holding the most samples,
counted once per stack (inclusive) and as the innermost frame (self).

    py-spy record -p PID -f raw -o engine.raw --nonblocking ...
    python -m bench.folded engine.raw [--top 40]

scripts/gpu-rows.sh's `engine-profile` stage records the engine process under the server benchmark's load
this way (py-spy leaves out idle samples unless told otherwise, so the shares are of busy time).
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def frame_name(frame: str) -> str:
    """'run_step (nmt_serve/engine/core.py:512)' -> 'run_step core.py' (a function, once per file)."""
    name, _, where = frame.partition(" (")
    return f"{name} {where.split(':')[0].rsplit('/', 1)[-1]}" if where else name


def summarize(lines, top: int = 40, within: str | None = None) -> str:
    """within: only the stacks through a frame of that name (as frame_name gives it), from that frame in."""
    inclusive, innermost, total = Counter(), Counter(), 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";")]
        if within is not None:
            if within not in frames:
                continue
            frames = frames[frames.index(within):]
        n = int(count)
        total += n
        for name in set(frames):
            inclusive[name] += n
        innermost[frames[-1]] += n
    if not total:
        return "no samples"
    out = [f"{total} samples", "", "inclusive:"]
    out += [f"{100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    out += ["", "self:"]
    out += [f"{100 * n / total:5.1f}%  {name}" for name, n in innermost.most_common(top // 2)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--within", help="only the stacks through this frame ('run_batches gpu.py'), shares of its samples")
    args = parser.parse_args(argv)
    with args.raw.open() as lines:
        print(summarize(lines, args.top, args.within))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
