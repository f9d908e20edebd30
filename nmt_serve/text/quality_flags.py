"""Signals that a translation is doubtful, per sentence, so a client can tell a trustworthy output from
confident nonsense: the shipped models are small and trained on image captions, and given greetings or
chat they answer things like "A morning morning morning morning".

The checks but `detached` are cheap and read only the source and output text (and the engine's truncation
bit and score).
The repetition and length thresholds were set on test_2016_flickr's outputs of the shipped models
(`python -m bench.quality_flags`) so that in-domain translations are almost never flagged. The
low-confidence threshold is calibrated on held-out sentences against nonsense
(`python -m bench.quality_flags --labelled`): the 5th percentile of the mean log-probability per token
that the caption-trained multilingual model (checkpoints/multi30k) gives Multi30k val, measured on test_2016_flickr against the same
sentences garbled (words shuffled, word salad, letters shuffled): precision 0.98, recall 0.70 for de-en
(the -1.0 it replaces: 0.99 and 0.38); the figures are in BENCHMARKS.md. The score and attention
thresholds depend on the model (how sure of itself it is where it was trained), so a model carries its
own (`FlagThresholds`, in its checkpoint's metadata, measured on its validation sentences by `python -m
nmt_serve.training.flag_calibration`); these constants are those of a model that has none. With the
caption model's thresholds the model routed today (checkpoints/debian-multi30k), less sure of itself on
captions, flagged about 12% of clean held-out captions; with its own, 2-2.5% (BENCHMARKS.md, "Quality
flags with each model's own thresholds").

One check reads the model's attention: `detached`, the decoder's cross-attention spread over the whole
source instead of following it (engine/attention_maps.source_entropy), which catches fluent nonsense the
score passes ("Wo ist der Bahnhof?" -> "A train station is at the train station.", -0.62). Its threshold is
calibrated as low_confidence's, at the 99th percentile of held-out in-domain sentences; together they
find 0.785 of the garbled test sentences for de-en and 0.869 for en-de (low_confidence alone: 0.694 and
0.734) at the same precision. The engine's search keeps the number as it translates (a few percent of its
steps), else it costs a forced decoding of the translation (a text changed after translation), so by
default the service checks only where the score is borderline (needs_attention_check).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, fields

REPETITION = "repetition"
LENGTH_RATIO = "length_ratio"
COPIED_SOURCE = "copied_source"
TRUNCATED = "truncated"
SPLIT = "split"
LOW_CONFIDENCE = "low_confidence"
LONG = "long"
DETACHED = "detached"
CONSTRAINT_UNMET = "constraint_unmet"
CONSTRAINT_STRAINED = "constraint_strained"

FLAG_DESCRIPTIONS = {
    REPETITION: "the output repeats a word or phrase, or a letter, in a run: typical of a model out of its domain",
    LENGTH_RATIO: "the output's length is far from what the model gives for a source of this length",
    COPIED_SOURCE: "the output is the source unchanged",
    TRUNCATED: "the output was cut at max_length before the model ended it",
    SPLIT: "the sentence was longer than the model handles well and was translated in pieces",
    LONG: "the sentence is longer than the model handles well (max_sentence_tokens) and was translated whole",
    LOW_CONFIDENCE: "the model was unsure of its words (mean log-probability per token below what 95% of held-out in-domain "
                    "sentences get)",
    DETACHED: "the model's attention was spread over the whole source instead of following it, as when it writes what its "
              "decoder expects rather than a translation (cross-attention entropy above what 99% of held-out in-domain "
              "sentences get)",
    CONSTRAINT_UNMET: "the glossary's terms could not be placed within max_length: this is the translation without them",
    CONSTRAINT_STRAINED: "the glossary's terms are in, but the model could not fit them into its sentence: each cost more "
                         "log-probability against its translation without them than 99% of well-placed terms do",
}

_WORD = re.compile(r"\w+", re.UNICODE)
_LETTER_RUN = re.compile(r"(\w)\1{3,}", re.UNICODE)  # "rabbooooo": four or more of one letter
_NOT_ALNUM = re.compile(r"[\W_]+", re.UNICODE)

# output words / source words on test_2016_flickr (de-en and en-de): 1st-99.9th percentile 0.5-2.0;
# short sources vary more, so a fixed slack in words is allowed as well
MIN_RATIO, MAX_RATIO, SLACK_WORDS = 0.4, 2.2, 3
# mean log-probability per output token (eos included) of the caption-trained multilingual model on Multi30k val
# (500 sentences, beam 4): 5th percentile -0.68 (de-en); 1st -0.83, 10th -0.58. In-domain sentences score
# about -0.3; chat lines the model never saw -0.4 to -1.2 ("Ich heiße Anna und wohne in Berlin." -> "Ich
# seems to be sailing and son in Berlin.": -0.87)
MIN_MEAN_LOGPROB = -0.68
# engine/attention_maps.source_entropy of the caption-trained multilingual model on Multi30k val (500 sentences per
# direction, beam 4, de-en and en-de pooled): 99th percentile 0.734 (de-en alone 0.712, en-de 0.747; 98th
# 0.721). In-domain captions get about 0.6-0.65; detached outputs 0.73-0.89 ("Wo ist der Bahnhof?" -> "A
# train station is at the train station.": 0.86)
MAX_SOURCE_ENTROPY = 0.73
# the attention check runs only below this score (and at or above MIN_MEAN_LOGPROB, which flags on its own):
# 26% (de-en) and 35% (en-de) of in-domain test sentences pay for it, and the recall it adds to
# low_confidence on the labelled set drops only from +0.09 to +0.08 (de-en) and +0.135 to +0.11 (en-de)
ATTENTION_CHECK_BELOW = -0.4
# log-prob given up per glossary term against the free translation (engine: EngineHypothesis.constraint_cost),
# caption-trained multilingual model, beam 4, test_2016_flickr (python -m bench.terminology, "How the terms fit"): caption
# nouns to synonyms it knows ("Mann" -> "guy", placed well) 95th percentile 8.0, 99th 10.0; to words it never saw
# ("hound", "lad": rambling around them) 5th 10.9; function words ("auf" -> "upon") median 11.9
MAX_CONSTRAINT_COST = 10.0


@dataclass(frozen=True)
class FlagThresholds:
    """The thresholds of the flags that read the model's own signals, which differ from model to model."""

    min_mean_logprob: float = MIN_MEAN_LOGPROB  # low_confidence below it: the 5th percentile of in-domain sentences
    max_source_entropy: float = MAX_SOURCE_ENTROPY  # detached above it: the 99th percentile
    attention_check_below: float = ATTENTION_CHECK_BELOW  # the attention is checked from min_mean_logprob up to it

    @classmethod
    def of(cls, recorded: dict | None) -> "FlagThresholds":
        """A model's thresholds from what its checkpoint records (metadata "quality_flags"); the defaults where none."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (recorded or {}).items() if k in names})


DEFAULT_THRESHOLDS = FlagThresholds()


@dataclass(frozen=True)
class SentenceFlags:
    sentence: int  # index of the sentence in its text
    source: str
    text: str
    flags: tuple[str, ...]
    direction: str | None = None  # of a text translated through a pivot language: the hop this sentence is of


def _words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def repeated_run(words: list[str], times: int = 3, longest: int = 4) -> bool:
    """A word or phrase of up to `longest` words said `times` times in a row ("morning morning morning")."""
    for n in range(1, longest + 1):
        # a phrase of n words said `times` times: (times - 1) * n words in a row each equal to the one n further on
        need, run = (times - 1) * n, 0
        for a, b in zip(words, words[n:]):
            run = run + 1 if a == b else 0
            if run >= need:
                return True
    return False


def doubled_word(words: list[str]) -> bool:
    """The same word of 3+ letters twice in a row ("morning morning"): rare in real text in both languages."""
    return any(a == b and len(a) >= 3 and not a.isdigit() for a, b in zip(words, words[1:]))


def _plain(text: str) -> str:
    """The text's letters and digits alone, normalized and case-folded (\\w is isalnum() or "_")."""
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", text).casefold())


