"""How often the quality flags (nmt_serve/text/quality_flags.py) fire on in-domain translations, and on input the
models were not trained for: the shipped models on test_2016_flickr (beam 4), and a handful of
greetings and chat lines.

    python -m bench.quality_flags [--data ../shared/data/multi30k]
    python -m bench.quality_flags --labelled [--data ...]
    python -m bench.quality_flags --latency [--baseline-root ../before]
    python -m bench.quality_flags --directions fr-en,en-fr,cs-en,en-cs

--labelled: precision and recall of "doubtful" (any flag) on a labelled set built from Multi30k: clean
sentences (label: fine) and the same sentences garbled three ways (label: nonsense in, so nonsense out):
words shuffled, word salad (random words of the split's vocabulary, as many as the sentence has) and
letters shuffled inside each word; and on hand-labelled translations of sentences the model was not
trained for (bench/quality_flags_labelled.tsv: everyday sentences, short captions; how they were
labelled is in the file). The thresholds of the score (low_confidence) and of the attention's source
entropy (detached) are calibrated on val (held out from training) and the figures are measured on
test_2016_flickr, which the calibration never saw; it prints both at the percentiles of val's clean
sentences, and precision/recall per flag, for each candidate threshold, and for low_confidence and
detached alone and together.

--directions: how many clean val sentences each flag takes in other directions of the served model, whose
thresholds were calibrated on de-en and en-de only.

--latency: what the attention check costs a /v1/translate request: one service per attention_check setting
(off, borderline, all; and --baseline-root: a checkout from before the check, as it is), all on the
shipped checkpoints, CPU, default settings; one sentence per request, concurrency 1, the same sentence
sent to each service in turn (rotating who goes first) so that the machine's other load falls on all of
them alike: in-domain sentences (test_2016_flickr) and the hand-labelled everyday ones.
"""
from __future__ import annotations

import argparse
import gzip
import os
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import ROOT, start_service
from nmt_serve.engine.attention_maps import source_entropy
from nmt_serve.inference.translator import Translator
from nmt_serve.text.quality_flags import (
    DETACHED,
    LOW_CONFIDENCE,
    FlagThresholds,
    flags_for,
    needs_attention_check,
)
from nmt_serve.training.flag_calibration import percentile

OUT_OF_DOMAIN = {
    "de": ["Hallo", "Guten Morgen", "Wie geht es dir?", "Danke schön!", "Bis morgen", "Ich liebe dich.",
           "Das Wetter ist heute schön.", "Kannst du mir helfen?"],
    "en": ["Hello", "Good morning", "How are you?", "Thank you!", "See you tomorrow", "I love you.",
           "The weather is nice today.", "Can you help me?"],
}


def thresholds_of(translator: Translator, direction: str | None = None) -> FlagThresholds:
    """The thresholds the service uses for this model in this direction: the direction's own, the model's
    pooled ones, or the defaults."""
    return FlagThresholds.of(translator.info.flag_thresholds(direction))


def flags_of(source: str, result, thresholds: FlagThresholds) -> tuple[str, ...]:
    """The service's flags for an offline result (truncation is not known here: the shipped models
    end every test sentence long before max_length)."""
    best = result.hypotheses[0]
    return flags_for(source, best.text, mean_logprob=best.score / (len(best.tokens) + 1), thresholds=thresholds)


GARBLINGS = ("shuffled", "salad", "letters")
LABELS = Path(__file__).with_name("quality_flags_labelled.tsv")


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


@dataclass
class Row:
    kind: str  # clean or a garbling; everyday or short (the hand-labelled file)
    source: str
    output: str
    doubtful: bool  # the label: garbled, or labelled wrong by hand
    mean_logprob: float
    source_entropy: float
    flags: tuple[str, ...]  # as the service gives them with every sentence's attention checked
    borderline: bool  # the service checks its attention by default (needs_attention_check)


def translated(translator: Translator, kinds_sources: list[tuple[str, str, bool]], beam_size: int, direction: str) -> list[Row]:
    sources = [source for _, source, _ in kinds_sources]
    results = translator.translate(sources, beam_size=beam_size, return_scores=True, return_attention=True,
                                   target_lang=direction.split("-")[1])
    rows = []
    thresholds = thresholds_of(translator, direction)
    for (kind, source, doubtful), r in zip(kinds_sources, results):
        best = r.hypotheses[0]
        mean, entropy = best.score / (len(best.tokens) + 1), source_entropy(translator, r.attention)
        rows.append(Row(kind, source, best.text, doubtful, mean, entropy,
                        flags_for(source, best.text, mean_logprob=mean, source_entropy=entropy, thresholds=thresholds),
                        needs_attention_check(mean, thresholds)))
    return rows


