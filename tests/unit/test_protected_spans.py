"""Spans of a plain text that no translation may change, found and carried through HTML and back."""
from __future__ import annotations

import pytest

from nmt_serve.text.html_markup import AlignedText, parse_html
from nmt_serve.text.protected_spans import PROTECTED, as_html, from_html


@pytest.mark.parametrize("text, spans", [
    ("Siehe https://example.com/a?b=1&c=2.", ["https://example.com/a?b=1&c=2"]),
    ("(www.hunde.de), dann", ["www.hunde.de"]),
    ("Siehe https://de.wikipedia.org/wiki/Hund_(Tier).", ["https://de.wikipedia.org/wiki/Hund_(Tier)"]),  # its own bracket
    ("(siehe https://a.de/x), dann", ["https://a.de/x"]),
    ("an max.muster+x@mail.example.org schreiben", ["max.muster+x@mail.example.org"]),
    ("Hallo {name}, du hast %s und %1$d und %(count)i und %.2f und {0}.", ["{name}", "%s", "%1$d", "%(count)i", "%.2f", "{0}"]),
    ("Setze ${HOME} oder $PATH, nicht $5.", ["${HOME}", "$PATH"]),
    ("Der Wert sollte {{ limit }} oder {{count}} sein, {{{ raw_html }}}.", ["{{ limit }}", "{{count}}", "{{{ raw_html }}}"]),
    ("Noch %count% Tage, %{days} Tage, %user.name%.", ["%count%", "%{days}", "%user.name%"]),
    ("Es sind 50% oder 20 % mehr {{ nicht geschlossen", []),
    ("Führe `rm -rf /tmp/x` aus.", ["`rm -rf /tmp/x`"]),
    ("50% sicher, 10%ig, 100 %, 3 % s", []),  # percentages are text
    ("Ein Hund rennt. Tom & Jerry <3", []),
])
def test_what_is_protected(text, spans):
    assert [m.group() for m in PROTECTED.finditer(text)] == spans


def test_a_text_goes_through_html_and_comes_back_as_written():
    text = "Tom & Jerry <3 https://a.de/?x=1&y=<2> &amp; `a<b`"
    marked = as_html(text)
    document = parse_html(marked)
    [segment] = document.segments
    assert "https" not in segment.text and "a<b" not in segment.text and "Tom & Jerry <3" in segment.text
    assert from_html(document.rebuild([AlignedText(segment.text)])) == text
    assert as_html("Nichts zu schützen.") is None


def test_a_protected_span_keeps_its_spacing_where_the_translation_moves_it():
    document = parse_html(as_html("Hallo {name}, du hast %s Nachrichten."))
    [segment] = document.segments
    src = segment.text  # "Hallo , du hast  Nachrichten."
    tgt = "Hello, you have messages."
    words = {w: src.index(w) for w in ("Hallo", "du", "hast", "Nachrichten")}
    align = [((0, 5), (words["Hallo"], words["Hallo"] + 5)), ((7, 10), (words["du"], words["du"] + 2)),
             ((11, 15), (words["hast"], words["hast"] + 4)), ((16, 24), (words["Nachrichten"], words["Nachrichten"] + 11))]
    out = from_html(document.rebuild([AlignedText(tgt, align)]))
    assert out == "Hello {name}, you have %s messages."


def test_a_text_is_searched_only_where_something_could_be_protected():
    """as_html skips the pattern for texts without any character a protected span needs: on random texts
    of those characters and others, it finds a span exactly where the pattern alone does."""
    import random

    rng = random.Random(0)
    alphabet = "ab.:/@{}%$`w_-ftphs1 ()AZ?!,'\"\n"
    found = 0
    for _ in range(20000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        spans = PROTECTED.search(text) is not None
        assert (as_html(text) is not None) == spans, text
        found += spans
    assert 0 < found < 20000
