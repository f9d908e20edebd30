"""Office documents through the service (POST /v1/translate_file, LibreTranslate's /translate_file and
/download_file) with the shipped de-en model: built here with python-docx and python-pptx (bold and
italic runs inside sentences, a table, a header and a footer; slides with a table and notes), read
back with the same libraries: every text run translated, every formatting element in place."""
from __future__ import annotations

import io
import time
import zipfile

import docx
import pptx
import pytest
from conftest import ROOT
from document_files import build_epub, build_odp, build_odt, odf_texts
from fastapi.testclient import TestClient
from pptx.util import Inches

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
SENTENCE = [("Ein kleiner ", None), ("brauner Hund", "bold"), (" rennt über die ", None), ("grüne Wiese", "italic"), (" vor dem Haus.", None)]
CELLS = [["Zwei Kinder spielen.", "Ein Mann lacht."], ["Eine Frau liest ein Buch.", "Ein Hund schläft."]]
MAX_FILE_BYTES, MAX_DOCUMENT_CHARS = 200_000, 3000
MAX_BODY_BYTES = 20_000  # smaller than any of the documents: the file routes take bodies up to max_file_bytes


@pytest.fixture(scope="module")
def client():
    settings = Settings(models_dir=str(ROOT / "checkpoints"), device="cpu", max_file_bytes=MAX_FILE_BYTES,
                        max_document_chars=MAX_DOCUMENT_CHARS, max_body_bytes=MAX_BODY_BYTES)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        deadline = time.time() + 60
        while c.get("/health/ready").status_code != 200:
            assert time.time() < deadline, "the shipped models did not load"
            time.sleep(0.05)
        yield c


def build_docx() -> bytes:
    d = docx.Document()
    d.sections[0].header.paragraphs[0].text = "Ein Mann fährt Fahrrad."
    d.sections[0].footer.paragraphs[0].text = "Zwei Hunde spielen im Schnee."
    p = d.add_paragraph()
    for text, style in SENTENCE:
        run = p.add_run(text)
        run.bold, run.italic = style == "bold" or None, style == "italic" or None
    d.add_paragraph("Ein Mann steht auf einer Leiter.")
    table = d.add_table(rows=2, cols=2)
    for r, row in enumerate(CELLS):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    out = io.BytesIO()
    d.save(out)
    return out.getvalue()


def docx_runs(d) -> list:
    paragraphs = list(d.paragraphs) + [p for t in d.tables for row in t.rows for cell in row.cells for p in cell.paragraphs]
    paragraphs += list(d.sections[0].header.paragraphs) + list(d.sections[0].footer.paragraphs)
    return [r for p in paragraphs for r in p.runs]


def build_pptx() -> bytes:
    prs = pptx.Presentation()
    slide = prs.slides.add_slide(prs.slide_layouts[5])
    slide.shapes.title.text = "Ein Hund rennt über die Wiese."
    p = slide.shapes.add_textbox(Inches(1), Inches(2), Inches(8), Inches(1)).text_frame.paragraphs[0]
    for text, style in SENTENCE:
        run = p.add_run()
        run.text, run.font.bold, run.font.italic = text, style == "bold" or None, style == "italic" or None
    table = slide.shapes.add_table(2, 2, Inches(1), Inches(4), Inches(8), Inches(1)).table
    for r, row in enumerate(CELLS):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    slide.notes_slide.notes_text_frame.text = "Eine Frau sitzt auf einer Bank."
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


def translate_file(client, name: str, data: bytes, source: str = "de", target: str = "en"):
    return client.post("/v1/translate_file", data={"source": source, "target": target}, files={"file": (name, data)})


def assert_every_run_translated(before: list, after: list, formatting) -> None:
    assert len(before) == len(after) > 0
    for a, b in zip(before, after):
        assert formatting(a) == formatting(b), (a.text, b.text)
        if a.text.strip():
            assert b.text.strip() and b.text != a.text, (a.text, b.text)


