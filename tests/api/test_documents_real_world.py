"""Documents as people send them, through the service (POST /v1/translate_file) with the shipped de-en
model: Word files with a table of contents, a link written as a simple field, optional hyphens and a
chart; an EPUB 2 book (XHTML 1.1's DOCTYPE, named entities, comments, an author in toc.ncx); and the
damaged, forged, protected and renamed files a service is sent too, each answered with a clear 400 in
the one error shape (never a 500, never gigabytes inflated, never a file its application will not
open)."""
from __future__ import annotations

import io
import re
import struct
import tracemalloc
import zipfile
import zlib

import docx
import pptx
from document_files import build_epub, build_odt
from lxml import etree
from test_documents import build_docx, client, our_error, translate_file  # noqa: F401  (client: the fixture)

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


# ---------------------------------------------------------------------------------------- building files


def replace_members(package: bytes, replace: dict, extra: dict | None = None) -> bytes:
    """The zip with some members' contents changed (a function of the old bytes) and some added."""
    src = zipfile.ZipFile(io.BytesIO(package))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            data = src.read(info)
            if info.filename in replace:
                data = replace[info.filename](data)
            z.writestr(info, data)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return out.getvalue()


def docx_with_body(body: str) -> bytes:
    """A python-docx document whose body is the given WordprocessingML (its section kept)."""
    out = io.BytesIO()
    docx.Document().save(out)

    def body_of(xml: bytes) -> bytes:
        s = xml.decode()
        return (s[:s.index("<w:body>") + len("<w:body>")] + body + s[s.index("<w:sectPr"):]).encode()

    return replace_members(out.getvalue(), {"word/document.xml": body_of})


def run(text: str) -> str:
    return f'<w:r><w:t xml:space="preserve">{text}</w:t></w:r>'


def field(instruction: str, result: str) -> str:
    return (f'<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText xml:space="preserve"> {instruction} </w:instrText></w:r>'
            f'<w:r><w:fldChar w:fldCharType="separate"/></w:r>{run(result)}<w:r><w:fldChar w:fldCharType="end"/></w:r>')


def w_paragraphs(data: bytes, member: str = "word/document.xml") -> list[list[str]]:
    """Each paragraph's w:t texts, in order."""
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(data)).read(member))
    return [[t.text or "" for t in p.iter(f"{{{W_NS}}}t")] for p in root.iter(f"{{{W_NS}}}p")]


def member_offset(package: bytes, name: str) -> tuple[zipfile.ZipInfo, int]:
    """A member's directory entry and where its compressed bytes start."""
    info = zipfile.ZipFile(io.BytesIO(package)).getinfo(name)
    name_length, extra_length = struct.unpack("<HH", package[info.header_offset + 26:info.header_offset + 30])
    return info, info.header_offset + 30 + name_length + extra_length


def set_in_directory(package: bytes, offset: int, value: int) -> bytes:
    """The package with a 2-byte field of every central directory entry (offset from the entry's start) set."""
    b = bytearray(package)
    i = b.find(b"PK\x01\x02")
    while i != -1:
        struct.pack_into("<H", b, i + offset, value)
        i = b.find(b"PK\x01\x02", i + 1)
    return bytes(b)


# ---------------------------------------------------------------------------------------- Word


def test_every_entry_of_a_table_of_contents_is_translated_and_its_page_numbers_kept(client):
    """Word writes a table of contents as one TOC field over several paragraphs, each entry a link with
    a PAGEREF field: the first entry (where the field begins) was left in German, the others translated."""
    entries = ["Ein Hund rennt über die Wiese.", "Zwei Kinder spielen im Schnee.", "Eine Frau liest ein Buch."]
    toc = ('<w:p><w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText xml:space="preserve"> TOC \\o "1-3" \\h \\z \\u </w:instrText></w:r>'
           '<w:r><w:fldChar w:fldCharType="separate"/></w:r>')
    for i, entry in enumerate(entries, 1):
        page_number = field(f"PAGEREF _Toc{i} " + "\\h", str(i))
        toc += ("" if i == 1 else "<w:p>") + f'<w:hyperlink w:anchor="_Toc{i}">{run(entry)}<w:r><w:tab/></w:r>{page_number}</w:hyperlink></w:p>'
    toc += '<w:p><w:r><w:fldChar w:fldCharType="end"/></w:r></w:p>'
    headings = "".join(f'<w:p><w:bookmarkStart w:id="{i}" w:name="_Toc{i}"/>{run(e)}<w:bookmarkEnd w:id="{i}"/></w:p>'
                       for i, e in enumerate(entries, 1))
    r = translate_file(client, "inhalt.docx", docx_with_body(toc + headings))
    assert r.status_code == 200, r.text
    paragraphs = w_paragraphs(r.content)
    toc_entries, translated_headings = paragraphs[:3], paragraphs[4:]
    for i, (entry, heading) in enumerate(zip(toc_entries, translated_headings), 1):
        assert entry[-1] == str(i), entry  # the page number: the PAGEREF field's result, as it was
        text = "".join(entry[:-1])
        assert text not in entries and text.strip() == "".join(heading).strip(), (entry, heading)
    assert "dog" in "".join(toc_entries[0]).lower()


