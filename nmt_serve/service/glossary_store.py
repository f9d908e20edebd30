"""Stored glossaries on disk: made once (POST /v1/glossaries), named by id in any number of translations
and jobs (`glossary_id`), as DeepL's and Google's glossaries are; one file each, shared by the API workers.

    <glossaries_dir>/<id>.json   {"id", "name", "source", "target", "owner", "created_at", "entries": [[source, target], ...]}

A glossary never changes once made (a new version is a new glossary), so each process keeps the ones it has
read, matched by first word (text/glossary.GlossaryIndex), and asks the disk only whether the file is still
there. A file is written whole and renamed into place: no reader sees half of one. Its owner is a digest of
the API key that made it (jobs_store.py's rule): another key neither lists, reads, uses nor deletes it.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path

from nmt_serve.service.jobs_store import ID
from nmt_serve.text.glossary import GlossaryEntry, Terminology


class GlossaryStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._read: dict[str, tuple[dict, Terminology]] = {}  # id -> (its record less the entries, its terms)
        self._lock = threading.Lock()

    def _path(self, glossary_id: str) -> Path | None:
        return self.directory / f"{glossary_id}.json" if ID.fullmatch(glossary_id) else None

    def create(self, owner: str, name: str, source: str, target: str, entries: list[GlossaryEntry]) -> dict:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = {"id": secrets.token_hex(16), "name": name, "source": source, "target": target, "owner": owner,
                  "created_at": time.time(), "entry_count": len(entries)}
        data = json.dumps({**record, "entries": [[e.source, e.target] for e in entries]}, ensure_ascii=False)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".new-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / f"{record['id']}.json")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return record

    def get(self, glossary_id: str, owner: str | None) -> tuple[dict, Terminology] | None:
        """(its record without the entries, its entries as terms), or None where there is none of this owner's
        (None: anyone's) by this id."""
        path = self._path(glossary_id)
        if path is None or not path.is_file():
            with self._lock:
                self._read.pop(glossary_id, None)  # deleted, by this worker or another
            return None
        found = self._read.get(glossary_id)
        if found is None:
            try:
                stored = json.loads(path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                return None
            entries = tuple(GlossaryEntry(s, t) for s, t in stored.pop("entries"))
            found = (stored, Terminology(entries))
            with self._lock:
                self._read[glossary_id] = found
        record = found[0]
        if owner is not None and record.get("owner") not in (owner, None, ""):
            return None
        return found

    def list(self, owner: str | None) -> list[dict]:
        """The owner's glossaries (None: everyone's), the newest first."""
        if not self.directory.is_dir():
            return []
        out = []
        for entry in os.scandir(self.directory):
            if entry.name.endswith(".json") and (found := self.get(entry.name[:-5], owner)) is not None:
                out.append(found[0])
        return sorted(out, key=lambda r: (r["created_at"], r["id"]), reverse=True)

    def delete(self, glossary_id: str, owner: str | None) -> bool:
        if self.get(glossary_id, owner) is None:
            return False
        try:
            self._path(glossary_id).unlink()
        except FileNotFoundError:
            return False
        with self._lock:
            self._read.pop(glossary_id, None)
        return True