def test_docx_comes_back_translated_with_its_formatting(client):
    source = build_docx()
    r = translate_file(client, "bericht.docx", source)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == DOCX and 'filename="bericht_en.docx"' in r.headers["content-disposition"]
    before, after = docx.Document(io.BytesIO(source)), docx.Document(io.BytesIO(r.content))
    runs_before, runs_after = docx_runs(before), docx_runs(after)
    assert_every_run_translated(runs_before, runs_after, lambda run: (run.bold, run.italic))
    assert sum(1 for x in runs_after if x.bold) == sum(1 for x in runs_before if x.bold) == 1
    assert sum(1 for x in runs_after if x.italic) == sum(1 for x in runs_before if x.italic) == 1
    bold = next(x.text for x in runs_after if x.bold).lower()
    assert "dog" in bold or "brown" in bold, [x.text for x in runs_after]  # the format went with its words
    assert "dog" in after.paragraphs[0].text.lower() and "ladder" in after.paragraphs[1].text.lower()
    table = after.tables[0]
    assert (len(table.rows), len(table.columns)) == (2, 2) and "children" in table.cell(0, 0).text.lower()
    header, footer = after.sections[0].header.paragraphs[0].text, after.sections[0].footer.paragraphs[0].text
    assert "bike" in header.lower() or "bicycle" in header.lower(), header
    assert "snow" in footer.lower(), footer


def test_a_footnote_mark_glued_to_a_word_stays_in_its_superscript_run(client):
    """The model translates "Mann" with its mark ("Manna") as the one word "man": the mark stays a
    mark, after the word, and the word stays plain."""
    d = docx.Document()
    p = d.add_paragraph("Ein Mann")
    p.add_run("a").font.superscript = True
    p.add_run(" fährt Fahrrad.")
    source = io.BytesIO()
    d.save(source)
    r = translate_file(client, "fussnote.docx", source.getvalue())
    assert r.status_code == 200, r.text
    runs = docx.Document(io.BytesIO(r.content)).paragraphs[0].runs
    assert [x.text for x in runs if x.font.superscript] == ["a"], [x.text for x in runs]
    assert "man" in "".join(x.text for x in runs if not x.font.superscript).lower(), [x.text for x in runs]


def test_pptx_comes_back_translated_with_its_formatting(client):
    source = build_pptx()
    r = translate_file(client, "folien.pptx", source)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == PPTX
    before, after = pptx.Presentation(io.BytesIO(source)), pptx.Presentation(io.BytesIO(r.content))
    runs_before, runs_after = pptx_runs(before), pptx_runs(after)
    assert_every_run_translated(runs_before, runs_after, lambda run: (run.font.bold, run.font.italic))
    slide = after.slides[0]
    table = next(s for s in slide.shapes if s.has_table).table
    assert (len(table.rows), len(table.columns)) == (2, 2) and "woman" in table.cell(1, 0).text.lower()
    assert "woman" in slide.notes_slide.notes_text_frame.text.lower() and "dog" in slide.shapes.title.text.lower()


@pytest.mark.parametrize("name, build", [("bericht.odt", build_odt), ("folien.odp", build_odp), ("buch.epub", build_epub)])
def test_odf_and_epub_round_trips(client, name, build):
    source = build()
    r = translate_file(client, name, source)
    assert r.status_code == 200, r.text
    member = {"bericht.odt": "content.xml", "folien.odp": "content.xml", "buch.epub": "OEBPS/text/kapitel 1.xhtml"}[name]
    before, after = odf_texts(source, member), odf_texts(r.content, member)
    assert zipfile.ZipFile(io.BytesIO(r.content)).namelist() == zipfile.ZipFile(io.BytesIO(source)).namelist()
    changed = [b for a, b in zip(before, after) if a != b]
    assert len(after) >= len(before) - 1 and len(changed) >= len(before) // 2, (before, after)
    assert "dog" in " ".join(after).lower()


