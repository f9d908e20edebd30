"""A file as a job (POST /v1/jobs/file, and LibreTranslate's /translate_file past sync_file_chars): read into
the job's texts, and the job's translations written back into a copy of it. An office document or e-book
(nmt_serve/text/documents) gives one text per paragraph unit, HTML with its runs' formatting as inline tags;
a .txt file one text per line (empty lines kept). An HTML page is one text, so never a job."""
from __future__ import annotations

import os

from fastapi import Request

from nmt_serve.service.file_translation import (
    UploadedFile,
    file_source,
    read_file,
    translate_file,
    translate_uploaded,
    translated_name,
)
from nmt_serve.service.jobs_runner import JobRunner
from nmt_serve.service.jobs_store import JobStore
from nmt_serve.service.settings import Settings
from nmt_serve.service.state import ServiceState
from nmt_serve.text.documents import FORMATS as DOCUMENT_FORMATS
from nmt_serve.text.documents import MEDIA_TYPES, Document, read_document

FORMATS = (".txt", *DOCUMENT_FORMATS)


def extension_of(name: str) -> str:
    return os.path.splitext(name)[1].lower()


def media_type(name: str) -> str:
    return MEDIA_TYPES.get(extension_of(name), "text/plain; charset=utf-8")


def read_texts(name: str, data: bytes, document: Document | None = None) -> tuple[list[str], str]:
    """The file's texts and their format ("text" or "html"); ValueError (DocumentError, UnicodeDecodeError)
    when the file cannot be read as its extension says. `document`: the file already read."""
    if extension_of(name) == ".txt":
        return data.decode("utf-8-sig").split("\n"), "text"
    return (document or read_document(data, name)).texts, "html"


def write_file(name: str, data: bytes, translations: list[str], language: str | None = None,
               flags: list[tuple[str, ...]] | None = None) -> bytes:
    """The file with the texts read from it replaced by their translations, in order; language: the
    translations' (a document then says its text is in it: Document.write); flags: per text, its
    translation's quality flags (noted for a reviewer where the format can)."""
    if extension_of(name) == ".txt":
        return "\n".join(translations).encode()
    return read_document(data, name).write(translations, language, flags)


def translated_file(store: JobStore, record: dict, partial: bool = False) -> tuple[str, bytes]:
    """A done file job's result: its name (as LibreTranslate names it) and its bytes (blocking: on a thread).
    partial: a job not done yet, its texts that are not translated yet kept as they are."""
    job_id, name = record["id"], record["file_name"]
    done: list[dict | None] = []  # per text its translation (schemas.Translation as JSON), None where not yet
    if partial:
        texts = store.texts(job_id)
        for (start, end), chunk in zip(record["chunks"], store.chunks_so_far(record)):
            done += [None] * (end - start) if chunk is None else chunk["translations"]
        translations = [texts[i] if t is None else t["text"] for i, t in enumerate(done)]
    else:
        done = [t for chunk in store.chunks(record) for t in chunk["translations"]]
        translations = [t["text"] for t in done]
    flags = [tuple(dict.fromkeys(f for sentence in (t or {}).get("flags") or [] for f in sentence["flags"])) for t in done]
    # a partial result is in two languages: it keeps saying the source's
    return translated_name(name, record["target"]), write_file(name, store.original(job_id), translations,
                                                               None if partial else record["target"], flags)


def runs_as_job(settings: Settings, file: UploadedFile) -> bool:
    """Whether /translate_file makes the file a job: more characters than sync_file_chars, or than one
    request may carry (max_chars_per_text for a .txt, max_document_chars for a document)."""
    if file.extension not in FORMATS:
        return False
    limit = settings.max_chars_per_text if file.document is None else settings.max_document_chars
    return file.chars > min(settings.sync_file_chars, limit)


async def submit_file(state: ServiceState, runner: JobRunner, *, name: str, data: bytes, texts: list[str], format: str,
                      source: str, target: str, param: str = "file", idempotency_key: str | None = None, **spec) -> dict:
    """The file's texts as a new job (413 past the job limits: max_job_bytes, max_job_texts, max_chars_per_text
    per text); its record. `source` is one language for the whole file (a .txt line alone tells little).
    idempotency_key: JobRunner.submit's."""
    state.limits.check_file_bytes(len(data), param, "max_job_bytes")
    state.limits.check_job_texts(texts, param)
    state.require_ready()
    return await runner.submit(dict(source=source, target=target, format=format, split_sentences=True, file_name=name, **spec),
                               texts, state.limits.decode_options(4, 1, None), data, idempotency_key)


async def translate_or_submit(state: ServiceState, request: Request, runner: JobRunner, *, name: str, data: bytes, source: str,
                              target: str, **spec) -> bytes | dict:
    """LibreTranslate's /translate_file: the file translated in the request (its bytes), or, when it runs as a
    job (runs_as_job), the job's record. With "auto", a file in no served language is taken as English, as
    upstream takes it (pipeline.resolve_model's upstream_fallbacks)."""
    if state.language(source) == state.language(target):
        return await translate_file(state, request, name=name, data=data, source=source, target=target)  # given back
    file = await read_file(state, name=name, data=data, source=source)
    if not runs_as_job(state.settings, file):
        return await translate_uploaded(state, request, file, source, target, upstream_fallbacks=True)
    source = file_source(state, file, source, target, upstream_fallbacks=True)
    if source is None:
        return data  # already in the target language
    texts, format = read_texts(name, file.data, file.document)  # (a text format's in UTF-8 now)
    return await submit_file(state, runner, name=name, data=file.data, texts=texts, format=format, source=source, target=target, **spec)
