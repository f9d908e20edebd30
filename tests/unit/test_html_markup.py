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


def shape(markup: str):
    """Element tags, attributes and nesting (and comment/PI contents), ignoring text."""
    def walk(el):
        tag = el.tag if isinstance(el.tag, str) else f"{el.tag.__name__}:{el.text}"
        return (tag, sorted(el.attrib.items()) if isinstance(el.tag, str) else [], [walk(c) for c in el])
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
    assert texts("03_nested_inline") == ["This is very important news for everyone here."]
    assert texts("15_br") == ["First line", "second line", "third line"]
    assert texts("14_translate_no") == ["Our product is the best.", "Normal text again."]
    assert texts("10_full_document") == ["My first page", "Welcome", "This is the first paragraph."]
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
    assert '<a href="/people" title="All people">EVERYONE</a> HERE.' in out


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


def test_an_element_with_no_aligned_word_is_kept_empty():
    doc = parse_html("<p>Hello <b>big</b> world</p>")
    out = doc.rebuild([AlignedText("Hallo Welt", [((0, 5), (0, 5)), ((6, 10), (10, 15))])])
    assert out == "<p>Hallo <b></b>Welt</p>"
    assert shape(out) == shape("<p>Hello <b>big</b> world</p>")


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
