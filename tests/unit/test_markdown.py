"""Markdown files translated in place (nmt_serve/text/documents/markdown.py), with the stand-in translators of
test_document_formats (every word upper-cased, or the words reversed), inline tags placed by the HTML path."""
from __future__ import annotations

import re

import pytest
from markdown_it import MarkdownIt
from test_document_formats import reversed_words, translator

from nmt_serve.text.documents import DocumentError, read_document, translate_document
from nmt_serve.text.html_markup import AlignedText

SOURCE = """---
title: Ein Titel
---
# Ein *Hund* ##

> - Ein **brauner** Hund rennt
>   über die [Wiese](https://a.de/wiese "Eine Wiese") und `code` hier.\\
> Zweite ![ein Bild](b.png) <kbd>Strg</kbd> <https://x.de> Zeile

| Kopf | Zwei |
|:-----|-----:|
| Ein Hund | ~~nein~~ |
| 42 | Siehe %s |
| `a\\|b` | Ein Mann |

Setext Titel
============

```python
print("nicht übersetzen")
```

[ref]: https://r.de
Ein [Link][ref] mit __fett__ und _kursiv_.

1. Erster Punkt
2. Zweiter Punkt
"""

EXPECTED = """---
title: Ein Titel
---
# EIN *HUND* ##

> - EIN **BRAUNER** HUND RENNT ÜBER DIE [WIESE](https://a.de/wiese "EINE WIESE") UND `code` HIER.\\
>   ZWEITE ![EIN BILD](b.png) <kbd>STRG</kbd> <https://x.de> ZEILE

| KOPF | ZWEI |
|:-----|-----:|
| EIN HUND | ~~NEIN~~ |
| 42 | SIEHE %s |
| `a\\|b` | EIN MANN |

SETEXT TITEL
============

```python
print("nicht übersetzen")
```

[ref]: https://r.de
EIN [LINK][ref] MIT __FETT__ UND _KURSIV_.

1. ERSTER PUNKT
2. ZWEITER PUNKT
"""


def shape(markdown: str) -> list:
    """The document as CommonMark reads it: its elements and their nesting, without the text."""
    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    return re.findall(r"</?[a-z0-9]+", md.render(markdown))


def test_every_paragraph_heading_and_cell_is_translated_and_the_rest_kept():
    document = read_document(SOURCE.encode(), "readme.md")
    # inline Markdown as inline HTML: code spans, autolinks and placeholders kept out of what the model reads
    assert document.texts[:2] == [
        'Ein <i data-md="0">Hund</i>',
        'Ein <b data-md="0">brauner</b> Hund rennt\nüber die <a data-md="1" title="Eine Wiese">Wiese</a> und '
        '<code data-md="2">code</code> hier.<br data-md="3">Zweite <img data-md="4" alt="ein Bild"> <kbd>Strg</kbd> '
        '<span translate="no" data-md="5">https://x.de</span> Zeile']
    assert len(document.texts) == 13  # not the front matter, the code block, the number alone
    out = translate_document(SOURCE.encode(), "readme.md", translator(), "en").decode()
    assert out == EXPECTED
    assert shape(out) == shape(SOURCE)


def test_markers_follow_their_words_when_the_translation_reorders_them():
    reverse = translator(reversed_words)
    assert translate_document(b"Ein Hund sieht [einen Link](a.html) hier\n", "a.md", reverse) == b"HIER [LINK EINEN](a.html) SIEHT HUND EIN\n"
    assert translate_document(b"Ein **brauner Hund** sieht uns\n", "a.md", reverse) == b"UNS SIEHT **HUND BRAUNER** EIN\n"


def test_reference_links_and_images_stay_references_to_their_definitions():
    """Before, each came back inline ([LINK](https://r.de)), the definitions left unused. A collapsed or
    shortcut reference names its label, which was its text and is not the translation's."""
    source = (b"[![Badge]][ci] Siehe [die Anleitung][Doku], [Doku][] und [Doku], ![ein Bild][Badge] oder [hier](a.html).\n\n"
              b"[ci]: https://ci.example/x\n[Doku]: https://d.example \"Die Doku\"\n[Badge]: https://b.example/b.svg\n")
    out = translate_document(source, "a.md", translator()).decode()
    assert out.split("\n")[0] == ("[![BADGE][Badge]][ci] SIEHE [DIE ANLEITUNG][Doku], [DOKU][Doku] UND [DOKU][Doku], "
                                   "![EIN BILD][Badge] ODER [HIER](a.html).")
    assert out.endswith(source.decode()[source.decode().index("[ci]:"):])  # the definitions as they were
    assert shape(out) == shape(source.decode())