def test_a_link_written_as_one_simple_field_is_translated_as_a_link_is(client):
    """A HYPERLINK field written as one w:fldSimple (as some generators write links) was a separator, its
    text never translated; another simple field's result (a page number) stays as it is."""
    link = ('<w:fldSimple w:instr=" HYPERLINK &quot;https://example.org&quot; "><w:r><w:rPr><w:rStyle w:val="Hyperlink"/>'
            '</w:rPr><w:t>fährt Fahrrad</w:t></w:r></w:fldSimple>')
    body = (f'<w:p>{run("Ein Mann ")}{link}{run(" auf der Straße.")}</w:p>'
            f'<w:p>{run("Zwei Kinder spielen auf Seite ")}<w:fldSimple w:instr=" PAGE "><w:r><w:t>3</w:t></w:r></w:fldSimple></w:p>')
    r = translate_file(client, "link.docx", docx_with_body(body))
    assert r.status_code == 200, r.text
    root = etree.fromstring(zipfile.ZipFile(io.BytesIO(r.content)).read("word/document.xml"))
    simple = root.findall(f".//{{{W_NS}}}fldSimple")
    link_text, page = ("".join(f.itertext()) for f in simple)
    first, second = ("".join(p.itertext()) for p in root.iter(f"{{{W_NS}}}p"))
    assert link_text.strip() and "fährt" not in first and "Fahrrad" not in first, first
    assert "man" in first.lower() and "children" in second.lower() and page == "3", (first, second)


def test_optional_hyphens_do_not_split_the_words_sent_to_translation(client):
    """German compounds carry optional hyphens (Ctrl+-: w:softHyphen): "Fahr<shy>rad" went to the model
    as the two words "Fahr rad", and came back glued around the hyphens the source's word had."""
    body = ('<w:p><w:r><w:t xml:space="preserve">Ein Mann fährt Fahr</w:t><w:softHyphen/><w:t xml:space="preserve">rad '
            'auf der Straße.</w:t></w:r></w:p>')
    plain = client.post("/v1/translate", json={"text": "Ein Mann fährt Fahrrad auf der Straße.", "source": "de", "target": "en"})
    assert plain.status_code == 200, plain.text
    r = translate_file(client, "silben.docx", docx_with_body(body))
    assert r.status_code == 200, r.text
    xml = zipfile.ZipFile(io.BytesIO(r.content)).read("word/document.xml").decode()
    assert "softHyphen" not in xml  # the source word's break points mean nothing in the translation
    assert "".join(w_paragraphs(r.content)[0]) == plain.json()["translations"][0]["text"]


CHART = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
         '<c:chartSpace xmlns:c="http://schemas.openxmlformats.org/drawingml/2006/chart" '
         'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><c:chart><c:title><c:tx><c:rich><a:bodyPr/>'
         '<a:p><a:r><a:rPr lang="de-DE" b="1"/><a:t>Zwei Hunde spielen im Schnee.</a:t></a:r></a:p></c:rich></c:tx></c:title>'
         '<c:plotArea><c:layout/></c:plotArea></c:chart></c:chartSpace>')


