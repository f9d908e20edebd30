"""Command-line translator: source lines on stdin, translations on stdout, one per line, in order.

    python -m model.translate --model checkpoints/de-en < input.de > output.en
"""
from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from .checkpoint import CheckpointError
from .translator import Translator


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nmt-translate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--beam-size", type=int, default=4, help="1 = greedy (default 4)")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences per model batch (default 64)")
    parser.add_argument("--max-length", type=int, default=None, help="cap on generated tokens (default: 1.5 x source + 10)")
    parser.add_argument("--length-penalty", type=float, default=1.0)
    parser.add_argument("--no-repeat-ngram-size", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"], help="default: float32 on CPU, float16 on CUDA")
    parser.add_argument("--quantization", default="none", choices=["none", "int8"],
                        help="int8: quantized Linear layers, faster on CPU at a small BLEU cost (see the model card)")
    parser.add_argument("--step-mode", default="auto", choices=["auto", "eager", "static"],
                        help="auto: the static decoder (CUDA graphs) on CUDA, the eager search on CPU; eager: always the eager search")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--progress", choices=["auto", "always", "never"], default="auto", help="progress bar on stderr (auto: when stdin is not a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        translator = Translator.load(args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
                                     step_mode=args.step_mode)
    except (CheckpointError, ValueError) as exc:  # a bad checkpoint or option: one line, not a traceback
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    lines = [line.rstrip("\n") for line in sys.stdin]
    show = args.progress == "always" or (args.progress == "auto" and not sys.stdin.isatty())
    # chunks of several batches: the translator sorts each chunk by length, the bar moves per chunk
    chunk = max(args.batch_size * 8, 1)
    with tqdm(total=len(lines), unit="sent", disable=not show, file=sys.stderr, dynamic_ncols=True) as bar:
        for start in range(0, len(lines), chunk):
            part = lines[start : start + chunk]
            results = translator.translate(
                part, beam_size=args.beam_size, max_length=args.max_length, length_penalty=args.length_penalty,
                no_repeat_ngram_size=args.no_repeat_ngram_size, max_batch_size=args.batch_size,
            )
            sys.stdout.write("".join(r.text + "\n" for r in results))
            sys.stdout.flush()
            bar.update(len(part))
    return 0


if __name__ == "__main__":
    sys.exit(main())
