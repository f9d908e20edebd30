"""Office documents and e-books translated in place (nmt_serve/text/documents), with a stand-in
translator: every word upper-cased (or the words reversed), inline tags placed by the HTML path from
a word-for-word alignment. The files are built in the test with python-docx and python-pptx, or
written as the minimal XML their formats need (.odt, .odp, .epub)."""
from __future__ import annotations

import io
import re
import zipfile

import docx
import pptx
import pytest
from document_files import build_epub, build_odp, build_odt, odf, odf_texts
from lxml import etree
from pptx.util import Inches

from nmt_serve.text.documents import DocumentError, read_document, translate_document
from nmt_serve.text.documents.document import open_zip, rewrite_zip
from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot
from nmt_serve.text.documents.office_open_xml import WORD as WORDPROCESSING
from nmt_serve.text.documents.office_open_xml import WORD_NS, paragraph_slots
from nmt_serve.text.html_markup import AlignedText, parse_html

WORD = re.compile(r"[^ \t\n\r\f]+")


def upper_words(text: str) -> AlignedText:
    out, align, pos = [], [], 0
    for m in WORD.finditer(text):
        gap = text[pos:m.start()] if not out else " "
        word = m.group().upper()
        start = len("".join(out)) + len(gap)
        out += [gap, word]
        align.append(((start, start + len(word)), m.span()))
        pos = m.end()
    return AlignedText("".join(out), align)


def reversed_words(text: str) -> AlignedText:
    words = list(WORD.finditer(text))[::-1]
    out, align = "", []
    for m in words:
        if out:
            out += " "
        align.append(((len(out), len(out) + len(m.group())), m.span()))
        out += m.group().upper()
    return AlignedText(out, align)


def translator(translate_segment=upper_words, seen: list | None = None):
    def translate_units(units: list[str]) -> list[str]:
        if seen is not None:
            seen.extend(units)
        out = []
        for unit in units:
            document = parse_html(unit)
            out.append(document.rebuild([translate_segment(s.text) for s in document.segments]))
        return out

    return translate_units


# ---------------------------------------------------------------------------------------- runs <-> inline HTML


def paragraph(*runs: tuple[str, str]) -> tuple[InlineParagraph, list[str]]:
    """A paragraph of (text, format) runs; returns it and the list each run's new text is written to."""
    written = [""] * len(runs)

    def writer(i):
        def write(text):
            written[i] = text
        return write

    return InlineParagraph([TextSlot(t, f, writer(i)) for i, (t, f) in enumerate(runs)]), written


def test_the_most_common_format_is_plain_text_and_the_others_spans():
    p, _ = paragraph(("Ein ", "plain"), ("Hund", "bold"), (" rennt über die ", "plain"), ("Wiese", "italic"), (".", "plain"))
    assert p.html == 'Ein <span data-run="0">Hund</span> rennt über die <span data-run="1">Wiese</span>.'
    assert p.text == "Ein Hund rennt über die Wiese."


def test_runs_alike_merge_and_separated_ones_do_not():
    slots = [TextSlot("Ein ", "a", lambda t: None), TextSlot("Hund", "a", lambda t: None),
             TextSlot(" und", "a", lambda t: None, separated=True)]
    p = InlineParagraph(slots)
    # one group per gap may be plain: the second (after a tab, say) becomes a span of its own
    assert p.html == 'Ein Hund<span data-run="0"> und</span>'


def test_text_goes_back_to_its_runs_in_order():
    p, written = paragraph(("Ein ", "plain"), ("Hund", "bold"), (" rennt über die ", "plain"), ("Wiese", "italic"), (".", "plain"))
    p.write('A <span data-run="0">dog</span> runs across the <span data-run="1">meadow</span>.')
    assert written == ["A ", "dog", " runs across the ", "meadow", "."]
    # text in a gap that had no plain run joins the span before it; entities are decoded
    p, written = paragraph(("fett", "bold"), ("kursiv", "italic"), ("der lange Rest", "plain"))
    p.write('<span data-run="0">bold</span> &amp; <span data-run="1">italic</span>rest')
    assert written == ["bold & ", "italic", "rest"]


def test_a_formatted_run_left_empty_by_the_alignment_takes_the_nearest_word():
    p, written = paragraph(("Ein ", "plain"), ("Hund", "bold"), (" rennt.", "plain"))
    p.write('A dog<span data-run="0"></span> runs.')
    assert written[1].strip() == "dog" and "".join(written).split() == ["A", "dog", "runs."]


def test_a_run_beside_runs_of_one_word_is_refilled_without_emptying_them():
    # the bold run got nothing, both its neighbours hold one word: the words shift one run along from
    # the nearest run with two, so every run keeps a word and the text stays as translated
    p, written = paragraph(("Ein ", "plain"), ("großer", "bold"), (" Hund", "italic"), (" bellt laut.", "plain"))
    assert p.html == 'Ein <span data-run="0">großer</span><span data-run="1"> Hund</span> bellt laut.'
    p.write('A <span data-run="0"></span><span data-run="1">dog</span> barks loudly.')
    assert written == ["A ", "dog", " barks", " loudly."]
    # across a separator the source had no space at, the moved word keeps the translation's space
    slots = [("Ein ", "plain", False), ("großer", "bold", False), (" Hund", "italic", False), ("bellt laut.", "plain", True)]
    written = [""] * len(slots)
    p = InlineParagraph([TextSlot(t, f, lambda text, i=i: written.__setitem__(i, text), separated)
                         for i, (t, f, separated) in enumerate(slots)])
    p.write('A <span data-run="0"></span><span data-run="1">dog</span> barks loudly.')
    assert written == ["A ", "dog", " barks", "loudly."]


def test_a_run_of_one_word_and_none_of_its_own_gives_it_and_a_run_of_punctuation_takes_none():
    # the colon's run holds the only word beside the empty bold run, which had it in the source
    p, written = paragraph(("Der ", "plain"), ("Hund", "bold"), (":", "italic"), (" bellt.", "plain"))
    p.write('The <span data-run="0"></span><span data-run="1">dog:</span> barks.')
    assert written == ["The ", "dog", ":", " barks."]
    # a run of punctuation the translation dropped is not given a word (nor a format it never had)
    p, written = paragraph(("Hund", "plain"), (":", "bold"), (" bellt laut", "plain"))
    p.write('Dog<span data-run="0"></span> barks loudly')
    assert written == ["Dog", "", " barks loudly"]


def test_a_formatted_run_whose_words_the_translation_dropped_takes_a_neighbour_s_word():
    # a bold word the model left out: the run is not left empty, it takes the nearest word of a
    # neighbour that can spare one, and the text is the translation's, whole and in order
    p, written = paragraph(("Ein ", "plain"), ("sehr", "bold"), (" großer Hund.", "plain"))
    document = parse_html(p.html)
    p.write(document.rebuild([AlignedText("A big dog.", [((0, 1), (0, 3)), ((2, 5), (9, 15)), ((6, 10), (16, 21))])]))
    assert "".join(written) == "A big dog." and written[1].strip()