def with_chart(package: bytes) -> bytes:
    """A Word document with a chart part related to its body (as Word's Insert > Chart makes one)."""
    content_type = "application/vnd.openxmlformats-officedocument.drawingml.chart+xml"
    relationship = "http://schemas.openxmlformats.org/officeDocument/2006/relationships/chart"
    return replace_members(package, {
        "[Content_Types].xml": lambda x: x.replace(b"</Types>", f'<Override PartName="/word/charts/chart1.xml" '
                                                                f'ContentType="{content_type}"/></Types>'.encode()),
        "word/_rels/document.xml.rels": lambda x: x.replace(b"</Relationships>", f'<Relationship Id="rIdChart1" '
                                                            f'Type="{relationship}" Target="charts/chart1.xml"/></Relationships>'.encode()),
    }, {"word/charts/chart1.xml": CHART})


def test_a_chart_title_in_a_word_document_is_translated_as_in_a_presentation(client):
    r = translate_file(client, "bericht.docx", with_chart(build_docx()))
    assert r.status_code == 200, r.text
    chart = etree.fromstring(zipfile.ZipFile(io.BytesIO(r.content)).read("word/charts/chart1.xml"))
    title = "".join(chart.itertext())
    assert "dog" in title.lower() and "Hunde" not in title, title
    assert chart.find(".//{http://schemas.openxmlformats.org/drawingml/2006/main}rPr").get("b") == "1"
    assert "dog" in docx.Document(io.BytesIO(r.content)).paragraphs[0].text.lower()


# ---------------------------------------------------------------------------------------- EPUB


def test_an_epub2_book_with_the_xhtml11_doctype_entities_and_comments_is_translated(client):
    """EPUB 2 chapters name XHTML 1.1's DTD (never loaded): the parser keeps `&nbsp;` as an entity node
    there, and a comment inside a paragraph is a node without text; either made the whole book a 400
    ("it is damaged or another format (ValueError)")."""
    chapter = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.1//EN" '
               '"http://www.w3.org/TR/xhtml11/DTD/xhtml11.dtd">\n<html xmlns="http://www.w3.org/1999/xhtml"><head><title>Kapitel</title>'
               '</head><body><p>Ein&nbsp;Hund rennt über die <i>grüne</i> Wiese.</p>'
               '<p>Zwei Kinder spielen im Schnee.<!-- Seite 12 --></p></body></html>')
    book = replace_members(build_epub(), {"OEBPS/text/kapitel 1.xhtml": lambda _: chapter.encode()})
    r = translate_file(client, "buch.epub", book)
    assert r.status_code == 200, r.text
    out = zipfile.ZipFile(io.BytesIO(r.content)).read("OEBPS/text/kapitel 1.xhtml").decode()
    assert 'XHTML 1.1//EN' in out and "<!-- Seite 12 -->" in out and "<i>" in out
    root = etree.fromstring(out.encode())
    first, second = ["".join(p.itertext()) for p in root.iter("{http://www.w3.org/1999/xhtml}p")]
    assert "dog" in first.lower() and "children" in second.lower(), (first, second)


def test_the_author_named_in_an_epub2_table_of_contents_is_not_translated(client):
    """toc.ncx names the book's title and its author (docAuthor): every `text` element of it was
    translated, the author's name too."""
    author = "Johann Wolfgang von Goethe"
    book = replace_members(build_epub(), {"OEBPS/toc.ncx": lambda x: x.replace(
        b"</docTitle>", f"</docTitle><docAuthor><text>{author}</text></docAuthor>".encode())})
    r = translate_file(client, "buch.epub", book)
    assert r.status_code == 200, r.text
    ncx = etree.fromstring(zipfile.ZipFile(io.BytesIO(r.content)).read("OEBPS/toc.ncx"))
    ns = {"n": "http://www.daisy.org/z3986/2005/ncx/"}
    assert ncx.findtext("n:docAuthor/n:text", namespaces=ns) == author
    assert ncx.findtext("n:docTitle/n:text", namespaces=ns) != "Ein Buch"


# ---------------------------------------------------------------------------------------- files that cannot be translated


