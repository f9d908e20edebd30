"""Which language a text is in, offline (lingua ships its n-gram models inside the wheel).

Two lingua detectors, built once per set of served source languages (`detector_for` is cached, so each
API worker process holds one pair), and py3langid as a second opinion before a text is called unserved:

- `detect()`: high-accuracy mode (1- to 5-gram models) over the served languages only. Among few
  languages those models are what tells short texts apart: over de/en/fr/cs, low-accuracy mode (trigrams
  only) called "The cat sleeps on the sofa." German; on 40 short sentences (1-8 words) of those four
  languages high-accuracy mode got 39 right, low-accuracy mode 38.
- `identify()`: low-accuracy mode over WIDE (31 widely written languages) plus the served ones, to name
  a language that no model serves ("this looks Spanish"), which the translation path refuses. On 90
  short sentences in 9 languages, high-accuracy mode over 27 of these languages got 89 right against 82
  for low-accuracy mode, but it costs about 450 MB more per worker (over all 75 of lingua's languages,
  about 900 MB against 80 MB). Low-accuracy mode is confidently wrong on the shortest texts ("Hello
  world": Vietnamese 0.95), so identify() answers only when it is sure: confidence >= NAMING_CONFIDENCE;
  a served language only when the high-accuracy detector agrees; an unserved one only from
  NAMING_MIN_LETTERS letters on and when the high-accuracy detector is not all but certain
  (SERVED_CERTAIN) of a served language. On those 90 sentences and 30 more (the tests'), nothing was
  named wrong, with de/en served (64 named, the rest None) or de/en/fr/cs (75 named); in particular no
  text in a served language was named an unserved one.

Many served languages (a converted NLLB-200 or M2M100: the 75 lingua knows) make the high-accuracy detector
costly: measured on this project's 2-core VM over all 75, it took 7.8 s to build, +1240 MB RSS per API
process and 4-5 ms a sentence of detect() (which holds the GIL), against 0.2 s, +36 MB and 1.3-1.7 ms in
low-accuracy mode. Top-1 of detect() over the first 1000 sentences of each Multi30k test_2016_flickr file, high
against low: de 1000 / 989, en 999 / 959, fr 1000 / 988, cs 990 / 935; language_detection.tsv 60 / 50 of 66,
everyday_sentences.tsv 54 / 44 of 55. (A two-stage try, high accuracy among low accuracy's five best, kept
high's accuracy but loaded models for 512 different candidate sets over 6,000 sentences: +1000 MB all the
same.) Low accuracy's errors are texts translated by the wrong model (1 in 25 English captions), so high
accuracy stays the default whatever the number of languages, and `accuracy="low"` (the setting
language_detection_accuracy) is for a deployment that would rather keep the memory.

Short texts and languages no model serves: among two served languages the high-accuracy detector is
sure of anything ("Hallo": English 0.87, "¿Dónde está la biblioteca? Necesito un libro.": English 0.96),
and low-accuracy mode over WIDE confuses neighbours below about 40 letters (that Spanish sentence, 36
letters: Romanian 0.91). So detect()'s confidence is P(language | served) x P(served), the second from
the wide detector (a short or foreign text whose letters fit other languages as well gets little: below
SURE_CONFIDENCE it is a guess), and identify() names an unserved language only from NAMING_SURE_LETTERS
letters on, below that (from NAMING_MIN_LETTERS) answering UNDETERMINED: in none of the served languages.
On tests/fixtures/language_detection.tsv (66 greetings and sentences: 40 in de and en, 26 in 11 unserved
languages), counting as right a served text given its language and an unserved one given an unserved
verdict (named rightly or UNDETERMINED), nothing, or a served guess below SURE_CONFIDENCE: 51 of 66
before (13 unserved greetings and short sentences given de or en at 0.52-0.96, the Spanish sentence called
Romanian, "Hallo" English at 0.87), 65 of 66 after ("Hallo" still English, now at 0.14).

A second opinion before a text is called unserved: lingua alone refused short everyday English. "A man
and a dog run in the park." came out UNDETERMINED (0.83) with de/en/fr/cs served: the wide detector says
Danish 0.78, and even the high-accuracy detector over de/en/fr/cs/da ties Danish 0.321 and English 0.320.
So before identify() names an unserved language or answers UNDETERMINED it asks py3langid (0.4.0, a
maintained fork of langid.py: naive Bayes over byte n-grams, 140 languages, trained on other texts than
lingua's; its model is in the wheel): when that ranks a served language first (strictly before the
next), identify() answers None and detect() picks among the served languages (for that sentence: English,
0.88 from py3langid). py3langid is asked over all of its languages, not only over WIDE and the served ones:
restricted, it gave the same answers for texts in served languages, but let through, as a served language,
1 (de/en served) and 5 (de/en/fr/cs) of 22 short sentences in languages outside WIDE (Welsh, Slovene,
Croatian, Latvian, Maltese; Catalan, Luxembourgish and the others stayed refused) that it names rightly
when it sees all of them. Texts in a served language refused as unserved (kind "unserved" in the tests'
verdict), before and after, with the first N sentences of Multi30k's test_2016_flickr (image captions,
3-34 words; read from the shared data, not in the repository) and tests/fixtures/everyday_sentences.tsv:

| served      | texts                                   | refused before               | after  |
|-------------|-----------------------------------------|------------------------------|--------|
| de, en      | Multi30k en, de: 100 each               | 1 (de)                       | 0      |
| de, en      | Multi30k en, de: 1000 each              | 19 (15 en, 4 de)             | 0      |
| de,en,fr,cs | Multi30k en, de, fr, cs: 100 each       | 4 (1 de, 3 cs)               | 1 (cs) |
| de,en,fr,cs | Multi30k en, de, fr, cs: 1000 each      | 30 (13 en, 4 de, 4 fr, 9 cs) | 1 (cs) |
| de, en      | everyday_sentences.tsv: 20 en, 20 de    | 3 (2 en, 1 de)               | 0      |
| de,en,fr,cs | everyday_sentences.tsv: 20 en, 20 de    | 3 (2 en, 1 de)               | 0      |

(the one left: "Muž griluje vzadu na dvorku.", which py3langid calls Slovak 0.33, Czech 0.27). Texts no
model serves stayed refused as often as before: with de/en served, 1949 of the 2000 fr and cs Multi30k
sentences (195 of the first 200), 12 of the 26 unserved texts of tests/fixtures/language_detection.tsv,
all 15 unserved sentences of everyday_sentences.tsv (also with de/en/fr/cs served), and 35 of 41 short
sentences in 31 unserved languages written for the measurement (33 of 41 with de/en/fr/cs served);
language_detection.tsv still scores 65 of 66 (with de/en and with de/en/fr/cs served).

Measured on the 2-core CPU machine this was written on, shared with other work (load average about 5,
so the load times varied by 2x between runs), lingua-language-detector 2.1.1; RSS of one Python
process, both detectors:

| served      | models    | load      | RSS added   | detect, 5-80 characters | identify, 5-80 characters |
|-------------|-----------|-----------|-------------|-------------------------|---------------------------|
| de, en      | preloaded | 1.6-2.4 s | +93-101 MB  | 0.04-0.06 ms median     | 0.20-0.25 ms median       |
| de, en      | lazy      | 2.0 s     | +105 MB     | the same once loaded    | the same once loaded      |
| de,en,fr,cs | preloaded | 2.7-5.9 s | +173-179 MB | 0.05-0.12 ms median     | 0.19-0.35 ms median       |
| de,en,fr,cs | lazy      | 3.6 s     | +179 MB     | the same once loaded    | the same once loaded      |

Loading holds the GIL (a thread ticking every 5 ms in the same process stalled for 1.2-4.7 s while
another loaded), so loading on a background thread would not spare the event loop. Preloading is
chosen: the whole cost is paid once, when `detector_for` builds the pair (best when the models are first
known, before readiness, so that no request waits for it), where lazy loading costs about the same
memory and stalls the event loop again whenever a text brings a language or script whose models are
not loaded yet.

py3langid (0.4.0) adds, measured on a 2-core machine (load average about 2): 0.5-0.6 s to building the
detectors, and about 100 MB RSS (its model alone holds 74 MB: 28 MB of n-gram weights, 39 MB of its
tokenizer's automaton), once per process: its model is loaded once and shared by every detector (`_langid`), where lingua's are
per detector (de/en served: +88-89 MB before, +187-188 MB after; de/en/fr/cs: +169-207 MB before,
+267-299 MB after). identify() on texts of 5-80 characters: 0.10-0.14 ms median before and after over
120 texts (both fixture files); over the 35-40 of them in unserved languages (those that reach the
second opinion), 0.12-0.14 ms median before, 0.20-0.24 ms after.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from lingua import ConfidenceValue, Language
    from py3langid.langid import LanguageIdentifier

log = logging.getLogger("nmt_serve.text.language_detection")

# widely written languages whose texts a user may well send; the rarer ones of lingua's 75 mostly add
# confusions in low-accuracy mode (short French named Tagalog, short English Sesotho)
WIDE = ("en", "de", "fr", "es", "it", "pt", "nl", "pl", "cs", "sk", "sv", "da", "nb", "fi", "tr", "ro", "hu", "el",
        "ru", "uk", "bg", "ja", "zh", "ko", "ar", "he", "hi", "fa", "vi", "id", "th")
NAMING_CONFIDENCE = 0.7
SERVED_CERTAIN = 0.999
# low-accuracy mode is confidently wrong on the shortest texts ("Hello world": Vietnamese 0.95, "Hallo
# Welt": Finnish 0.72), so a text is called unserved only from this many letters on
NAMING_MIN_LETTERS = 20
# ... and the unserved language is named only from this many: below, trigrams still mix up neighbours
# ("¿Dónde está la biblioteca? Necesito un libro.", 36 letters: Romanian 0.91, Spanish 0.07), so such a
# text is "in a language no model serves" (UNDETERMINED) without a name
NAMING_SURE_LETTERS = 40
# py3langid's codes where they differ from lingua's ISO 639-1 ones (Norwegian Bokmål)
LANGID_CODES = {"nb": "no"}
UNDETERMINED = "und"  # ISO 639-2's "undetermined": not a served language, not sure which
# below this a detection is a guess ("not sure"): a short text the wider view gives to other languages
# ("Hallo": English 0.87 among de/en, but Finnish 0.52 and English 0.11 among all)
SURE_CONFIDENCE = 0.5
# a text is judged by its beginning: lingua holds the GIL, and a whole 20,000-character text held the
# event loop for 25 ms (detect) and 67 ms (identify), its first 1000 characters, which tell the
# language as well, for 0.7 and 5.7 ms
SAMPLE_CHARS = 1000
ACCURACIES = ("high", "low")  # lingua's mode for the served languages' detector (see the docstring: many languages)


@dataclass(frozen=True)
class Detection:
    language: str  # ISO 639-1 code, e.g. "de"
    confidence: float  # 0..1


def lingua_language(code: str) -> Language | None:
    # lingua is imported where it is used: a service with detection off (Settings.language_detection)
    # runs without the package (a GPU image may lack its 170 MB wheel)
    from lingua import IsoCode639_1, Language

    try:
        return Language.from_iso_code_639_1(IsoCode639_1.from_str(code))
    except ValueError:
        return None


def language_name(code: str) -> str:
    """The English name of a language code ("es" -> "Spanish"), the code itself when lingua does not know
    it (or is not installed: a service with detection off may run without it)."""
    if code == UNDETERMINED:
        return "an undetermined language"
    try:
        language = lingua_language(code)
    except ImportError:
        return code
    return language.name.title().replace("_", " ") if language is not None else code


def _code(language: Language) -> str:
    return language.iso_code_639_1.name.lower()


def _sample(text: str) -> str:
    if len(text) <= SAMPLE_CHARS:
        return text
    cut = text.rfind(" ", 0, SAMPLE_CHARS)
    return text[: cut if cut > SAMPLE_CHARS // 2 else SAMPLE_CHARS]


def _ranked(values: list[ConfidenceValue]) -> list[Detection]:
    # all zeros: no letters lingua could weigh (empty, digits, punctuation)
    return [Detection(_code(v.language), float(v.value)) for v in values if v.value > 0]


@lru_cache(maxsize=1)
def _langid() -> LanguageIdentifier:
    """py3langid's model (in its wheel), loaded once per process and shared by every detector: it is
    never restricted (set_languages), so one copy serves any set of served languages."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