def test_docx_a_footnote_mark_glued_to_a_word_stays_in_its_superscript_run():
    for mark in ("1", "a"):
        d = docx.Document()
        paragraph_ = d.add_paragraph("Ein Mann")
        paragraph_.add_run(mark).font.superscript = True
        paragraph_.add_run(" fährt.")
        source = io.BytesIO()
        d.save(source)

        def dropped(text: str) -> AlignedText:  # "Manna" (or "Mann1") translated as "man"
            assert text == f"Ein Mann{mark} fährt."
            return AlignedText("A man rides.", [((0, 1), (0, 3)), ((2, 5), (4, 9)), ((6, 12), (10, 16))])

        out = docx.Document(io.BytesIO(translate_document(source.getvalue(), "f.docx", translator(dropped))))
        runs = out.paragraphs[0].runs
        assert [(r.text, bool(r.font.superscript)) for r in runs] == [("A man", False), (mark, True), (" rides.", False)]


# ---------------------------------------------------------------------------------------- .docx


def build_docx() -> bytes:
    d = docx.Document()
    section = d.sections[0]
    section.header.paragraphs[0].text = "Kopfzeile des Berichts"
    section.footer.paragraphs[0].text = "Fußzeile mit Namen"
    p = d.add_paragraph("Ein kleiner ")
    p.add_run("brauner Hund").bold = True
    p.add_run(" rennt über die ")
    p.add_run("grüne Wiese").italic = True
    p.add_run(" am Haus.")
    tabbed = d.add_paragraph("Name:")
    tabbed.runs[0].add_tab()
    tabbed.add_run("zwei Kinder")
    table = d.add_table(rows=2, cols=3)
    for r, row in enumerate(table.rows):
        for c, cell in enumerate(row.cells):
            cell.text = f"zelle {r} {c}"
    table.cell(0, 0).paragraphs[0].runs[0].bold = True
    d.add_comment(p.runs[1], text="ein Kommentar zum Hund", author="Anna")
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def docx_runs(d) -> list:
    paragraphs = list(d.paragraphs) + [p for t in d.tables for row in t.rows for cell in row.cells for p in cell.paragraphs]
    for s in d.sections:
        paragraphs += list(s.header.paragraphs) + list(s.footer.paragraphs)
    return [r for p in paragraphs for r in p.runs]


def test_docx_every_run_translated_and_every_format_kept():
    source = build_docx()
    seen = []
    out = translate_document(source, "bericht.docx", translator(seen=seen))
    before, after = docx.Document(io.BytesIO(source)), docx.Document(io.BytesIO(out))
    runs_before, runs_after = docx_runs(before), docx_runs(after)
    assert len(runs_before) == len(runs_after)
    for a, b in zip(runs_before, runs_after):
        assert b.text == a.text.upper() and (a.bold, a.italic) == (b.bold, b.italic)
    p = after.paragraphs[0]
    assert [r.text for r in p.runs if r.text] == ["EIN KLEINER ", "BRAUNER HUND", " RENNT ÜBER DIE ", "GRÜNE WIESE", " AM HAUS."]
    assert [r.bold for r in p.runs if r.text] == [None, True, None, None, None] and [r.text for r in p.runs if r.italic] == ["GRÜNE WIESE"]
    assert "\t" in after.paragraphs[1].text and after.paragraphs[1].text == "NAME:\tZWEI KINDER"
    table = after.tables[0]
    assert (len(table.rows), len(table.columns)) == (2, 3) and table.cell(1, 2).text == "ZELLE 1 2"
    assert table.cell(0, 0).paragraphs[0].runs[0].bold
    assert after.sections[0].header.paragraphs[0].text == "KOPFZEILE DES BERICHTS"
    assert after.sections[0].footer.paragraphs[0].text == "FUSSZEILE MIT NAMEN"
    comments = list(after.comments)
    assert len(comments) == 1 and comments[0].text == "EIN KOMMENTAR ZUM HUND" and comments[0].author == "Anna"
    # one unit per paragraph, its formatting as inline spans
    assert 'Ein kleiner <span data-run="0">brauner Hund</span> rennt über die <span data-run="1">grüne Wiese</span> am Haus.' in seen


def test_docx_formatting_follows_its_words_when_they_move():
    out = translate_document(build_docx(), "b.docx", translator(reversed_words))
    runs = docx.Document(io.BytesIO(out)).paragraphs[0].runs
    bold = [r.text for r in runs if r.bold]
    italic = [r.text for r in runs if r.italic]
    # "HAUS. AM WIESE GRÜNE DIE ÜBER RENNT HUND BRAUNER KLEINER EIN": tags keep their order, so one
    # of the two moved runs holds its words and the other is clamped beside them, never lost
    assert bold and italic and all(t.strip() for t in bold + italic)
    assert "".join(r.text for r in runs).split() == ["HAUS.", "AM", "WIESE", "GRÜNE", "DIE", "ÜBER", "RENNT", "HUND", "BRAUNER", "KLEINER", "EIN"]


def test_docx_footnotes_kept_as_bytes_by_python_docx_are_translated_too():
    source = build_docx()
    footnotes = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
                 '<w:footnotes xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
                 '<w:footnote w:type="separator" w:id="-1"><w:p><w:r><w:separator/></w:r></w:p></w:footnote>'
                 '<w:footnote w:id="1"><w:p><w:r><w:footnoteRef/></w:r><w:r><w:t xml:space="preserve"> Eine Fußnote hier.</w:t></w:r></w:p></w:footnote>'
                 '</w:footnotes>')
    with_footnotes = add_part(source, "word/footnotes.xml", footnotes,
                              "application/vnd.openxmlformats-officedocument.wordprocessingml.footnotes+xml",
                              "http://schemas.openxmlformats.org/officeDocument/2006/relationships/footnotes")
    out = translate_document(with_footnotes, "f.docx", translator())
    xml = zipfile.ZipFile(io.BytesIO(out)).read("word/footnotes.xml").decode()
    assert "EINE FUSSNOTE HIER." in xml and "<w:footnoteRef/>" in xml and "<w:separator/>" in xml


def add_part(package: bytes, name: str, xml: str, content_type: str, relationship: str) -> bytes:
    """The package with one more part, related to the main document."""
    src = zipfile.ZipFile(io.BytesIO(package))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "[Content_Types].xml":
                data = data.replace(b"</Types>", f'<Override PartName="/{name}" ContentType="{content_type}"/></Types>'.encode())
            elif info.filename == "word/_rels/document.xml.rels":
                data = data.replace(b"</Relationships>", f'<Relationship Id="rIdF1" Type="{relationship}" Target="{name.split("/", 1)[1]}"/></Relationships>'.encode())
            z.writestr(info, data)
        z.writestr(name, xml)
    return out.getvalue()


