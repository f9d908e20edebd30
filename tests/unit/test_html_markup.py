"""HTML markup kept through translation: segments, verbatim markup, tags moved with their words."""
from __future__ import annotations

import re
from pathlib import Path

import lxml.html
import pytest

from nmt_serve.text.html_markup import AlignedText, parse_html

SNIPPETS = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "html").glob("*.html"))
WORD = re.compile(r"[^ \t\n\r\f]+")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def identity(text: str) -> AlignedText:
    return AlignedText(text, [(m.span(), m.span()) for m in WORD.finditer(text)])


def upper(text: str) -> AlignedText:
    # word by word, so a letter whose upper case is longer ("ß") cannot shift the spans
    out, align, pos = [], [], 0
    for m in WORD.finditer(text):
        gap = text[pos:m.start()] if not out else " "
        word = m.group().upper()
        start = len("".join(out)) + len(gap)
        out += [gap, word]
        align.append(((start, start + len(word)), m.span()))
        pos = m.end()
    return AlignedText("".join(out), align)


def reverse(text: str) -> AlignedText:
    """Word order reversed and upper-cased: inline tags can only be right if they move."""
    words = list(WORD.finditer(text))[::-1]
    out, align, pos = [], [], 0
    for m in words:
        if out:
            pos += 1
        align.append(((pos, pos + len(m.group())), m.span()))
        out.append(m.group().upper())
        pos += len(m.group())
    return AlignedText(" ".join(out), align)


def unaligned(text: str) -> AlignedText:
    return AlignedText(reverse(text).text)


TRANSLATORS = {"identity": identity, "upper": upper, "reverse": reverse, "unaligned": unaligned}


def translate(source: str, fn) -> str:
    doc = parse_html(source)
    return doc.rebuild([fn(s.text) for s in doc.segments])


# the attributes whose values are text for people, translated as the text is
TRANSLATED = {"title", "alt", "placeholder", "aria-label", "label", "abbr"}


def shape(markup: str):
    """Element tags, attributes and nesting (and comment/PI contents), ignoring text (translated attributes'
    values too)."""
    def value(el, name, v):
        return None if name in TRANSLATED or (el.tag, name) in (("meta", "content"), ("input", "value")) else v

    def walk(el):
        tag = el.tag if isinstance(el.tag, str) else f"{el.tag.__name__}:{el.text}"
        attrs = sorted((k, value(el, k, v)) for k, v in el.attrib.items()) if isinstance(el.tag, str) else []
        return (tag, attrs, [walk(c) for c in el])
    return walk(lxml.html.document_fromstring(markup))


def untouched_parts(source: str) -> list[str]:
    """Raw text of elements whose content must come out byte-identical (fixtures avoid nesting them)."""
    parts = [m.group() for m in re.finditer(r"<(script|style|pre|code|textarea)\b.*?</\1>", source, re.S)]
    parts += [m.group() for m in re.finditer(
        r"<(\w+)[^>]*(?:translate=\"no\"|notranslate)[^>]*>.*?</\1>", source, re.S)]
    return parts


def test_there_are_enough_snippets():
    assert len(SNIPPETS) >= 25


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.stem)
def test_identity_rebuilds_the_input_byte_for_byte(path):
    source = read(path)
    assert translate(source, identity) == source


@pytest.mark.parametrize("name", sorted(TRANSLATORS))
@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.stem)
def test_output_parses_to_the_same_tree(path, name):
    source = read(path)
    out = translate(source, TRANSLATORS[name])
    assert shape(out) == shape(source)


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: p.stem)
def test_untouched_content_is_copied_verbatim(path):
    source = read(path)
    parts = untouched_parts(source)
    out = translate(source, reverse)
    texts = [s.text for s in parse_html(source).segments]
    for part in parts:
        assert part in out
        inner = re.sub(r"^<[^>]*>|</\w+>$", "", part).strip()
        assert not any(inner in t for t in texts), (inner, texts)


def test_some_snippets_have_untouched_parts():
    assert sum(bool(untouched_parts(read(p))) for p in SNIPPETS) >= 4


