"""The interface every document format shares: a document read from its bytes is a list of units
(each an HTML fragment: a paragraph's text with its formatting as inline tags), translated by
whoever holds them, and written back into a copy of the file with everything else kept as it was.

`read_document` and `Document.write` are pure functions of bytes (no I/O, no service), so the API,
a background job or the command line can call them, and split the translation of the units however
they like in between.
"""
from __future__ import annotations

import copy
import io
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_UNPACKED_BYTES = 256 << 20  # what a zip-based document may expand to (a zip bomb stops here)
# What its markup parts (XML, XHTML, relationships: the parts parsed into trees) may expand to. lxml's tree
# and the units made of it take 20-40x the markup's bytes: 20 MB of Word XML, a 60 KB upload, took 8 s and
# 730 MB to read (2 cores). A 1,000-page book's document.xml is some 5-15 MB.
MAX_MARKUP_BYTES = 32 << 20
MARKUP_PARTS = (".xml", ".rels", ".xhtml", ".html", ".htm", ".opf", ".ncx", ".svg")


class DocumentError(ValueError):
    """The file cannot be read as the format its name says (corrupt, encrypted, or another format)."""


class Unit(Protocol):
    html: str  # what to translate: text with inline tags (HTML format)
    text: str  # the same without the tags (for limits and language detection)

    def write(self, translated_html: str) -> None: ...


@dataclass
class Document:
    units: list[Unit]
    _save: Callable[[], bytes]
    # says, where the file says which language its text is in, that it is in this one (a BCP 47 tag)
    _relabel: Callable[[str], None] | None = None
    # the language the file declares its source text is in, where a format declares it for translation
    # (XLIFF's source language; a BCP 47 tag as written), else None
    source_language: str | None = None
    # takes, per unit, the quality flags of its translation (text/quality_flags.py), where a format has a
    # place for a reviewer's notes (XLIFF's notes, a gettext entry's translator comment)
    _annotate: Callable[[list[tuple[str, ...]]], None] | None = None

    @property
    def texts(self) -> list[str]:
        return [u.html for u in self.units]

    def write(self, translations: list[str], language: str | None = None, flags: list[tuple[str, ...]] | None = None) -> bytes:
        """The file with each unit's translation in place (call once: the units write into the
        document as it was read); language: the translation's, as the service names it, written where
        the file names its text's language (language_marks.py); flags: per unit, its translation's
        quality flags, noted for a reviewer where the format has a place for it."""
        if len(translations) != len(self.units):
            raise ValueError(f"{len(translations)} translations for {len(self.units)} units")
        for unit, text in zip(self.units, translations):
            unit.write(text)
        if flags is not None and self._annotate is not None:
            if len(flags) != len(self.units):
                raise ValueError(f"flags for {len(flags)} units of {len(self.units)}")
            self._annotate(flags)
        if language and self._relabel is not None:
            from nmt_serve.text.language_codes import bcp47

            self._relabel(bcp47(language))
        return self._save()


# an OLE compound file (CFB): a password-protected Office file (its encrypted package inside), or a
# legacy binary one (.doc, .ppt, .xls)
_CFB_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_ENCRYPTED_PACKAGE = "EncryptionInfo".encode("utf-16-le")  # the stream name, as the CFB directory holds it
# what OOXML, ODF and EPUB containers may use (their specifications name no other)
_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflated"}
_CHUNK = 1 << 20


def open_zip(data: bytes, max_unpacked_bytes: int = MAX_UNPACKED_BYTES, max_markup_bytes: int = MAX_MARKUP_BYTES) -> zipfile.ZipFile:
    """The document's zip container, refused when it is none or would expand past the limit. Every
    member is read through once here, a mebibyte at a time: one that is encrypted, compressed by a
    method these formats do not use, damaged (its CRC), or that holds more than its header says (the
    header is what the limit counts; read whole, zipfile inflates a member in one call: gigabytes for
    a forged header) is refused now, before any library or the translation reads it."""
    if data.startswith(_CFB_SIGNATURE):
        if _ENCRYPTED_PACKAGE in data:
            raise DocumentError("it is password-protected (encrypted): remove the password and send it again")
        raise DocumentError("it is a legacy binary Office file (.doc, .ppt, .xls) or another OLE file, not a zip "
                            "container: save it in the current format")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError, EOFError, struct.error) as exc:
        raise DocumentError("it is not a zip container") from exc
    except NotImplementedError as exc:  # a zip "version" zipfile does not read: a damaged directory
        raise DocumentError(f"it is a zip container that cannot be read ({exc})") from exc
    unpacked = sum(info.file_size for info in archive.infolist())
    if unpacked > max_unpacked_bytes:
        raise DocumentError(f"it expands to {unpacked} bytes; the limit is {max_unpacked_bytes}")
    markup = sum(info.file_size for info in archive.infolist() if info.filename.lower().endswith(MARKUP_PARTS))
    if markup > max_markup_bytes:
        raise DocumentError(f"its markup (XML) expands to {markup} bytes; the limit is {max_markup_bytes}: split the document")
    for info in archive.infolist():
        _check_member(archive, info)
    return archive


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
    name = info.filename
    if info.flag_bits & 0x1:
        raise DocumentError(f"its part {name} is encrypted (password-protected)")
    if info.compress_type not in _METHODS:
        raise DocumentError(f"its part {name} uses compression method {info.compress_type}; "
                            f"these formats use only {' and '.join(_METHODS.values())}")
    # read in chunks, zipfile inflates a chunk's worth at a time and stops at the size the header says (a
    # forged one then fails the CRC check); read() whole would inflate all of it in one call
    try:
        with archive.open(info) as member:
            while member.read(_CHUNK):
                pass
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError, ValueError, EOFError) as exc:
        raise DocumentError(f"its part {name} is damaged ({exc})") from exc


def rewrite_zip(archive: zipfile.ZipFile, replaced: dict[str, bytes]) -> bytes:
    """A copy of the container with some members' contents replaced: every member in its order,
    with its name, date and compression (ODF and EPUB need their `mimetype` first and stored)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for info in archive.infolist():
            data = replaced.get(info.filename)
            try:
                data = archive.read(info) if data is None else data
            except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:  # open_zip read it through
                raise DocumentError(f"its part {info.filename} cannot be read ({exc})") from exc
            # a copy: writestr sets the entry's offset and sizes to the new container's, and the source's
            # entries would then point into the wrong file
            new.writestr(copy.copy(info), data, compress_type=info.compress_type)
    return out.getvalue()
