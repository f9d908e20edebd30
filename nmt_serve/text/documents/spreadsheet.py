"""Excel workbooks (.xlsx): the text of their cells translated in place, every other part kept byte for byte.

A workbook keeps each distinct text of its cells once, in its shared strings part (`<si>`: a plain `<t>`,
or rich text, runs `<r>` each with its formatting `<rPr>` and text `<t>`), and a cell names it by its
index: each shared string with a letter in it is one unit (its runs inline HTML, as a paragraph's:
inline_runs.py), so a text in a hundred cells is translated once. Cells of inline strings (`<is>`, as
some generators write them) are units too, and so are the comments (notes: rich text as a cell's, the
author's name Excel writes first kept out; threaded comments: plain text), and the paragraphs of charts
(titles, axis titles) and drawings (text boxes, shapes), DrawingML as a presentation's, and the alternative
text of pictures, shapes and charts. Numbers, dates,
formulas and their cached results, a chart's cached copies of cells, and sheet names (formulas refer to
them) are left as they are. The parts are edited with lxml rather than loaded into a spreadsheet library,
which would write back only what it models.
"""
from __future__ import annotations

import posixpath
import re
import zipfile

from lxml import etree

from nmt_serve.text.documents.document import Document, DocumentError, open_zip, rewrite_zip
from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot
from nmt_serve.text.documents.language_marks import relabel_drawing
from nmt_serve.text.documents.office_open_xml import DRAWING, SAFE_PARSER, alt_texts, paragraphs, plain_text_unit

SML = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_RELATIONSHIPS = "http://schemas.openxmlformats.org/package/2006/relationships"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_LETTER = re.compile(r"[^\W\d_]")
_TYPES = "http://schemas.openxmlformats.org/package/2006/content-types"
_COMMENTS = "application/vnd.openxmlformats-officedocument.spreadsheetml.comments+xml"
_THREADED = "application/vnd.ms-excel.threadedcomments+xml"
_THREADED_NS = "http://schemas.microsoft.com/office/spreadsheetml/2018/threadedcomments"
_DRAWINGS = {"application/vnd.openxmlformats-officedocument.drawingml.chart+xml",
             "application/vnd.openxmlformats-officedocument.drawing+xml"}


def _setter(t: etree._Element):
    def write(text: str) -> None:
        t.text = text
        if text != text.strip():  # Excel drops a text's outer spaces unless told to keep them
            t.set(_XML_SPACE, "preserve")

    return write


def _string(holder: etree._Element, author: str | None = None) -> InlineParagraph | None:
    """A shared string (`<si>`), an inline one (`<is>`) or a comment's text as a unit; None where it has no
    letter. author: a comment's, whose name Excel writes as its first run ("Max:"), kept as it is."""
    slots = []
    for child in holder:
        if child.tag == f"{{{SML}}}t":
            slots.append(TextSlot(child.text or "", None, _setter(child)))
        elif child.tag == f"{{{SML}}}r" and (t := child.find(f"{{{SML}}}t")) is not None:
            if author and not slots and (t.text or "").strip() == f"{author}:":
                continue
            formatting = child.find(f"{{{SML}}}rPr")
            slots.append(TextSlot(t.text or "", etree.tostring(formatting) if formatting is not None else None, _setter(t)))
        # <rPh> and <phoneticPr>: reading guides over Japanese text, not the cell's text
    if not any(_LETTER.search(s.text) for s in slots):
        return None
    if author and slots[0].text != slots[0].text.lstrip():  # the line break after the author's name stays
        lead = slots[0].text[:len(slots[0].text) - len(slots[0].text.lstrip())]
        slots[0] = TextSlot(slots[0].text.lstrip(), slots[0].key, lambda text, put=slots[0].write: put(lead + text))
    return InlineParagraph(slots)


def _comments(root: etree._Element) -> list[InlineParagraph]:
    """A sheet's notes (the comments part): each comment's text a unit."""
    authors = [a.text or "" for a in root.iter(f"{{{SML}}}author")]
    units = []
    for comment in root.iter(f"{{{SML}}}comment"):
        index = int(comment.get("authorId", -1)) if (comment.get("authorId") or "").isdigit() else -1
        text = comment.find(f"{{{SML}}}text")
        if text is not None and (u := _string(text, authors[index] if 0 <= index < len(authors) else None)) is not None:
            units.append(u)
    return units