def test_segments_are_what_a_person_would_translate():
    def texts(name):
        return [" ".join(WORD.findall(s.text)) for s in parse_html(read(SNIPPETS_BY_NAME[name])).segments]
    assert texts("13_inline_code") == ["Run to list files."]
    assert texts("08_entities") == ["Fish & chips cost <5\xa0euros at the café ☺ © 2024."]
    # the text's segments, then the values of the attributes that are text for people (a link's title)
    assert texts("03_nested_inline") == ["This is very important news for everyone here.", "All people"]
    assert texts("15_br") == ["First line", "second line", "third line"]
    assert texts("14_translate_no") == ["Our product is the best.", "Normal text again."]
    assert texts("10_full_document") == ["My first page", "Welcome", "This is the first paragraph.", "A page about translation"]
    assert texts("07_attributes_text") == ["Click the icon to open the settings.", "Help", "settings icon", "Open settings",
                                           "Your name here", "Get some help"]
    assert texts("11_script_style") == ["Visible text here."]
    assert texts("05_list")[:3] == ["First item", "Second bold item", "Home page"]
    assert texts("01_plain_text") == ["Hello world. This is plain text without any tags."]
    assert texts("27_bare_ampersand") == ["AT&T and R&D say 5 < 6 and 7 > 3 &unknown; done."]


SNIPPETS_BY_NAME = {p.stem: p for p in SNIPPETS}


def test_segments_without_inline_markup_need_no_alignment():
    doc = parse_html(read(SNIPPETS_BY_NAME["05_list"]))
    # a link that wraps a whole list item stays outside its text
    assert [s.has_inline for s in doc.segments] == [False, True, False, False, False]
    assert parse_html("<p>I like <em>green</em> apples.</p>").segments[0].has_inline


def test_a_tag_around_one_word_moves_with_that_word():
    assert translate("<p>I like <em>green</em> apples.</p>", reverse) == "<p>APPLES. <em>GREEN</em> LIKE I</p>"
    out = translate(read(SNIPPETS_BY_NAME["03_nested_inline"]), reverse)
    assert "<b>NEWS <i>IMPORTANT</i> VERY</b>" in out
    out = translate(read(SNIPPETS_BY_NAME["03_nested_inline"]), upper)
    assert '<a href="/people" title="ALL PEOPLE">EVERYONE</a> HERE.' in out


def test_inline_code_follows_the_word_before_it_with_a_space_on_each_side():
    doc = parse_html("<p>Run <code>ls -l</code> to list files.</p>")
    (seg,) = doc.segments
    # a German-like order: "Um Dateien zu listen, führe <code> aus."
    tgt = "Um Dateien zu listen, führe aus."
    run = seg.text.index("Run")
    align = [((tgt.index("führe"), tgt.index("führe") + 5), (run, run + 3))]
    out = doc.rebuild([AlignedText(tgt, align)])
    assert out == "<p>Um Dateien zu listen, führe <code>ls -l</code> aus.</p>"


def test_unchanged_words_keep_their_entities_new_text_is_escaped():
    doc = parse_html("<p>Tom &amp; Jerry caf&#233;</p>")
    assert doc.rebuild(["Tom &amp; Jerry <b>"]) == "<p>Tom &amp;amp; Jerry &lt;b&gt;</p>"
    assert doc.rebuild(["Jerry & Tom café"]) == "<p>Jerry &amp; Tom caf&#233;</p>"
    assert doc.rebuild(["Jerry et Tom é"]) == "<p>Jerry et Tom é</p>"


def test_an_element_whose_words_the_translation_dropped_stays_empty_where_they_stood():
    """The model dropped the words: the element stays (the tree is the source's), empty, beside its
    neighbour's translation. Written as they were, they would put the source language, or a word twice
    (the shipped model: 12 of 37 such elements were an article whose translation went with its noun),
    into the translation. A mark (a footnote's "1") does go in as written: see the tests below."""
    doc = parse_html("<p>Hello <b>big</b> world</p>")
    out = doc.rebuild([AlignedText("Hallo Welt", [((0, 5), (0, 5)), ((6, 10), (10, 15))])])
    assert out == "<p>Hallo <b></b>Welt</p>"
    assert shape(out) == shape("<p>Hello <b>big</b> world</p>")
    # with no alignment there is no telling that a word was dropped: the element wraps the word at its place
    assert doc.rebuild(["Hallo Welt"]) == "<p>Hallo <b>Welt</b></p>"
    doc = parse_html("<p>Er kam <b>sehr <i>spät</i></b>.</p>")  # nested, last in the sentence
    out = doc.rebuild([AlignedText("He came.", [((0, 2), (0, 2)), ((3, 8), (3, 6))])])
    assert out == "<p>He came.<b><i></i></b></p>"