def test_subtitles_come_back_translated_with_their_timings(client):
    """.srt through /v1/translate_file and LibreTranslate's /translate_file, with the shipped de-en model."""
    import srt

    source = ("1\n00:00:01,000 --> 00:00:03,000\nEin Hund rennt\nüber die Wiese.\n\n"
              "2\n00:00:03,500 --> 00:00:05,000\n<i>Zwei Kinder</i> spielen im Schnee.\n\n"
              "3\n00:00:06,000 --> 00:00:07,000\nEine Frau mit einem roten Hut\n\n"
              "4\n00:00:07,200 --> 00:00:08,000\nsitzt auf einer Bank.\n\n").encode()
    r = translate_file(client, "film.srt", source)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-subrip", r.text
    cues = list(srt.parse(r.content.decode()))
    assert [(c.index, c.start.total_seconds(), c.end.total_seconds()) for c in cues] == [
        (1, 1.0, 3.0), (2, 3.5, 5.0), (3, 6.0, 7.0), (4, 7.2, 8.0)]
    assert "dog" in cues[0].content.lower() and "children" in cues[1].content.lower(), cues
    # the sentence over cues 3 and 4 was translated whole and shared out: one sentence, two non-empty halves
    assert "woman" in cues[2].content.lower() and cues[3].content.endswith("."), cues
    assert "." not in cues[2].content and cues[3].content[:1].islower(), cues
    assert "<i>" in cues[1].content and "</i>" in cues[1].content, cues[1].content
    assert ".srt" in client.get("/frontend/settings").json()["supportedFilesFormat"]
    lt = client.post("/translate_file", data={"source": "de", "target": "en"}, files={"file": ("film.srt", source)})
    url = lt.json()["translatedFileUrl"]
    assert url.endswith(".film_en.srt") and client.get(url[url.index("/download_file/"):]).content == r.content


def test_webvtt_captions_come_back_translated_with_their_timings(client):
    import webvtt

    source = ("WEBVTT\n\nNOTE kept as it is\n\n00:00:01.000 --> 00:00:03.000 align:start\n<v Anna>Ein Hund rennt\n\n"
              "00:00:03.200 --> 00:00:05.000\n<v Anna>über die <i>Wiese</i>.\n\n").encode()
    r = translate_file(client, "film.vtt", source)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/vtt"), r.text
    captions = webvtt.from_string(r.content.decode())
    assert [(c.start, c.end, str(c.settings)) for c in captions] == [("00:00:01.000", "00:00:03.000", "align:start"),
                                                                    ("00:00:03.200", "00:00:05.000", "")]
    assert all(c.raw_text.startswith("<v Anna>") for c in captions), captions
    assert "dog" in captions[0].text.lower() and "<i>" in captions[1].raw_text and "NOTE kept as it is" in r.text
    lt = client.post("/translate_file", data={"source": "de", "target": "en"}, files={"file": ("film.vtt", source)})
    url = lt.json()["translatedFileUrl"]
    assert url.endswith(".film_en.vtt") and client.get(url[url.index("/download_file/"):]).content == r.content


def test_xliff_files_come_back_with_targets_that_keep_their_codes(client):
    from lxml import etree

    ns1, ns2 = "urn:oasis:names:tc:xliff:document:1.2", "urn:oasis:names:tc:xliff:document:2.0"
    xlf = (f'<?xml version="1.0" encoding="UTF-8"?>\n<xliff version="1.2" xmlns="{ns1}"><file source-language="de" '
           f'datatype="plaintext" original="a"><body><trans-unit id="1"><source>Ein <g id="1">roter</g> Hund<x id="2"/> rennt '
           f'über die Wiese.</source></trans-unit><trans-unit id="2"><source>Zwei Kinder spielen.</source><target>Two '
           f'children play.</target></trans-unit></body></file></xliff>').encode()
    r = translate_file(client, "app.xlf", xlf)
    assert r.status_code == 200 and r.headers["content-type"] == "application/xliff+xml", r.text
    root = etree.fromstring(r.content)
    targets = list(root.iter(f"{{{ns1}}}target"))
    assert len(targets) == 2 and targets[1].text == "Two children play."
    first = etree.tostring(targets[0], encoding="unicode")
    assert 'dog<x id="2"/>' in first and '<g id="1">red</g>' in first and "Hund" not in first, first
    assert root.find(f"{{{ns1}}}file").get("target-language") == "en"

    xliff = (f'<xliff xmlns="{ns2}" version="2.0" srcLang="de"><file id="f"><unit id="u"><segment id="s"><source>Zwei '
             f'<pc id="1">Hunde</pc> spielen im <ph id="2"/>Schnee.</source></segment></unit></file></xliff>').encode()
    lt = client.post("/translate_file", data={"source": "de", "target": "en"}, files={"file": ("app.xliff", xliff)})
    url = lt.json()["translatedFileUrl"]
    assert url.endswith(".app_en.xliff")
    out = etree.fromstring(client.get(url[url.index("/download_file/"):]).content)
    target = etree.tostring(out.find(f".//{{{ns2}}}target"), encoding="unicode")
    assert '<pc id="1">dogs</pc>' in target and '<ph id="2"/>' in target and out.get("trgLang") == "en", target


