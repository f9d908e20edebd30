"""Stored glossaries on disk: made once (POST /v1/glossaries), named by id in any number of translations
and jobs (`glossary_id`), as DeepL's and Google's glossaries are; shared by the API workers.

    <glossaries_dir>/<id>.entries.json   [[source, target], ...]
    <glossaries_dir>/<id>.json           {"id", "name", "source", "target", "owner", "created_at", "entry_count"}

The record is written after the entries and removed before them: a glossary is there while its record is.
Listing reads the small records only. A glossary never changes once made (a new version is a new glossary),
so each process keeps the records it has read, and the terms of the glossaries it used last (MAX_HELD,
matched by first word: text/glossary.GlossaryIndex), and asks the disk only whether the record is still there.
Each file is written whole and renamed into place (jobs_store.write_json): no reader sees half of one. Its
owner is a digest of the API key that made it (jobs_store.py's rule): another key neither lists, reads, uses
nor deletes it.
"""
from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path

from nmt_serve.service.jobs_store import ID, write_json
from nmt_serve.text.glossary import GlossaryEntry, Terminology

MAX_HELD = 32  # glossaries whose terms a process keeps in memory (the most recently used)
_RECORD, _ENTRIES = ".json", ".entries.json"


class GlossaryStore:
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._records: dict[str, dict] = {}
        self._terms: OrderedDict[str, Terminology] = OrderedDict()
        self._lock = threading.Lock()

    def _path(self, glossary_id: str, kind: str) -> Path:
        return self.directory / f"{glossary_id}{kind}"

    def create(self, owner: str, name: str, source: str, target: str, entries: list[GlossaryEntry]) -> dict:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = {"id": secrets.token_hex(16), "name": name, "source": source, "target": target, "owner": owner,
                  "created_at": time.time(), "entry_count": len(entries)}
        write_json(self._path(record["id"], _ENTRIES), [[e.source, e.target] for e in entries])
        try:
            write_json(self._path(record["id"], _RECORD), record)  # from now on the glossary is there
        except BaseException:
            self._path(record["id"], _ENTRIES).unlink(missing_ok=True)
            raise
        return record

    def get(self, glossary_id: str, owner: str | None) -> dict | None:
        """Its record, or None where there is none of this owner's (None: anyone's) by this id."""
        if not ID.fullmatch(glossary_id) or not self._path(glossary_id, _RECORD).is_file():
            with self._lock:  # deleted, by this worker or another
                self._records.pop(glossary_id, None)
                self._terms.pop(glossary_id, None)
            return None
        record = self._records.get(glossary_id)
        if record is None:
            try:
                record = json.loads(self._path(glossary_id, _RECORD).read_text(encoding="utf-8"))
            except FileNotFoundError:
                return None
            with self._lock:
                self._records[glossary_id] = record
        return record if owner is None or record.get("owner") in (owner, None, "") else None

    def terms(self, glossary_id: str, owner: str | None) -> tuple[dict, Terminology] | None:
        """(its record, its entries as terms), or None as get() says."""
        record = self.get(glossary_id, owner)
        if record is None:
            return None
        with self._lock:
            terms = self._terms.get(glossary_id)
            if terms is not None:
                self._terms.move_to_end(glossary_id)
        if terms is None:
            try:
                pairs = json.loads(self._path(glossary_id, _ENTRIES).read_text(encoding="utf-8"))
            except FileNotFoundError:  # deleted meanwhile
                return None
            terms = Terminology(tuple(GlossaryEntry(s, t) for s, t in pairs))
            with self._lock:
                self._terms[glossary_id] = terms
                while len(self._terms) > MAX_HELD:
                    self._terms.popitem(last=False)
        return record, terms

    def list(self, owner: str | None) -> list[dict]:
        """The owner's glossaries (None: everyone's), the newest first."""
        if not self.directory.is_dir():
            return []
        out = []
        for entry in os.scandir(self.directory):
            name = entry.name
            if name.endswith(_RECORD) and not name.endswith(_ENTRIES) and (record := self.get(name[:-len(_RECORD)], owner)):
                out.append(record)
        return sorted(out, key=lambda r: (r["created_at"], r["id"]), reverse=True)

    def delete(self, glossary_id: str, owner: str | None) -> bool:
        if self.get(glossary_id, owner) is None:
            return False
        try:
            self._path(glossary_id, _RECORD).unlink()  # from now on it is not there, whatever remains
        except FileNotFoundError:
            return False
        self._path(glossary_id, _ENTRIES).unlink(missing_ok=True)
        with self._lock:
            self._records.pop(glossary_id, None)
            self._terms.pop(glossary_id, None)
        return True
