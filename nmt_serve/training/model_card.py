"""Measure a checkpoint and write its model card (README.md) and scores into the checkpoint.

    python -m nmt_serve.training.model_card --model checkpoints/de-en --data ../shared/data/multi30k

Scores sacreBLEU (cased, 13a, detokenized) and chrF on the validation and test sets with greedy and
beam search, in float32 and with int8 Linear layers (`--quantization int8`), counts runaway outputs
(longer than 3x the source), and records them in config.json (metadata.scores) and README.md.
A multilingual checkpoint is measured in every direction it serves (float32 weights unless
--quantizations says otherwise), and each direction between two languages other than English also
through English with the same model (pivot), the baseline its direct translation should beat.
A model named by its own language codes (NLLB-200, M2M100, mBART-50, made by nmt-convert) is measured in
the directions between the languages the test files hold (or --directions), recorded under the names the
service gives them (`de-en` for `deu_Latn-eng_Latn`), where routing compares it with the other models.
Each row is kept in the checkpoint's model_card.partial.json as soon as it is measured: the same command,
run again after an interruption, measures only the rest.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import torch

from nmt_serve.cli.common import fail
from nmt_serve.convert.card import architecture, render_converted_card, score_row, signatures
from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import CONFIG_FILE, read_info
from nmt_serve.text.language_codes import direction_names, public_directions
from nmt_serve.training.data import read_lines
from nmt_serve.training.evaluate import evaluate
from nmt_serve.training.hardware import cpu_name
from nmt_serve.training.measured_rows import MeasuredRows, row_key
from nmt_serve.training.multiway import LANGUAGE_NAMES

SPLITS = {"val": "val", "test_2016_flickr": "test_2016_flickr"}


def measure(translator: Translator, data: Path, beam_sizes: list[int], pair_tests: dict[str, str] | None = None,
            splits: list[str] | None = None, kept: MeasuredRows | None = None) -> list[dict]:
    """A bilingual model's rows: every Multi30k split and beam size, and every pairwise test set named in
    `pair_tests` ({name: path pattern}); kept: the rows an earlier run measured, and where to keep new ones."""
    kept = kept or MeasuredRows()
    src, tgt = translator.source_lang, translator.target_lang
    rows = [scored_row(translator, kept, lambda split=split: (data / f"{split}.{src}.gz", data / f"{split}.{tgt}.gz"), split, beam)
            for split in (SPLITS.values() if splits is None else splits) for beam in beam_sizes]
    for name, pattern in (pair_tests or {}).items():
        rows += measure_pair_tests(translator, name, pattern, beam_sizes, kept=kept)
    return rows


def scored_row(translator: Translator, kept: MeasuredRows, files: Callable[[], tuple[Path, Path]], split: str, beam: int,
               direction: str | None = None, pivot: str | None = None) -> dict:
    """One row: a test set's (files(): source and reference) sacreBLEU at a beam size, in `direction` (None: a
    bilingual model's own) or through `pivot`; kept from an earlier run where it measured it."""
    def run() -> dict:
        source, reference = files()
        src, tgt = direction.split("-") if direction else (None, None)
        report = evaluate(translator, read_lines(source), read_lines(reference), beam_size=beam, target_lang=tgt,
                          source_lang=src, pivot=pivot)
        del report["hypotheses"]
        return {**({"direction": direction} if direction else {}), "split": split, "quantization": translator.quantization, **report}

    row = kept.row({"direction": direction, "split": split, "beam_size": beam, "pivot": pivot, "quantization": translator.quantization}, run)
    weights = "int8" if translator.quantization == "int8" else "float32"
    print(f"{direction or ''} {split} beam {beam}{' through ' + pivot if pivot else ''} {weights}: BLEU {row['bleu']:.2f} "
          f"chrF {row['chrf']:.2f} runaway {row['runaway_outputs']} ({row['seconds']}s)".lstrip(), flush=True)
    return row