W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def test_word_paragraph_walk_links_fields_and_separators():
    p = etree.fromstring(
        f'<w:p {W}><w:pPr/><w:r><w:t xml:space="preserve">Siehe </w:t></w:r><w:proofErr w:type="spellStart"/>'
        '<w:hyperlink><w:r><w:rPr><w:rStyle w:val="Link"/><w:lang w:val="de-DE"/></w:rPr><w:t>die Seite</w:t></w:r></w:hyperlink>'
        '<w:bookmarkStart w:id="0"/><w:r><w:t xml:space="preserve"> auf Seite </w:t></w:r>'
        '<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText> PAGE </w:instrText></w:r>'
        '<w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>7</w:t></w:r><w:r><w:fldChar w:fldCharType="end"/></w:r>'
        '<w:r><w:t>:</w:t><w:tab/><w:t>Ende</w:t></w:r><w:fldSimple w:instr="DATE"><w:r><w:t>1.1.2026</w:t></w:r></w:fldSimple></w:p>')
    slots = paragraph_slots(p, WORDPROCESSING)
    # the page number and the date are fields' results: not text to translate
    assert [s.text for s in slots] == ["Siehe ", "die Seite", " auf Seite ", ":", "Ende"]
    assert [s.separated for s in slots] == [False, False, False, True, True]
    assert slots[0].key == slots[2].key != slots[1].key  # the link's run: a format of its own (its language does not count)
    unit = InlineParagraph(slots)
    # the text after the fields and the tab: plain again, its gap has no other plain run
    assert unit.html == 'Siehe <span data-run="0">die Seite</span> auf Seite <span data-run="1">:</span> Ende'
    unit.write('See <span data-run="0">the page</span> on page <span data-run="1">:</span> End')
    assert [t.text for t in p.iter(f"{{{WORD_NS}}}t")] == ["See ", "the page", " on page ", "7", ":", "End", "1.1.2026"]


def test_epub_named_html_entities_are_read():
    chapter = ('<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml"><head><title>T</title></head>'
               '<body><p>Ein&nbsp;Hund &amp; eine Katze.</p></body></html>')
    book = build_epub()
    src = zipfile.ZipFile(io.BytesIO(book))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            z.writestr(info, chapter if info.filename == "OEBPS/text/kapitel 1.xhtml" else src.read(info))
    seen = []
    translate_document(out.getvalue(), "b.epub", translator(seen=seen))
    assert "Ein\xa0Hund &amp; eine Katze." in seen


# ---------------------------------------------------------------------------------------- .pptx


def build_pptx() -> bytes:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])  # title only
    slide.shapes.title.text = "Ein Bericht über Hunde"
    box = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(6), Inches(1)).text_frame
    p = box.paragraphs[0]
    for text, bold, italic in (("Ein ", False, False), ("brauner Hund", True, False), (" rennt über die ", False, False),
                               ("grüne Wiese", False, True), (" am Haus.", False, False)):
        run = p.add_run()
        run.text, run.font.bold, run.font.italic = text, bold or None, italic or None
    table = slide.shapes.add_table(2, 3, Inches(1), Inches(4), Inches(6), Inches(1)).table
    for r in range(2):
        for c in range(3):
            table.cell(r, c).text = f"zelle {r} {c}"
    slide.notes_slide.notes_text_frame.text = "Notizen für den Sprecher"
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def pptx_runs(prs) -> list:
    runs = []
    for slide in prs.slides:
        for shape in slide.shapes:
            if shape.has_text_frame:
                runs += [r for p in shape.text_frame.paragraphs for r in p.runs]
            if shape.has_table:
                runs += [r for row in shape.table.rows for cell in row.cells for p in cell.text_frame.paragraphs for r in p.runs]
        runs += [r for p in slide.notes_slide.notes_text_frame.paragraphs for r in p.runs]
    return runs


def test_pptx_every_run_translated_and_every_format_kept():
    source = build_pptx()
    out = translate_document(source, "folien.pptx", translator())
    before, after = pptx.Presentation(io.BytesIO(source)), pptx.Presentation(io.BytesIO(out))
    runs_before, runs_after = pptx_runs(before), pptx_runs(after)
    assert len(runs_before) == len(runs_after) > 10
    for a, b in zip(runs_before, runs_after):
        assert b.text == a.text.upper() and (a.font.bold, a.font.italic) == (b.font.bold, b.font.italic)
    slide = after.slides[0]
    table = next(s for s in slide.shapes if s.has_table).table
    assert (len(table.rows), len(table.columns)) == (2, 3) and table.cell(1, 2).text == "ZELLE 1 2"
    assert slide.notes_slide.notes_text_frame.text == "NOTIZEN FÜR DEN SPRECHER"
    assert slide.shapes.title.text == "EIN BERICHT ÜBER HUNDE"


# ---------------------------------------------------------------------------------------- .odt, .odp


def test_odt_every_text_translated_and_its_structure_kept():
    source = build_odt()
    out = translate_document(source, "bericht.odt", translator())
    names = zipfile.ZipFile(io.BytesIO(out)).infolist()
    assert names[0].filename == "mimetype" and names[0].compress_type == zipfile.ZIP_STORED
    before, after = odf_texts(source), odf_texts(out)
    assert after == [t.upper().replace("ß", "SS") if t not in ("1", "Anna") else t for t in before]
    content = zipfile.ZipFile(io.BytesIO(out)).read("content.xml").decode()
    assert '<text:span text:style-name="Bold">BRAUNER HUND</text:span>' in content
    assert '<text:span text:style-name="Italic">GRÜNE WIESE</text:span>' in content and "<text:s/>" in content
    assert "<text:note-citation>1</text:note-citation>" in content and "<dc:creator>Anna</dc:creator>" in content
    styles = odf_texts(out, "styles.xml")
    assert styles == ["KOPFZEILE HIER", "SEITE ", "1", " VON ALLEN"]


def test_odp_slides_tables_and_notes():
    source = build_odp()
    out = translate_document(source, "folien.odp", translator())
    assert odf_texts(out) == [t.upper() for t in odf_texts(source)]
    content = zipfile.ZipFile(io.BytesIO(out)).read("content.xml").decode()
    assert "<presentation:notes>" in content and "<table:table-cell><text:p>ZWEI KINDER SPIELEN.</text:p>" in content
    with pytest.raises(DocumentError, match="not an OpenDocument text"):
        read_document(source, "folien.odt")


# ---------------------------------------------------------------------------------------- .epub


def test_epub_chapters_and_table_of_contents():
    source = build_epub()
    out = translate_document(source, "buch.epub", translator())
    book = zipfile.ZipFile(io.BytesIO(out))
    assert book.infolist()[0].filename == "mimetype" and book.read("OEBPS/content.opf") == zipfile.ZipFile(io.BytesIO(source)).read("OEBPS/content.opf")
    chapter = book.read("OEBPS/text/kapitel 1.xhtml").decode()
    assert chapter.startswith("<?xml") and "<!DOCTYPE html>" in chapter
    root = etree.fromstring(chapter.encode())
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    assert root.findtext(".//h:title", namespaces=ns) == "ERSTES KAPITEL"
    p = root.find(".//h:body/h:p", ns)
    assert p.findtext("h:b", namespaces=ns) == "BRAUNER HUND" and p.findtext("h:i", namespaces=ns) == "GRÜNE WIESE"
    assert "".join(p.itertext()) == "EIN BRAUNER HUND RENNT ÜBER DIE GRÜNE WIESE AM HAUS.1"
    assert p.find("h:a", ns).get("href") == "#n1"
    div = root.find(".//h:body/h:div", ns)
    assert div.text == "ZWEI KINDER SPIELEN." and div.findtext("h:p", namespaces=ns) == "EIN MANN LACHT." and div[0].tail == "EINE FRAU LIEST."
    assert root.findtext(".//h:pre", namespaces=ns) == "nicht übersetzen" and "p { margin: 0 }" in chapter
    assert root.findtext(".//h:aside/h:p", namespaces=ns) == "EINE FUSSNOTE HIER."
    assert odf_texts(out, "OEBPS/toc.ncx") == ["EIN BUCH", "ERSTES KAPITEL"]


