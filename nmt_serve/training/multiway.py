"""One model, many directions: the target language is a token put before the source.

The encoder input of a multilingual model starts with a tag naming the language to translate into
(`<2fr> A dog runs .</s>`, as Johnson et al., 2017 do), so sentences of different directions share
one batch and the decoder needs nothing per row. Training data is multi-way parallel text: files
`train.{lang}.gz` whose lines are translations of each other, one pair per direction and line.
"""
from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from itertools import permutations
from pathlib import Path

from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.training.data import ParallelData, read_lines

log = logging.getLogger("train")  # the run's log (train.py writes it to train.log)

TAG_FORMAT = "<2{}>"
# the languages of the shipped models (Multi30k's), by ISO 639-1 code
LANGUAGE_NAMES = {"cs": "Czech", "de": "German", "en": "English", "fr": "French"}


def target_tag(language: str) -> str:
    return TAG_FORMAT.format(language)


def parse_languages(spec: str) -> list[str]:
    """"en,de,fr" -> ["en", "de", "fr"], in the given order, each once."""
    languages = [s.strip() for s in spec.split(",") if s.strip()]
    if len(languages) < 2 or len(set(languages)) != len(languages):
        raise ValueError(f"languages {spec!r}: name two or more different languages, comma-separated")
    return languages


def parse_directions(spec: str, languages: list[str]) -> list[tuple[str, str]]:
    """"all" -> every ordered pair of languages; "en-de,de-en" -> those pairs (each of known languages)."""
    if spec.strip() in ("", "all"):
        return list(permutations(languages, 2))
    directions = []
    for item in spec.split(","):
        src, sep, tgt = item.strip().partition("-")
        if not sep or src not in languages or tgt not in languages or src == tgt:
            raise ValueError(f"direction {item.strip()!r}: expected SRC-TGT of two different languages among {languages}")
        directions.append((src, tgt))
    return list(dict.fromkeys(directions))


def read_multiway(pattern: str, languages: list[str]) -> dict[str, list[str]]:
    """{lang: lines} from a path pattern with `{lang}`; every file must have the same number of lines."""
    if "{lang}" not in pattern:
        raise ValueError(f"{pattern!r}: a multilingual data path needs {{lang}} where the language code goes")
    texts = {lang: read_lines(pattern.format(lang=lang)) for lang in languages}
    counts = {lang: len(lines) for lang, lines in texts.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"{pattern}: the languages' files differ in length {counts}; they must be line-aligned")
    return texts


def target_tags(languages) -> dict[str, str]:
    """{lang: its tag}, as a checkpoint's config.json records them."""
    return {lang: target_tag(lang) for lang in sorted(languages)}


def tag_ids(tokenizer: Tokenizer, languages: list[str]) -> dict[str, int]:
    """{lang: id of its tag}; the tokenizer must hold every tag as one piece (a user-defined symbol)."""
    return tokenizer.symbol_ids(target_tags(languages))


def multiway_pairs(
    texts: dict[str, list[str]], directions: list[tuple[str, str]], tokenizer: Tokenizer, tags: dict[str, int],
    max_tokens_per_sentence: int | None = None, drop_empty: bool = True,
) -> dict[tuple[str, str], ParallelData]:
    """Per direction its pairs: source = tag of the target + source ids + eos, target = ids + eos. Each
    sentence is tokenized once and shared by the directions that use it."""
    ids = {lang: [tokenizer.encode(line, add_eos=True) for line in lines] for lang, lines in texts.items()
           if any(lang in d for d in directions)}
    out = {}
    for src, tgt in directions:
        src_ids, tgt_ids = [], []
        for s, t, s_text, t_text in zip(ids[src], ids[tgt], texts[src], texts[tgt]):
            if drop_empty and (not s_text.strip() or not t_text.strip()):
                continue
            if max_tokens_per_sentence and max(len(s) + 1, len(t)) > max_tokens_per_sentence:
                continue
            src_ids.append([tags[tgt]] + s)
            tgt_ids.append(t)
        out[(src, tgt)] = ParallelData(src_ids, tgt_ids)
    return out


def concatenate(parts: list[ParallelData]) -> ParallelData:
    return ParallelData([s for p in parts for s in p.src], [t for p in parts for t in p.tgt])


def pair_corpora(
    pattern: str, directions: list[tuple[str, str]], tokenizer: Tokenizer, tags: dict[str, int],
    valid_lines: int = 0, max_tokens_per_sentence: int | None = None, weights: dict[str, float] | None = None,
    seed: int = 1,
) -> tuple[dict[tuple[str, str], ParallelData], dict[tuple[str, str], tuple[ParallelData, list[str]]]]:
    """Pairwise corpora (`train.{pair}.{lang}`, as nmt-corpus writes them) as training pairs of the
    directions they serve, both ways of each pair -> (training data, validation (data, references)) per
    direction. `valid_lines` pairs of each corpus, spread evenly over it so that they come from many
    packages, are kept apart for validation and never trained on. `weights` repeat (or thin out) the
    pairs by their origin's kind, the first column of `train.{pair}.origin` ({"ddtp-short": 3,
    "catalog": 0.5}; a fraction keeps each pair once with that probability, drawn from `seed`)."""
    if "{pair}" not in pattern or "{lang}" not in pattern:
        raise ValueError(f"{pattern!r}: a pair corpus path needs {{pair}} and {{lang}}")
    wanted = set(directions)
    seen: set[str] = set()
    train: dict[tuple[str, str], ParallelData] = {}
    valid: dict[tuple[str, str], tuple[ParallelData, list[str]]] = {}
    for name, (a, b), texts in pair_files(pattern, directions):
        count = len(texts[a])
        held = held_for_validation(count, valid_lines)
        ids = {lang: [tokenizer.encode(line, add_eos=True) for line in lines] for lang, lines in texts.items()}
        copies = origin_copies(Path(pattern.format(pair=name, lang="origin")), count, weights, seed, seen) if weights else None
        for src, tgt in ((a, b), (b, a)):
            if (src, tgt) not in wanted:
                continue
            parts = {False: ParallelData([], []), True: ParallelData([], [])}
            refs = []
            for i, (s, t) in enumerate(zip(ids[src], ids[tgt])):
                if not texts[src][i].strip() or not texts[tgt][i].strip():
                    continue
                part = parts[i in held]
                if i in held:
                    refs.append(texts[tgt][i])
                elif max_tokens_per_sentence and max(len(s) + 1, len(t)) > max_tokens_per_sentence:
                    continue
                for _ in range(1 if i in held or copies is None else copies[i]):
                    part.src.append([tags[tgt]] + s)
                    part.tgt.append(t)
            train[(src, tgt)] = parts[False]
            if held:
                valid[(src, tgt)] = (parts[True], refs)
    warn_unused(weights, seen, pattern)
    return train, valid


