"""The int8 engine's two kernels, fbgemm's dynamic linear and oneDNN's u8 x s8 linear, on the weights of
the shipped model and of OPUS-MT, and what choosing between them does to a whole translation.

    python -m bench.int8_kernels [--threads 1] [--sections kernels,step,translate] [--rounds 3]

kernels: microseconds per call at 1 to 256 rows, each weight quantized once (the same int8 values for
both kernels), best of five repetitions: each weight hot in cache, which a decoder step never sees.
step: the products of one decoder step, each weight once per step (float32, int8 on fbgemm, int8 with
the output layer on oneDNN), at 1 to 256 rows. translate: the Translator in int8 on OPUS-MT's real shape
(random weights, bench.common.marian_twin), greedy and beam 4 at batch 32, the output layer through
oneDNN from ONEDNN_INT8_MIN_ROWS rows (today's rule) against fbgemm only, alternating in one process.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

from bench.common import ROOT, emit, machine, table, test_sources

# (name, out_features, in_features): every Linear shape of the two models' decoders and output layers
WEIGHTS = [
    ("shipped self q/k/v", 768, 256), ("shipped feed-forward in", 1024, 256), ("shipped output", 8000, 256),
    ("OPUS-MT self q/k/v", 1536, 512), ("OPUS-MT feed-forward in", 2048, 512), ("OPUS-MT feed-forward out", 512, 2048),
    ("OPUS-MT output", 58101, 512),
]
ROWS = [1, 8, 16, 32, 64, 128, 256]


def best_of(fn, repeat: int = 5) -> float:
    fn()
    calls = max(1, int(0.05 / max(_once(fn), 1e-6)))
    return min(_once(fn, calls) for _ in range(repeat)) * 1e6


def _once(fn, calls: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def kernels() -> str:
    from nmt_serve.inference.model_runner import Int8Linear

    rows_out = []
    for name, out_f, in_f in WEIGHTS:
        torch.manual_seed(0)
        linear = Int8Linear(torch.randn(out_f, in_f) * 0.05, torch.randn(out_f) * 0.01, wide=True)
        for rows in ROWS:
            x = torch.randn(rows, in_f)
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fbgemm = best_of(lambda: torch.ops.quantized.linear_dynamic(x, linear.packed, True))
                onednn = best_of(lambda: linear(x) if rows >= 32 else _onednn(linear, x))
            rows_out.append([name, f"{out_f}x{in_f}", rows, f"{fbgemm:,.0f}", f"{onednn:,.0f}", f"{fbgemm / onednn:.2f}"])
    return table(["weight", "shape", "rows", "fbgemm us", "oneDNN us", "fbgemm / oneDNN"], rows_out)


def _onednn(linear, x: torch.Tensor) -> torch.Tensor:
    """oneDNN's kernel below the switch's row count, as Int8Linear runs it above."""
    import nmt_serve.inference.model_runner as runner_module

    saved, runner_module.ONEDNN_INT8_MIN_ROWS = runner_module.ONEDNN_INT8_MIN_ROWS, 0
    try:
        return linear(x)
    finally:
        runner_module.ONEDNN_INT8_MIN_ROWS = saved


# every Linear a decoder step multiplies by, in the order it does (fused as the runner fuses them), and
# its output layer: (out_features, in_features)
STEP_SHAPES = {
    "shipped": [(768, 256), (256, 256), (256, 256), (256, 256), (1024, 256), (256, 1024)] * 3 + [(8000, 256)],
    "OPUS-MT": [(1536, 512), (512, 512), (512, 512), (512, 512), (2048, 512), (512, 2048)] * 6 + [(58101, 512)],
}


def step_products(rounds: int) -> str:
    """A step's products as a step sees them: each weight once per step, so that it comes from the
    last-level cache or memory rather than from a hot L2 as in `kernels`. Per row count: float32 (the
    float engine's oneDNN packed weights, or a lone row's own layout), int8 on fbgemm only, and int8
    with the output layer on oneDNN. Median microseconds per step of `rounds` x 2 + 1 rounds."""
    import nmt_serve.inference.model_runner as runner_module
    from nmt_serve.inference.model_runner import FloatLinear, Int8Linear

    out = []
    for name, shapes in STEP_SHAPES.items():
        torch.manual_seed(0)
        weights = [(torch.randn(o, i) * 0.05, torch.randn(o) * 0.01) for o, i in shapes]
        floats = [FloatLinear(w, b, packed=True, lone_row=torch.get_num_threads()) for w, b in weights]
        int8s = [Int8Linear(w, b, wide=w.size(0) > 4096) for w, b in weights]
        for rows in (1, 4, 16, 32, 64, 128, 256):
            x = {i: torch.randn(rows, i) for _, i in shapes}

            def float_step():
                for linear, (_, i) in zip(floats, shapes):
                    linear(x[i])

            def int8_step(min_rows: int):
                def run():
                    saved, runner_module.ONEDNN_INT8_MIN_ROWS = runner_module.ONEDNN_INT8_MIN_ROWS, min_rows
                    try:
                        for linear, (_, i) in zip(int8s, shapes):
                            linear(x[i])
                    finally:
                        runner_module.ONEDNN_INT8_MIN_ROWS = saved
                return run

            variants = {"float32": float_step, "int8, fbgemm": int8_step(10**9), "int8, oneDNN output": int8_step(0)}
            times: dict[str, list[float]] = {v: [] for v in variants}
            with torch.inference_mode():
                for _ in range(2 * rounds + 1):
                    for v, fn in variants.items():  # alternating, so that drift hits each alike
                        fn()
                        times[v].append(_once(fn, 10) * 1e6)
            med = {v: sorted(t)[len(t) // 2] for v, t in times.items()}
            out.append([name, rows, f"{med['float32']:,.0f}", f"{med['int8, fbgemm']:,.0f}", f"{med['int8, oneDNN output']:,.0f}",
                        f"{med['float32'] / med['int8, fbgemm']:.2f}", f"{med['int8, fbgemm'] / med['int8, oneDNN output']:.2f}"])
    return table(["shape", "rows", "float32 us", "int8 fbgemm us", "int8 oneDNN output us", "float32 / int8 fbgemm",
                  "fbgemm / oneDNN output"], out)


def translate(rounds: int, sentences: int, max_new: int) -> str:
    import nmt_serve.inference.model_runner as runner_module
    from bench.common import marian_twin
    from bench.engines import run_ours
    from nmt_serve.convert.marian import import_marian
    from nmt_serve.inference.translator import Translator

    work = Path(tempfile.mkdtemp(prefix="bench-int8-"))
    twin = marian_twin(ROOT / "checkpoints" / "de-en", work / "marian", shape="opus-mt")
    ours = import_marian(twin, work / "ours", "de", "en")
    translator = Translator.load(ours, device="cpu", dtype="float32", quantization="int8")
    ids = [translator.encode_source(t) for t in test_sources("de")[:sentences]]
    rule = runner_module.ONEDNN_INT8_MIN_ROWS
    variants = {"fbgemm only": 10**9, f"oneDNN output from {rule} rows": rule}
    times: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], list] = {}
    for _ in range(rounds):
        for beam in (1, 4):
            for name, min_rows in variants.items():
                runner_module.ONEDNN_INT8_MIN_ROWS = min_rows
                run = lambda: run_ours(translator, ids, 32, beam, max_new)  # noqa: E731
                start = time.perf_counter()
                outputs[name, beam] = run()
                times.setdefault((name, beam), []).append(time.perf_counter() - start)
    runner_module.ONEDNN_INT8_MIN_ROWS = rule
    rows = []
    for beam in (1, 4):
        base = min(times["fbgemm only", beam])
        for name in variants:
            best = min(times[name, beam])
            same = sum(a == b for a, b in zip(outputs[name, beam], outputs["fbgemm only", beam]))
            rows.append([f"{'greedy' if beam == 1 else 'beam 4'}, batch 32", name, f"{sentences / best:.1f}",
                         f"{base / best:.2f}", f"{same}/{sentences}"])
    return table(["setting", "output layer", "sentences/s (best round)", "speed vs fbgemm only", "outputs as fbgemm only"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sections", default="kernels,step,translate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--output")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sections = args.sections.split(",")
    report = [f"# int8 kernels ({machine()}, {args.threads} thread(s))"]
    if "kernels" in sections:
        report += ["", "## Per call", "", kernels()]
    if "step" in sections:
        report += ["", "## A step's products, each weight once per step (medians, alternating)", "", step_products(args.rounds)]
    if "translate" in sections:
        report += ["", f"## OPUS-MT shape, int8, {args.sentences} sentences (to {args.max_new_tokens} tokens), best of {args.rounds} alternating rounds",
                   "", translate(args.rounds, args.sentences, args.max_new_tokens)]
    return emit("\n".join(report), args.output)


if __name__ == "__main__":
    raise SystemExit(main())