def test_an_xliff_file_s_declared_source_language_is_the_one_auto_takes(client):
    from lxml import etree

    ns = "urn:oasis:names:tc:xliff:document:2.0"
    # three German interface strings that a detector calls English: the file says what they are
    xliff = (f'<xliff xmlns="{ns}" version="2.0" srcLang="de-DE"><file id="f"><unit id="1"><segment><source>Name</source>'
             f'</segment></unit><unit id="2"><segment><source>Hand</source></segment></unit><unit id="3"><segment><source>'
             f'Start</source></segment></unit></file></xliff>').encode()
    assert client.post("/detect", data={"q": "Name\nHand\nStart"}).json()[0]["language"] == "en"
    r = client.post("/v1/translate_file", data={"source": "auto", "target": "en"}, files={"file": ("ui.xliff", xliff)})
    assert r.status_code == 200, r.text
    root = etree.fromstring(r.content)
    assert len(list(root.iter(f"{{{ns}}}target"))) == 3 and root.get("trgLang") == "en"
    # declared in the target language: nothing to translate, the file as it came
    same = client.post("/v1/translate_file", data={"source": "auto", "target": "de"}, files={"file": ("ui.xliff", xliff)})
    assert same.status_code == 200 and same.content == xliff


def test_subtitles_and_texts_in_a_legacy_code_page_are_read_in_it(client):
    import srt

    # a Czech subtitle file as Czech sites serve them (Windows-1250), the language not named; a German text in
    # Latin-1; each comes back translated, in UTF-8
    czech = ("1\n00:00:01,000 --> 00:00:03,000\nMuž jede na kole po ulici.\n\n2\n00:00:04,000 --> 00:00:06,000\n"
             "Dvě děti si hrají ve sněhu.\n").encode("cp1250")
    r = translate_file(client, "film.srt", czech, source="auto")
    assert r.status_code == 200, r.text
    cues = list(srt.parse(r.content.decode("utf-8")))
    assert len(cues) == 2 and "children" in cues[1].content.lower(), cues
    r = translate_file(client, "brief.txt", "Zwei Kinder spielen im Schnee. Ein Mann fährt Fahrrad.".encode("latin-1"))
    text = r.text.lower()
    assert r.status_code == 200 and "children" in text and ("bicycle" in text or "bike" in text), r.text
    # as a job: its texts read the same way, its result in UTF-8
    job = client.post("/v1/jobs/file", data={"source": "auto", "target": "en"}, files={"file": ("film.srt", czech)})
    assert job.status_code == 202, job.text
    deadline = time.time() + 300  # (how long two cues take is the machine's business; only the outcome is tested)
    while (status := client.get(f"/v1/jobs/{job.json()['id']}").json())["state"] not in ("done", "failed") and time.time() < deadline:
        time.sleep(0.05)
    assert status["state"] == "done", status
    result = client.get(f"/v1/jobs/{job.json()['id']}/result")
    assert "children" in list(srt.parse(result.content.decode("utf-8")))[1].content.lower()
    assert client.delete(f"/v1/jobs/{job.json()['id']}").status_code == 200  # (the jobs directory is the default one)