def measure_speed(translator: Translator, sources: list[str], *, target_lang: str | None, threads: int,
                  source_lang: str | None = None) -> dict:
    """How fast the model translates on this machine at `threads` torch threads: one sentence at a time,
    greedy (latency per sentence, p50 and p90), and the same sentences 32 at a time with beam 4
    (sentences/s). float32 weights, as served on a CPU by default."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        translator.translate(sources[:8], beam_size=1, target_lang=target_lang, source_lang=source_lang)  # first-call allocations
        times = []
        for text in sources:
            start = time.perf_counter()
            translator.translate([text], beam_size=1, target_lang=target_lang, source_lang=source_lang)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        translator.translate(sources, beam_size=4, max_batch_size=32, target_lang=target_lang, source_lang=source_lang)
        batched = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)
    times.sort()
    return {"sentences": len(sources), "threads": threads, "greedy_batch1_p50_ms": round(1000 * statistics.median(times), 2),
            "greedy_batch1_p90_ms": round(1000 * times[int(0.9 * (len(times) - 1))], 2),
            "beam4_batch32_sentences_per_s": round(len(sources) / batched, 1)}


def speed_section(payload: dict) -> str:
    """The recorded speed, or "" when none was measured."""
    speed = payload.get("metadata", {}).get("speed")
    if not speed:
        return ""
    return f"""
## Speed

{speed['direction']}, the first {speed['sentences']} sentences of `{speed['split']}`, float32, {speed['threads']} thread(s) on
{speed['hardware']}, `Translator` in one process (`--speed`): one sentence at a time, greedy, p50
{speed['greedy_batch1_p50_ms']} ms and p90 {speed['greedy_batch1_p90_ms']} ms per sentence; 32 at a time with beam 4,
{speed['beam4_batch32_sentences_per_s']} sentences/s. BENCHMARKS.md compares engines on one machine.
"""


def pair_test_files(pattern: str, direction: str, exists: Callable[[Path], bool] = Path.is_file) -> tuple[Path, Path] | None:
    """(source file, reference file) of a direction in a pairwise test set (`eval-short.{pair}.{lang}`,
    as nmt-corpus writes it: one file pair serves both directions), or None where it has none."""
    src, tgt = direction.split("-")
    for pair in (f"{src}-{tgt}", f"{tgt}-{src}"):
        files = Path(pattern.format(pair=pair, lang=src)), Path(pattern.format(pair=pair, lang=tgt))
        if all(exists(f) for f in files):
            return files
    return None


def measure_pair_tests(translator: Translator, name: str, pattern: str, beam_sizes: list[int],
                       directions: list[str] | None = None, kept: MeasuredRows | None = None) -> list[dict]:
    """Rows of a pairwise test set (split `name`) in every direction of `directions` (default: every one the model
    serves) the set holds. A bilingual model's rows name their direction too (the set holds both)."""
    kept = kept or MeasuredRows()
    rows = []
    for direction in translator.directions if directions is None else directions:
        files = pair_test_files(pattern, direction)
        if files is not None:
            rows += [scored_row(translator, kept, lambda files=files: files, name, beam, direction) for beam in beam_sizes]
    return rows


def measure_directions(translator: Translator, data: Path, beam_sizes: list[int], pivot: str = "en",
                       pair_tests: dict[str, str] | None = None, splits: list[str] | None = None,
                       directions: dict[str, list[str]] | None = None, kept: MeasuredRows | None = None) -> list[dict]:
    """A multilingual model's rows: every direction, split and beam size, and every pairwise test set
    named in `pair_tests` ({name: path pattern}); then, for each direction that does not touch the pivot
    language, the test set through it with beam 4. directions: {direction: its Multi30k splits} (default every
    direction the model serves, on `splits`). A model named by its own codes (NLLB-200's `deu_Latn`) is measured
    and recorded under the names the service gives its directions (`de-en`): those routing compares.
    kept: the rows an earlier run measured, and where to keep new ones."""
    kept = kept or MeasuredRows()
    served = public_directions(translator.directions, translator.info.language_codes)
    if directions is None:
        directions = {d: list(SPLITS.values()) if splits is None else splits for d in served}

    def files(split: str, direction: str) -> Callable[[], tuple[Path, Path]]:
        src, tgt = direction.split("-")
        return lambda: (data / f"{split}.{src}.gz", data / f"{split}.{tgt}.gz")

    rows = [scored_row(translator, kept, files(split, direction), split, beam, direction)
            for direction, its_splits in directions.items() for split in its_splits for beam in beam_sizes]
    for name, pattern in (pair_tests or {}).items():
        rows += measure_pair_tests(translator, name, pattern, beam_sizes, list(directions), kept=kept)
    for direction, its_splits in directions.items():
        src, tgt = direction.split("-")
        if not pivot or pivot in (src, tgt) or not {f"{src}-{pivot}", f"{pivot}-{tgt}"} <= set(served) or "test_2016_flickr" not in its_splits:
            continue
        rows.append(scored_row(translator, kept, files("test_2016_flickr", direction), "test_2016_flickr", 4, direction, pivot))
    return rows