def test_damaged_zip_members_are_a_400_not_a_500(client):
    good = build_docx()
    info, start = member_offset(good, "word/document.xml")
    corrupt = bytearray(good)
    for i in range(start + 4, start + 40):
        corrupt[i] ^= 0x55  # the deflate stream damaged (zlib.error: was a 500)
    cases = {
        "damaged": ("kaputt.docx", bytes(corrupt)),
        "encrypted": ("zip-passwort.docx", set_in_directory(good, 8, 0x1)),  # a ZipCrypto member (RuntimeError)
        "compression method 9": ("deflate64.docx", set_in_directory(good, 10, 9)),  # Deflate64 (NotImplementedError)
    }
    for expected, (name, data) in cases.items():
        message = our_error(translate_file(client, name, data), 400, "invalid_request")
        assert "cannot be read as .docx" in message and expected in message, message
    # in an .odt or an .epub, a member nothing reads before the file is written back (an image): was a
    # 500 after the whole document had been translated
    for name, package in (("bild.odt", build_odt()), ("bild.epub", build_epub())):
        with_image = replace_members(package, {}, {"Pictures/bild.png": b"\x89PNG" + bytes(range(256)) * 64})
        info, start = member_offset(with_image, "Pictures/bild.png")
        damaged = bytearray(with_image)
        damaged[start + info.compress_size // 2] ^= 0xFF
        message = our_error(translate_file(client, name, bytes(damaged)), 400, "invalid_request")
        assert "Pictures/bild.png" in message, message
    # a member whose name in the directory is not the one in its own header (BadZipFile, read only
    # when the translated file was written: a 500)
    odt = build_odt()
    renamed = odt[:odt.index(b"PK\x01\x02")] + odt[odt.index(b"PK\x01\x02"):].replace(b"META-INF/manifest.xml", b"META-INF/manifest.xmL")
    message = our_error(translate_file(client, "umbenannt.odt", renamed), 400, "invalid_request")
    assert "META-INF/manifest.xmL is damaged" in message, message


def cfb(*stream_names: str) -> bytes:
    """The start of an OLE compound file: its signature, and a directory naming the streams (UTF-16LE)."""
    directory = b"".join(name.encode("utf-16-le").ljust(64, b"\0") + bytes(64) for name in ("Root Entry", *stream_names))
    return b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504) + directory


def test_protected_and_legacy_files_are_named_as_such(client):
    # Word and PowerPoint save a password-protected file as a compound file holding the encrypted package
    for name in ("geheim.docx", "geheim.pptx"):
        message = our_error(translate_file(client, name, cfb("EncryptionInfo", "EncryptedPackage")), 400, "invalid_request")
        assert "password-protected" in message, message
    message = our_error(translate_file(client, "alt.docx", cfb("WordDocument", "1Table")), 400, "invalid_request")
    assert "legacy binary Office file" in message, message
    # an OpenDocument saved with a password: its manifest lists the encryption, content.xml is ciphertext
    manifest = ('<?xml version="1.0" encoding="UTF-8"?><manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
                '<manifest:file-entry manifest:full-path="content.xml" manifest:media-type="text/xml"><manifest:encryption-data '
                'manifest:checksum-type="SHA1/1K" manifest:checksum="x"/></manifest:file-entry></manifest:manifest>')
    odt = replace_members(build_odt(), {"content.xml": lambda _: bytes(range(256)) * 4, "META-INF/manifest.xml": lambda _: manifest.encode()})
    assert "password-protected" in our_error(translate_file(client, "geheim.odt", odt), 400, "invalid_request")
    # an EPUB with DRM: its chapters are ciphertext, listed in META-INF/encryption.xml
    encryption = ('<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" xmlns:enc="http://www.w3.org/2001/04/xmlenc#">'
                  '<enc:EncryptedData><enc:EncryptionMethod Algorithm="http://www.w3.org/2001/04/xmlenc#aes128-cbc"/>'
                  '<enc:CipherData><enc:CipherReference URI="OEBPS/text/kapitel%201.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')
    book = replace_members(build_epub(), {"OEBPS/text/kapitel 1.xhtml": lambda _: bytes(range(256)) * 4},
                           {"META-INF/encryption.xml": encryption})
    assert "DRM" in our_error(translate_file(client, "drm.epub", book), 400, "invalid_request")


