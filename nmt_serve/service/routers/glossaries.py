"""Stored glossaries: POST /v1/glossaries, GET /v1/glossaries, GET /v1/glossaries/{id} (and /entries),
DELETE /v1/glossaries/{id}; a translation or a job names one by `glossary_id` (service/glossary_store.py).

With API keys on, a glossary is its key's: another key neither lists, reads, uses nor deletes it (404, and
400 naming glossary_id where a translation names it, as for no glossary).
"""
from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from nmt_serve.service.dependencies import get_state, seen_owner
from nmt_serve.service.errors import APIError, bad_request, documented_error, too_large
from nmt_serve.service.jobs_runner import storage_error
from nmt_serve.service.pipeline import AUTO
from nmt_serve.service.routers.ids import path_id
from nmt_serve.service.schemas import GlossaryCreate, GlossaryEntries, GlossaryInfo, GlossaryList, GlossaryTerm
from nmt_serve.service.state import ServiceState
from nmt_serve.text.glossary import GlossaryEntry, check

router = APIRouter(prefix="/v1", tags=["glossaries"])  # access checked before: middleware.BodySizeLimit
GlossaryId = path_id("glossary")
NOT_FOUND = {404: documented_error("no such glossary (or another key's)", "not_found", "no glossary 5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2", "id")}
FULL = {507: documented_error("the glossaries directory is full: retry later (Retry-After)", "insufficient_storage",
                              "the glossaries directory is full (No space left on device): retry later")}


def _entries(body: GlossaryCreate, limit: int) -> list[GlossaryEntry]:
    """The body's entries, checked as a request's glossary is (text/glossary.check: each source term with a word
    in it, no source term with two targets), the same pair twice kept once."""
    if (body.entries is None) == (body.entries_tsv is None):
        raise bad_request("give entries or entries_tsv", "entries")
    if body.entries is not None:
        pairs = [(e.source, e.target) for e in body.entries]
    else:
        pairs = []
        for n, line in enumerate(body.entries_tsv.splitlines(), 1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                raise bad_request(f"entries_tsv line {n}: a line is `source<TAB>target`", "entries_tsv")
            pairs.append((fields[0].strip(), fields[1].strip()))
    entries = list(dict.fromkeys(GlossaryEntry(source, target) for source, target in pairs))
    if len(entries) > limit:
        raise too_large(f"{len(entries)} entries; the limit is {limit} (max_glossary_entries)", "entries")
    if not entries:
        raise bad_request("a glossary needs an entry", "entries")
    if (problem := check(entries, [], max_entries=limit)) is not None:
        raise bad_request(problem[0], "entries")
    return entries


@router.post("/glossaries", status_code=201, response_model=GlossaryInfo,
             responses={413: documented_error("more entries than max_glossary_entries", "request_too_large",
                                              "12000 entries; the limit is 10000 (max_glossary_entries)", "entries"),
                        409: documented_error("the key has max_glossaries glossaries already", "too_many_glossaries",
                                              "at most 1000 glossaries a key (max_glossaries): delete one first", "name"),
                        **FULL})
async def create_glossary(body: GlossaryCreate, request: Request, state: ServiceState = Depends(get_state)) -> GlossaryInfo:
    """Keep a glossary for one direction (its source and target as a translation names them), to name by id in
    any number of translations and jobs (`glossary_id`). Entries are matched as a request's `glossary` is
    (case- and inflection-tolerant); a glossary never changes: a new version is a new glossary."""
    state.require_ready()
    if body.source == AUTO:
        raise bad_request("a glossary is for one source language: name it, not auto", "source")
    model = state.model_for(body.source, body.target)  # 400 for a direction not served
    entries = _entries(body, state.settings.max_glossary_entries)
    owner = seen_owner(state, request)
    store = state.glossaries
    if len(await asyncio.to_thread(store.list, owner)) >= state.settings.max_glossaries:
        raise APIError(409, "too_many_glossaries", f"at most {state.settings.max_glossaries} glossaries a key (max_glossaries): "
                                                   "delete one first", "name")
    try:
        record = await asyncio.to_thread(store.create, owner or "", body.name, model.source, model.target, entries)
    except OSError as exc:
        raise storage_error(exc, "glossaries") from None
    return GlossaryInfo(**record)


@router.get("/glossaries", response_model=GlossaryList)
async def list_glossaries(request: Request, state: ServiceState = Depends(get_state)) -> GlossaryList:
    return GlossaryList(glossaries=[GlossaryInfo(**r) for r in await asyncio.to_thread(state.glossaries.list, seen_owner(state, request))])


async def _found(state: ServiceState, request: Request, glossary_id: str, read, *args):
    found = await asyncio.to_thread(read, glossary_id, seen_owner(state, request), *args)
    if found is None:
        raise APIError(404, "not_found", f"no glossary {glossary_id}", "id")
    return found


@router.get("/glossaries/{glossary_id:hex_id}", response_model=GlossaryInfo, responses=NOT_FOUND)
async def get_glossary(glossary_id: GlossaryId, request: Request, state: ServiceState = Depends(get_state)) -> GlossaryInfo:
    return GlossaryInfo(**await _found(state, request, glossary_id, state.glossaries.get))


@router.get("/glossaries/{glossary_id:hex_id}/entries", response_model=GlossaryEntries,
            responses={**NOT_FOUND, 200: {"content": {"text/tab-separated-values": {"example": "Hund\thound\nKatze\tfeline\n"}}}})
async def glossary_entries(glossary_id: GlossaryId, request: Request,
                           format: Literal["json", "tsv"] = Query("json", description="tsv: lines of source<TAB>target, "
                                                                                       "as entries_tsv takes them"),
                           state: ServiceState = Depends(get_state)):
    _, terms = await _found(state, request, glossary_id, state.glossaries.terms)
    if format == "tsv":
        return Response("".join(f"{e.source}\t{e.target}\n" for e in terms.glossary),
                        media_type="text/tab-separated-values; charset=utf-8")
    return GlossaryEntries(id=glossary_id, entries=[GlossaryTerm(source=e.source, target=e.target) for e in terms.glossary])


@router.delete("/glossaries/{glossary_id:hex_id}", status_code=204, response_class=Response, responses={**NOT_FOUND, **FULL})
async def delete_glossary(glossary_id: GlossaryId, request: Request, state: ServiceState = Depends(get_state)) -> Response:
    """Delete a glossary: translations and jobs that name it from then on are refused (400; a queued or running
    job that names it fails)."""
    try:
        deleted = await asyncio.to_thread(state.glossaries.delete, glossary_id, seen_owner(state, request))
    except OSError as exc:
        raise storage_error(exc, "glossaries") from None
    if not deleted:
        raise APIError(404, "not_found", f"no glossary {glossary_id}", "id")
    return Response(status_code=204)