def plan_directions(served: list[str], codes: dict[str, str] | None, data: Path | None, splits: list[str],
                    pair_tests: dict[str, str], chosen: list[str] | None) -> dict[str, list[str]]:
    """{direction: the Multi30k splits it is measured on}, checked before any model is loaded (a measurement takes
    hours): `chosen` (--directions, either naming for a model with its own codes) or every direction served
    that some test set holds; ValueError (one line) for a direction it does not serve, a Multi30k file that is
    missing, or a chosen direction no test set holds. A model named by its own codes (NLLB-200: 40,602
    directions) is measured, unless told, in those between the languages the test files hold."""
    public = public_directions(served, codes)
    names = direction_names(served, codes)

    @functools.lru_cache(maxsize=None)
    def listed(directory: Path) -> frozenset[str]:  # each directory read once: 40,602 directions x files to look for
        return frozenset(os.listdir(directory)) if directory.is_dir() else frozenset()

    def exists(path: Path) -> bool:
        return path.name in listed(path.parent)

    def files(direction: str) -> dict[str, bool]:  # split -> whether both its files are there
        return {split: all(exists(data / f"{split}.{lang}.gz") for lang in direction.split("-")) for split in splits}

    def held(direction: str) -> bool:
        return any(pair_test_files(pattern, direction, exists) for pattern in pair_tests.values())

    if chosen:
        unknown = [d for d in chosen if d not in names]
        if unknown:
            raise ValueError(f"--directions {', '.join(unknown)}: the model does not translate it "
                             f"(it serves {', '.join(list(public)[:12])}{', ...' if len(public) > 12 else ''})")
        directions = list(dict.fromkeys(names[d] for d in chosen))
    elif codes:
        # only directions between languages some test file's name holds (any part of it: a superset) are looked at
        directories = ({data} if splits else set()) | {Path(pattern).parent for pattern in pair_tests.values()}
        named = {piece for directory in directories for name in listed(directory) for part in name.split(".")
                 for piece in (part, *part.split("-"))}
        candidates = [d for d in public if set(d.split("-")) <= named]
        directions = [d for d in candidates if all(files(d).values()) and splits or held(d)]
        if not directions and (splits or pair_tests):
            raise ValueError(f"no test file in --data {data} ({', '.join(splits) or 'no splits'}) or --pair-tests holds "
                             "two of the model's languages")
        return {d: [s for s, there in files(d).items() if there] for d in directions}
    else:
        directions = list(public)
    plan = {}
    for direction in directions:
        missing = [s for s, there in files(direction).items() if not there]
        if missing:
            src, tgt = direction.split("-")
            lacking = [f"{missing[0]}.{lang}.gz" for lang in (src, tgt) if not exists(data / f"{missing[0]}.{lang}.gz")]
            raise ValueError(f"{direction}: --data {data} has no {' or '.join(lacking)} "
                             f"(--splits names the Multi30k splits to measure)")
        if splits or held(direction):
            plan[direction] = splits
        elif chosen:
            raise ValueError(f"{direction}: no --pair-tests set holds it and --splits names none")
    return plan


