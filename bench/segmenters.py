"""Which sentence segmenter the service uses, by measured accuracy: pysbd vs sentencex (and the
service's model.segmentation, sentencex with one rule on top) on the
project's gold sets (tests/fixtures/segmentation/{de,en}.txt: abbreviations, ordinals, numbers,
quotes) and on test_2016_flickr captions joined into paragraphs, plus speed.

    pip install pysbd && python -m bench.segmenters [--data ../shared/data/multi30k]
"""
from __future__ import annotations

import argparse
import gzip
import os
import time
from pathlib import Path

import pysbd
import sentencex

GOLD = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "segmentation"
CUT = " ⟂ "


def gold_cases(lang: str) -> list[list[str]]:
    lines = (GOLD / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
    return [line.split(CUT) for line in lines if line and not line.startswith("#")]


def flickr_cases(data: Path, lang: str, per_paragraph: int = 5) -> list[list[str]]:
    with gzip.open(data / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return [lines[i : i + per_paragraph] for i in range(0, len(lines), per_paragraph)]


def run_pysbd(lang: str):
    seg = pysbd.Segmenter(language=lang, clean=False)
    return lambda text: [s.strip() for s in seg.segment(text) if s.strip()]


def run_sentencex(lang: str):
    return lambda text: [s.strip() for s in sentencex.segment(lang, text) if s.strip()]


def run_ours(lang: str):
    from nmt_serve.text.segmentation import segment

    return lambda text: segment(text, lang).texts


def score(split, cases: list[list[str]]) -> tuple[float, float, float]:
    """Share of texts split exactly right, boundary F1, and milliseconds per 1,000 characters."""
    exact = tp = fp = fn = 0
    chars = sum(len(" ".join(c)) for c in cases)
    start = time.perf_counter()
    outputs = [split(" ".join(c)) for c in cases]
    seconds = time.perf_counter() - start
    for gold, got in zip(cases, outputs):
        exact += got == gold
        gold_cuts = set(_cuts(gold))
        got_cuts = set(_cuts(got))
        tp += len(gold_cuts & got_cuts)
        fp += len(got_cuts - gold_cuts)
        fn += len(gold_cuts - got_cuts)
    f1 = 2 * tp / max(1, 2 * tp + fp + fn)
    return exact / len(cases), f1, 1000 * seconds / chars * 1000


def _cuts(sentences: list[str]) -> list[int]:
    cuts, at = [], 0
    for s in sentences[:-1]:
        at += len(s) + 1
        cuts.append(at)
    return cuts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("NMT_DATA", "../shared/data/multi30k"))
    args = parser.parse_args()
    print("| set | segmenter | texts split exactly | boundary F1 | ms per 1,000 chars |")
    print("| --- | --- | --- | --- | --- |")
    for lang in ("de", "en"):
        sets = {f"gold {lang} ({len(gold_cases(lang))} texts)": gold_cases(lang)}
        if (Path(args.data) / f"test_2016_flickr.{lang}.gz").exists():
            cases = flickr_cases(Path(args.data), lang)
            sets[f"test_2016_flickr {lang} ({len(cases)} paragraphs of 5)"] = cases
        for name, cases in sets.items():
            for label, make in (("pysbd", run_pysbd), ("sentencex", run_sentencex),
                                ("model.segmentation (sentencex + its number rule)", run_ours)):
                exact, f1, speed = score(make(lang), cases)
                print(f"| {name} | {label} | {exact:.3f} | {f1:.3f} | {speed:.2f} |")


if __name__ == "__main__":
    main()