def test_an_office_file_renamed_to_docx_or_pptx_is_named_not_translated_into_a_file_office_refuses(client):
    """A .pptm renamed .pptx was translated and sent back as a .pptx holding a macro-enabled
    presentation (PowerPoint refuses a file whose name and content disagree); a .docm renamed .docx was
    "damaged or another format (ValueError)"."""
    out = io.BytesIO()
    pptx.Presentation().save(out)
    main = b"application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"
    pptm = replace_members(out.getvalue(), {"[Content_Types].xml": lambda x: x.replace(
        main, b"application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml")})
    message = our_error(translate_file(client, "folien.pptx", pptm), 400, "invalid_request")
    assert "PowerPoint presentation with macros (.pptm)" in message and "save it as .pptx" in message, message
    main = b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"
    docm = replace_members(build_docx(), {"[Content_Types].xml": lambda x: x.replace(
        main, b"application/vnd.ms-word.document.macroEnabled.main+xml")})
    message = our_error(translate_file(client, "bericht.docx", docm), 400, "invalid_request")
    assert "Word document with macros (.docm)" in message, message
    message = our_error(translate_file(client, "folien.docx", out.getvalue()), 400, "invalid_request")
    assert "PowerPoint presentation (.pptx), not a Word document (.docx)" in message, message
    # saved as "Strict Open XML Document" (ISO 29500 Strict), which python-docx does not read: was
    # "damaged or another format (KeyError)"
    strict = replace_members(build_docx(), {"_rels/.rels": lambda x: x.replace(
        b"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument",
        b"http://purl.oclc.org/ooxml/officeDocument/relationships/officeDocument")})
    assert "Strict Open XML" in our_error(translate_file(client, "strikt.docx", strict), 400, "invalid_request")
    # a zip that names its main part but lacks it
    hollow = replace_members(build_docx(), {"word/document.xml": lambda _: b""})
    hollow = zipfile.ZipFile(io.BytesIO(hollow))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in hollow.infolist():
            if info.filename != "word/document.xml":
                z.writestr(info, hollow.read(info))
    message = our_error(translate_file(client, "leer.docx", out.getvalue()), 400, "invalid_request")
    assert "main document part /word/document.xml is missing" in message, message


def test_a_forged_zip_header_is_refused_before_it_is_inflated(client):
    """A member whose header says a few thousand bytes and whose stream inflates to 160 MiB (160 kB
    sent): read whole, zipfile stops at what the header says only after inflating the whole stream in
    one call (a 20 MB upload: 20 GB), and the 256 MiB limit counts what the headers say."""
    good = build_docx()
    info, start = member_offset(good, "word/styles.xml")
    deflater = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = deflater.compress(b" " * (160 << 20)) + deflater.flush()
    forged = bytearray(good[:start] + stream + good[start + info.compress_size:])
    struct.pack_into("<I", forged, info.header_offset + 18, len(stream))  # the local header's compressed size
    directory = forged.find(b"PK\x01\x02", info.header_offset + 30 + len(stream))
    shift = len(stream) - info.compress_size
    i = directory
    while i != -1:  # the directory: this member's compressed size, the later members' offsets
        length = struct.unpack_from("<H", forged, i + 28)[0]
        if forged[i + 46:i + 46 + length] == b"word/styles.xml":
            struct.pack_into("<I", forged, i + 20, len(stream))
        elif struct.unpack_from("<I", forged, i + 42)[0] > info.header_offset:
            struct.pack_into("<I", forged, i + 42, struct.unpack_from("<I", forged, i + 42)[0] + shift)
        i = forged.find(b"PK\x01\x02", i + 1)
    end = forged.rfind(b"PK\x05\x06")
    struct.pack_into("<I", forged, end + 16, directory)
    assert len(forged) < 200_000  # max_file_bytes in these tests
    tracemalloc.start()
    try:
        message = our_error(translate_file(client, "bombe.docx", bytes(forged)), 400, "invalid_request")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # read a chunk at a time, zipfile stops at the header's size, where the CRC fails
    assert re.search(r"word/styles\.xml is damaged", message), message
    assert peak < 32 << 20, f"{peak >> 20} MiB allocated to refuse it"


def test_a_paragraph_longer_than_one_text_may_be_is_translated_within_the_documents_limit(tmp_path):
    """A document's limit is max_document_chars over all its paragraphs: one paragraph past
    max_chars_per_text (here 300 characters, the document's 420) is its text, not a 413 "text 0 has ..."."""
    import time

    from fastapi.testclient import TestClient
    from test_documents import ROOT

    from nmt_serve.service.app import create_app
    from nmt_serve.service.settings import Settings

    long = " ".join(["Ein Mann fährt Fahrrad auf der Straße."] * 11)
    assert 300 < len(long) < 500
    d = docx.Document()
    d.add_paragraph(long)
    data = io.BytesIO()
    d.save(data)
    settings = Settings(models_dir=str(ROOT / "checkpoints"), device="cpu", max_chars_per_text=300, max_document_chars=500)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        deadline = time.time() + 120
        while c.get("/health/ready").status_code != 200:
            assert time.time() < deadline, "the shipped models did not load"
            time.sleep(0.05)
        r = translate_file(c, "lang.docx", data.getvalue())
        assert r.status_code == 200, r.text
        [paragraph] = [p.text for p in docx.Document(io.BytesIO(r.content)).paragraphs if p.text]
        assert paragraph.count("bicycle") + paragraph.count("bike") == 11, paragraph
        d.add_paragraph(long)  # two: past max_document_chars, that limit still holds
        data = io.BytesIO()
        d.save(data)
        assert "max_document_chars" in our_error(translate_file(c, "zwei.docx", data.getvalue()), 413, "request_too_large")