def test_a_mark_with_a_letter_glued_to_a_word_is_not_the_word():
    # "Manna" is aligned to "man": the footnote mark stays a mark after it, "man" keeps its format
    doc = parse_html("<p>Ein Mann<sup>a</sup> fährt.</p>")
    out = doc.rebuild([AlignedText("A man rides.", [((0, 1), (0, 3)), ((2, 5), (4, 9)), ((6, 12), (10, 16))])])
    assert out == "<p>A man<sup>a</sup> rides.</p>"
    out = doc.rebuild([AlignedText("A mana rides.", [((0, 1), (0, 3)), ((2, 6), (4, 9)), ((7, 13), (10, 16))])])
    assert out == "<p>A man<sup>a</sup> rides.</p>"  # the model kept it: wrapped, not written twice
    # a mark standing apart is not found in the first letter of the next word ("apples")
    doc = parse_html("<p>Er isst <sup>a</sup> Äpfel.</p>")
    out = doc.rebuild([AlignedText("He eats apples.", [((0, 2), (0, 2)), ((3, 7), (3, 7)), ((8, 15), (10, 16))])])
    assert out == "<p>He eats <sup>a</sup> apples.</p>"
    # more than one letter: part of the word, which the element follows into its translation
    doc = parse_html("<p>Ein Mann spielt <b>Fuß</b>ball.</p>")
    align = [((0, 1), (0, 3)), ((2, 5), (4, 8)), ((6, 11), (9, 15)), ((12, 19), (16, 24))]
    out = doc.rebuild([AlignedText("A man plays soccer.", align)])
    assert out == "<p>A man plays <b>soccer</b>.</p>"  # (the full stop was not the element's)


def test_words_the_attention_left_unaligned_are_paired_where_the_translation_shows():
    # the first target word attends to no source word (as the engine's attention often leaves it)
    doc = parse_html("<p><b>Ein</b> Mann steht.</p>")
    out = doc.rebuild([AlignedText("A man stands.", [((2, 5), (4, 8)), ((6, 13), (9, 15))])])
    assert out == "<p><b>A</b> man stands.</p>"
    # a word written the same in both (a name, a number) is that word, whatever the attention says
    doc = parse_html("<p>Ein süßes <b>Baby</b> lacht.</p>")
    out = doc.rebuild([AlignedText("A baby laughs.", [((2, 6), (4, 9)), ((7, 14), (15, 21))])])
    assert out == "<p>A <b>baby</b> laughs.</p>"
    # an article attends to its noun: "a" goes with "Leiter" as well as "ladder."
    doc = parse_html("<p>Ein Mann steht auf <b>einer</b> Leiter.</p>")
    align = [((0, 1), (0, 3)), ((2, 5), (4, 8)), ((6, 8), (9, 14)), ((9, 17), (9, 14)), ((18, 20), (15, 18)),
             ((21, 22), (25, 32)), ((23, 30), (25, 32))]
    out = doc.rebuild([AlignedText("A man is standing on a ladder.", align)])
    assert out == "<p>A man is standing on <b>a</b> ladder.</p>"
    # not where the word before it has no word of the translation either: of "Ein süßes" -> "A" there
    # is no telling which one the model dropped, so the element stays empty
    doc = parse_html("<p>Ein <b>süßes</b> Baby lacht.</p>")
    out = doc.rebuild([AlignedText("A baby laughs.", [((0, 1), (10, 14)), ((2, 6), (10, 14)), ((7, 14), (15, 21))])])
    assert out == "<p><b></b>A baby laughs.</p>"


def test_an_element_takes_no_letters_of_a_word_it_does_not_hold():
    # "Bus" is unaligned and "Bahn" attended elsewhere: the space after "Car" may go with the element,
    # the "B" that happens to match may not
    doc = parse_html("<p><i>Auto Bus</i> fährt schnell.</p>")
    out = doc.rebuild([AlignedText("Car Bahn runs.", [((0, 3), (0, 4)), ((4, 8), (16, 24)), ((9, 14), (9, 15))])])
    assert out == "<p><i>Car </i>Bahn runs.</p>"


