"""Files translated whole, for LibreTranslate's /translate_file and our /v1/translate_file: plain
text and HTML through the pipeline as one text, office documents, e-books, subtitles and gettext
catalogs, XLIFF and Markdown (.docx, .pptx, .xlsx, .odt, .odp, .epub, .srt, .vtt, .po, .xlf, .xliff, .md) through nmt_serve/text/documents: read into paragraph units (inline HTML), translated
as HTML (so the runs' formatting lands on the target words by the alignment), written back.

A document's units go to the pipeline in groups of max_texts_per_request, a few groups at once: the
engine batches their sentences together, and a long document does not fill the queue (each group
has the request's deadline). Reading and writing the file run on a thread; a file is read once
(read_file), then translated here (translate_uploaded) or, from /translate_file, made a job (jobs_files.py).
"""
from __future__ import annotations

import asyncio
import codecs
import os
from dataclasses import dataclass
from urllib.parse import quote

from fastapi import Request

from nmt_serve.service.errors import bad_request
from nmt_serve.service.file_store import MEDIA_TYPES
from nmt_serve.service.pipeline import AUTO, TextResult, resolve_model, translate_texts
from nmt_serve.service.state import ServiceState
from nmt_serve.text.documents import Document, DocumentError, read_document
from nmt_serve.text.glossary import Terminology
from nmt_serve.text.language_codes import iso_639_1
from nmt_serve.text.text_encoding import TextEncodingError, decode, decode_html

DETECTION_SAMPLE_CHARS = 5000  # a file's language is told from its beginning (on the event loop: kept short)
GROUPS_AT_ONCE = 4  # groups of a document's paragraphs in the engine at once
TEXT_FORMATS = {".txt": "text", ".html": "html", ".htm": "html"}
# formats an editor saves in the system's code page where it is not UTF-8 (XLIFF names its encoding, a
# gettext catalog its charset; WebVTT is UTF-8 by definition); HTML, which may name its own
LEGACY_TEXT = (".txt", ".srt", ".md", ".markdown")
HTML_TEXT = (".html", ".htm")
FORMATS = tuple(MEDIA_TYPES)  # .txt, .html, .htm, then the documents'


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(os.path.splitext(name)[1].lower(), "application/octet-stream")


def translated_name(name: str, target: str) -> str:
    """As LibreTranslate names it: the original name with the target language before the extension."""
    stem, extension = os.path.splitext(name)
    return f"{stem}_{target}{extension}"


def attachment_headers(name: str) -> dict[str, str]:
    """A file to download (never rendered or sniffed into something else), named in ASCII and UTF-8."""
    ascii_name = name.encode("ascii", "replace").decode().replace("?", "_").replace('"', "_")
    return {"Content-Disposition": f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name)}",
            "X-Content-Type-Options": "nosniff"}


def check_format(name: str, param: str = "file") -> str:
    """The file's extension, refused (400) when it is not one of FORMATS."""
    extension = os.path.splitext(name)[1].lower()
    if extension not in FORMATS:
        raise bad_request(f"file format not supported ({extension or 'no extension'}); supported: {', '.join(FORMATS)}", param)
    return extension


@dataclass
class UploadedFile:
    """A file read for translation: a text (.txt, .html, .htm) or an office document / e-book."""

    name: str
    data: bytes
    extension: str
    text: str | None = None
    document: Document | None = None

    @property
    def chars(self) -> int:
        """Its characters of text: a text's whole, a document's paragraphs without their tags."""
        return len(self.text) if self.document is None else sum(len(u.text) for u in self.document.units)

    def sample(self) -> str:
        """Its beginning, which tells its language (a short paragraph alone says little)."""
        text = self.text if self.document is None else "\n".join(u.text for u in self.document.units)
        return text[:DETECTION_SAMPLE_CHARS]


def utf8_file(state: ServiceState, name: str, data: bytes, source: str, param: str = "file") -> bytes:
    """A text format's bytes in UTF-8: read in the encoding they were saved in (text/text_encoding.py: UTF-8,
    an HTML page's declared encoding, else the code page of the source language, or with "auto" of the
    served ones, that the language detector reads best); other formats as they are. An HTML page's
    declaration then names UTF-8. 400 where no encoding reads them. Blocking: on a thread."""
    extension = os.path.splitext(name)[1].lower()
    if extension not in LEGACY_TEXT + HTML_TEXT:
        return data
    languages = [iso_639_1(s) or s for s in sorted(state.sources)] if source == AUTO else [state.language(source)]

    def detect(text: str) -> tuple[str | None, float]:
        found = state.detector().detect(text) if state.settings.language_detection and state.models else []
        return (found[0].language, found[0].confidence) if found else (None, 0.0)

    try:
        text, encoding = (decode_html if extension in HTML_TEXT else decode)(data, languages, detect)
    except TextEncodingError as exc:
        raise bad_request(f"the file cannot be read as {extension}: {exc}", param) from None
    utf8 = text.encode("utf-8")
    return data if utf8 == data.removeprefix(codecs.BOM_UTF8) else utf8