# ---------------------------------------------------------------------------------------- bad files



def _png() -> bytes:
    """A 1x1 PNG, for a picture to describe."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x00\x00\x00")) + chunk(b"IEND", b""))


def _described_docx() -> bytes:
    d = docx.Document()
    d.add_paragraph("Ein Mann lacht.")
    link = etree.SubElement(d.paragraphs[0]._p, f"{{{WORD_NS}}}hyperlink", {f"{{{WORD_NS}}}tooltip": "Zur Startseite"})
    etree.SubElement(etree.SubElement(link, f"{{{WORD_NS}}}r"), f"{{{WORD_NS}}}t").text = " Start"
    d.add_picture(io.BytesIO(_png()))
    doc_pr = d.inline_shapes[0]._inline.docPr
    doc_pr.set("descr", "Ein roter Hund im Park")
    doc_pr.set("title", "Hund")
    # Word writes the description in the picture's own properties too
    d.inline_shapes[0]._inline.graphic.graphicData.pic.nvPicPr.cNvPr.set("descr", "Ein roter Hund im Park")
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def _described_pptx() -> bytes:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[6])
    picture = slide.shapes.add_picture(io.BytesIO(_png()), Inches(1), Inches(1))
    picture._element.nvPicPr.cNvPr.set("descr", "Ein roter Hund im Park")
    out = io.BytesIO()
    prs.save(out)
    return out.getvalue()


def _described_odt() -> bytes:
    body = ('<office:body><office:text><text:p>Ein Mann <text:a xmlns:xlink="http://www.w3.org/1999/xlink" xlink:href="https://a.de" office:title="Zur Startseite">'
            'lacht</text:a>.<draw:frame draw:name="Bild1"><draw:image/>'
            '<svg:title>Hund</svg:title><svg:desc>Ein roter Hund im Park</svg:desc></draw:frame></text:p></office:text></office:body>')
    return odf("application/vnd.oasis.opendocument.text", body)


def _described_epub() -> bytes:
    archive = open_zip(build_epub())
    chapter = archive.read("OEBPS/text/kapitel 1.xhtml").decode().replace(
        "<pre>", '<figure><img src="hund.png" alt="Ein roter Hund im Park"/></figure><p title="Hund">Ein <img src="b.png" '
                 'alt="Zwei Kinder"/> Mann lacht.</p><pre>')
    return rewrite_zip(archive, {"OEBPS/text/kapitel 1.xhtml": chapter.encode()})


@pytest.mark.parametrize("name, build", [("a.docx", _described_docx), ("a.pptx", _described_pptx), ("a.odt", _described_odt),
                                         ("a.epub", _described_epub)])
def test_the_alternative_text_of_pictures_is_translated(name, build):
    data = build()
    texts = read_document(data, name).texts
    assert texts.count("Ein roter Hund im Park") == 1, texts  # one unit where the file holds it twice (docx)
    out = translate_document(data, name, translator(), "en")
    with zipfile.ZipFile(io.BytesIO(out)) as z:
        xml = "".join(z.read(n).decode("utf-8", "replace") for n in z.namelist() if n.endswith((".xml", ".xhtml")))
    assert "EIN ROTER HUND IM PARK" in xml and "Ein roter Hund im Park" not in xml
    if name != "a.pptx":
        assert "Hund<" not in xml and '"Hund"' not in xml  # the picture's (or paragraph's) title too
    if name in ("a.docx", "a.odt"):  # a link's tooltip
        assert "ZUR STARTSEITE" in xml and "Zur Startseite" not in xml
    if name == "a.epub":  # an image inside a sentence: its alt translated with the sentence's words
        assert 'alt="ZWEI KINDER"' in xml and "MANN LACHT." in xml

@pytest.mark.parametrize("name", ["a.docx", "a.pptx", "a.odt", "a.odp", "a.epub"])
def test_files_that_are_not_what_they_claim_raise_one_error(name):
    builders = {"a.docx": build_docx, "a.pptx": build_pptx, "a.odt": build_odt, "a.odp": build_odp, "a.epub": build_epub}
    good = builders[name]()
    truncated = good[: len(good) // 2]
    other = build_docx() if not name.endswith(".docx") else build_epub()
    broken_xml = corrupt_member(good)
    for bad in (b"", b"not a zip at all", truncated, other, broken_xml):
        with pytest.raises(DocumentError):
            read_document(bad, name)


def corrupt_member(package: bytes) -> bytes:
    """The package with its main XML part cut in half."""
    src = zipfile.ZipFile(io.BytesIO(package))
    targets = {"word/document.xml", "ppt/slides/slide1.xml", "content.xml", "OEBPS/text/kapitel 1.xhtml"}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            data = src.read(info)
            z.writestr(info, data[: len(data) // 2] if info.filename in targets else data)
    return out.getvalue()


def test_a_zip_bomb_is_refused_before_it_is_unpacked():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("content.xml", b"\0" * (2 << 20))
    assert len(out.getvalue()) < 10_000
    with pytest.raises(DocumentError, match="expands"):
        open_zip(out.getvalue(), max_unpacked_bytes=1 << 20)


def test_a_document_of_more_markup_than_can_be_read_in_reason_is_refused_before_it_is_parsed():
    """Markup that compresses well (paragraphs, empty or not) is a small upload and a large tree: refused
    from the sizes the container announces (its parts are checked to hold no more), before lxml reads it."""
    import nmt_serve.text.documents.document as document

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("[Content_Types].xml", b"<Types/>")
        z.writestr("word/document.xml", b"<w:document><w:body>" + b"<w:p/>" * 400_000 + b"</w:body></w:document>")
        z.writestr("word/media/image1.png", b"\x89PNG" + bytes(3 << 20))  # binary parts count only towards the total
    assert len(out.getvalue()) < 60_000
    limit = getattr(document, "MAX_MARKUP_BYTES", 32 << 20)
    assert limit < 64 << 20
    with pytest.raises(DocumentError, match="markup"):
        open_zip(out.getvalue(), max_markup_bytes=2 << 20)
    open_zip(out.getvalue(), max_markup_bytes=3 << 20)  # the image does not count


def test_a_container_rewritten_twice_comes_out_the_same():
    source = io.BytesIO()
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("a.xml", "<a>" + "x" * 1000 + "</a>")
        z.writestr("b.xml", "<b>" + "y" * 1000 + "</b>")
    archive = open_zip(source.getvalue())
    first = rewrite_zip(archive, {"a.xml": b"<a/>"})
    # the source's entries still point into the source (zipfile's writestr moves the entry it is given)
    assert rewrite_zip(archive, {"a.xml": b"<a/>"}) == first
    assert zipfile.ZipFile(io.BytesIO(first)).read("b.xml") == b"<b>" + b"y" * 1000 + b"</b>"


def test_unknown_formats_are_refused():
    with pytest.raises(DocumentError, match="supported"):
        read_document(b"x", "scan.pdf")


SUBTITLES = ("1\r\n00:00:01,000 --> 00:00:03,500\r\nEin Mann fährt\r\nmit dem Fahrrad.\r\n\r\n"
             "2\r\n00:00:04,000 --> 00:00:06,000\r\n<i>Zwei Hunde</i> spielen & toben.\r\n\r\n"
             "7\r\n00:01:07,000 --> 00:01:08,250\r\n<font color=\"#ffff00\">Hallo</font> <3\r\n\r\n")


def test_subtitles_are_translated_cue_by_cue_with_their_numbers_and_timings_kept():
    import srt

    document = read_document(SUBTITLES.encode("utf-8-sig"), "film.srt")
    # a cue's lines are one text; SubRip's tags are inline HTML, everything else text
    assert document.texts == ["Ein Mann fährt mit dem Fahrrad.", "<i>Zwei Hunde</i> spielen &amp; toben.",
                              '<font color="#ffff00">Hallo</font> &lt;3']
    assert [u.text for u in document.units] == ["Ein Mann fährt mit dem Fahrrad.", "Zwei Hunde spielen & toben.", "Hallo <3"]
    out = document.write(["A man rides his bike through the narrow streets of the old town.",
                          "<i>Two dogs</i> play &amp; romp.", '<font color="#ffff00">Hello</font> &lt;3'])
    assert b"\r\n" in out and b"\n\n" not in out.replace(b"\r\n", b"")  # its line ends kept
    cues = list(srt.parse(out.decode()))
    assert [c.index for c in cues] == [1, 2, 7]
    assert [(c.start.total_seconds(), c.end.total_seconds()) for c in cues] == [(1.0, 3.5), (4.0, 6.0), (67.0, 68.25)]
    assert cues[0].content.split("\n") == ["A man rides his bike through the narrow", "streets of the old town."]
    assert all(len(line) <= 42 for c in cues for line in c.content.split("\n"))
    assert cues[1].content == "<i>Two dogs</i> play & romp."
    assert cues[2].content == '<font color="#ffff00">Hello</font> <3'  # a space in a tag breaks no line


def _srt(*cues: tuple[float, float, str]) -> bytes:
    import srt
    from datetime import timedelta

    return srt.compose([srt.Subtitle(i + 1, timedelta(seconds=a), timedelta(seconds=b), text)
                        for i, (a, b, text) in enumerate(cues)]).encode()


def test_a_sentence_shown_over_several_cues_is_translated_whole_and_shared_out_among_them():
    import srt

    document = read_document(_srt((1, 3, "Ich habe gestern den Hund"), (3.1, 5, "im Park gesehen."),
                                  (5.5, 7, "Er lief weg.")), "film.srt")
    # translated cue by cue, the first half has no verb: the sentence is one text
    assert document.texts == ["Ich habe gestern den Hund im Park gesehen.", "Er lief weg."]
    out = list(srt.parse(document.write(["I saw the dog in the park yesterday.", "He ran away."]).decode()))
    assert [(c.index, c.start.total_seconds(), c.end.total_seconds()) for c in out] == [(1, 1, 3), (2, 3.1, 5), (3, 5.5, 7)]
    # by the cues' shares of the source's characters (25 and 16), cut between words
    assert [c.content for c in out] == ["I saw the dog in the", "park yesterday.", "He ran away."]
    # a unit written back untranslated (a partial job's result) leaves its cues as they were
    source = _srt((1, 2, "<i>Er lief, und ich wollte...</i>"), (2, 3, "<i>...ihn fangen.</i>"), (4, 5, "- Wer?\n- Ich."))
    document = read_document(source, "film.srt")
    assert document.write(document.texts) == source


def test_a_translation_of_fewer_words_than_cues_leaves_no_cue_empty():
    import srt
    import webvtt

    # "Ja," / "genau," / "das war er." as "Exactly, him.": "Exactly," takes the first two cues' share of the
    # source, so the second would show nothing; it goes, the first shows its word until the second's end, and
    # the cues after keep their numbers
    document = read_document(_srt((1, 2, "Ja,"), (2, 3, "genau,"), (3, 5, "das war er."), (6, 7, "Gut.")), "film.srt")
    assert len(document.units) == 2
    out = list(srt.parse(document.write(["Exactly, him.", "Good."]).decode()))
    assert [(c.index, c.start.total_seconds(), c.end.total_seconds(), c.content) for c in out] == [
        (1, 1, 3, "Exactly,"), (3, 3, 5, "him."), (4, 6, 7, "Good.")]
    captions = ("WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nJa,\n\n00:00:02.000 --> 00:00:03.500\ngenau das.\n\n"
                "00:00:04.000 --> 00:00:05.000\nGut.\n")
    document = read_document(captions.encode(), "film.vtt")
    out = webvtt.from_string(document.write(["Exactly.", "Good."]).decode())
    assert [(c.start, c.end, c.text) for c in out] == [("00:00:01.000", "00:00:03.500", "Exactly."),
                                                      ("00:00:04.000", "00:00:05.000", "Good.")]


def test_a_cut_falls_after_punctuation_near_the_cues_share():
    document = read_document(_srt((1, 2, "Als er kam, sahen"), (2, 4, "wir den großen Hund.")), "film.srt")
    # by the shares alone the cut would fall after "came, we" (0.45 of the text); after the comma it is 0.36 away
    out = document.write(["When he came, we saw the big dog."]).decode()
    assert "When he came,\n\n2\n" in out and out.rstrip().endswith("we saw the big dog."), out


@pytest.mark.parametrize("cues, units", [
    ([(1, 2, "Ich sah"), (5, 6, "den Hund.")], 2),  # 3 s apart: not one sentence shown in pieces
    ([(1, 2, "Ich sah."), (2, 3, "den Hund.")], 2),  # a sentence's end between them
    ([(1, 2, "Ich sah"), (2, 3, "- Wen?")], 2),  # a new speaker
    ([(1, 2, "Musik ♪"), (2, 3, "hallo zusammen.")], 2),  # a music cue
    ([(1, 2, "Ich wollte..."), (2, 3, "Egal.")], 2),  # an ellipsis that the next cue does not take up
    ([(1, 2, "Ich wollte..."), (2, 3, "nach Hause.")], 1),
    ([(t, t + 1, "und dann") for t in range(6)], 2),  # at most four cues
])
def test_which_cues_are_one_sentence(cues, units):
    assert len(read_document(_srt(*cues), "film.srt").units) == units


def test_ellipses_and_tags_at_a_cut_are_put_back_on_both_sides():
    import srt

    document = read_document(_srt((1, 2, "<i>Er lief, und ich wollte...</i>"), (2, 3, "<i>...ihn fangen.</i>")), "film.srt")
    # the model reads one sentence: no ellipsis in it, one run of italics
    assert document.texts == ["<i>Er lief, und ich wollte ihn fangen.</i>"]
    out = list(srt.parse(document.write(["<i>He ran, and I wanted to catch him.</i>"]).decode()))
    assert [c.content for c in out] == ["<i>He ran, and I wanted to...</i>", "<i>...catch him.</i>"]
    # a tag open at a cut is closed before it and opened again after it: each cue is well-formed on its own
    document = read_document(_srt((1, 2, "Der Mann,"), (2, 3, "der dort steht,"), (3, 4, "lacht laut.")), "film.srt")
    out = list(srt.parse(document.write(['The <font color="red">man standing there</font> laughs out loud.']).decode()))
    assert [c.content for c in out] == ['The <font color="red">man</font>', '<font color="red">standing there</font> laughs',
                                        "out loud."]


def test_a_dialogue_cue_keeps_a_speaker_a_line():
    import srt

    document = read_document(_srt((1, 2, "- Wer ist da?\n- Ich bin es."), (3, 4, "- Wer?\nIch.")), "film.srt")
    assert document.texts == ["- Wer ist da? - Ich bin es.", "- Wer? Ich."]
    out = list(srt.parse(document.write(["- Who is there? - It's me.", "- Who? - Me."]).decode()))
    # the second cue's lines were not each a turn: its translation is laid out by width
    assert [c.content for c in out] == ["- Who is there?\n- It's me.", "- Who? - Me."]


@pytest.mark.parametrize("data, reason", [(b"\xff\xfe1\x00", "UTF-8"), (b"1\n00:00:01 --> soon\nHallo\n", "SubRip"),
                                          (b"Hallo, wie geht es?\n", "SubRip")])
def test_a_file_that_is_no_subtitles_is_refused_saying_why(data, reason):
    with pytest.raises(DocumentError, match=reason):
        read_document(data, "film.srt")


CAPTIONS = """WEBVTT - Ein Film
Kind: captions