def render_multilingual_card(directory: Path, payload: dict, rows: list[dict], hardware: str) -> str:
    cfg = payload["model"]
    training = payload.get("metadata", {}).get("training", {})
    tcfg = training.get("config", {})
    params = Translator.load(directory, device="cpu").num_parameters()
    directions = payload["directions"]
    languages = sorted({lang for d in directions for lang in d.split("-")})
    names = ", ".join(f"{LANGUAGE_NAMES.get(lang, lang)} ({lang})" for lang in languages)

    def cell(direction: str, split: str, beam: int, pivot: str | None = None) -> str:
        found = [r for r in rows if r.get("direction") == direction and r["split"] == split and r["beam_size"] == beam
                 and r.get("pivot") == pivot and r.get("quantization", "none") == "none"]
        return f"{found[0]['bleu']:.2f} / {found[0]['chrf']:.2f}" if found else "-"

    table = "\n".join(
        f"| {d} | {cell(d, 'val', 1)} | {cell(d, 'val', 4)} | {cell(d, 'test_2016_flickr', 1)} | {cell(d, 'test_2016_flickr', 4)} "
        f"| {cell(d, 'test_2016_flickr', 4, 'en')} |" for d in directions)
    runaway = sum(r["runaway_outputs"] for r in rows)
    hours = training.get("train_seconds", 0) / 3600
    extra = pair_tests_table(rows, directions)
    corpus = corpus_manifest(tcfg.get("pair_data", ""))
    if corpus:
        title = f"Multi30k and {corpus['name']}"
        what = "image captions, software messages and package descriptions"
        origin = (f"Fine-tuned from `{tcfg['init_from']}`{growth(tcfg)} with" if tcfg.get("init_from") else "Trained from scratch with")
        mix = payload.get("metadata", {}).get("interpolation")
        if mix:
            origin = (f"Its weights lie {mix['weight']:g} of the way from `{mix['base']['path']}` to `{mix['tuned']['path']}`, "
                      f"a model fine-tuned from it (`nmt_serve/training/interpolate.py`); both were trained with")
    else:
        title, what, origin = "Multi30k", "image captions", "Trained from scratch with"
    return f"""# Multilingual Transformer, {title}: {len(directions)} directions

Translates {what} between {names}: every direction listed below, with one set of weights.
{origin} this project's pipeline (`python -m nmt_serve.training.train --languages ...`).
The target language is a tag before the source (`{payload['target_tags'][languages[0]]}` ...); the service
adds it from the request's `target`, and one batch mixes directions.

## Scores

sacreBLEU (cased, 13a) / chrF, detokenized output, one reference. Measured with `python -m nmt_serve.training.model_card`.
"through en" is the same model translating into English and from English into the target (pivoting):
the baseline a direct direction should beat. Outputs over 3x the source length, all rows: {runaway}.

| direction | val greedy | val beam 4 | test greedy | test beam 4 | test beam 4 through en |
| --- | --- | --- | --- | --- | --- |
{table}

{extra}{signatures(rows)}

## Data

Multi30k task 1 (Elliott et al., 2016), raw cased text, multi-way parallel: the 29,000 `train` captions
in all four languages give {len(directions)} x 29,000 training pairs (and the tokenizer's text), `val`
(1,014) model selection (the mean greedy BLEU over the directions, on its first
{tcfg.get('valid_max_sentences') or 'all'} lines), `test_2016_flickr` (1,000) the reported score.
Partly derived from Flickr30K: for non-commercial research and educational use.
{corpus_section(corpus, tcfg) if corpus else ""}
## Model

| | |
| --- | --- |
| architecture | {architecture(cfg)} |
| parameters | {params:,} |
| vocabulary | joint sentencepiece {tcfg.get('spm_type', 'bpe')} over the four languages, {cfg['src_vocab_size']} pieces (the target tags among them), shared embeddings tied to the output layer |
| weights | float16 safetensors |

## Training
{tuned_run_note(payload.get('metadata', {}))}
| | |
| --- | --- |
| steps / epochs | {training.get('steps', '?')} / {training.get('epochs', '?')} (an epoch: every direction's pairs once) |
| batch | {tcfg.get('max_tokens', '?')} padded tokens, directions mixed |
| optimizer | Adam (0.9, 0.98), peak lr {tcfg.get('lr', '?')}, {tcfg.get('warmup_steps', '?')} warmup steps, {schedule(tcfg)} |
| regularization | dropout {cfg['dropout']}, label smoothing {tcfg.get('label_smoothing', '?')}, gradient clipping {tcfg.get('clip_norm', '?')} |
| checkpoint | {checkpoint_row(payload.get('metadata', {}))} |
| training time | {hours:.2f} h on {training.get('device') or hardware}, {training.get('threads', '?')} thread(s) |

## Limitations

{"Multi30k is small and narrow: short descriptions of photos. Expect good output on such sentences and" if not corpus else
 "Multi30k and Debian's translations are narrow: photo captions, software messages, package descriptions. Expect"}
{"poor output on news, dialogue, technical text or long sentences." if not corpus else
 "weaker output on news, dialogue and literary text, and on long sentences."} A multilingual model shares its
capacity between directions; the tables above are the evidence per direction.
{speed_section(payload)}{flags_section(payload)}"""