def test_an_html_page_in_the_encoding_it_declares_comes_back_in_utf8_declaring_it(client):
    """Before, a page that was not UTF-8 was refused (400) whatever it declared."""
    page = ('<!DOCTYPE html><html lang="de"><head><meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
            "<title>Straße</title></head><body><p>Zwei Kinder spielen im Schnee.</p><p>Ein Mädchen läuft.</p></body></html>")
    r = translate_file(client, "seite.html", page.encode("latin-1"))
    assert r.status_code == 200, r.text
    out = r.content.decode("utf-8")
    assert "charset=utf-8" in out and "iso-8859-1" not in out and "children" in out.lower() and "Mädchen" not in out, out


def test_doubtful_segments_of_an_xliff_file_get_a_note_for_the_reviewer(client):
    """In the request and as a job: the quality flags /v1/translate shows go where a CAT tool shows them."""
    from lxml import etree

    ns = "urn:oasis:names:tc:xliff:document:1.2"
    units = ["Zwei Kinder spielen im Schnee.", "Alles klar.", "Ich habe keine Ahnung."]
    xliff = (f'<xliff version="1.2" xmlns="{ns}"><file original="ui" source-language="de" datatype="plaintext"><body>'
             + "".join(f'<trans-unit id="{k}"><source>{text}</source></trans-unit>' for k, text in enumerate(units))
             + "</body></file></xliff>").encode()

    def notes(data: bytes) -> list[list[str]]:
        root = etree.fromstring(data)
        return [[n.text for n in u.iter(f"{{{ns}}}note") if n.get("from") == "nmt-serve"] for u in root.iter(f"{{{ns}}}trans-unit")]

    r = translate_file(client, "ui.xlf", xliff)
    assert r.status_code == 200, r.text
    found = notes(r.content)
    assert found[0] == [] and all(n and n[0].startswith("Machine translation flagged: low_confidence (") for n in found[1:]), found
    job = client.post("/v1/jobs/file", data={"source": "de", "target": "en"}, files={"file": ("ui.xlf", xliff)})
    assert job.status_code == 202, job.text
    deadline = time.time() + 300
    while (status := client.get(f"/v1/jobs/{job.json()['id']}").json())["state"] not in ("done", "failed") and time.time() < deadline:
        time.sleep(0.05)
    assert status["state"] == "done", status
    assert notes(client.get(f"/v1/jobs/{job.json()['id']}/result").content) == found
    assert client.delete(f"/v1/jobs/{job.json()['id']}").status_code == 200  # (the jobs directory is the default one)


def test_a_markdown_file_comes_back_translated_with_its_markup(client):
    source = ("# Ein Hund\n\nEin **brauner Hund** rennt über die [Wiese](https://a.de/wiese).\n\n"
              "- Zwei Kinder spielen.\n- Ein Mann lacht.\n\n```\nEin Hund\n```\n").encode()
    r = translate_file(client, "liesmich.md", source)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown"), r.text
    out = r.content.decode()
    lines = out.split("\n")
    assert lines[0].startswith("# ") and "dog" in lines[0].lower(), out
    assert "**" in lines[2] and "](https://a.de/wiese)" in lines[2] and "rennt" not in lines[2], out
    assert lines[4].startswith("- Two children") and lines[5].startswith("- ") and lines[7:10] == ["```", "Ein Hund", "```"], out


def test_a_workbook_comes_back_with_its_cells_translated(client):
    import openpyxl
    from test_document_formats import build_xlsx

    r = translate_file(client, "tiere.xlsx", build_xlsx())
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/vnd.openxmlformats-officedocument.spreadsheetml"), r.text
    sheet = openpyxl.load_workbook(io.BytesIO(r.content))["Tiere"]
    assert "dog" in sheet["A1"].value.lower() and "dog" in str(sheet["B1"].value).lower()
    assert (sheet["A2"].value, sheet["A3"].value, sheet["C1"].value) == (42, "=LEN(A1)", "2024-01-01")