def labelled(translator: Translator, lines: list[str], beam_size: int, direction: str) -> list[Row]:
    """The clean lines and their garblings; all but clean are labelled doubtful."""
    return translated(translator, [(kind, source, kind != "clean") for kind in ("clean", *GARBLINGS)
                                   for source in (lines if kind == "clean" else garble(lines, kind))], beam_size, direction)


def hand_labelled(translator: Translator, pair: str, beam_size: int) -> tuple[list[Row], int]:
    """The sources of LABELS for a direction with a row for the output this model gives them (a source
    may have rows for several models' outputs), labelled from that row; and how many sources have none."""
    entries = [line.rstrip("\n").split("\t") for line in LABELS.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    labels: dict[tuple[str, str], dict[str, bool]] = {}  # (set, source) -> output -> wrong
    for kind, direction, source, output, label in entries:
        if direction == pair:
            labels.setdefault((kind, source), {})[output] = label == "wrong"
    rows = translated(translator, [(kind, source, False) for kind, source in labels], beam_size, pair)
    kept = [replace(row, doubtful=labels[row.kind, row.source][row.output]) for row in rows
            if row.output in labels[row.kind, row.source]]
    return kept, len(rows) - len(kept)


def precision_recall(rows: list[Row], predicted) -> str:
    tp = sum(1 for row in rows if row.doubtful and predicted(row))
    fp = sum(1 for row in rows if not row.doubtful and predicted(row))
    fn = sum(1 for row in rows if row.doubtful and not predicted(row))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return f"precision {precision:.3f}, recall {recall:.3f} (tp {tp}, fp {fp}, fn {fn})"


def low_confidence(row: Row) -> bool:
    return LOW_CONFIDENCE in row.flags


def detached(row: Row) -> bool:
    return DETACHED in row.flags


def borderline_detached(row: Row) -> bool:
    """detached as the service gives it by default: only where the score is borderline (attention_check)."""
    return detached(row) and row.borderline


def labelled_report(args) -> None:
    translator = Translator.load(args.model, device="cpu")
    pairs = ("de-en", "en-de")
    val = {pair: labelled(translator, read(args.data, "val", pair[:2])[: args.lines], args.beam_size, pair) for pair in pairs}
    clean_val = {pair: [row for row in rows if row.kind == "clean"] for pair, rows in val.items()}
    pooled = [row.source_entropy for rows in clean_val.values() for row in rows]
    print(f"# {args.model}, beam {args.beam_size}, CPU; val: {args.lines} clean sentences per direction and 3x as many garbled")
    print("source entropy, clean val, both directions pooled: "
          + ", ".join(f"p{p}={percentile(pooled, p):.3f}" for p in (90, 95, 98, 99))
          + f" (the model's, pooled over its directions: {thresholds_of(translator).max_source_entropy})")
    for pair in pairs:
        thresholds = thresholds_of(translator, pair)
        src, tgt = pair.split("-")
        clean = [row.mean_logprob for row in clean_val[pair]]
        entropies = [row.source_entropy for row in clean_val[pair]]
        print(f"## {pair}: val")
        print("mean log-probability per token, clean val, percentiles: "
              + ", ".join(f"p{p}={percentile(clean, p):.3f}" for p in (1, 2, 5, 10, 20)))
        print("source entropy, clean val, percentiles: " + ", ".join(f"p{p}={percentile(entropies, p):.3f}" for p in (50, 90, 95, 98, 99)))
        for kind in GARBLINGS:
            rows = [row for row in val[pair] if row.kind == kind]
            print(f"  {kind}: median log-prob {percentile([r.mean_logprob for r in rows], 50):.3f}, "
                  f"median source entropy {percentile([r.source_entropy for r in rows], 50):.3f}")
        test = labelled(translator, read(args.data, "test_2016_flickr", src)[: args.lines], args.beam_size, pair)
        clean_test = [row for row in test if row.kind == "clean"]
        print(f"## {pair}: test_2016_flickr (held out), {len(test)} rows")
        print(f"- any flag, every sentence's attention checked: {precision_recall(test, lambda row: bool(row.flags))}")
        print(f"- any flag, attention checked where the score is borderline (the service's default): "
              f"{precision_recall(test, lambda row: bool(set(row.flags) - {DETACHED}) or borderline_detached(row))}")
        for flag in sorted({f for row in test for f in row.flags}):
            print(f"  - {flag}: {precision_recall(test, lambda row, flag=flag: flag in row.flags)}")
        both = lambda row: low_confidence(row) or detached(row)
        gated = lambda row: low_confidence(row) or borderline_detached(row)
        checked = sum(row.borderline for row in clean_test) / len(clean_test)
        print(f"- low_confidence alone (< {thresholds.min_mean_logprob}): {precision_recall(test, low_confidence)}")
        print(f"- detached alone (> {thresholds.max_source_entropy}): {precision_recall(test, detached)}")
        print(f"- both: {precision_recall(test, both)}")
        print(f"- both, detached only where borderline ({checked:.3f} of clean test sentences checked): {precision_recall(test, gated)}")
        share = sum(both(row) for row in clean_val[pair]) / len(clean_val[pair])
        matched = percentile(clean, 100 * share)
        print(f"- low_confidence alone at {matched:.3f}, the val percentile both flag ({100 * share:.1f}%): "
              f"{precision_recall(test, lambda row, t=matched: row.mean_logprob < t)}")
        for kind in GARBLINGS:
            rows = [row for row in test if row.kind == kind]
            print(f"  - recall on {kind}: " + ", ".join(f"{name} {sum(map(f, rows)) / len(rows):.3f}" for name, f in
                                                       (("low_confidence", low_confidence), ("detached", detached), ("both", both), ("both, borderline", gated))))
        for p in (1, 2, 5, 10):
            threshold = percentile(clean, p)
            print(f"- mean log-prob < {threshold:.3f} (val p{p}): {precision_recall(test, lambda row, t=threshold: row.mean_logprob < t)}")
            print(f"  with the other flags: {precision_recall(test, lambda row, t=threshold: row.mean_logprob < t or bool(set(row.flags) - {LOW_CONFIDENCE}))}")
        for p in (95, 98, 99):
            threshold = percentile(pooled, p)
            print(f"- source entropy > {threshold:.3f} (pooled val p{p}): {precision_recall(test, lambda row, t=threshold: row.source_entropy > t)}; "
                  f"or low_confidence: {precision_recall(test, lambda row, t=threshold: row.source_entropy > t or low_confidence(row))}")
        rows, changed = hand_labelled(translator, pair, args.beam_size)
        print(f"## {pair}: hand-labelled ({LABELS.name}), {len(rows)} rows ({changed} sources whose output has no label, left out)")
        for kind in ("everyday", "short"):
            mine = [row for row in rows if row.kind == kind]
            wrong = [row for row in mine if row.doubtful]
            print(f"- {kind}: {len(wrong)} wrong, {len(mine) - len(wrong)} fine; flagged: " + "; ".join(
                f"{name} {sum(map(f, wrong))}/{len(wrong)} wrong, {sum(f(row) for row in mine if not row.doubtful)}/{len(mine) - len(wrong)} fine"
                for name, f in (("low_confidence", low_confidence), ("detached", detached), ("both", both), ("both, borderline", gated),
                                ("any flag", lambda row: bool(row.flags)))))
            for row in mine:
                if args.verbose or row.doubtful and detached(row) and not low_confidence(row) or not row.doubtful and row.flags:
                    print(f"    {'wrong' if row.doubtful else 'fine'} {row.mean_logprob:.2f} {row.source_entropy:.3f} "
                          f"{','.join(row.flags) or '-'}: {row.source!r} -> {row.output!r}")
        print()


def directions_report(args) -> None:
    translator = Translator.load(args.model, device="cpu")
    print(f"# {args.model}, beam {args.beam_size}, CPU: clean val, the first {args.lines} sentences per direction, share flagged")
    for pair in args.directions.split(","):
        rows = translated(translator, [("clean", line, False) for line in read(args.data, "val", pair[:2])[: args.lines]],
                          args.beam_size, pair)
        print(f"- {pair}: " + ", ".join(f"{name} {sum(map(f, rows)) / len(rows):.3f}" for name, f in (
            ("low_confidence", low_confidence), ("detached", detached), ("both", lambda row: low_confidence(row) or detached(row)),
            ("both, borderline", lambda row: low_confidence(row) or borderline_detached(row)))))


def latency_report(args) -> None:
    import httpx

    services = {mode: ["--attention-check", mode] for mode in ("off", "borderline", "all")}
    roots = {mode: ROOT for mode in services}
    if args.baseline_root:
        services = {"before": [], **services}
        roots["before"] = Path(args.baseline_root).resolve()
    entries = [line.split("\t") for line in LABELS.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    sets = {"in-domain (test_2016_flickr)": read(args.data, "test_2016_flickr", "de")[: args.requests],
            "everyday (hand-labelled)": [source for kind, direction, source, *_ in entries if kind == "everyday" and direction == "de-en"]}
    procs, clients = [], {}
    try:
        for k, (mode, flags) in enumerate(services.items()):
            procs.append(start_service(args.port + k, ROOT / "checkpoints", ["--device", "cpu", *flags], root=roots[mode]))
            clients[mode] = httpx.Client(base_url=f"http://127.0.0.1:{args.port + k}", timeout=60)
        modes = list(services)
        models = {m["id"]: m for m in clients[modes[0]].get("/v1/models").json()["models"]}
        print(f"# /v1/translate, one de-en sentence per request, beam 4, concurrency 1, {len(modes)} services in turn")
        for name, sentences in sets.items():
            times: dict[str, list[float]] = {mode: [] for mode in modes}
            checked = 0
            for warmup in sentences[:5]:
                for mode in modes:
                    clients[mode].post("/v1/translate", json={"text": warmup, "source": "de", "target": "en"})
            for i, sentence in enumerate(sentences):
                order = modes[i % len(modes):] + modes[: i % len(modes)]
                for mode in order:
                    start = time.perf_counter()
                    r = clients[mode].post("/v1/translate", json={"text": sentence, "source": "de", "target": "en", "return_scores": True})
                    times[mode].append(time.perf_counter() - start)
                    r.raise_for_status()
                    if mode == "off":
                        body = r.json()
                        checked += needs_attention_check(body["translations"][0]["score"] / (body["usage"]["generated_tokens"] + 1),
                                                         FlagThresholds.of(models["de-en"].get("quality_flags")))
            print(f"## {name}: {len(sentences)} requests each, {checked} ({100 * checked / len(sentences):.0f}%) with a borderline score")
            for mode in modes:
                t = sorted(times[mode])
                # the same sentence's time against the first service's: paired, so sentence lengths cancel out
                diffs = [1000 * (a - b) for a, b in zip(times[mode], times[modes[0]])]
                spread = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
                print(f"- {mode}: p50 {1000 * statistics.median(t):.1f} ms, p90 {1000 * t[int(0.9 * (len(t) - 1))]:.1f} ms, "
                      f"mean {1000 * statistics.fmean(t):.1f} ms; against {modes[0]}, per request: median "
                      f"{statistics.median(diffs):+.1f} ms, mean {statistics.fmean(diffs):+.1f} ± {spread:.1f} ms")
    finally:
        for client in clients.values():
            client.close()
        for proc in procs:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=os.environ.get("NMT_DATA", "../shared/data/multi30k"))
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--labelled", action="store_true", help="precision/recall on the labelled set (see above)")
    parser.add_argument("--model", default="checkpoints/debian-multi30k", help="--labelled, --directions: the checkpoint "
                                                                             "(the service routes every direction to this one), "
                                                                             "flagged with its own thresholds (or the defaults)")
    parser.add_argument("--lines", type=int, default=500, help="--labelled: the first N lines of val and of test")
    parser.add_argument("--verbose", action="store_true", help="--labelled: every hand-labelled row with its score and entropy")
    parser.add_argument("--directions", help="clean val sentences flagged in these directions (see above)")
    parser.add_argument("--latency", action="store_true", help="/v1/translate latency for each attention_check setting (see above)")
    parser.add_argument("--baseline-root", help="--latency: also a service run from this checkout (before the check)")
    parser.add_argument("--requests", type=int, default=200, help="--latency: in-domain sentences")
    parser.add_argument("--port", type=int, default=18790, help="--latency: the first service's port (one more for each next)")
    args = parser.parse_args()
    if args.labelled:
        labelled_report(args)
        return
    if args.latency:
        latency_report(args)
        return
    if args.directions:
        directions_report(args)
        return
    for pair in ("de-en", "en-de"):
        src = pair.split("-")[0]
        translator = Translator.load(f"checkpoints/{pair}", device="cpu")
        with gzip.open(Path(args.data) / f"test_2016_flickr.{src}.gz", "rt", encoding="utf-8") as f:
            lines = [line.strip() for line in f]
        results = translator.translate(lines, beam_size=args.beam_size, return_scores=True)
        thresholds = thresholds_of(translator, pair)
        flagged = [(line, r.text, flags) for line, r in zip(lines, results) if (flags := flags_of(line, r, thresholds))]
        counts = Counter(flag for *_, flags in flagged for flag in flags)
        print(f"## {pair}: test_2016_flickr, {len(lines)} sentences, beam {args.beam_size}")
        print(f"flagged: {len(flagged)} ({100 * len(flagged) / len(lines):.1f}%), by flag: {dict(counts)}")
        for line, out, flags in flagged:
            print(f"- {', '.join(flags)}: {line!r} -> {out!r}")
        ood = OUT_OF_DOMAIN[src]
        ood_results = translator.translate(ood, beam_size=args.beam_size, return_scores=True)
        hits = [(line, r.text, flags_of(line, r, thresholds)) for line, r in zip(ood, ood_results)]
        print(f"out of domain: {sum(bool(h[2]) for h in hits)} of {len(hits)} flagged")
        for line, out, flags in hits:
            print(f"- {', '.join(flags) or '(none)'}: {line!r} -> {out!r}")
        print()


if __name__ == "__main__":
    main()