STYLE
::cue(.yellow) { color: yellow }

NOTE Eine Anmerkung, nicht zu übersetzen

intro
00:00:01.000 --> 00:00:03.000 line:0 position:20% align:start
<v Roger>Ich habe <i>gestern</i> den Hund

00:00:03.100 --> 00:00:05.000
<v Roger>im Park gesehen &amp; gerufen.</v>

00:00:05.200 --> 00:00:06.000
<v Anna>Wo?

3
00:00:06.000 --> 00:00:07.000
<c.yellow>Hallo</c> <00:00:06.500>Welt, <lang en>dog</lang> &lt;3
"""


def test_webvtt_captions_keep_their_blocks_settings_speakers_and_markup():
    import webvtt

    document = read_document(CAPTIONS.encode(), "film.vtt")
    # Roger's sentence over two cues is one unit, his voice tag out of it; Anna is another speaker; a class or
    # language tag is a span, a karaoke timestamp dropped
    assert document.texts == ["Ich habe <i>gestern</i> den Hund im Park gesehen &amp; gerufen.", "Wo?",
                              '<span data-vtt="0">Hallo</span> Welt, <span data-vtt="1">dog</span> &lt;3']
    assert [u.text for u in document.units][2] == "Hallo Welt, dog <3"
    out = document.write(["I saw the dog <i>yesterday</i> in the park &amp; called.", "Where?",
                          '<span data-vtt="0">Hello</span> world, <span data-vtt="1">dog</span> &lt;3'], "en").decode()
    captions = webvtt.from_string(out)
    assert [(c.identifier, c.start, c.end) for c in captions] == [
        ("intro", "00:00:01.000", "00:00:03.000"), (None, "00:00:03.100", "00:00:05.000"),
        (None, "00:00:05.200", "00:00:06.000"), ("3", "00:00:06.000", "00:00:07.000")]
    assert str(captions[0].settings) == "line:0 position:20% align:start"
    assert [c.raw_text for c in captions] == ["<v Roger>I saw the dog <i>yesterday</i>", "<v Roger>in the park &amp; called.</v>",
                                              "<v Anna>Where?", "<c.yellow>Hello</c> world, <lang en>dog</lang> &lt;3"]
    assert "::cue(.yellow) { color: yellow }" in out and "NOTE Eine Anmerkung, nicht zu übersetzen" in out
    assert out.startswith("WEBVTT - Ein Film\nKind: captions\n")


@pytest.mark.parametrize("data, name", [
    (b"WEBVTT\n\n00:00:01.000 --> 00:00:02.000\n<v Anna></v>\n\n00:00:02.000 --> 00:00:03.000\nHallo.\n", "film.vtt"),
    (b"1\n00:00:01,000 --> 00:00:02,000\n<i></i>\n\n2\n00:00:02,000 --> 00:00:03,000\nHallo.\n", "film.srt")])
def test_a_cue_of_markup_alone_is_kept_as_it_is(data, name):
    document = read_document(data, name)
    assert document.texts == ["Hallo."]
    out = document.write(["Hello."]).decode()
    assert ("<v Anna></v>" in out or "<i></i>" in out) and "Hello." in out


@pytest.mark.parametrize("data, reason", [(b"\xff\xfe1\x00", "UTF-8"), (b"1\n00:00:01,000 --> 00:00:02,000\nHallo\n", "WebVTT")])
def test_a_file_that_is_no_webvtt_is_refused_saying_why(data, reason):
    with pytest.raises(DocumentError, match=reason):
        read_document(data, "film.vtt")


CATALOG = r'''msgid ""
msgstr ""
"Language: de\n"
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=3; plural=(n==1 ? 0 : n>=2 && n<=4 ? 1 : 2);\n"

#: main.c:10
#, c-format
msgid "  Datei %s nicht gefunden.\n"
"\n"
"Siehe https://example.org/hilfe?a=1&b=2"
msgstr ""

msgid "Ein Mann"
msgstr "A man"

#, fuzzy
msgid "Eine Frau"
msgstr "A woman (old)"

msgid "%d Hund"
msgid_plural "%d Hunde"
msgstr[0] ""
msgstr[1] ""
msgstr[2] ""

#~ msgid "Alt"
#~ msgstr ""
'''


def test_a_catalog_gets_the_translations_it_lacks_marked_fuzzy_and_keeps_the_rest():
    import polib

    document = read_document(CATALOG.encode(), "cs.po")
    # line by line, each line's spaces kept outside; placeholders and URLs kept out of what the model reads
    assert document.texts == ['Datei <span translate="no">%s</span> nicht gefunden.',
                              'Siehe <span translate="no">https://example.org/hilfe?a=1&amp;b=2</span>',
                              '<span translate="no">%d</span> Hund', '<span translate="no">%d</span> Hunde',
                              '<span translate="no">%d</span> Hunde']
    out = document.write(['File <span translate="no">%s</span> not found.',
                          'See <span translate="no">https://example.org/hilfe?a=1&amp;b=2</span>',
                          '<span translate="no">%d</span> pes', '<span translate="no">%d</span> psi',
                          '<span translate="no">%d</span> psů'], "cs")
    catalog = polib.pofile(out.decode())
    assert catalog.metadata["Language"] == "cs"
    first = catalog.find("  Datei %s nicht gefunden.\n\nSiehe https://example.org/hilfe?a=1&b=2")
    assert first.msgstr == "  File %s not found.\n\nSee https://example.org/hilfe?a=1&b=2"
    assert first.flags == ["c-format", "fuzzy"] and first.occurrences == [("main.c", "10")]
    assert catalog.find("Ein Mann").msgstr == "A man" and "fuzzy" not in catalog.find("Ein Mann").flags
    assert catalog.find("Eine Frau").msgstr == "A woman (old)"  # a translator's, fuzzy: kept
    assert catalog.find("%d Hund").msgstr_plural == {0: "%d pes", 1: "%d psi", 2: "%d psů"}
    assert [e.msgid for e in catalog.obsolete_entries()] == ["Alt"]


def test_a_doubtful_translation_gets_a_translator_comment_in_its_entry():
    import polib

    document = read_document(CATALOG.encode(), "cs.po")
    flags = [("low_confidence",), (), (), ("repetition",), ("repetition", "truncated")]  # per unit (line or plural form)
    catalog = polib.pofile(document.write(translator()(document.texts), "cs", flags).decode())
    first = catalog.find("  Datei %s nicht gefunden.\n\nSiehe https://example.org/hilfe?a=1&b=2")
    assert first.tcomment.startswith("Machine translation flagged: low_confidence (")
    # the plural entry's forms together, each flag once; the entry without a flag gets no comment
    assert catalog.find("%d Hund").tcomment.count("repetition (") == 1 and "truncated (" in catalog.find("%d Hund").tcomment
    assert not catalog.find("Ein Mann").tcomment


@pytest.mark.parametrize("charset", ["ISO-8859-1", "CHARSET"])
def test_a_catalog_is_read_in_its_charset_and_written_in_utf8(charset):
    import polib

    header = f'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset={charset}\\n"\n\n'
    data = (header + 'msgid "Grüße"\nmsgstr ""\n').encode("latin-1" if charset != "CHARSET" else "utf-8")
    document = read_document(data, "de.po")
    assert document.texts == ["Grüße"]
    # Czech has letters ISO-8859-1 lacks: the catalog comes back in UTF-8, and its header says so
    catalog = polib.pofile(document.write(["Pozdravy ze Žďáru"], "cs").decode("utf-8"))
    assert catalog.find("Grüße").msgstr == "Pozdravy ze Žďáru"
    assert catalog.metadata["Content-Type"] == "text/plain; charset=UTF-8"


@pytest.mark.parametrize("data, reason", [(b"msgid \"a\"\nmsgstr \"\xff\"\n", "UTF-8"), (b"Hallo, wie geht es?\n", "gettext"),
                                          (b"", "empty"), (b'msgid ""\nmsgstr "Content-Type: text/plain; charset=ASCII\\n"\n'
                                                           b'msgid "\xc3\xa4"\nmsgstr ""\n', "ASCII text, the charset its header names")])
def test_a_file_that_is_no_catalog_is_refused_saying_why(data, reason):
    with pytest.raises(DocumentError, match=reason):
        read_document(data, "de.po")


def build_xlsx(inline: str | None = None) -> bytes:
    """A workbook made by openpyxl: plain, repeated and rich text, a number, a formula, a date as text;
    `inline`: also a cell D1 of an inline string (as some generators write them), put in by hand."""
    import openpyxl
    from openpyxl.cell.rich_text import CellRichText, TextBlock
    from openpyxl.cell.text import InlineFont

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Tiere"
    sheet["A1"], sheet["A2"], sheet["A3"] = "Ein Hund rennt über die Wiese.", 42, "=LEN(A1)"
    sheet["B1"] = CellRichText(["Ein kleiner ", TextBlock(InlineFont(b=True), "brauner Hund"), " schläft."])
    sheet["B2"], sheet["C1"] = "Ein Hund rennt über die Wiese.", "2024-01-01"
    out = io.BytesIO()
    book.save(out)
    if inline is None:
        return out.getvalue()
    source, copy = zipfile.ZipFile(io.BytesIO(out.getvalue())), io.BytesIO()
    with zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as z:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "xl/worksheets/sheet1.xml":
                data = data.replace(b"</row>", f'<c r="D1" t="inlineStr"><is><t>{inline}</t></is></c></row>'.encode(), 1)
            z.writestr(info, data)
    return copy.getvalue()


def test_a_workbook_gets_its_texts_translated_and_keeps_everything_else():
    import openpyxl

    source = build_xlsx(inline="Zwei Kinder spielen.")
    document = read_document(source, "tiere.xlsx")
    plain = [re.sub(r"<[^>]+>", "", t) for t in document.texts]
    assert set(plain) == {"Ein Hund rennt über die Wiese.", "Ein kleiner brauner Hund schläft.", "Zwei Kinder spielen."}
    english = {"Ein Hund rennt über die Wiese.": "A dog runs across the meadow.", "Zwei Kinder spielen.": " Two kids play."}

    def translate(html_text: str) -> str:  # the rich text: its bold run on "brown dog"
        if "brauner Hund" in html_text:
            return re.sub(r"brauner Hund", "brown dog", html_text).replace("Ein kleiner ", "A small ").replace(" schläft.", " sleeps.")
        return english[html_text]

    out = document.write([translate(t) for t in document.texts])
    book = openpyxl.load_workbook(io.BytesIO(out), rich_text=True)
    sheet = book["Tiere"]  # the sheet's name is kept: formulas refer to it
    assert sheet["A1"].value == sheet["B2"].value == "A dog runs across the meadow."
    assert (sheet["A2"].value, sheet["A3"].value, sheet["C1"].value) == (42, "=LEN(A1)", "2024-01-01")
    assert sheet["D1"].value == " Two kids play."
    rich = sheet["B1"].value
    assert str(rich) == "A small brown dog sleeps."
    assert [(getattr(block, "font", None) is not None and block.font.b, str(getattr(block, "text", block))) for block in rich
            if str(getattr(block, "text", block))] == [(False, "A small "), (True, "brown dog"), (False, " sleeps.")]
    before, after = zipfile.ZipFile(io.BytesIO(source)), zipfile.ZipFile(io.BytesIO(out))
    assert before.namelist() == after.namelist()
    changed = {n for n in before.namelist() if before.read(n) != after.read(n)}
    assert changed == {"xl/worksheets/sheet1.xml"}  # openpyxl writes its strings into the sheet (inline)
    assert b'xml:space="preserve"' in after.read("xl/worksheets/sheet1.xml")  # the leading space kept


SHARED = {
    "[Content_Types].xml": '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>'
    '<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>'
    '<Override PartName="/xl/sharedStrings.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sharedStrings+xml"/>'
    '</Types>',
    "_rels/.rels": '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" '
    'Target="xl/workbook.xml"/></Relationships>',
    "xl/workbook.xml": '<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" '
    'xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships"><sheets>'
    '<sheet name="Tiere" sheetId="1" r:id="rId1"/></sheets></workbook>',
    "xl/_rels/workbook.xml.rels": '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>'
    '<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/sharedStrings" Target="sharedStrings.xml"/>'
    '</Relationships>',
    "xl/worksheets/sheet1.xml": '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"><sheetData>'
    '<row r="1"><c r="A1" t="s"><v>0</v></c><c r="B1" t="s"><v>1</v></c><c r="C1"><v>42</v></c></row>'
    '<row r="2"><c r="A2" t="s"><v>0</v></c><c r="B2" t="s"><v>2</v></c></row></sheetData></worksheet>',
    "xl/sharedStrings.xml": '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="4" uniqueCount="3">'
    '<si><t>Ein Hund rennt über die Wiese.</t></si>'
    '<si><r><t xml:space="preserve">Ein kleiner </t></r><r><rPr><b/></rPr><t>brauner Hund</t></r><r><t xml:space="preserve"> schläft.</t></r></si>'
    '<si><t>2024-01-01</t></si></sst>',
}


def test_a_workbook_of_shared_strings_gets_each_text_translated_once():
    """As Excel writes a workbook: each distinct text once in xl/sharedStrings.xml, the cells its indices."""
    import openpyxl

    source = io.BytesIO()
    with zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in SHARED.items():
            z.writestr(name, '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>' + text)
    document = read_document(source.getvalue(), "tiere.xlsx")
    assert [re.sub(r"<[^>]+>", "", t) for t in document.texts] == ["Ein Hund rennt über die Wiese.", "Ein kleiner brauner Hund schläft."]
    rich = document.texts[1]
    out = document.write(["A dog runs across the meadow.",
                          rich.replace("Ein kleiner ", "A small ").replace("brauner Hund", "brown dog").replace(" schläft.", " sleeps.")])
    sheet = openpyxl.load_workbook(io.BytesIO(out), rich_text=True)["Tiere"]
    assert sheet["A1"].value == sheet["A2"].value == "A dog runs across the meadow."  # one text, two cells
    assert (str(sheet["B1"].value), sheet["C1"].value, sheet["B2"].value) == ("A small brown dog sleeps.", 42, "2024-01-01")
    bold = [str(block.text) for block in sheet["B1"].value if getattr(block, "font", None) is not None and block.font.b]
    assert bold == ["brown dog"]
    after = zipfile.ZipFile(io.BytesIO(out))
    assert after.read("xl/worksheets/sheet1.xml") == zipfile.ZipFile(source).read("xl/worksheets/sheet1.xml")
    assert b'count="4" uniqueCount="3"' in after.read("xl/sharedStrings.xml")


def test_a_workbook_gets_its_comments_and_chart_titles_translated():
    import openpyxl
    from lxml import etree
    from openpyxl.chart import BarChart, Reference
    from openpyxl.comments import Comment

    book = openpyxl.Workbook()
    sheet = book.active
    sheet["A1"], sheet["A2"], sheet["A3"] = "Umsatz", 3, 5
    sheet["A1"].comment = Comment("Diese Zahl ist falsch.", "Max")
    chart = BarChart()
    chart.title, chart.y_axis.title = "Umsatz pro Jahr", "Euro"
    chart.add_data(Reference(sheet, min_col=1, min_row=1, max_row=3), titles_from_data=True)
    sheet.add_chart(chart, "C3")
    made = io.BytesIO()
    book.save(made)
    threaded = ('<ThreadedComments xmlns="http://schemas.microsoft.com/office/spreadsheetml/2018/threadedcomments">'
                '<threadedComment ref="A2" id="{1}"><text>Bitte prüfen.</text></threadedComment></ThreadedComments>')
    source = io.BytesIO()
    with zipfile.ZipFile(made) as z, zipfile.ZipFile(source, "w", zipfile.ZIP_DEFLATED) as out:
        for info in z.infolist():
            data = z.read(info)
            if info.filename == "xl/comments/comment1.xml":  # as Excel writes a note: its author's name first, in bold
                data = data.replace(b"<text><t>Diese Zahl ist falsch.</t></text>",
                                    b'<text><r><rPr><b/></rPr><t>Max:</t></r><r><t xml:space="preserve">\nDiese Zahl ist falsch.</t></r></text>')
            if info.filename == "xl/drawings/drawing1.xml":  # the chart's alternative text, as Excel's dialog sets it
                assert b'name="Chart 1"' in data
                data = data.replace(b'name="Chart 1"', b'name="Chart 1" descr="Umsatz der Jahre"')
            if info.filename == "[Content_Types].xml":
                data = data.replace(b"</Types>", b'<Override PartName="/xl/threadedComments/threadedComment1.xml" '
                                    b'ContentType="application/vnd.ms-excel.threadedcomments+xml"/></Types>')
            out.writestr(info, data)
        out.writestr("xl/threadedComments/threadedComment1.xml", threaded)
    document = read_document(source.getvalue(), "umsatz.xlsx")
    english = {"Umsatz": "Sales", "Diese Zahl ist falsch.": "This number is wrong.", "Bitte prüfen.": "Please check.",
               "Umsatz pro Jahr": "Sales per year", "Euro": "Euros", "Umsatz der Jahre": "Sales over the years"}
    assert sorted(document.texts) == sorted(english)  # the author's name is no text to translate
    written = document.write([english[t] for t in document.texts], "en")
    assert openpyxl.load_workbook(io.BytesIO(written))["Sheet"]["A1"].comment.text == "Max:\nThis number is wrong."
    out = zipfile.ZipFile(io.BytesIO(written))
    comment = etree.fromstring(out.read("xl/comments/comment1.xml"))
    assert [t.text for t in comment.iter("{*}t")] == ["Max:", "\nThis number is wrong."]
    assert b"<text>Please check.</text>" in out.read("xl/threadedComments/threadedComment1.xml")
    chart = etree.fromstring(out.read("xl/charts/chart1.xml"))
    assert [t.text for t in chart.iter("{http://schemas.openxmlformats.org/drawingml/2006/main}t")] == ["Sales per year", "Euros"]
    assert b'name="Chart 1" descr="Sales over the years"' in out.read("xl/drawings/drawing1.xml")


def test_a_workbook_with_macros_renamed_is_named_not_translated():
    source, copy = zipfile.ZipFile(io.BytesIO(build_xlsx())), io.BytesIO()
    with zipfile.ZipFile(copy, "w") as z:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == "[Content_Types].xml":
                data = data.replace(b"spreadsheetml.sheet.main+xml", b"XXX").replace(
                    b"application/vnd.openxmlformats-officedocument.XXX", b"application/vnd.ms-excel.sheet.macroEnabled.main+xml")
            z.writestr(info, data)
    with pytest.raises(DocumentError, match="macros"):
        read_document(copy.getvalue(), "tabelle.xlsx")