def test_a_catalog_comes_back_with_the_translations_it_lacked(client):
    import polib

    source = ('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
              'msgid "Ein Hund rennt über die Wiese."\nmsgstr ""\n\n'
              'msgid "Zwei Kinder spielen."\nmsgstr "Two kids play."\n').encode()
    r = translate_file(client, "en.po", source)
    assert r.status_code == 200 and r.headers["content-disposition"].endswith("en_en.po"), r.text
    catalog = polib.pofile(r.content.decode())
    entry = catalog.find("Ein Hund rennt über die Wiese.")
    assert "dog" in entry.msgstr.lower() and entry.fuzzy
    assert catalog.find("Zwei Kinder spielen.").msgstr == "Two kids play." and catalog.metadata["Language"] == "en"


def test_libretranslate_translate_file_takes_documents(client):
    assert ".docx" in client.get("/frontend/settings").json()["supportedFilesFormat"]
    r = client.post("/translate_file", data={"source": "de", "target": "en"}, files={"file": ("bericht.docx", build_docx())})
    assert r.status_code == 200, r.text
    url = r.json()["translatedFileUrl"]
    assert url.endswith(".bericht_en.docx")
    download = client.get(url[url.index("/download_file/"):])
    assert download.status_code == 200 and download.headers["content-type"] == DOCX
    assert "dog" in docx.Document(io.BytesIO(download.content)).paragraphs[0].text.lower()
    # source "auto": the document's language found from all its text
    r = client.post("/translate_file", data={"source": "auto", "target": "en"}, files={"file": ("b.pptx", build_pptx())})
    assert r.status_code == 200, r.text


def our_error(r, status: int, type_: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param"} and body["error"]["type"] == type_, body
    return body["error"]["message"]


def test_bad_files_get_the_one_error_shape(client):
    good = build_docx()
    for name, data in (("kaputt.docx", good[: len(good) // 2]), ("kaputt.docx", b"plain text"), ("kaputt.pptx", good),
                       ("kaputt.epub", good), ("kaputt.odt", b"")):
        assert "cannot be read" in our_error(translate_file(client, name, data), 400, "invalid_request")
    assert "supported: .txt, .html, .htm, .docx, .pptx, .xlsx, .odt, .odp, .epub, .srt, .vtt, .po, .xlf, .xliff, .md, .markdown" in our_error(
        translate_file(client, "scan.pdf", b"%PDF-1.4"), 400, "invalid_request")
    assert "max_file_bytes" in our_error(translate_file(client, "gross.docx", b"x" * (MAX_FILE_BYTES + 1)), 413, "request_too_large")
    # past the file routes' body limit (the file and its form's framing) the body is refused unread
    assert "265536 bytes" in our_error(translate_file(client, "riesig.docx", b"x" * 300_000), 413, "request_too_large")
    # other routes keep max_body_bytes
    assert "20000 bytes" in our_error(client.post("/v1/translate", json={"text": "x" * 30_000, "source": "de", "target": "en"}),
                                      413, "request_too_large")
    d = docx.Document()
    for _ in range(60):
        d.add_paragraph("Ein Mann steht auf einer Leiter und streicht die Wand.")
    big = io.BytesIO()
    d.save(big)
    assert "max_document_chars" in our_error(translate_file(client, "lang.docx", big.getvalue()), 413, "request_too_large")
    assert translate_file(client, "ohne.docx", good, target="xx").status_code == 400
    # LibreTranslate's routes keep LibreTranslate's shape
    r = client.post("/translate_file", data={"source": "de", "target": "en"}, files={"file": ("kaputt.docx", b"nope")})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "cannot be read" in r.json()["error"]


def test_text_and_html_files_and_a_document_already_in_the_target_language(client):
    r = translate_file(client, "notiz.txt", b"Ein Hund rennt.\n\nZwei Kinder spielen.\n")
    assert r.status_code == 200 and r.headers["content-type"] == "text/plain; charset=utf-8", r.text
    assert "dog" in r.text.lower() and "\n\n" in r.text
    r = translate_file(client, "seite.html", b"<p>Ein <b>Hund</b> rennt.</p>")
    assert r.status_code == 200 and "<b>" in r.text and "dog" in r.text.lower(), r.text
    assert 'filename="seite_en.html"' in r.headers["content-disposition"]
    source = build_docx()
    assert translate_file(client, "b.docx", source, source="en", target="en").content == source
