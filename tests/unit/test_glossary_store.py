"""The stored glossaries' files (service/glossary_store.py): a glossary is there while its record is."""
from __future__ import annotations

from nmt_serve.service import glossary_store
from nmt_serve.service.glossary_store import GlossaryStore
from nmt_serve.text.glossary import GlossaryEntry


def test_listing_reads_records_only_and_a_deletion_by_another_worker_is_seen(tmp_path, monkeypatch):
    store, other_worker = GlossaryStore(tmp_path), GlossaryStore(tmp_path)
    made = [store.create("", f"g{k}", "de", "en", [GlossaryEntry("Hund", f"dog{k}")] * 1) for k in range(3)]
    # a listing never reads entries: thousands of glossaries of 10,000 entries are listed from their records
    read = []
    real = glossary_store.Path.read_text
    monkeypatch.setattr(glossary_store.Path, "read_text", lambda self, *a, **k: read.append(self.name) or real(self, *a, **k))
    assert [r["name"] for r in other_worker.list(None)] == ["g2", "g1", "g0"]
    assert read and not any(name.endswith(".entries.json") for name in read)
    record, terms = other_worker.terms(made[1]["id"], None)
    assert record["entry_count"] == 1 and terms.terms_for(["Ein Hund."]) == [["dog1"]]
    assert store.delete(made[1]["id"], None)
    assert other_worker.terms(made[1]["id"], None) is None and other_worker.get(made[1]["id"], None) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{r['id']}{kind}" for r in (made[0], made[2])
                                                               for kind in (".json", ".entries.json"))


def test_a_process_holds_the_terms_of_the_glossaries_it_used_last(tmp_path, monkeypatch):
    monkeypatch.setattr(glossary_store, "MAX_HELD", 2)
    store = GlossaryStore(tmp_path)
    ids = [store.create("", "g", "de", "en", [GlossaryEntry("Hund", "dog")])["id"] for _ in range(3)]
    for glossary_id in ids:
        store.terms(glossary_id, None)
    assert list(store._terms) == ids[1:]
    assert store.terms(ids[0], None) is not None  # read again from its file