def test_a_table_padded_to_columns_is_padded_to_its_new_widths_and_one_in_a_quote_keeps_its_markers():
    """Before, a translated row came back with one space around each cell (the columns no longer lined up in
    the file) and a table in a quote lost its `>` on every translated row."""
    source = ("| Name | Wert | Anmerkung |\n|:-----|-----:|:---------:|\n| Hund | 3    | bellt     |\n\n"
              "> | Ein Hund | zwei |\n> |---|---|\n> | Katze | drei |\n\n"
              "  | x | Spalte |\n  | --- | --- |\n  | Ein sehr langer Wert | y |\n")
    out = translate_document(source.encode(), "a.md", translator()).decode()
    assert out.split("\n")[:3] == ["| NAME | WERT | ANMERKUNG |", "|:-----|-----:|:---------:|", "| HUND | 3    | BELLT     |"]
    assert out.split("\n")[4:7] == ["> | EIN HUND | ZWEI |", "> |---|---|", "> | KATZE | DREI |"]  # not padded: as it was
    assert out.split("\n")[8:11] == ["  | X | SPALTE |", "  | --- | --- |", "  | EIN SEHR LANGER WERT | Y |"]

    def longer(text: str) -> AlignedText:  # each word two letters longer
        words = list(re.finditer(r"\S+", text))
        out = " ".join(m.group().upper() + "EN" for m in words)
        starts = [0]
        for m in words[:-1]:
            starts.append(starts[-1] + len(m.group()) + 3)
        return AlignedText(out, [((a, a + len(m.group()) + 2), m.span()) for a, m in zip(starts, words)])

    wider = translate_document(source.encode(), "a.md", translator(longer)).decode().split("\n")
    assert wider[:3] == ["| NAMEEN | WERTEN | ANMERKUNGEN |", "|:-------|-------:|:-----------:|", "| HUNDEN | 3      | BELLTEN     |"]
    assert shape(out) == shape(source)


def test_githubs_alerts_task_lists_and_footnotes_keep_their_marks():
    source = (b"> [!NOTE]\n> Ein Hinweis hier.\n\n- [ ] Eine Aufgabe\\\n  zweite Zeile\n- [x] Erledigt [^1]\n\n"
              b"[^1]: Eine Fussnote.\n\nText mit [eckigen] Klammern an <a@b.org>.\n")
    out = translate_document(source, "a.md", translator()).decode()
    # an alert's kind on a line of its own; a line after a hard break behind the source's markers; brackets
    # that are text escaped
    assert out == ("> [!NOTE]\n> EIN HINWEIS HIER.\n\n- [ ] EINE AUFGABE\\\n  ZWEITE ZEILE\n- [x] ERLEDIGT [^1]\n\n"
                   "[^1]: EINE FUSSNOTE.\n\nTEXT MIT \\[ECKIGEN\\] KLAMMERN AN <a@b.org>.\n")
    assert shape(out) == shape(source.decode())


def test_an_emphasis_keeps_no_space_at_its_edges_and_an_empty_one_goes():
    document = read_document(b"See the **[Cargo Guide](https://a.org)** for **all** of it.\n", "a.md")
    assert document.texts == ['See the <b data-md="0"><a data-md="1">Cargo Guide</a></b> for <b data-md="2">all</b> of it.']
    # as the HTML path may place them: the space before the words inside the element, an element emptied
    out = document.write(['Die<b data-md="0"><a data-md="1"> Anleitung</a></b> für<b data-md="2"> </b>alles.']).decode()
    assert out == "Die **[Anleitung](https://a.org)** für alles.\n"
    assert shape(out) == shape("x **[y](https://a.org)** z\n")
    # two code spans the translation put side by side stay two
    document = read_document(b"`a` uses `b` here.\n", "a.md")
    assert document.write(['<code data-md="0">a</code><code data-md="1">b</code> hier.']) == b"`a` `b` hier.\n"


def test_an_html_block_is_translated_as_html():
    source = (b'<p align="center">\n  <img src="logo.png" alt="Ein Hund" width="100">\n</p>\n\n<details>\n'
              b"<summary>Mehr zeigen</summary>\n\nEin Text.\n\n</details>\n\n<!-- Kommentar -->\n\n- Eine Liste\n\n  <div>Ein Hund</div>\n"
              b"  <b>Zwei</b> Kinder\n\n> <p>Im Zitat</p>\n")
    out = translate_document(source, "a.md", translator()).decode()
    # a centred logo's alt text, a <details>' summary; a comment as it was; a block in a list item or a quote
    # behind its markers (before, those two stayed untranslated)
    assert out == ('<p align="center">\n  <img src="logo.png" alt="EIN HUND" width="100">\n</p>\n\n<details>\n'
                   "<summary>MEHR ZEIGEN</summary>\n\nEIN TEXT.\n\n</details>\n\n<!-- Kommentar -->\n\n- EINE LISTE\n\n"
                   "  <div>EIN HUND</div>\n  <b>ZWEI</b> KINDER\n\n> <p>IM ZITAT</p>\n")
    assert shape(out) == shape(source.decode())


def test_text_that_markdown_would_read_as_markup_is_escaped():
    document = read_document(b"- Ein Punkt\n\nEin Satz.\n", "a.md")
    # (the translations as the HTML path gives them: text escaped as HTML)
    out = document.write(["1. a*b*c [x] &lt;y&gt; snake_case _x_", "# kein Titel"]).decode()
    assert out == "- 1\\. a\\*b\\*c \\[x\\] \\<y> snake_case \\_x\\_\n\n\\# kein Titel\n"
    rendered = MarkdownIt("commonmark").render(out)
    assert "<ul>\n<li>1. a*b*c [x] &lt;y&gt; snake_case _x_</li>" in rendered and "<p># kein Titel</p>" in rendered


def test_line_endings_a_byte_order_mark_and_untranslated_blocks_are_kept():
    source = "\ufeff# Titel\r\n\r\nEin Satz\r\nüber zwei Zeilen.\r\n".encode()
    document = read_document(source, "a.md")
    assert document.write(document.texts) == source  # a partial job's result: nothing translated yet
    out = read_document(source, "a.md").write(["Title", "A sentence over two lines."])
    assert out == "\ufeff# Title\r\n\r\nA sentence over two lines.\r\n".encode()


def test_a_file_that_is_no_utf8_text_is_refused_saying_why():
    with pytest.raises(DocumentError, match="UTF-8"):
        read_document("Grüße".encode("latin-1"), "a.md")
