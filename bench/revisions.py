"""Before/after: the decoding speed of two git revisions (or one and the working tree), side by side.

    python -m bench.revisions BASE [NEW] [--threads N] [--sentences-b1 N] [--sentences-b32 N] [--rounds N]
                              [--quantization int8]

NEW defaults to the working tree. `--chain REV1 REV2 ...` measures each consecutive pair in turn (one
row per change), which is how BENCHMARKS.md gets one before/after ratio per optimization.

Each tree decodes the same German sentences (Multi30k test_2016_flickr) with the shipped de-en model in
a fresh Python process of its own, for greedy and beam 4 at batch 1 and batch 32. The two trees take
turns for `--rounds` rounds and the best time of each is kept, so drift in machine load hits both
alike. `--quantization int8` loads both in int8 (each revision's own int8 engine). Prints sentences/s,
the speed ratio, and whether the outputs are token-for-token identical.
The child process uses only the facade and search API that every revision since the engine core has
(`Translator.load`, `encode_source`, `_pad`, `SearchOptions`, and `generate` or `Translator.generate`),
under the package of its tree: `nmt_serve`, or `model` before the one namespace.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench.common import ROOT, emit, machine, table

SETTINGS = [(1, 1), (1, 4), (32, 1), (32, 4)]  # (batch size, beam size)

CHILD = r"""
import importlib, json, sys, time
import torch
# the tree's own layout, named by the parent (the venv's editable install would resolve the other one
# from the working tree): the nmt_serve namespace, or the model/ package of earlier revisions
package = sys.argv[6]
if package == "nmt_serve":
    from nmt_serve.inference.translator import Translator
    from nmt_serve.inference.search import SearchOptions
    from nmt_serve.training.data import read_lines
else:
    Translator = importlib.import_module("model.translator").Translator
    read_lines = importlib.import_module("model.data").read_lines
    try:
        search_module = importlib.import_module("model.inference.search")
    except ImportError:
        search_module = importlib.import_module("model.search")
    SearchOptions = search_module.SearchOptions
if hasattr(Translator, "generate"):  # revisions whose Translator runs search itself
    search = lambda translator, src, options: translator.generate(src, options)
else:  # earlier revisions: the Transformer held its engine
    search = lambda translator, src, options: search_module.generate(translator.model, src, options)

threads, data, checkpoint, n_b1, n_b32 = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
translator = Translator.load(checkpoint, device="cpu", dtype="float32", quantization=sys.argv[7])
lines = read_lines(data)
results = {}
for batch, beam in %s:
    ids = [translator.encode_source(t) for t in lines[: n_b1 if batch == 1 else n_b32]]
    chunks = [ids[i : i + batch] for i in range(0, len(ids), batch)]
    search(translator, translator._pad(chunks[0]), SearchOptions(beam_size=beam))  # warm-up
    start = time.perf_counter()
    outputs = []
    for chunk in chunks:
        outputs += [h[0].tokens for h in search(translator, translator._pad(chunk), SearchOptions(beam_size=beam))]
    results[f"{batch},{beam}"] = {"seconds": time.perf_counter() - start, "outputs": outputs}
print(json.dumps(results))
""" % (SETTINGS,)


PACKAGES = ("nmt_serve", "model")  # the code's top-level folder: now, and before the one namespace


def package_of(tree: Path) -> str:
    return next(name for name in PACKAGES if (tree / name).is_dir())


def export_revision(rev: str, into: Path) -> Path:
    """The tracked files of `rev` (its code package is all the child needs), unpacked into a directory."""
    listed = subprocess.run(["git", "ls-tree", "--name-only", rev], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    package = next(name for name in PACKAGES if name in listed)
    archive = subprocess.run(["git", "archive", rev, package], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_tree(tree: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    data = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.de.gz"
    data = Path(os.environ.get("NMT_DATA", data.parent)) / data.name
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(args.threads), str(data), str(ROOT / "checkpoints" / "de-en"),
         str(args.sentences_b1), str(args.sentences_b32), package_of(tree), args.quantization],
        env=env, cwd=tree, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def compare_pair(base: str, new: str | None, args) -> str:
    names = (base, new or "working tree")
    with tempfile.TemporaryDirectory(prefix="bench-rev-") as tmp:
        trees = {base: export_revision(base, Path(tmp) / "base")}
        trees[names[1]] = export_revision(new, Path(tmp) / "new") if new else ROOT
        best: dict[str, dict] = {}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                print(f"  round {round_ + 1}/{args.rounds}: {name}", file=sys.stderr)
                for key, r in run_tree(tree, args).items():
                    kept = best.setdefault(name, {})
                    if key not in kept or r["seconds"] < kept[key]["seconds"]:
                        kept[key] = r
    rows = []
    for batch, beam in SETTINGS:
        key = f"{batch},{beam}"
        before, after = best[names[0]][key], best[names[1]][key]
        n = len(before["outputs"])
        same = sum(a == b for a, b in zip(before["outputs"], after["outputs"]))
        rows.append([
            f"{'greedy' if beam == 1 else f'beam {beam}'}, batch {batch}, {n} sentences",
            n / before["seconds"], n / after["seconds"], f"{before['seconds'] / after['seconds']:.2f}",
            "identical" if same == n else f"{same}/{n} identical",
        ])
    return f"{names[0]} -> {names[1]}\n\n" + table(
        ["setting", f"{names[0]} sentences/s", f"{names[1]} sentences/s", "speed-up", "outputs"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", help="git revision to compare with (e.g. HEAD~1, a tag, a hash)")
    parser.add_argument("new", nargs="?", help="git revision to measure (default: the working tree)")
    parser.add_argument("--chain", nargs="+", metavar="REV", help="measure each consecutive pair of these revisions")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences-b1", type=int, default=40)
    parser.add_argument("--sentences-b32", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quantization", choices=["none", "int8"], default="none")
    parser.add_argument("--output")
    args = parser.parse_args(argv)

    pairs = list(zip(args.chain, args.chain[1:])) if args.chain else [(args.base, args.new)]
    if not pairs or pairs[0][0] is None:
        parser.error("give BASE [NEW] or --chain REV1 REV2 ...")
    quantized = "; int8" if args.quantization == "int8" else ""
    header = f"Machine: {machine()}; {args.threads} thread(s){quantized}; best of {args.rounds} alternating rounds.\n"
    report = header + "\n".join("\n" + compare_pair(base, new, args) for base, new in pairs) + "\n"
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