def test_an_element_of_no_words_is_never_lost():
    """A footnote mark or a number glued to a word, or standing alone, that the translation dropped goes
    in as written (letters dropped by the model stay dropped: see the test above); one the translation
    kept is wrapped where it stands, not written twice."""
    doc = parse_html("<p>Der Hund<sup>1</sup> läuft.</p>")  # the source word is "Hund1"
    out = doc.rebuild([AlignedText("The dog runs.", [((0, 3), (0, 3)), ((4, 7), (4, 9)), ((8, 13), (10, 16))])])
    assert out == "<p>The dog<sup>1</sup> runs.</p>"
    out = doc.rebuild([AlignedText("The dog1 runs.", [((0, 3), (0, 3)), ((4, 8), (4, 9)), ((9, 14), (10, 16))])])
    assert out == "<p>The dog<sup>1</sup> runs.</p>"
    doc = parse_html("<p>Hello <sup>2</sup> world</p>")
    assert doc.rebuild([AlignedText("Hallo Welt", [((0, 5), (0, 5)), ((6, 10), (8, 13))])]) == "<p>Hallo <sup>2</sup> Welt</p>"
    doc = parse_html('<p>Siehe <sup><a href="#f1">[1]</a></sup>Hund &amp; Katze.</p>')  # nested, before a word
    out = doc.rebuild([AlignedText("See dog and cat.", [((0, 3), (0, 5)), ((4, 7), (6, 13)), ((8, 11), (14, 15)), ((12, 16), (16, 22))])])
    assert out == '<p>See <sup><a href="#f1">[1]</a></sup>dog and cat.</p>'


def test_siblings_keep_their_source_order_when_the_words_swap():
    source = "<p><b>one</b> and <i>two</i></p>"
    out = translate(source, reverse)
    assert shape(out) == shape(source)
    assert out.index("<b>") < out.index("<i>")


def test_whitespace_around_a_segment_stays_outside_its_text():
    doc = parse_html("<p>\n  Hello <b>x</b> there  \n</p>")
    assert doc.segments[0].text == "Hello x there"
    assert doc.rebuild([identity("Hello x there")]) == "<p>\n  Hello <b>x</b> there  \n</p>"


def test_no_text_and_wrong_counts():
    assert parse_html("").rebuild([]) == ""
    assert parse_html("<div> <br> </div>").segments == []
    with pytest.raises(ValueError):
        parse_html("<p>a</p>").rebuild([])


SENTENCES = {"Ein Mann isst.": "A man is eating.", "Eine Frau trinkt.": "A woman is drinking.", "Ein Hund rennt.": "A dog is running."}


def by_sentence(text: str, with_sentences: bool = True) -> AlignedText:
    """Each sentence translated on its own, as the pipeline does, its first word left unaligned (as the
    attention often leaves it) and each other one aligned to the source word before its own, so that
    every source word has one (nothing for the alignment's completion to mend); with_sentences: the
    sentences' spans given, as the pipeline gives them."""
    out, align, spans = "", [], []
    for m in re.finditer(r"[^.]+\.", text):
        s0 = m.start() + len(m.group()) - len(m.group().lstrip())
        source, t0 = text[s0:m.end()], len(out) + (s0 - spans[-1][1][1] if spans else 0)
        out = (out + text[spans[-1][1][1]:s0] if spans else out) + SENTENCES[source]
        source_words, target_words = list(WORD.finditer(source)), list(WORD.finditer(SENTENCES[source]))
        for i, w in enumerate(target_words[1:]):
            sw = source_words[min(i, len(source_words) - 1)]
            align.append(((t0 + w.start(), t0 + w.end()), (s0 + sw.start(), s0 + sw.end())))
        spans.append(((t0, len(out)), (s0, m.end())))
    return AlignedText(out, align, spans if with_sentences else None)