async def read_file(state: ServiceState, *, name: str, data: bytes, source: str = AUTO, param: str = "file") -> UploadedFile:
    """The file decoded (a text) or read (a document, on a thread); 400 for a format not in FORMATS or a
    file that cannot be read as its extension says, 413 past max_file_bytes. A text format not in UTF-8 is
    read in the encoding it was saved in (utf8_file), and is from then on its UTF-8 bytes. source: the
    file's language as the request names it (what a legacy encoding is guessed for)."""
    extension = check_format(name, param)
    state.limits.check_file_bytes(len(data), param)
    if extension in LEGACY_TEXT + HTML_TEXT:
        data = await asyncio.to_thread(utf8_file, state, name, data, source, param)
    if extension in TEXT_FORMATS:
        try:
            return UploadedFile(name, data, extension, text=data.decode("utf-8-sig"))
        except UnicodeDecodeError:
            raise bad_request("the file is not UTF-8 text", param) from None
    try:
        return UploadedFile(name, data, extension, document=await asyncio.to_thread(read_document, data, name))
    except DocumentError as exc:
        raise bad_request(str(exc), param) from None


def file_source(state: ServiceState, file: UploadedFile, source: str, target: str, param: str = "file",
                upstream_fallbacks: bool = False) -> str | None:
    """One source language for the whole file: "auto" the language the file declares (XLIFF's source
    language: short interface strings say little to a detector) where a loaded model translates it to the
    target, else told from its beginning; None when there is nothing to translate (the source is the
    target, or the file is already in it). upstream_fallbacks: LibreTranslate's answer where ours is a 400
    (pipeline.resolve_model)."""
    if state.language(source) == state.language(target):
        return None
    sample = file.sample()
    if source != AUTO or not sample.strip():
        return source
    declared = file.document.source_language if file.document is not None else None
    if declared:
        named = state.language(declared.replace("_", "-").split("-")[0])
        if named == state.language(target):
            return None
        if f"{named}-{state.language(target)}" in state.models or f"{named}-{state.language(target)}" in state.pivots:
            return named
    model, _ = resolve_model(state, AUTO, state.language(target), sample, param, upstream_fallbacks)
    return model.source if model is not None else None


async def translate_file(state: ServiceState, request: Request, *, name: str, data: bytes, source: str, target: str,
                         param: str = "file", terminology: Terminology | None = None) -> bytes:
    """The file's bytes translated; every failure is an APIError (a file that cannot be read: 400).
    terminology: a glossary's terms (a stored glossary's: /v1/translate_file's glossary_id)."""
    check_format(name, param)
    state.limits.check_file_bytes(len(data), param)
    if state.language(source) == state.language(target):
        return data  # nothing to translate (LibreTranslate gives a text back as it is, too)
    return await translate_uploaded(state, request, await read_file(state, name=name, data=data, source=source, param=param), source, target, param,
                                    terminology=terminology)


async def translate_uploaded(state: ServiceState, request: Request, file: UploadedFile, source: str, target: str,
                             param: str = "file", upstream_fallbacks: bool = False, terminology: Terminology | None = None) -> bytes:
    """A file read by read_file, translated in this request (max_chars_per_text for a text,
    max_document_chars for a document: 413 past them)."""
    options = state.limits.decode_options(4, 1, None)
    if file.document is None:
        state.limits.check_file(file.text, param)
        results = await translate_texts(state, request, source=source, target=target, texts=[file.text], options=options,
                                        param=param, format=TEXT_FORMATS[file.extension], upstream_fallbacks=upstream_fallbacks,
                                        terminology=terminology)
        return results[0].text.encode()
    document = file.document
    state.limits.check_document([u.text for u in document.units], param)
    if document.texts:
        source = file_source(state, file, source, target, param, upstream_fallbacks)
        if source is None:
            return file.data  # already in the target language
    results = await _translate_units(state, request, document.texts, source, target, options, param, terminology)
    try:
        return await asyncio.to_thread(document.write, [r.text for r in results], state.language(target), [unit_flags(r) for r in results])
    except (DocumentError, ValueError) as exc:
        raise bad_request(f"the document could not be written back: {exc}", param) from None


def unit_flags(result: TextResult) -> tuple[str, ...]:
    """A unit's quality flags: its sentences', each once (Document.write notes them where the format can)."""
    return tuple(dict.fromkeys(flag for sentence in result.flags for flag in sentence.flags))


async def _translate_units(state: ServiceState, request: Request, texts: list[str], source: str, target: str, options,
                           param: str, terminology: Terminology | None = None) -> list[TextResult]:
    size = state.settings.max_texts_per_request
    running = asyncio.Semaphore(GROUPS_AT_ONCE)

    async def group(i: int):
        async with running:
            # the document's limit was checked (check_document): a paragraph past max_chars_per_text is its text
            return await translate_texts(state, request, source=source, target=target, texts=texts[i:i + size],
                                         options=options, param=param, format="html", checked=True, terminology=terminology)

    tasks = [asyncio.ensure_future(group(i)) for i in range(0, len(texts), size)]
    try:
        groups = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # one group failed: the others' sentences leave the engine too
            task.cancel()
        raise
    return [r for group in groups for r in group]