def pair_files(pattern: str, directions: list[tuple[str, str]]) -> Iterator[tuple[str, tuple[str, str], dict[str, list[str]]]]:
    """Each pair corpus that serves some of the directions (in either order): its name ("en-de"), its two
    languages (sorted) and their lines, {lang: lines}."""
    for a, b in sorted({tuple(sorted(d)) for d in directions}):
        name = next((f"{x}-{y}" for x, y in ((a, b), (b, a))
                     if Path(pattern.format(pair=f"{x}-{y}", lang=x)).exists()), None)
        if name is None:
            continue
        texts = {lang: read_lines(pattern.format(pair=name, lang=lang)) for lang in (a, b)}
        if len(texts[a]) != len(texts[b]):
            raise ValueError(f"{pattern.format(pair=name, lang='*')}: the two sides differ in length")
        yield name, (a, b), texts


def held_for_validation(count: int, valid_lines: int) -> set[int]:
    """The lines of a pair corpus of `count` kept apart for validation: `valid_lines` of them, spread
    evenly over it (so that they come from many packages)."""
    return set(range(count // (2 * valid_lines), count, max(1, count // valid_lines))[:valid_lines]) if valid_lines else set()


def pair_texts(pattern: str, directions: list[tuple[str, str]], valid_lines: int,
               weights: dict[str, float] | None = None, seed: int = 1) -> list[list[str]]:
    """Every side of the pair corpora that serve the directions, without their validation lines, each line
    as many times as training weighs it (`weights` by origin, as pair_corpora): text to learn a tokenizer
    from beside the multi-way files, in the proportions the model will see."""
    sides = []
    for name, _, texts in pair_files(pattern, directions):
        count = len(next(iter(texts.values())))
        held = held_for_validation(count, valid_lines)
        times = origin_copies(Path(pattern.format(pair=name, lang="origin")), count, weights, seed) if weights else [1] * count
        for lines in texts.values():
            sides.append([line for i, line in enumerate(lines) if i not in held for _ in range(times[i])])
    return sides


def repeated_lines(lines: list[str], weight: float, seed: int) -> list[str]:
    """Every line `weight` times (a fraction: a seeded sample), as `repeated` does with pairs."""
    rng = random.Random(seed)
    return [line for line in lines for _ in range(copies(weight, rng))]


def parse_weights(spec: str) -> dict[str, float]:
    """"ddtp-short=3,catalog=0.5" -> {"ddtp-short": 3.0, "catalog": 0.5}."""
    weights = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        kind, sep, value = item.partition("=")
        try:
            weights[kind.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or weights[kind.strip()] < 0:
            raise ValueError(f"pair weight {item!r}: expected KIND=WEIGHT, a number >= 0")
    return weights


def origin_copies(path: Path, count: int, weights: dict[str, float], seed: int, seen: set[str] | None = None) -> list[int]:
    """How many times each line of a pair corpus is trained on, by the kind of its origin (the first
    tab-separated column of the corpus's `.origin` file; kinds not named weigh 1). `seen` collects the
    kinds found."""
    if not path.exists():
        raise ValueError(f"{path}: pair weights need the corpus's origin file")
    rng = random.Random(seed)
    kinds = [line.split("\t", 1)[0] for line in read_lines(path, entities=False)]
    if len(kinds) != count:
        raise ValueError(f"{path} has {len(kinds)} lines, its corpus {count}")
    if seen is not None:
        seen.update(kinds)
    return [copies(weights.get(kind, 1.0), rng) for kind in kinds]


def warn_unused(weights: dict[str, float] | None, seen: set[str], pattern: str) -> None:
    """A weight for a kind no line of the pair corpora has (a misspelt kind, or a corpus without that source)
    changes nothing: say so."""
    if weights and (unused := sorted(set(weights) - seen)):
        log.warning("pair weights for %s change nothing: no line of %s has that kind (its kinds: %s)",
                    ", ".join(unused), pattern, ", ".join(sorted(seen)) or "none")


def copies(weight: float, rng: random.Random) -> int:
    """How many times one pair of weight `weight` is trained on: its whole part, plus one more with the
    probability of its fraction, so that a corpus's expected size is its weight times its size."""
    return int(weight) + (rng.random() < weight - int(weight))


def repeated(data: ParallelData, weight: float, seed: int) -> ParallelData:
    """Every pair of `data` `weight` times (a fraction: a seeded sample of them)."""
    rng = random.Random(seed)
    out = ParallelData([], [])
    for s, t in zip(data.src, data.tgt):
        for _ in range(copies(weight, rng)):
            out.src.append(s)
            out.tgt.append(t)
    return out