_PRELOADING = threading.Lock()
_preloaded = False


def preload() -> None:
    """Load the models every detector shares, whatever the served languages: py3langid's and lingua's
    trigram models of WIDE (lingua keeps a loaded model for every later detector of the process). The API
    process runs this at start-up beside the engine's own loading, so that once the engine names the
    served languages only their high-accuracy models are left to load: here 0.33 s of the 1.25 s a de/en
    detector took from nothing, which readiness waited for after the engine's."""
    global _preloaded
    from lingua import LanguageDetectorBuilder

    with _PRELOADING:
        if not _preloaded:
            _langid()
            wide = [lingua_language(c) for c in WIDE]
            LanguageDetectorBuilder.from_languages(*wide).with_low_accuracy_mode().with_preloaded_language_models().build()
            _preloaded = True


class LanguageDetector:
    def __init__(self, served: Iterable[str], accuracy: str = "high"):
        """accuracy: the served languages' detector in lingua's high- or low-accuracy mode."""
        from lingua import LanguageDetectorBuilder

        if accuracy not in ACCURACIES:
            raise ValueError(f"accuracy must be one of {', '.join(ACCURACIES)}, not {accuracy!r}")

        preload()  # (at once when done; a preload under way is waited for, not repeated)
        served = sorted(set(served))
        unknown = [c for c in served if lingua_language(c) is None]
        if unknown:
            # (a converted NLLB-200 has 127 such codes: the line names a few)
            log.warning("no language detection for %d of the served languages, unknown to lingua: %s%s", len(unknown),
                        ", ".join(unknown[:12]), ", ..." if len(unknown) > 12 else "")
        self.served = tuple(c for c in served if c not in unknown)
        languages = [lingua_language(c) for c in self.served]
        self.high_accuracy = accuracy == "high"
        wide = {lingua_language(c) for c in WIDE} | set(languages)
        self._wide = LanguageDetectorBuilder.from_languages(*wide).with_low_accuracy_mode().with_preloaded_language_models().build()
        if not languages:
            self._served = None
        elif self.high_accuracy:
            self._served = LanguageDetectorBuilder.from_languages(*languages).with_preloaded_language_models().build()
        elif set(languages) == wide:  # every widely written language served: the wide detector is this one
            self._served = self._wide
        else:
            self._served = LanguageDetectorBuilder.from_languages(*languages).with_low_accuracy_mode().with_preloaded_language_models().build()
        self._second = _langid()
        # the served languages under py3langid's codes ("nb" is its "no"); one it does not know is never its answer
        self._second_served = frozenset(LANGID_CODES.get(c, c) for c in self.served) & set(self._second.labels)

    def _among_served(self, sample: str) -> list[Detection]:
        """The high-accuracy detector's view: which served language, if it is one (sums to 1)."""
        return _ranked(self._served.compute_language_confidence_values(sample)) if self._served is not None else []

    def _wide_view(self, sample: str) -> list[Detection]:
        return _ranked(self._wide.compute_language_confidence_values(sample))

    def _second_opinion_served(self, sample: str) -> bool:
        """Whether py3langid (naive Bayes over byte n-grams, trained on other texts than lingua's models)
        ranks a served language first among all of its 140 languages (strictly: a tie, or a text without
        any of its features, where every language scores the same, is no served answer)."""
        first, second = self._second.rank(sample)[:2]
        return first[0] in self._second_served and first[1] > second[1]

    def detect(self, text: str) -> list[Detection]:
        """The served languages the text may be in, best first; empty when the text has nothing to tell
        languages apart by. Each confidence is P(language | served) from the high-accuracy detector times
        P(served) from the wide one: a long text in a served language keeps ~1, and a short or foreign
        one whose letters fit other languages as well gets little (below SURE_CONFIDENCE: not sure)."""
        sample = _sample(text)
        ranked = self._among_served(sample)
        if not ranked:
            return []
        served = sum(d.confidence for d in self._wide_view(sample) if d.language in self.served)
        return [Detection(d.language, d.confidence * served) for d in ranked]

    def identify(self, text: str) -> Detection | None:
        """The text's language among WIDE and the served ones, UNDETERMINED for one no model serves
        when it is too short to name, or None when unsure."""
        sample = _sample(text)
        ranked = self._wide_view(sample)
        if not ranked:
            return None
        found = ranked[0]
        served = self._among_served(sample)
        if found.language in self.served:
            sure = found.confidence >= NAMING_CONFIDENCE
            return found if sure and served and served[0].language == found.language else None
        letters = sum(c.isalpha() for c in sample)
        unserved = sum(d.confidence for d in ranked if d.language not in self.served)
        if letters < NAMING_MIN_LETTERS or unserved < NAMING_CONFIDENCE:
            return None
        # with one served language its detector is certain of any text, so it cannot contradict
        if len(self.served) > 1 and served and served[0].confidence >= SERVED_CERTAIN:
            return None
        # nor when a second, independent detector puts a served language first ("A man and a dog run in the
        # park.": lingua's wide detector says Danish 0.78, py3langid English 0.88)
        if self._second_opinion_served(sample):
            return None
        if found.confidence >= NAMING_CONFIDENCE and letters >= NAMING_SURE_LETTERS:
            return found
        return Detection(UNDETERMINED, unserved)


@lru_cache(maxsize=4)
def detector_for(served: frozenset[str], accuracy: str = "high") -> LanguageDetector:
    return LanguageDetector(served, accuracy)