def needs_attention_check(mean_logprob: float | None, thresholds: FlagThresholds = DEFAULT_THRESHOLDS) -> bool:
    """Whether a sentence's score is borderline: low enough that the attention check is worth its forced
    decoding, not so low that low_confidence flags it anyway."""
    return mean_logprob is not None and thresholds.min_mean_logprob <= mean_logprob < thresholds.attention_check_below


def flags_for(source: str, output: str, *, truncated: bool = False, split: bool = False, long: bool = False,
              mean_logprob: float | None = None, source_entropy: float | None = None,
              constraint_cost: float | None = None, thresholds: FlagThresholds = DEFAULT_THRESHOLDS) -> tuple[str, ...]:
    """The doubt flags of one translated sentence (empty when none); source_entropy: None when the
    attention was not checked; constraint_cost: where glossary terms were placed, the log-prob given up
    per term; thresholds: the translating model's."""
    found = []
    src, out = _words(source), _words(output)
    if repeated_run(out) and not repeated_run(src) or doubled_word(out) and not doubled_word(src) \
            or _LETTER_RUN.search(output) and not _LETTER_RUN.search(source):
        found.append(REPETITION)
    if src and out:
        ratio = len(out) / len(src)
        if (ratio > MAX_RATIO and len(out) - len(src) > SLACK_WORDS) or (ratio < MIN_RATIO and len(src) - len(out) > SLACK_WORDS):
            found.append(LENGTH_RATIO)
    elif src and not out:
        found.append(LENGTH_RATIO)
    if len(src) >= 2 and _plain(source) == _plain(output):
        found.append(COPIED_SOURCE)
    if truncated:
        found.append(TRUNCATED)
    if split:
        found.append(SPLIT)
    if long:
        found.append(LONG)
    if mean_logprob is not None and mean_logprob < thresholds.min_mean_logprob:
        found.append(LOW_CONFIDENCE)
    if source_entropy is not None and source_entropy > thresholds.max_source_entropy:
        found.append(DETACHED)
    if constraint_cost is not None and constraint_cost > MAX_CONSTRAINT_COST:
        found.append(CONSTRAINT_STRAINED)
    return tuple(found)


def review_note(flags: tuple[str, ...] | list[str]) -> str:
    """What a reviewer reads of a translation's flags: each with what it means."""
    return "Machine translation flagged: " + "; ".join(f"{f} ({FLAG_DESCRIPTIONS[f]})" if f in FLAG_DESCRIPTIONS else f
                                                        for f in flags)
