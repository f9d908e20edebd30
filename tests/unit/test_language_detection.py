"""Language detection (nmt_serve/text/language_detection.py): offline, among the served languages for detect(),
and identify() naming a language no model serves only when it is sure."""
from __future__ import annotations

import pytest

from nmt_serve.text.language_detection import (
    Detection,
    LanguageDetector,
    detector_for,
    language_name,
)

GERMAN = ["Ein Mann fährt mit dem Fahrrad durch die Stadt.", "Zwei Hunde spielen im Schnee.", "Wo ist der Bahnhof?",
          "Kannst du mir bitte helfen?", "Die Kinder spielen im Garten hinter dem Haus."]
ENGLISH = ["A man rides his bicycle through the city.", "Two dogs are playing in the snow.", "Where is the station?",
           "Can you help me, please?", "The children are playing in the garden behind the house."]
FRENCH = ["Un homme traverse la ville à vélo.", "Deux chiens jouent dans la neige.", "Où sont les toilettes ?",
          "Les enfants jouent dans le jardin derrière la maison."]
CZECH = ["Muž jede na kole přes město.", "Dva psi si hrají ve sněhu.", "Kde je nádraží?", "Děti si hrají na zahradě za domem."]
SHORT = {"de": ["Guten Morgen", "Danke schön", "Hallo Welt", "Ich weiß nicht."],
         "en": ["Good morning", "Thank you", "Hello world", "I don't know."]}
SPANISH = ["El perro corre por el parque mientras los niños juegan con la pelota.",
           "Mañana vamos a visitar a nuestros abuelos en el pueblo."]
ITALIAN = ["Il cane corre nel parco mentre i bambini giocano con la palla.",
           "Domani andiamo a trovare i nostri nonni in campagna."]


@pytest.fixture(scope="module")
def de_en() -> LanguageDetector:
    return detector_for(frozenset({"de", "en"}))


@pytest.fixture(scope="module")
def four() -> LanguageDetector:
    return detector_for(frozenset({"de", "en", "fr", "cs"}))


def best(detector: LanguageDetector, text: str) -> str:
    return detector.detect(text)[0].language


def test_german_and_english_sentences(de_en):
    for text in GERMAN:
        assert best(de_en, text) == "de", text
    for text in ENGLISH:
        assert best(de_en, text) == "en", text
    found = de_en.detect(GERMAN[0])
    assert found[0].confidence > 0.9
    assert [d.confidence for d in found] == sorted((d.confidence for d in found), reverse=True)
    assert sum(d.confidence for d in found) == pytest.approx(1.0)


def test_short_texts(de_en):
    for language, texts in SHORT.items():
        for text in texts:
            assert best(de_en, text) == language, text


def test_french_and_czech_when_served(four):
    for language, texts in (("de", GERMAN), ("en", ENGLISH), ("fr", FRENCH), ("cs", CZECH)):
        for text in texts:
            assert best(four, text) == language, text


def test_detect_answers_among_the_served_languages_only(de_en, four):
    for text in SPANISH + ITALIAN + FRENCH:
        assert {d.language for d in de_en.detect(text)} <= {"de", "en"}, text
    assert {d.language for d in four.detect(SPANISH[0])} <= {"de", "en", "fr", "cs"}


def test_identify_names_languages_no_model_serves(de_en):
    for language, texts in (("es", SPANISH), ("it", ITALIAN), ("fr", FRENCH[-1:])):
        for text in texts:
            found = de_en.identify(text)
            assert found is not None and found.language == language and 0.7 <= found.confidence <= 1, (text, found)
    # too short to name an unserved language in low-accuracy mode (it says Vietnamese, 0.95)
    assert de_en.identify("Hola mundo") is None


def test_identify_never_names_another_language_for_a_served_one(de_en, four):
    """The translation path refuses a text that identify() names an unserved language: it must not
    happen to texts in a served language (unsure is fine: None)."""
    for detector, texts in ((de_en, GERMAN + ENGLISH + SHORT["de"] + SHORT["en"]), (four, GERMAN + ENGLISH + FRENCH + CZECH)):
        for text in texts:
            found = detector.identify(text)
            assert found is None or found.language in detector.served, (text, found)
    assert de_en.identify(GERMAN[0]).language == "de" and four.identify(CZECH[-1]).language == "cs"


def test_nothing_to_detect(de_en):
    for text in ("", "   ", "12345", "!?."):
        assert de_en.detect(text) == [] and de_en.identify(text) is None, text


def test_long_texts_are_judged_quickly(de_en):
    import time

    text = " ".join(GERMAN * 400)  # about 20,000 characters, the default limit per text
    started = time.perf_counter()
    assert best(de_en, text) == "de" and de_en.identify(text).language == "de"
    assert time.perf_counter() - started < 1.0


def test_detectors_are_built_once_per_set_of_languages(de_en):
    assert detector_for(frozenset({"en", "de"})) is de_en


def test_one_served_language_and_unknown_codes():
    detector = LanguageDetector(["de", "xx"])  # "xx": a model whose language lingua does not know
    assert detector.served == ("de",)
    assert detector.detect(GERMAN[1]) == [Detection("de", 1.0)]
    assert detector.identify(SPANISH[0]).language == "es"  # one served language cannot contradict it
    assert LanguageDetector([]).detect(GERMAN[0]) == []


def test_language_names():
    assert (language_name("es"), language_name("de"), language_name("xx")) == ("Spanish", "German", "xx")
