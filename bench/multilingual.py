"""One multilingual model against bilingual models: wrong-language outputs, speed and memory, side by side.

    python -m bench.multilingual --multilingual checkpoints/multi30k --bilingual checkpoints/de-en checkpoints/en-de \
        [--data ../shared/data/multi30k] [--beam-size 4]

1. Wrong language: every direction of the multilingual model translates test_2016_flickr and the
   service's language detector (lingua, over the four languages) reads each output. An output counts
   as wrong when the detector names another language with the reference detected as the target
   language (where it cannot tell the reference either, a short caption of names, the output is not
   judged), and the raw count is shown beside it.
2. Speed: the test set translated by each bilingual model and by the multilingual model in the same
   direction (same batch size and beam), and by the multilingual model with the directions mixed in
   one batch.
3. Memory: resident memory of a process that loads the models (as the engine does, float32 on the
   CPU): the bilingual models, the multilingual one, and all of them.
BLEU is in the model cards (python -m nmt_serve.training.model_card).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from nmt_serve.inference.translator import Translator
from nmt_serve.text.language_detection import detector_for
from nmt_serve.training.data import read_lines

SPLIT = "test_2016_flickr"


def wrong_language(translator: Translator, data: Path, beam: int, directions: list[str] | None = None) -> dict[str, dict]:
    """Per direction: outputs, outputs judged (reference detected as the target), wrong among those, wrong raw."""
    directions = directions or translator.directions
    languages = sorted({lang for d in directions for lang in d.split("-")})
    detector = detector_for(frozenset(languages))
    out = {}
    for direction in directions:
        src, tgt = direction.split("-")
        sources, references = read_lines(data / f"{SPLIT}.{src}.gz"), read_lines(data / f"{SPLIT}.{tgt}.gz")
        outputs = [r.text for r in translator.translate(sources, beam_size=beam, target_lang=tgt)]
        judged = wrong = raw = 0
        examples = []
        for output, reference in zip(outputs, references):
            found = detector.detect(output)
            named = found[0].language if found else None
            raw += named != tgt
            ref = detector.detect(reference)
            if ref and ref[0].language == tgt:
                judged += 1
                if named != tgt:
                    wrong += 1
                    examples.append(f"{named}: {output}")
        out[direction] = dict(outputs=len(outputs), judged=judged, wrong=wrong, raw=raw, examples=examples[:3])
    return out


def seconds_to_translate(translator: Translator, texts: list[str], beam: int, target_lang: str | None) -> float:
    translator.translate(texts[:64], beam_size=beam, target_lang=target_lang)  # warm-up
    started = time.perf_counter()
    translator.translate(texts, beam_size=beam, max_batch_size=64, target_lang=target_lang)
    return time.perf_counter() - started


def mixed_seconds(translator: Translator, data: Path, beam: int, directions: list[str]) -> tuple[float, int]:
    """Every direction's test sentences in one call per target language, as the engine mixes them:
    sentences of different directions share batches (the tag is part of the source)."""
    from nmt_serve.inference.search import SearchOptions

    ids = []
    for direction in directions:
        src, tgt = direction.split("-")
        ids += [translator.encode_source(t, tgt) for t in read_lines(data / f"{SPLIT}.{src}.gz")]
    options = SearchOptions(beam_size=beam)
    started = time.perf_counter()
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    with torch.inference_mode():
        for start in range(0, len(order), 64):
            batch = [ids[i] for i in order[start : start + 64]]
            translator.generate(translator._pad(batch), options)
    return time.perf_counter() - started, len(ids)


def resident_mib(paths: list[str]) -> float:
    """VmRSS of a fresh process after loading these checkpoints (float32, CPU)."""
    code = ("import sys, torch; torch.set_num_threads(1); from nmt_serve.inference.translator import Translator; "
            "ms = [Translator.load(p, device='cpu', warmup=False) for p in sys.argv[1:]]; "
            "print([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0].split()[1])")
    out = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    return int(out.stdout.strip()) / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--multilingual", required=True)
    parser.add_argument("--bilingual", nargs="*", default=[])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("NMT_DATA", "../shared/data/multi30k")))
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    multi = Translator.load(args.multilingual, device="cpu")
    report: dict = {"threads": torch.get_num_threads()}

    wrong = wrong_language(multi, args.data, args.beam_size)
    report["wrong_language"] = wrong
    total = {k: sum(w[k] for w in wrong.values()) for k in ("outputs", "judged", "wrong", "raw")}
    print(f"## Wrong target language ({SPLIT}, beam {args.beam_size}, lingua over {len(multi.directions)} directions)\n")
    print("| direction | outputs | judged | wrong | wrong, unjudged too |\n| --- | --- | --- | --- | --- |")
    for d, w in wrong.items():
        print(f"| {d} | {w['outputs']} | {w['judged']} | {w['wrong']} | {w['raw']} |")
    print(f"| all | {total['outputs']} | {total['judged']} | {total['wrong']} ({total['wrong'] / max(total['judged'], 1) * 1000:.2f} per 1000) "
          f"| {total['raw']} |\n")
    for d, w in wrong.items():
        for example in w["examples"]:
            print(f"- {d}: {example}")

    print(f"\n## Speed (CPU, {report['threads']} threads, {SPLIT}, beam {args.beam_size}, batches of 64)\n")
    print("| direction | bilingual s | multilingual s | multilingual / bilingual |\n| --- | --- | --- | --- |")
    speed = {}
    for path in args.bilingual:
        bi = Translator.load(path, device="cpu")
        direction = bi.directions[0]
        src, tgt = direction.split("-")
        texts = read_lines(args.data / f"{SPLIT}.{src}.gz")
        b, m = seconds_to_translate(bi, texts, args.beam_size, None), seconds_to_translate(multi, texts, args.beam_size, tgt)
        speed[direction] = (b, m)
        print(f"| {direction} | {b:.2f} | {m:.2f} | {m / b:.2f} |")
    seconds, count = mixed_seconds(multi, args.data, args.beam_size, multi.directions)
    report["speed"] = {"pairs": speed, "mixed_sentences_per_second": count / seconds}
    print(f"\nAll {len(multi.directions)} directions mixed in shared batches: {count} sentences in {seconds:.1f} s "
          f"({count / seconds:.0f} sentences/s).\n")

    memory = {"bilingual": resident_mib(args.bilingual) if args.bilingual else None,
              "multilingual": resident_mib([args.multilingual]),
              "all": resident_mib([*args.bilingual, args.multilingual])}
    report["memory_mib"] = memory
    print("## Memory (resident MiB of a process holding the models, float32, CPU)\n")
    print("| models | MiB |\n| --- | --- |")
    for name, mib in memory.items():
        if mib is not None:
            print(f"| {name} | {mib:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
