"""Office documents, e-books, subtitles, gettext catalogs, translation tools' XLIFF and Markdown translated in
place: .docx, .pptx, .xlsx, .odt, .odp, .epub, .srt, .vtt, .po, .xlf, .xliff, .md and .markdown.

`read_document(data, filename)` reads a file into a `Document`: its translatable units (HTML
fragments, one per paragraph, its runs' formatting as inline tags) and `write(translations, language)`,
which gives back the file's bytes with every unit translated in place, the language the file names for
its text changed to the translation's (`language_marks.py`), and everything else kept.
`translate_document(data, filename, translate_units)` does both around one call.

One module per format family: `word.py` (.docx, python-docx), `presentation.py` (.pptx,
python-pptx), both through `office_open_xml.py`; `spreadsheet.py` (.xlsx, lxml: the shared strings); `open_document.py` (.odt, .odp) and `epub.py`
(.epub), zip and lxml; `subrip.py` (.srt, the srt library) and `web_vtt.py` (.vtt, webvtt-py), whose cues
`subtitles.py` makes units (a cue, or the cues one sentence runs over; timings kept); `gettext.py` (.po,
polib: the entries without a translation filled, marked fuzzy); `xliff.py` (.xlf, .xliff 1.2 and 2.x, lxml:
the segments without a target get one, inline codes kept); `markdown.py` (.md, markdown-it-py: paragraphs,
headings and table cells, their inline Markdown as inline HTML and back);
`inline_runs.py` turns a paragraph's runs into inline HTML and back.

Before any of them reads a file, its zip container is checked (`document.open_zip`: what it expands
to, and every member read through once: encrypted, damaged or forged members refused), and so is a
.docx's or .pptx's main part (`office_open_xml.check_main_part`: a .docm, a template or a workbook
renamed is named, not translated). Whatever cannot be read is a DocumentError that says why.
"""
from __future__ import annotations

import os
import zipfile
from collections.abc import Callable

from lxml import etree

from nmt_serve.text.documents.document import Document, DocumentError, open_zip

MEDIA_TYPES = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".odt": "application/vnd.oasis.opendocument.text",
    ".odp": "application/vnd.oasis.opendocument.presentation",
    ".epub": "application/epub+zip",
    ".srt": "application/x-subrip",
    ".vtt": "text/vtt",
    ".po": "text/x-gettext-translation",
    ".xlf": "application/xliff+xml",
    ".xliff": "application/xliff+xml",
    ".md": "text/markdown; charset=utf-8",
    ".markdown": "text/markdown; charset=utf-8",
}
FORMATS = tuple(MEDIA_TYPES)

__all__ = ["FORMATS", "MEDIA_TYPES", "Document", "DocumentError", "read_document", "translate_document"]


def _reader(extension: str) -> Callable[[bytes], Document]:
    # imported on use: python-docx and python-pptx take ~0.1 s each to import
    if extension == ".docx":
        from nmt_serve.text.documents.word import read_docx

        return read_docx
    if extension == ".pptx":
        from nmt_serve.text.documents.presentation import read_pptx

        return read_pptx
    if extension in (".odt", ".odp"):
        from nmt_serve.text.documents.open_document import read_open_document

        return lambda data: read_open_document(data, extension)
    if extension == ".xlsx":
        from nmt_serve.text.documents.spreadsheet import read_xlsx

        return read_xlsx
    if extension == ".po":
        from nmt_serve.text.documents.gettext import read_po

        return read_po
    if extension in (".md", ".markdown"):
        from nmt_serve.text.documents.markdown import read_markdown

        return read_markdown
    if extension in (".xlf", ".xliff"):
        from nmt_serve.text.documents.xliff import read_xliff

        return read_xliff
    if extension == ".srt":
        from nmt_serve.text.documents.subrip import read_srt

        return read_srt
    if extension == ".vtt":
        from nmt_serve.text.documents.web_vtt import read_vtt

        return read_vtt
    from nmt_serve.text.documents.epub import read_epub

    return read_epub


def read_document(data: bytes, filename: str) -> Document:
    """The document's units, ready to translate; DocumentError when the file cannot be read as the
    format its extension names."""
    extension = os.path.splitext(filename)[1].lower()
    if extension not in MEDIA_TYPES:
        raise DocumentError(f"{extension or 'no extension'} is not a document format; supported: {', '.join(FORMATS)}")
    try:
        if extension in (".docx", ".pptx", ".xlsx"):
            from nmt_serve.text.documents.office_open_xml import check_main_part

            # the container, its size and its main part checked before the library unpacks every part
            with open_zip(data) as archive:
                check_main_part(archive, extension)
        return _reader(extension)(data)
    except DocumentError as exc:
        raise DocumentError(f"the file cannot be read as {extension}: {exc}") from exc
    except (zipfile.BadZipFile, KeyError, ValueError, TypeError, AttributeError, etree.LxmlError) as exc:
        # what the libraries raise on a file that is not what it claims (python-docx and python-pptx
        # have no error type of their own for it)
        raise DocumentError(f"the file cannot be read as {extension}: it is damaged or another format "
                            f"({type(exc).__name__})") from exc


def translate_document(data: bytes, filename: str, translate_units: Callable[[list[str]], list[str]],
                       language: str | None = None) -> bytes:
    """The file translated: `translate_units` takes the units' HTML and returns their translations
    (HTML, in the same order); language: the translation's (Document.write)."""
    document = read_document(data, filename)
    return document.write(translate_units(document.texts) if document.units else [], language)
