"""Word documents (.docx) through python-docx: the body, headers, footers, footnotes, endnotes and
comments, each paragraph translated in place (tables, text boxes and nested tables included, as
they are paragraphs too), the DrawingML text of its charts (titles, axis titles) and SmartArt, and the
alternative text of its pictures, shapes and charts and its links' tooltips (office_open_xml.alt_texts).

python-docx models the body, headers, footers and comments; the rest of the package (footnotes,
endnotes, charts, diagrams) it keeps as bytes, which are parsed here and written back. Runs are
changed only in their text (`w:t`): python-docx's `Run.text` setter would also drop a run's tabs,
breaks, drawings and footnote marks. A translated paragraph loses its optional hyphens
(`w:softHyphen`): they mark where the source's words may break, and would split the words sent to
translation.
"""
from __future__ import annotations

import io

import docx

from nmt_serve.text.documents.document import Document
from nmt_serve.text.documents.language_marks import relabel_drawing, relabel_word
from nmt_serve.text.documents.office_open_xml import (
    DRAWING,
    WORD,
    WORD_NS,
    alt_texts,
    held_roots,
    package_writer,
    paragraphs,
    part_root,
)

_WML = "application/vnd.openxmlformats-officedocument.wordprocessingml."
# the parts whose text a reader sees (not styles, settings or the glossary's building blocks)
STORIES = frozenset({
    _WML + "document.main+xml",  # the only main part python-docx opens (a .docm or .dotx is refused before)
    _WML + "header+xml", _WML + "footer+xml", _WML + "footnotes+xml", _WML + "endnotes+xml", _WML + "comments+xml",
})
_DRAWINGML = "application/vnd.openxmlformats-officedocument.drawingml."
# parts of DrawingML paragraphs (a:p), as in a presentation: charts and SmartArt (its data and its drawing)
DRAWINGS = frozenset({_DRAWINGML + "chart+xml", _DRAWINGML + "diagramData+xml", "application/vnd.ms-office.drawingml.diagramDrawing+xml"})


STYLES = _WML + "styles+xml"  # the defaults' and the styles' languages


def read_docx(data: bytes) -> Document:
    document = docx.Document(io.BytesIO(data))
    units, stored = [], []
    for part in document.part.package.iter_parts():
        if part.content_type not in STORIES and part.content_type not in DRAWINGS:
            continue
        root, as_bytes = part_root(part)
        found = paragraphs(root, WORD if part.content_type in STORIES else DRAWING) + alt_texts(root)
        units += found
        if as_bytes and found:
            stored.append((part, root))

    def relabel(tag: str) -> None:
        wanted = lambda kind: kind in STORIES or kind == STYLES or kind in DRAWINGS  # noqa: E731
        for part, root in held_roots(document.part.package, stored, wanted):
            if part.content_type in DRAWINGS:
                relabel_drawing(root, tag)
            else:
                relabel_word(root, tag, WORD_NS)

    return Document(units, package_writer(document, stored), relabel)