@pytest.mark.parametrize("source, want", [
    ("<p>Ein Mann isst. <b>Eine Frau trinkt.</b> Ein Hund rennt.</p>",
     "<p>A man is eating. <b>A woman is drinking.</b> A dog is running.</p>"),
    ("<p><b>Ein Mann isst.</b> Eine Frau trinkt.</p>", "<p><b>A man is eating.</b> A woman is drinking.</p>"),
    ("<p>Ein Mann isst.<span data-run=1>\tEine Frau trinkt.</span></p>", "<p>A man is eating.<span data-run=1>\tA woman is drinking.</span></p>"),
    ("<p><i>Ein Mann isst. Eine Frau trinkt.</i> Ein Hund rennt.</p>", "<p><i>A man is eating. A woman is drinking.</i> A dog is running.</p>"),
    ("<p>Ein Mann isst. <img src=x> Eine Frau trinkt.</p>", "<p>A man is eating. <img src=x> A woman is drinking.</p>"),
])
def test_markup_around_or_between_whole_sentences_keeps_to_their_translations(source, want):
    document = parse_html(source)
    assert document.rebuild([by_sentence(s.text) for s in document.segments]) == want
    # the words' alignment alone would leave each sentence's first word outside (what the spans mend)
    if "<b>" in source or "data-run" in source:
        assert parse_html(source).rebuild([by_sentence(s.text, False) for s in parse_html(source).segments]) != want


def test_attributes_that_are_text_for_people_are_translated_in_their_own_quotes():
    page = ("<!DOCTYPE html>\n<html lang=de><head><meta name=description content='Ein Hund rennt.'>"
            '<meta name="viewport" content="width=device-width"></head><body>'
            '<img src="hund.png" alt="Ein &quot;roter&quot; Hund" title=Hund><input placeholder=" Ihr Name ">'
            '<input type=submit value="Senden"><input type=text value="Hans"><a href="/x" aria-label="Weiter">&gt;</a>'
            '<p translate="no" title="Markenname">FooBar</p><img alt="*"><script>var s = \'<img alt="Hund">\';</script>'
            "</body></html>")
    doc = parse_html(page)
    # after the text's segments (none here but the link's ">"), each value that holds a letter, decoded
    assert [s.text for s in doc.segments] == [">", "Ein Hund rennt.", 'Ein "roter" Hund', "Hund", "Ihr Name", "Senden", "Weiter"]
    out = doc.rebuild([s.text.upper() for s in doc.segments], lang="en")
    assert out == ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta name=description content='EIN HUND RENNT.'>"
                   '<meta name="viewport" content="width=device-width"></head><body>'
                   '<img src="hund.png" alt="EIN &quot;ROTER&quot; HUND" title=HUND><input placeholder=" IHR NAME ">'
                   '<input type=submit value="SENDEN"><input type=text value="Hans"><a href="/x" aria-label="WEITER">&gt;</a>'
                   '<p translate="no" title="Markenname">FooBar</p><img alt="*"><script>var s = \'<img alt="Hund">\';</script>'
                   "</body></html>")
    # without a language the root's lang stays; a value translated into words needs quotes it had not
    assert parse_html(page).rebuild([s.text for s in doc.segments]) == page
    assert 'title="Ein Hund"' in parse_html(page).rebuild([*[s.text for s in doc.segments][:3], "Ein Hund", *[s.text for s in doc.segments][4:]])



def test_a_words_punctuation_the_element_does_not_hold_stays_outside_it():
    # the word alignment pairs whole words, punctuation and all: "meadow." with "Wiese"; the full stop stood
    # after the link in the source, and stays after it
    doc = parse_html('<p>Er sieht die <a href="x">Wiese</a>.</p>')
    out = doc.rebuild([AlignedText("He sees the meadow.", [((0, 2), (0, 2)), ((3, 7), (3, 8)), ((8, 11), (9, 12)),
                                                             ((12, 19), (13, 18))])])
    assert out == '<p>He sees the <a href="x">meadow</a>.</p>'
    # punctuation the element holds in the source it holds in the translation
    doc = parse_html('<p>Er sagt <i>"Hallo!"</i> dann</p>')
    out = doc.rebuild([AlignedText('He says "Hello!" then', [((0, 2), (0, 2)), ((3, 7), (3, 7)), ((8, 16), (11, 19)),
                                                               ((17, 21), (24, 28))])])
    assert out == '<p>He says <i>"Hello!"</i> then</p>'