def growth(tcfg: dict) -> str:
    grown = [f"{tcfg[key]} {part} layers" for key, part in (("grow_encoder_layers", "encoder"), ("grow_decoder_layers", "decoder"))
             if tcfg.get(key)]
    return (", grown to " + " and ".join(grown) + " (each new layer a copy of the one below with its output projections "
            "at zero, so that it started out computing what that checkpoint did: `nmt_serve/training/grow.py`),") if grown else ""


def tuned_run_note(meta: dict) -> str:
    """Under an interpolation's Training heading: whose run the table describes."""
    mix = meta.get("interpolation")
    return (f"\nThe run of `{mix['tuned']['path']}`, the fine-tuned parent; `{mix['base']['path']}`'s is in config.json "
            "(`metadata.interpolation.base`).\n" if mix else "")


def checkpoint_row(meta: dict) -> str:
    """Which weights of the run were exported, and how an interpolation (interpolate.py) mixed them."""
    averaged = meta.get("training", {}).get("averaged", [])
    chosen = ("average of steps " + ", ".join(map(str, averaged)) if len(averaged) > 1
              else "best single checkpoint by validation BLEU")
    mix = meta.get("interpolation")
    if not mix:
        return chosen
    w = mix["weight"]
    return (f"{chosen}, then interpolated with the run's starting point, weight by weight: {1 - w:g} x "
            f"`{mix['base']['path']}` + {w:g} x `{mix['tuned']['path']}`")


def schedule(tcfg: dict) -> str:
    return ("linear decay to 0 at the last step" if tcfg.get("lr_schedule") == "linear" else "inverse square root decay")


def flags_section(payload: dict) -> str:
    """The quality flags' thresholds measured on this model, or "" when it has none."""
    found = payload.get("metadata", {}).get("quality_flags")
    if not found:
        return ""
    measured = found.get("measured_on", {})
    own = found.get("directions") or {}
    table = "".join(f"| {d} | {t['min_mean_logprob']} | {t['max_source_entropy']} | {t['attention_check_below']} |\n"
                    for d, t in sorted(own.items()))
    per_direction = f"""
Each direction measured on its own sentences has thresholds of its own, which the service uses for it:

| direction | low_confidence below | detached above | attention checked below |
| --- | --- | --- | --- |
{table}""" if own else ""
    return f"""
## Quality flags

The service flags a sentence `low_confidence` below a mean log-probability per token of
{found['min_mean_logprob']}, `detached` above a source entropy of {found['max_source_entropy']}, and checks the attention
of sentences scoring under {found['attention_check_below']}: this model's own 5th, 99th and 30th percentiles on
{measured.get('sentences', '?')} validation sentences (`{measured.get('data', '?')}`, {len(measured.get('directions', []))}
directions pooled, beam {measured.get('beam_size', '?')}), measured with `python -m nmt_serve.training.flag_calibration`.
{per_direction}"""


def pair_tests_table(rows: list[dict], directions: list[str]) -> str:
    """The pairwise test sets' scores (greedy and beam 4 per direction), or "" when none were measured."""
    names = sorted({r["split"] for r in rows if r["split"] not in SPLITS.values() and not r.get("pivot")})
    parts = []
    for name in names:
        found = {(r["direction"], r["beam_size"]): r for r in rows
                 if r["split"] == name and r.get("quantization", "none") == "none" and not r.get("pivot")}
        lines = []
        for d in directions:
            if any(k[0] == d for k in found):
                cells = [f"{found[(d, b)]['bleu']:.2f} / {found[(d, b)]['chrf']:.2f}" if (d, b) in found else "-" for b in (1, 4)]
                count = next(r["sentences"] for k, r in found.items() if k[0] == d)
                lines.append(f"| {d} | {count} | {cells[0]} | {cells[1]} |")
        parts.append(f"""Held-out test set `{name}` (sacreBLEU / chrF):

| direction | sentences | greedy | beam 4 |
| --- | --- | --- | --- |
""" + "\n".join(lines) + "\n\n")
    return "".join(parts)


