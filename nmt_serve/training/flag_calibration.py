"""The thresholds of a model's quality flags (nmt_serve/text/quality_flags.py), measured on sentences it was
not trained on but that are of its domain, and recorded in its checkpoint.

    python -m nmt_serve.training.flag_calibration --model checkpoints/debian-multi30k --data ../shared/data/multi30k

How sure a model is of its words depends on the model: one trained on captions alone gives its captions a
mean log-probability per token of about -0.3, one that also learned software text gives them less. A
threshold set on one model flags too much (or too little) of another's good output, so each model keeps
its own, at the same percentiles of its own validation sentences (Multi30k `val`, held out from training;
beam 4, as the service translates):
- low_confidence below the 5th percentile of the mean log-probability per token;
- detached above the 99th percentile of the decoder's cross-attention entropy over the source;
- the attention is checked for scores under the 30th percentile (the caption model's -0.4 took 26-35% of
  its in-domain sentences).
Each direction with at least MIN_SENTENCES sentences gets thresholds of its own; the pooled ones (all
directions together) serve the others. They go into config.json's metadata ("quality_flags": the pooled
ones, "directions", and what they were measured on); the engine hands them to the service with the
model's other facts.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from nmt_serve.engine.attention_maps import source_entropy
from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import CONFIG_FILE, read_info
from nmt_serve.text.language_codes import direction_names, public_directions
from nmt_serve.text.quality_flags import FlagThresholds
from nmt_serve.training.data import read_lines

LOW_CONFIDENCE_PERCENTILE = 5
DETACHED_PERCENTILE = 99
ATTENTION_CHECK_PERCENTILE = 30
MIN_SENTENCES = 100  # for a 99th percentile that is not simply the largest value: a direction with fewer uses the pooled thresholds


def percentile(values: list[float], p: float) -> float:
    """The nearest-rank percentile (no interpolation: a threshold is one sentence's value)."""
    ordered = sorted(values)
    return ordered[round(p / 100 * (len(ordered) - 1))]


def signals(translator: Translator, sources: list[str], *, target_lang: str | None, beam_size: int = 4,
            batch_size: int = 64, source_lang: str | None = None) -> list[tuple[float, float]]:
    """(mean log-probability per token, eos included; source entropy) of each source's best translation."""
    out = []
    for start in range(0, len(sources), batch_size):
        batch = sources[start : start + batch_size]
        for r in translator.translate(batch, beam_size=beam_size, return_scores=True, return_attention=True,
                                      target_lang=target_lang, source_lang=source_lang):
            best = r.hypotheses[0]
            out.append((best.score / (len(best.tokens) + 1), source_entropy(translator, r.attention)))
    return out


def thresholds_of(signals_: list[tuple[float, float]]) -> FlagThresholds:
    """The thresholds at this module's percentiles of (mean log-probability, source entropy) pairs."""
    scores, entropies = [s for s, _ in signals_], [e for _, e in signals_]
    return FlagThresholds(
        min_mean_logprob=round(percentile(scores, LOW_CONFIDENCE_PERCENTILE), 3),
        max_source_entropy=round(percentile(entropies, DETACHED_PERCENTILE), 3),
        attention_check_below=round(percentile(scores, ATTENTION_CHECK_PERCENTILE), 3),
    )


def calibrate(translator: Translator, sets: dict[str, list[str]], *, beam_size: int = 4
              ) -> tuple[FlagThresholds, dict[str, FlagThresholds], dict]:
    """Thresholds from {direction: source sentences} -> (those of all directions pooled, each direction's own
    where it has at least MIN_SENTENCES, what they were measured on). A direction's own matter because a
    model is surer of some directions than of others: a pooled threshold lets the doubtful sentences of
    the surer directions pass, and flags more of the good ones of the others."""
    by_direction: dict[str, list[tuple[float, float]]] = {}
    for direction, sources in sets.items():
        source, target = direction.split("-") if translator.info.multilingual else (None, None)
        by_direction[direction] = signals(translator, sources, beam_size=beam_size, target_lang=target, source_lang=source)
    pooled = [s for found in by_direction.values() for s in found]
    if len(pooled) < MIN_SENTENCES:
        raise ValueError(f"{len(pooled)} sentences: too few for a 99th percentile (give at least {MIN_SENTENCES})")
    own = {d: thresholds_of(found) for d, found in by_direction.items() if len(found) >= MIN_SENTENCES}
    lines = {len(s) for s in sets.values()}
    measured = {"sentences": len(pooled), "directions": sorted(sets), "beam_size": beam_size,
                "per_direction": lines.pop() if len(lines) == 1 else None,
                "percentiles": {"min_mean_logprob": LOW_CONFIDENCE_PERCENTILE, "max_source_entropy": DETACHED_PERCENTILE,
                                "attention_check_below": ATTENTION_CHECK_PERCENTILE}}
    return thresholds_of(pooled), own, measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-flag-calibration", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path, help="directory with val.{lang}.gz (or a pattern with {lang})")
    parser.add_argument("--directions", default="", help="comma-separated (default: every direction the model serves with files "
                        "here; for a model named by its own codes, such as NLLB-200, those between languages with files)")
    parser.add_argument("--lines", type=int, default=1000,
                        help=f"the first N sentences of each direction's source (a direction gets thresholds of its own from {MIN_SENTENCES})")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (args.model / CONFIG_FILE).is_file():
        parser.error(f"--model {args.model}: no {CONFIG_FILE} there")
    pattern = str(args.data) if "{lang}" in str(args.data) else str(args.data / "val.{lang}.gz")
    info = read_info(args.model)
    # a model named by its own codes (NLLB-200's deu_Latn-fra_Latn) is measured and recorded under the names the
    # service gives its directions (de-fr), where the service looks its thresholds up
    served = public_directions(info.served(), info.language_codes)
    names = direction_names(info.served(), info.language_codes)
    asked = [d for d in args.directions.split(",") if d]
    unknown = [d for d in asked if d not in names]
    if unknown:
        parser.error(f"--directions: {', '.join(unknown)} not served by {args.model}")
    directions = list(dict.fromkeys(names[d] for d in asked)) or served
    if info.language_codes and not asked:
        # between the languages with files only: NLLB-200 translates each of them into 201 others
        have = {lang for d in directions for lang in d.split("-") if Path(pattern.format(lang=lang)).is_file()}
        directions = [d for d in directions if set(d.split("-")) <= have]
    sets = {d: read_lines(pattern.format(lang=d.split("-")[0]))[: args.lines] for d in directions
            if Path(pattern.format(lang=d.split("-")[0])).is_file()}
    if not sets:
        listed = ", ".join(directions[:12]) + (f", ... ({len(directions)} directions)" if len(directions) > 12 else "")
        parser.error(f"--data {args.data}: no source file for any of {listed}")
    translator = Translator.load(args.model, device="cpu")
    try:
        thresholds, own, measured = calibrate(translator, sets, beam_size=args.beam_size)
    except ValueError as e:
        parser.error(str(e))
    config_path = args.model / CONFIG_FILE
    payload = json.loads(config_path.read_text())
    payload.setdefault("metadata", {})["quality_flags"] = {
        **asdict(thresholds), "directions": {d: asdict(t) for d, t in own.items()},
        "measured_on": {"data": pattern.replace(str(Path.cwd()) + "/", ""), **measured},
    }
    config_path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"{args.model}: low_confidence below {thresholds.min_mean_logprob}, detached above {thresholds.max_source_entropy}, "
          f"attention checked below {thresholds.attention_check_below} ({measured['sentences']} sentences, "
          f"{len(sets)} directions, beam {args.beam_size}); {len(own)} directions with thresholds of their own")
    for d, t in own.items():
        print(f"  {d}: {t.min_mean_logprob} / {t.max_source_entropy} / {t.attention_check_below}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
