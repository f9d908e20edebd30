"""Word documents (.docx) through python-docx: the body, headers, footers, footnotes, endnotes and
comments, each paragraph translated in place (tables, text boxes and nested tables included, as
they are paragraphs too).

python-docx models the body, headers, footers and comments; the rest of the package (footnotes,
endnotes) it keeps as bytes, which are parsed here and written back. Runs are changed only in
their text (`w:t`): python-docx's `Run.text` setter would also drop a run's tabs, breaks, drawings
and footnote marks.
"""
from __future__ import annotations

import io

import docx

from nmt_serve.text.documents.document import Document
from nmt_serve.text.documents.office_open_xml import (
    WORD,
    package_writer,
    paragraphs,
    part_root,
)

_WML = "application/vnd.openxmlformats-officedocument.wordprocessingml."
# the parts whose text a reader sees (not styles, settings or the glossary's building blocks)
STORIES = frozenset({
    _WML + "document.main+xml", _WML + "template.main+xml", "application/vnd.ms-word.document.macroEnabled.main+xml",
    "application/vnd.ms-word.template.macroEnabledTemplate.main+xml",
    _WML + "header+xml", _WML + "footer+xml", _WML + "footnotes+xml", _WML + "endnotes+xml", _WML + "comments+xml",
})


def read_docx(data: bytes) -> Document:
    document = docx.Document(io.BytesIO(data))
    units, stored = [], []
    for part in document.part.package.iter_parts():
        if part.content_type not in STORIES:
            continue
        root, as_bytes = part_root(part)
        found = paragraphs(root, WORD)
        units += found
        if as_bytes and found:
            stored.append((part, root))

    return Document(units, package_writer(document, stored))
