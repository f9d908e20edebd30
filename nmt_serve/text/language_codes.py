"""Naming a language across model families: ISO 639-1 (`de`, what users, LibreTranslate's clients and
language detection use), NLLB-200's ISO 639-3 + script (`deu_Latn`), mBART-50's locale (`de_DE`) and
M2M100's (`de`). A model keeps its own codes; these give each one the ISO 639-1 name by which users may
call it too, for the languages lingua knows (the ones detection can find). Their ISO 639-3 codes are kept
here rather than asked of lingua, so that loading a model needs none of it (a GPU image may lack its
170 MB wheel) and names it the same with or without it."""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

MBART = re.compile(r"([a-z]{2})_[A-Z]{2}")  # de_DE
NLLB = re.compile(r"([a-z]{3})_[A-Z][a-z]{3}")  # deu_Latn
ISO_639_3 = {  # ISO 639-3: ISO 639-1, lingua's languages (tests/unit/test_language_codes.py holds it to lingua's table)
    "afr": "af", "ara": "ar", "aze": "az", "bel": "be", "ben": "bn", "bos": "bs", "bul": "bg", "cat": "ca", "ces": "cs", "cym": "cy",
    "dan": "da", "deu": "de", "ell": "el", "eng": "en", "epo": "eo", "est": "et", "eus": "eu", "fas": "fa", "fin": "fi", "fra": "fr",
    "gle": "ga", "guj": "gu", "heb": "he", "hin": "hi", "hrv": "hr", "hun": "hu", "hye": "hy", "ind": "id", "isl": "is", "ita": "it",
    "jpn": "ja", "kat": "ka", "kaz": "kk", "kor": "ko", "lat": "la", "lav": "lv", "lit": "lt", "lug": "lg", "mar": "mr", "mkd": "mk",
    "mon": "mn", "mri": "mi", "msa": "ms", "nld": "nl", "nno": "nn", "nob": "nb", "pan": "pa", "pol": "pl", "por": "pt", "ron": "ro",
    "rus": "ru", "slk": "sk", "slv": "sl", "sna": "sn", "som": "so", "sot": "st", "spa": "es", "sqi": "sq", "srp": "sr", "swa": "sw",
    "swe": "sv", "tam": "ta", "tel": "te", "tgl": "tl", "tha": "th", "tsn": "tn", "tso": "ts", "tur": "tr", "ukr": "uk", "urd": "ur",
    "vie": "vi", "xho": "xh", "yor": "yo", "zho": "zh", "zul": "zu",
}


@lru_cache(maxsize=4096)
def iso_639_1(code: str) -> str | None:
    """The ISO 639-1 code a model's language code names, or None when there is none (or lingua does
    not know the language)."""
    if re.fullmatch(r"[a-z]{2}", code):
        return code
    if m := MBART.fullmatch(code):
        return m.group(1)
    if m := NLLB.fullmatch(code):
        return ISO_639_3.get(m.group(1))
    return None


def iso_aliases(codes: Iterable[str]) -> dict[str, str]:
    """{ISO 639-1 name: the model's code} for the codes whose ISO 639-1 name no other code of the model
    shares (NLLB's `zho_Hans` and `zho_Hant` are both Chinese: each keeps only its own code)."""
    named = {code: iso_639_1(code) for code in codes}
    counts = Counter(iso for iso in named.values() if iso)
    return {iso: code for code, iso in named.items() if iso and counts[iso] == 1 and iso != code}


def public_names(codes: Iterable[str]) -> dict[str, str]:
    """{a model's code: how the service names its language}: the ISO 639-1 code where the language has one
    of its own in that model (iso_aliases), else the model's code (`deu_Latn` -> `de`, `ace_Arab` stays).
    The engine, the API and the model card name a code-named model's directions by it, so that it competes
    for `de-fr` with the models that name it so and its scores are recorded under the names routing reads."""
    codes = list(codes)
    iso_of = {code: iso for iso, code in iso_aliases(codes).items()}
    return {code: iso_of.get(code, code) for code in codes}


def public_directions(directions: Iterable[str], codes: Iterable[str] | None) -> list[str]:
    """Directions between a model's codes ("deu_Latn-fra_Latn") as the service names them ("de-fr"); a model
    without codes (None) names them so already."""
    if not codes:
        return list(directions)
    names = public_names(codes)
    return [f"{names.get(s, s)}-{names.get(t, t)}" for s, t in (d.split("-", 1) for d in directions)]


def direction_names(directions: list[str], codes: Iterable[str] | None) -> dict[str, str]:
    """{a direction as the model or the service names it: the service's name} (what a tool's --directions takes)."""
    public = public_directions(directions, codes)
    return {**dict(zip(directions, public)), **{name: name for name in public}}


def bcp47(language: str) -> str:
    """A BCP 47 tag for a language the service names: `en` -> `en`, `pt_BR` -> `pt-BR`, `fra_Latn` -> `fr`."""
    if "_" in language and len(language.split("_")[1]) == 2:  # a locale, as mBART's de_DE
        primary, region = language.split("_", 1)
        return f"{primary}-{region}"
    return iso_639_1(language) or language.replace("_", "-")
