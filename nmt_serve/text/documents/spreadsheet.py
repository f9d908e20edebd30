"""Excel workbooks (.xlsx): the text of their cells translated in place, every other part kept byte for byte.

A workbook keeps each distinct text of its cells once, in its shared strings part (`<si>`: a plain `<t>`,
or rich text, runs `<r>` each with its formatting `<rPr>` and text `<t>`), and a cell names it by its
index: each shared string with a letter in it is one unit (its runs inline HTML, as a paragraph's:
inline_runs.py), so a text in a hundred cells is translated once. Cells of inline strings (`<is>`, as
some generators write them) are units too. Numbers, dates, formulas and their cached results, sheet names
(formulas refer to them), comments and charts are left as they are. The parts are edited with lxml rather
than loaded into a spreadsheet library, which would write back only what it models.
"""
from __future__ import annotations

import posixpath
import re
import zipfile

from lxml import etree

from nmt_serve.text.documents.document import Document, DocumentError, open_zip, rewrite_zip
from nmt_serve.text.documents.inline_runs import InlineParagraph, TextSlot
from nmt_serve.text.documents.office_open_xml import SAFE_PARSER

SML = "http://schemas.openxmlformats.org/spreadsheetml/2006/main"
_RELATIONSHIPS = "http://schemas.openxmlformats.org/package/2006/relationships"
_XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_LETTER = re.compile(r"[^\W\d_]")


def _setter(t: etree._Element):
    def write(text: str) -> None:
        t.text = text
        if text != text.strip():  # Excel drops a text's outer spaces unless told to keep them
            t.set(_XML_SPACE, "preserve")

    return write


def _string(holder: etree._Element) -> InlineParagraph | None:
    """A shared string (`<si>`) or an inline one (`<is>`) as a unit; None where it has no letter."""
    slots = []
    for child in holder:
        if child.tag == f"{{{SML}}}t":
            slots.append(TextSlot(child.text or "", None, _setter(child)))
        elif child.tag == f"{{{SML}}}r" and (t := child.find(f"{{{SML}}}t")) is not None:
            formatting = child.find(f"{{{SML}}}rPr")
            slots.append(TextSlot(t.text or "", etree.tostring(formatting) if formatting is not None else None, _setter(t)))
        # <rPh> and <phoneticPr>: reading guides over Japanese text, not the cell's text
    if not any(_LETTER.search(s.text) for s in slots):
        return None
    return InlineParagraph(slots)


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

    def save() -> bytes:
        return rewrite_zip(archive, {name: etree.tostring(root, xml_declaration=True, encoding="UTF-8", standalone=True)
                                     for name, root in roots.items()})

    return Document(units, save)
