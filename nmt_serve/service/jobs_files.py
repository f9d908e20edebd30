"""A file as a job (POST /v1/jobs/file): read into the job's texts, and the job's translations written back
into a copy of it. An office document or e-book (nmt_serve/text/documents) gives one text per paragraph
unit, HTML with its runs' formatting as inline tags; a .txt file one text per line (empty lines kept)."""
from __future__ import annotations

import os

from nmt_serve.text.documents import FORMATS as DOCUMENT_FORMATS
from nmt_serve.text.documents import MEDIA_TYPES, read_document

FORMATS = (".txt", *DOCUMENT_FORMATS)


def extension_of(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(extension_of(name), "text/plain; charset=utf-8")


def read_texts(name: str, data: bytes) -> tuple[list[str], str]:
    """The file's texts and their format ("text" or "html"); ValueError (DocumentError, UnicodeDecodeError)
    when the file cannot be read as its extension says."""
    if extension_of(name) == ".txt":
        return data.decode("utf-8-sig").split("\n"), "text"
    return read_document(data, name).texts, "html"


def write_file(name: str, data: bytes, translations: list[str]) -> bytes:
    """The file with the texts read from it replaced by their translations, in order."""
    if extension_of(name) == ".txt":
        return "\n".join(translations).encode()
    return read_document(data, name).write(translations)
