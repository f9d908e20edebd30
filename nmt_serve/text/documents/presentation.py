"""PowerPoint presentations (.pptx) through python-pptx: every slide's text (text boxes,
placeholders, tables, grouped shapes, SmartArt, chart titles), the speaker notes and the comments,
each paragraph translated in place, and the alternative text of pictures and shapes. Slide layouts and masters are left alone: their text is the
template's prompts ("Click to edit"), not the author's.
"""
from __future__ import annotations

import io

import pptx

from nmt_serve.text.documents.document import Document
from nmt_serve.text.documents.language_marks import relabel_drawing
from nmt_serve.text.documents.office_open_xml import (
    DRAWING,
    alt_texts,
    held_roots,
    package_writer,
    paragraphs,
    part_root,
    plain_text_unit,
)

_PRESENTATION = "application/vnd.openxmlformats-officedocument.presentationml."
_DRAWING = "application/vnd.openxmlformats-officedocument.drawingml."
_PARTS = {
    _PRESENTATION + "slide+xml", _PRESENTATION + "notesSlide+xml", _DRAWING + "chart+xml", _DRAWING + "diagramData+xml",
    "application/vnd.ms-office.drawingml.diagramDrawing+xml",
    "application/vnd.ms-powerpoint.comments+xml",  # modern comments: DrawingML paragraphs
}
_LEGACY_COMMENTS = _PRESENTATION + "comments+xml"  # <p:cm><p:text>plain text</p:text></p:cm>
_P = "http://schemas.openxmlformats.org/presentationml/2006/main"


def read_pptx(data: bytes) -> Document:
    presentation = pptx.Presentation(io.BytesIO(data))
    units, stored = [], []
    for part in presentation.part.package.iter_parts():
        if part.content_type in _PARTS:
            root, as_bytes = part_root(part)
            found = paragraphs(root, DRAWING) + alt_texts(root)
        elif part.content_type == _LEGACY_COMMENTS:
            root, as_bytes = part_root(part)
            found = [plain_text_unit(t) for t in root.iter(f"{{{_P}}}text") if (t.text or "").strip()]
        else:
            continue
        units += found
        if as_bytes and found:
            stored.append((part, root))

    def relabel(tag: str) -> None:  # the slides', and the masters' and layouts' defaults
        wanted = lambda kind: kind in _PARTS or kind.startswith(_PRESENTATION) and kind.endswith("+xml")  # noqa: E731
        for _, root in held_roots(presentation.part.package, stored, wanted):
            relabel_drawing(root, tag)

    return Document(units, package_writer(presentation, stored), relabel)
