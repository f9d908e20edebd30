"""How often the quality flags (nmt_serve/text/quality_flags.py) fire on in-domain translations, and on input the
models were not trained for: the shipped models on test_2016_flickr (beam 4), and a handful of
greetings and chat lines.

    python -m bench.quality_flags [--data ../shared/data/multi30k]
"""
from __future__ import annotations

import argparse
import gzip
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("NMT_DATA", "../shared/data/multi30k"))
    parser.add_argument("--beam-size", type=int, default=4)
    args = parser.parse_args()
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
