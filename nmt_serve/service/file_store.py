"""Translated files kept for download (LibreTranslate's POST /translate_file answers with a URL, the
client fetches the file from GET /download_file/<id> afterwards), and what each kind of file is
served as (MEDIA_TYPES: every format /translate_file accepts).

The files live in a directory, not in a process's memory: with several API workers the download may
reach another worker than the upload did, and all of them see the same directory: `<jobs_dir>/files`
where jobs_dir is set (so replicas sharing it share the files too), else the engine's socket directory
(private to this user, removed when the server stops). Each file is one write-then-rename,
so a worker never reads half of one; a file expires `ttl_s` after it was stored, and the oldest go
first when the directory would hold more than `max_bytes`.
"""
from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from nmt_serve.text.documents import MEDIA_TYPES as DOCUMENT_MEDIA_TYPES

ID = re.compile(r"[0-9a-f]{32}")
MEDIA_TYPES = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8", ".htm": "text/html; charset=utf-8",
               **DOCUMENT_MEDIA_TYPES}
# a response that is a translated file, as OpenAPI documents it: each media type a file is served as
FILE_CONTENT = {media.split(";")[0]: {"schema": {"type": "string", "format": "binary"}} for media in dict.fromkeys(MEDIA_TYPES.values())}


@dataclass
class StoredFile:
    name: str
    data: bytes

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES.get(os.path.splitext(self.name)[1].lower(), "application/octet-stream")


class FileStore:
    def __init__(self, directory: str | Path, ttl_s: float = 1800.0, max_bytes: int = 64 << 20):
        self.directory = Path(directory)
        self.ttl_s, self.max_bytes = ttl_s, max_bytes

    def put(self, name: str, data: bytes) -> str:
        """Store the file; return its id (128 random bits: knowing the id is what grants the download)."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._make_room(len(data))
        file_id = secrets.token_hex(16)
        name = name.replace("\n", " ").replace("\r", " ")
        partial = self.directory / f".{file_id}.partial"
        partial.write_bytes(name.encode() + b"\n" + data)
        os.replace(partial, self.directory / file_id)
        return file_id

    def get(self, file_id: str) -> StoredFile | None:
        if not ID.fullmatch(file_id):
            return None  # also keeps paths out: only 32 hex digits name a file
        path = self.directory / file_id
        try:
            if time.time() - path.stat().st_mtime > self.ttl_s:
                path.unlink(missing_ok=True)
                return None
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        name, _, data = raw.partition(b"\n")
        return StoredFile(name.decode(), data)

    def _make_room(self, incoming: int) -> None:
        now = time.time()
        files = []
        for path in self.directory.iterdir():
            if not ID.fullmatch(path.name):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # another worker removed it meanwhile
                continue
            if now - st.st_mtime > self.ttl_s:
                path.unlink(missing_ok=True)
            else:
                files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files) + incoming
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