def _content_types(archive: zipfile.ZipFile, members: dict[str, str]) -> dict[str, str]:
    """Member name -> its content type, for the parts [Content_Types].xml names one by one."""
    name = members.get("[content_types].xml")
    if name is None:
        return {}
    root = etree.fromstring(archive.read(name), SAFE_PARSER)
    return {members[part]: o.get("ContentType", "") for o in root.iter(f"{{{_TYPES}}}Override")
            if (part := (o.get("PartName") or "").lstrip("/").lower()) in members}


def _parts(archive: zipfile.ZipFile, members: dict[str, str]) -> tuple[str | None, list[str]]:
    """The workbook's shared strings part and its worksheets, by its relationships."""
    rels = etree.fromstring(archive.read(members["_rels/.rels"]), SAFE_PARSER)
    workbook = next(r.get("Target") for r in rels if (r.get("Type") or "").endswith("/officeDocument"))
    workbook = posixpath.normpath(workbook.lstrip("/"))
    folder, name = posixpath.split(workbook)
    own = members.get(posixpath.join(folder, "_rels", name + ".rels").lower())
    shared, sheets = None, []
    if own is not None:
        for r in etree.fromstring(archive.read(own), SAFE_PARSER):
            if r.get("TargetMode") == "External" or not r.get("Target"):
                continue
            target = r.get("Target")
            path = posixpath.normpath(target.lstrip("/") if target.startswith("/") else posixpath.join(folder, target))
            member = members.get(path.lower())
            kind = (r.get("Type") or "").rsplit("/", 1)[-1]
            if member is not None and kind == "sharedStrings":
                shared = member
            elif member is not None and kind == "worksheet":
                sheets.append(member)
    return shared, sheets


def read_xlsx(data: bytes) -> Document:
    archive = open_zip(data)
    members = {name.lower(): name for name in archive.namelist()}
    shared, sheets = _parts(archive, members)
    roots: dict[str, etree._Element] = {}
    units: list[InlineParagraph] = []
    if shared is not None:
        roots[shared] = etree.fromstring(archive.read(shared), SAFE_PARSER)
        units += [u for si in roots[shared].iter(f"{{{SML}}}si") if (u := _string(si)) is not None]
    for sheet in sheets:
        raw = archive.read(sheet)
        if b"inlineStr" not in raw:  # most sheets: numbers and indices into the shared strings, left unparsed
            continue
        roots[sheet] = etree.fromstring(raw, SAFE_PARSER)
        for cell in roots[sheet].iter(f"{{{SML}}}c"):
            held = cell.find(f"{{{SML}}}is")
            if cell.get("t") == "inlineStr" and held is not None and (u := _string(held)) is not None:
                units.append(u)
    if shared is None and not sheets:
        raise DocumentError("it names no worksheet and no shared strings (xl/_rels/workbook.xml.rels)")
    drawings: list[etree._Element] = []
    for name, kind in _content_types(archive, members).items():
        if kind == _COMMENTS:
            root = etree.fromstring(archive.read(name), SAFE_PARSER)
            found = _comments(root)
        elif kind == _THREADED:
            root = etree.fromstring(archive.read(name), SAFE_PARSER)
            found = [plain_text_unit(t) for t in root.iter(f"{{{_THREADED_NS}}}text") if _LETTER.search(t.text or "")]
        elif kind in _DRAWINGS:
            root = etree.fromstring(archive.read(name), SAFE_PARSER)
            found = paragraphs(root, DRAWING)
            drawings += [root] if found else []
            found += alt_texts(root)
        else:
            continue
        if found:
            units += found
            roots[name] = root

    def save() -> bytes:
        return rewrite_zip(archive, {name: etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)
                                     for name, root in roots.items()})

    def relabel(tag: str) -> None:  # charts' and drawings' runs name their language, as a presentation's do
        for root in drawings:
            relabel_drawing(root, tag)

    return Document(units, save, relabel)