def test_a_translated_document_says_it_is_in_the_target_language(client):
    """Where a file names its text's language (spell checking, hyphenation and reading aloud go by it), the
    translation names the target's: Word's w:lang (runs and style defaults), PowerPoint's run `lang`,
    OpenDocument's fo:language / fo:country, EPUB's dc:language and its pages' lang. Before, a German
    document translated into English still said de-DE, and was spell-checked as German."""
    from document_files import odf

    word = docx.Document()
    word.styles["Normal"].element.get_or_add_rPr()
    paragraph = word.add_paragraph("Ein Mann fährt Fahrrad.")
    for rpr in [word.styles["Normal"].element.rPr, paragraph.runs[0]._r.get_or_add_rPr()]:
        lang = etree.SubElement(rpr, f"{{{W}}}lang")
        lang.set(f"{{{W}}}val", "de-DE")
        lang.set(f"{{{W}}}eastAsia", "zh-CN")  # another script's language stays
    data = io.BytesIO()
    word.save(data)
    r = translate_file(client, "brief.docx", data.getvalue())
    assert r.status_code == 200, r.text
    package = zipfile.ZipFile(io.BytesIO(r.content))
    for member in ("word/document.xml", "word/styles.xml"):
        langs = [(el.get(f"{{{W}}}val"), el.get(f"{{{W}}}eastAsia")) for el in etree.fromstring(package.read(member)).iter(f"{{{W}}}lang")]
        assert {val for val, _ in langs} == {"en"} and ("en", "zh-CN") in langs, (member, langs)

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[5])
    slide.shapes.title.text = "Ein Mann fährt Fahrrad."
    slide.shapes.title.text_frame.paragraphs[0].runs[0]._r.get_or_add_rPr().set("lang", "de-DE")
    data = io.BytesIO()
    deck.save(data)
    r = translate_file(client, "folien.pptx", data.getvalue())
    assert r.status_code == 200, r.text
    [run] = pptx.Presentation(io.BytesIO(r.content)).slides[0].shapes.title.text_frame.paragraphs[0].runs
    assert run._r.rPr.get("lang") == "en"

    styles = ('<office:styles><style:style style:name="Standard" style:family="paragraph"><style:text-properties '
              'fo:language="de" fo:country="DE"/></style:style></office:styles>')
    r = translate_file(client, "text.odt", odf("application/vnd.oasis.opendocument.text",
                                                "<office:body><office:text><text:p>Ein Mann fährt Fahrrad.</text:p></office:text></office:body>",
                                                styles))
    assert r.status_code == 200, r.text
    [props] = etree.fromstring(zipfile.ZipFile(io.BytesIO(r.content)).read("styles.xml")).iter(f"{{{STYLE}}}text-properties")
    assert props.get(f"{{{FO}}}language") == "en" and props.get(f"{{{FO}}}country") is None

    book = replace_members(build_epub(), {"OEBPS/text/kapitel 1.xhtml": lambda xml: xml.replace(
        b'<html xmlns="http://www.w3.org/1999/xhtml"', b'<html xml:lang="de" lang="de" xmlns="http://www.w3.org/1999/xhtml"')})
    r = translate_file(client, "buch.epub", book)
    assert r.status_code == 200, r.text
    package = zipfile.ZipFile(io.BytesIO(r.content))
    opf = etree.fromstring(package.read("OEBPS/content.opf"))
    assert [el.text for el in opf.iter("{http://purl.org/dc/elements/1.1/}language")] == ["en"]
    page = etree.fromstring(package.read("OEBPS/text/kapitel 1.xhtml"))
    assert page.get("lang") == page.get("{http://www.w3.org/XML/1998/namespace}lang") == "en"


W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
FO = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"
