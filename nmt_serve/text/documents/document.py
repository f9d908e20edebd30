"""The interface every document format shares: a document read from its bytes is a list of units
(each an HTML fragment: a paragraph's text with its formatting as inline tags), translated by
whoever holds them, and written back into a copy of the file with everything else kept as it was.

`read_document` and `Document.write` are pure functions of bytes (no I/O, no service), so the API,
a background job or the command line can call them, and split the translation of the units however
they like in between.
"""
from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

MAX_UNPACKED_BYTES = 256 << 20  # what a zip-based document may expand to (a zip bomb stops here)


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

    @property
    def texts(self) -> list[str]:
        return [u.html for u in self.units]

    def write(self, translations: list[str]) -> bytes:
        """The file with each unit's translation in place (call once: the units write into the
        document as it was read)."""
        if len(translations) != len(self.units):
            raise ValueError(f"{len(translations)} translations for {len(self.units)} units")
        for unit, text in zip(self.units, translations):
            unit.write(text)
        return self._save()


def open_zip(data: bytes, max_unpacked_bytes: int = MAX_UNPACKED_BYTES) -> zipfile.ZipFile:
    """The document's zip container, refused when it is none or would expand past the limit."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError) as exc:
        raise DocumentError("it is not a zip container") from exc
    unpacked = sum(info.file_size for info in archive.infolist())
    if unpacked > max_unpacked_bytes:
        raise DocumentError(f"it expands to {unpacked} bytes; the limit is {max_unpacked_bytes}")
    return archive


def rewrite_zip(archive: zipfile.ZipFile, replaced: dict[str, bytes]) -> bytes:
    """A copy of the container with some members' contents replaced: every member in its order,
    with its name, date and compression (ODF and EPUB need their `mimetype` first and stored)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as new:
        for info in archive.infolist():
            data = replaced.get(info.filename)
            new.writestr(info, archive.read(info) if data is None else data, compress_type=info.compress_type)
    return out.getvalue()