def corpus_manifest(pattern: str) -> dict | None:
    """The manifest of the pairwise corpus a model was trained on (beside its files), if it is here."""
    path = Path(pattern).parent / "manifest.json" if pattern else None
    return json.loads(path.read_text()) if path and path.is_file() else None


# a corpus's kinds of segment (the `.origin` files' first column), as a model card names them
CORPUS_KINDS = {"ddtp-short": "short descriptions", "ddtp-long": "description sentences", "catalog": "catalog messages",
                "dictionary": "dictionary sentences", "help": "help pages' sentences"}
# what each source of a manifest (its "sources" keys) holds, as a model card says it
CORPUS_SOURCES = {
    "ddtp": "package descriptions paired with their translations (DDTP; short descriptions and sentence-aligned paragraphs)",
    "catalogs": "the message catalogs of a fixed list of programs (gettext msgid -> msgstr)",
    "dictionaries": "a dictionary's example sentences (Ding's German-English list)",
    "help": "the translated help pages of GNOME's guides, applications and games, paired block by block",
}


def corpus_section(manifest: dict, tcfg: dict) -> str:
    counts = manifest.get("counts", {})
    train = counts.get("train", {})
    kinds = [k for k in CORPUS_KINDS if any(c.get(k) for c in train.values())]
    rows = "\n".join(f"| {pair} | {c.get('pairs', 0):,} | " + " | ".join(f"{c.get(k, 0):,}" for k in kinds) + " |"
                     for pair, c in sorted(train.items()))
    releases = ", ".join(f"{r['codename']} {r['version']}" for r in manifest.get("archive", {}).get("releases", []))
    sources = [text for key, text in CORPUS_SOURCES.items()
               if key in manifest.get("sources", {}) and any((manifest["sources"][key] or {}).get(f) for f in ("packages", "paired_descriptions"))]
    sources = sources or [CORPUS_SOURCES["ddtp"], CORPUS_SOURCES["catalogs"]]
    held_out = _listing([f"`{name}`" for name, pairs in counts.items()
                         if name != "train" and any(c.get("pairs") for c in pairs.values())] or ["`eval`"])
    by_entry = {"dictionaries": "a dictionary's lines", "help": "help pages"}  # sources held out entry by entry
    entries = [text for key, text in by_entry.items() if CORPUS_SOURCES[key] in sources]
    about = textwrap.fill(
        f"`{manifest['name']}`, built by `nmt-corpus` from Debian's archive ({releases}) through apt only: "
        f"{_listing(sources, '; ' if len(sources) > 2 else ', ')}. Its manifest lists every source package, version "
        f"and license field and what each filter dropped. Packages whose name's SHA-1 hex digest ends in `0` are held "
        f"out of training (the {held_out} sets){', and so are some of ' + ' and '.join(entries) if entries else ''}.", width=105)
    licenses = textwrap.fill(
        "Licenses: the descriptions are Debian main's (DFSG-free) with translations contributed through DDTP; each "
        f"catalog{', dictionary' if 'dictionary' in kinds else ''}{' and help page' if 'help' in kinds else ''} carries "
        "its program's license.", width=105)
    return f"""
{about}

| pair | training pairs | {" | ".join(CORPUS_KINDS[k] for k in kinds)} |
| --- | --- | {" | ".join("---" for _ in kinds)} |
{rows}

Used here: `{tcfg.get('pair_data')}`, directions {tcfg.get('pair_directions', 'all')}, pairs weighted by
origin `{tcfg.get('pair_weights') or 'none'}`{f" (Multi30k's x{tcfg['multiway_weight']:g})" if tcfg.get('multiway_weight', 1) != 1 else ""}, sentences over {tcfg.get('max_sentence_tokens')} pieces
left out, {tcfg.get('pair_valid_lines')} pairs per corpus kept apart for validation (the mean greedy BLEU
over Multi30k's and these sets selects checkpoints).
{licenses}
"""


