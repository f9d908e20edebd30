"""How often the quality flags (nmt_serve/text/quality_flags.py) fire on in-domain translations, and on input the
models were not trained for: the shipped models on test_2016_flickr (beam 4), and a handful of
greetings and chat lines.

    python -m bench.quality_flags [--data ../shared/data/multi30k]
    python -m bench.quality_flags --labelled [--data ...]

--labelled: precision and recall of "doubtful" (any flag) on a labelled set built from Multi30k: clean
sentences (label: fine) and the same sentences garbled three ways (label: nonsense in, so nonsense out):
words shuffled, word salad (random words of the split's vocabulary, as many as the sentence has) and
letters shuffled inside each word. The score threshold is calibrated on val (held out from training)
and the figures are measured on test_2016_flickr, which the calibration never saw; it prints the
mean log-probability per token at the percentiles of val's clean sentences, and precision/recall per
flag and for each candidate threshold.
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
from collections import Counter
from pathlib import Path

from nmt_serve.inference.translator import Translator
from nmt_serve.text.quality_flags import flags_for

OUT_OF_DOMAIN = {
    "de": ["Hallo", "Guten Morgen", "Wie geht es dir?", "Danke schön!", "Bis morgen", "Ich liebe dich.",
           "Das Wetter ist heute schön.", "Kannst du mir helfen?"],
    "en": ["Hello", "Good morning", "How are you?", "Thank you!", "See you tomorrow", "I love you.",
           "The weather is nice today.", "Can you help me?"],
}


def flags_of(source: str, result) -> tuple[str, ...]:
    """The service's flags for an offline result (truncation is not known here: the shipped models
    end every test sentence long before max_length)."""
    best = result.hypotheses[0]
    return flags_for(source, best.text, mean_logprob=best.score / (len(best.tokens) + 1))


GARBLINGS = ("shuffled", "salad", "letters")


def garble(lines: list[str], kind: str, seed: int = 0) -> list[str]:
    """Each line made nonsense in one way (seeded, so the labelled set is the same every run)."""
    rng = random.Random(f"{kind}-{seed}")
    vocabulary = sorted({w for line in lines for w in line.split()})
    out = []
    for line in lines:
        words = line.split()
        if kind == "shuffled":
            for _ in range(10):  # a different order, where the sentence has more than one word
                rng.shuffle(words)
                if " ".join(words) != line or len(set(words)) < 2:
                    break
        elif kind == "salad":
            words = [rng.choice(vocabulary) for _ in words]
        else:
            words = ["".join(rng.sample(w, len(w))) for w in words]
        out.append(" ".join(words))
    return out


def read(data: str, split: str, lang: str) -> list[str]:
    with gzip.open(Path(data) / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def labelled(translator: Translator, lines: list[str], beam_size: int, target: str) -> list[tuple[str, str, str, float, tuple[str, ...]]]:
    """(kind: clean or a garbling, source, output, mean log-probability per token, flags) for the clean lines and
    their garblings; all but clean are labelled nonsense."""
    rows = []
    for kind in ("clean", *GARBLINGS):
        sources = lines if kind == "clean" else garble(lines, kind)
        for source, r in zip(sources, translator.translate(sources, beam_size=beam_size, return_scores=True, target_lang=target)):
            best = r.hypotheses[0]
            rows.append((kind, source, best.text, best.score / (len(best.tokens) + 1), flags_of(source, r)))
    return rows


def precision_recall(rows, predicted) -> str:
    tp = sum(1 for row in rows if row[0] != "clean" and predicted(row))
    fp = sum(1 for row in rows if row[0] == "clean" and predicted(row))
    fn = sum(1 for row in rows if row[0] != "clean" and not predicted(row))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return f"precision {precision:.3f}, recall {recall:.3f} (tp {tp}, fp {fp}, fn {fn})"


def labelled_report(args) -> None:
    for pair in ("de-en", "en-de"):
        src, tgt = pair.split("-")
        translator = Translator.load(args.model, device="cpu")
        val = labelled(translator, read(args.data, "val", src)[: args.lines], args.beam_size, tgt)
        clean = sorted(row[3] for row in val if row[0] == "clean")
        print(f"## {pair} ({args.model}): val, {len(clean)} clean sentences and {len(val) - len(clean)} garbled, beam {args.beam_size}")
        print("mean log-probability per token, clean val, percentiles: "
              + ", ".join(f"p{p}={clean[int(p / 100 * (len(clean) - 1))]:.3f}" for p in (1, 2, 5, 10, 20)))
        for kind in GARBLINGS:
            values = sorted(row[3] for row in val if row[0] == kind)
            print(f"  {kind}: median {values[len(values) // 2]:.3f}")
        test = labelled(translator, read(args.data, "test_2016_flickr", src)[: args.lines], args.beam_size, tgt)
        print(f"## {pair}: test_2016_flickr (held out), {len(test)} rows")
        print(f"- any flag (as shipped): {precision_recall(test, lambda row: bool(row[4]))}")
        for flag in sorted({f for row in test for f in row[4]}):
            print(f"  - {flag}: {precision_recall(test, lambda row, flag=flag: flag in row[4])}")
        for p in (1, 2, 5, 10):
            threshold = clean[int(p / 100 * (len(clean) - 1))]
            print(f"- mean log-prob < {threshold:.3f} (val p{p}): {precision_recall(test, lambda row, t=threshold: row[3] < t)}")
            print(f"  with the other flags: {precision_recall(test, lambda row, t=threshold: row[3] < t or bool(set(row[4]) - {'low_confidence'}))}")
        print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("NMT_DATA", "../shared/data/multi30k"))
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--labelled", action="store_true", help="precision/recall on the labelled set (see above)")
    parser.add_argument("--model", default="checkpoints/multi30k", help="--labelled: the checkpoint (the service routes "
                                                                      "every direction to the multilingual one)")
    parser.add_argument("--lines", type=int, default=500, help="--labelled: the first N lines of val and of test")
    args = parser.parse_args()
    if args.labelled:
        labelled_report(args)
        return
    for pair in ("de-en", "en-de"):
        src = pair.split("-")[0]
        translator = Translator.load(f"checkpoints/{pair}", device="cpu")
        with gzip.open(Path(args.data) / f"test_2016_flickr.{src}.gz", "rt", encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        results = translator.translate(lines, beam_size=args.beam_size, return_scores=True)
        flagged = [(line, r.text, flags_of(line, r)) for line, r in zip(lines, results) if flags_of(line, r)]
        counts = Counter(flag for *_, flags in flagged for flag in flags)
        print(f"## {pair}: test_2016_flickr, {len(lines)} sentences, beam {args.beam_size}")
        print(f"flagged: {len(flagged)} ({100 * len(flagged) / len(lines):.1f}%), by flag: {dict(counts)}")
        for line, out, flags in flagged:
            print(f"- {', '.join(flags)}: {line!r} -> {out!r}")
        ood = OUT_OF_DOMAIN[src]
        ood_results = translator.translate(ood, beam_size=args.beam_size, return_scores=True)
        hits = [(line, r.text, flags_of(line, r)) for line, r in zip(ood, ood_results)]
        print(f"out of domain: {sum(bool(h[2]) for h in hits)} of {len(hits)} flagged")
        for line, out, flags in hits:
            print(f"- {', '.join(flags) or '(none)'}: {line!r} -> {out!r}")
        print()


if __name__ == "__main__":
    main()