def _listing(items: list[str], separator: str = ", ") -> str:
    """"a", "a and b", "a, b and c" (separator between all but the last two)."""
    return items[0] if len(items) == 1 else f"{separator.join(items[:-1])} and {items[-1]}"


def render_card(directory: Path, payload: dict, rows: list[dict], hardware: str) -> str:
    cfg = payload["model"]
    meta = payload.get("metadata", {})
    training = meta.get("training", {})
    tcfg = training.get("config", {})
    src, tgt = payload["source_lang"], payload["target_lang"]
    params = Translator.load(directory, device="cpu").num_parameters()
    table = "\n".join(score_row(r, r["split"]) for r in rows)
    hours = training.get("train_seconds", 0) / 3600
    return f"""# {src}->{tgt} Transformer, Multi30k

Translates {LANGUAGE_NAMES.get(src, src)} image captions into {LANGUAGE_NAMES.get(tgt, tgt)}.
Trained from scratch with this project's pipeline (`python -m nmt_serve.training.train`).

## Scores

sacreBLEU, cased, detokenized output, one reference. Measured with `python -m nmt_serve.training.model_card`.
"Linear layers" int8 is the `--quantization int8` option (CPU): faster, at the cost shown here.

| split | search | Linear layers | BLEU | chrF | outputs > 3x source |
| --- | --- | --- | --- | --- | --- |
{table}

{signatures(rows)}

## Data

Multi30k task 1 (Elliott et al., 2016), raw cased text: `train` (29,000 sentence pairs) for the
tokenizer and the model, `val` (1,014) for model selection, `test_2016_flickr` (1,000) for the
reported score. Partly derived from Flickr30K: for non-commercial research and educational use.

## Model

| | |
| --- | --- |
| architecture | {architecture(cfg)} |
| parameters | {params:,} |
| vocabulary | joint sentencepiece {tcfg.get('spm_type', 'bpe')}, {cfg['src_vocab_size']} pieces, shared embeddings tied to the output layer |
| weights | float16 safetensors |

## Training

| | |
| --- | --- |
| steps / epochs | {training.get('steps', '?')} / {training.get('epochs', '?')} |
| batch | {tcfg.get('max_tokens', '?')} padded tokens |
| optimizer | Adam (0.9, 0.98), peak lr {tcfg.get('lr', '?')}, {tcfg.get('warmup_steps', '?')} warmup steps, {schedule(tcfg)} |
| regularization | dropout {cfg['dropout']}, label smoothing {tcfg.get('label_smoothing', '?')}, gradient clipping {tcfg.get('clip_norm', '?')} |
| checkpoint | {checkpoint_row(meta)} |
| training time | {hours:.2f} h on {hardware}, {training.get('threads', '?')} thread(s) |

## Limitations

Multi30k is small and narrow: short descriptions of photos. Expect good output on such sentences and
poor output on news, dialogue, technical text or long sentences. Names and rare words are split into
sentencepiece pieces and may be transliterated oddly.
{speed_section(payload)}{flags_section(payload)}"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nmt-model-card", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--data", type=Path, help="directory with {val,test_2016_flickr}.{lang}.gz (to measure)")
    parser.add_argument("--beam-sizes", default="1,4")
    parser.add_argument("--quantizations", default="none,int8", help="comma-separated: none, int8")
    parser.add_argument("--hardware", default=f"{platform.machine()} CPU")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--notes", type=Path, help="a markdown file put after the card's introduction (a model's status, "
                        "caveats): kept when the card is measured again")
    parser.add_argument("--render-only", action="store_true", help="write the card from the scores config.json holds")
    parser.add_argument("--pair-tests", action="append", default=[], metavar="NAME=PATTERN",
                        help="a pairwise held-out test set to measure too, e.g. "
                             "debian-v1/eval-short=corpora/debian-v1/eval-short.{pair}.{lang} (repeatable)")
    parser.add_argument("--splits", default=",".join(SPLITS.values()), help="Multi30k splits to measure")
    parser.add_argument("--directions", help="comma-separated directions to measure (default: every one the model serves; "
                        "for a model named by its own codes, such as NLLB-200, those between the languages the test files hold)")
    parser.add_argument("--pivot", default="en", help="the language non-English directions are also measured through ('' for none)")
    parser.add_argument("--keep-scores", action="store_true",
                        help="add the rows measured now to those recorded (same direction, split, beam replaced)")
    parser.add_argument("--speed", metavar="DIRECTION", help="also time the model in this direction on the first "
                        "--speed-sentences of test_2016_flickr (one sentence greedy; 32 at a time beam 4) at --threads")
    parser.add_argument("--speed-sentences", type=int, default=200)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    beam_sizes = [int(b) for b in args.beam_sizes.split(",")]
    info = read_info(args.model)
    multilingual = info.multilingual
    config_path = args.model / CONFIG_FILE
    payload = json.loads(config_path.read_text())
    if args.render_only:
        rows = payload.get("metadata", {}).get("scores")
        if not rows:
            parser.error(f"{config_path} holds no scores: measure them first (leave out --render-only)")
    else:
        if args.data is None and args.splits:
            parser.error("--data is needed to measure the Multi30k scores (or --splits '' for none)")
        pair_tests = {}
        for item in args.pair_tests:
            name, sep, pattern = item.partition("=")
            if not sep or "{pair}" not in pattern or "{lang}" not in pattern:
                parser.error(f"--pair-tests {item}: expected NAME=PATTERN with {{pair}} and {{lang}}")
            pair_tests[name] = pattern
        rows = []
        splits = [s for s in args.splits.split(",") if s]
        chosen = [d.strip() for d in args.directions.split(",") if d.strip()] if args.directions else None
        try:
            directions = plan_directions(info.served(), info.language_codes, args.data, splits, pair_tests, chosen)
        except ValueError as e:
            fail(parser, str(e))
        # each row kept as it is measured: a run cut short resumes with the same settings (measured_rows.py)
        kept = MeasuredRows(args.model, dict(data=str(args.data), beam_sizes=beam_sizes, quantizations=args.quantizations,
                                             directions=directions, pair_tests=pair_tests, pivot=args.pivot))
        for quantization in args.quantizations.split(","):
            translator = Translator.load(args.model, device="cpu", quantization=quantization)
            rows += (measure_directions(translator, args.data, beam_sizes, pivot=args.pivot, pair_tests=pair_tests,
                                        directions=directions, kept=kept)
                     if multilingual else measure(translator, args.data, beam_sizes, pair_tests=pair_tests, splits=splits, kept=kept))
        if args.keep_scores:
            fresh = {row_key(r) for r in rows}
            rows = [r for r in payload.get("metadata", {}).get("scores", []) if row_key(r) not in fresh] + rows
        payload.setdefault("metadata", {})["scores"] = rows
        if args.speed:
            if args.data is None:
                parser.error("--speed reads test_2016_flickr from --data")
            translator = Translator.load(args.model, device="cpu")
            source, target = args.speed.split("-")
            sentences = read_lines(args.data / f"test_2016_flickr.{source}.gz")[: args.speed_sentences]
            speed = measure_speed(translator, sentences, target_lang=target if multilingual else None,
                                  source_lang=source if multilingual else None, threads=args.threads or 1)
            payload["metadata"]["speed"] = {"direction": args.speed, "split": "test_2016_flickr", "hardware": cpu_name(), **speed}
            print(f"speed: {payload['metadata']['speed']}")
        config_path.write_text(json.dumps(payload, indent=2) + "\n")
    converted = payload.get("metadata", {}).get("imported_from")
    if converted:
        card = render_converted_card(args.model, payload, rows, speed_section(payload) + flags_section(payload))
    else:
        card = (render_multilingual_card if multilingual else render_card)(args.model, payload, rows, args.hardware)
    if args.notes:
        # after the introduction, before the first section
        intro, heading, sections = card.partition("\n## ")
        card = f"{intro.rstrip()}\n\n{args.notes.read_text().strip()}\n{heading}{sections}"
    (args.model / "README.md").write_text(card)
    if not args.render_only:
        kept.done()
    print(f"wrote {args.model / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
