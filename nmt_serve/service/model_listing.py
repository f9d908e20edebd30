"""GET /v1/models' body. A many-to-many model makes it large: NLLB-200's 40,602 directions are 27 MB of JSON,
which took 2 s of the event loop to validate and serialize on every call (every other request waited). The
whole listing is therefore built once per set of served models, on a thread, and kept with its gzip (a few
percent of the size, for clients that take it); a listing narrowed by source, target or model is built when
asked, from the directions that match."""
from __future__ import annotations

import asyncio
import gzip
from collections.abc import Callable
from dataclasses import dataclass

from nmt_serve.service.directions import Pivot, ServedDirection
from nmt_serve.service.schemas import ModelInfo, ModelList, PivotDirection, UnloadedCheckpoint
from nmt_serve.service.state import ServiceState


def model_list(state: ServiceState, keep: Callable[[ServedDirection | Pivot], bool] = lambda _: True) -> ModelList:
    """The served directions `keep` takes, the pivot directions it takes, and the checkpoints left unloaded."""
    return ModelList(models=[ModelInfo(**{k: v for k, v in m.describe().items() if k in ModelInfo.model_fields})
                             for m in state.models.values() if keep(m)],
                     pivots=[PivotDirection(**p.describe()) for p in state.pivots.values() if keep(p)],
                     unloaded=[UnloadedCheckpoint(**u) for u in state.unloaded])


@dataclass
class Listing:
    """The whole listing of one set of served models, as JSON and gzipped."""
    of: tuple  # (models, pivots, unloaded): the objects it was built from, held so that identity compares
    body: bytes
    gzipped: bytes


async def whole_listing(state: ServiceState) -> Listing:
    """The whole listing, built on a thread the first time for these models and kept while they are served."""
    of = (state.models, state.pivots, state.unloaded)
    kept = state.listing
    if kept is None or any(a is not b for a, b in zip(kept.of, of)):
        def build() -> Listing:
            body = model_list(state).model_dump_json().encode()
            return Listing(of, body, gzip.compress(body, compresslevel=6))

        kept = state.listing = await asyncio.to_thread(build)
    return kept


def narrowed(state: ServiceState, source: str | None, target: str | None, model: str | None) -> ModelList:
    """The listing of the directions from `source`, into `target` and served by `model` (each in any form a request
    may name it; a pivot direction is served by both its models)."""
    source = state.language(source) if source else None
    target = state.language(target) if target else None

    def keep(m: ServedDirection | Pivot) -> bool:
        models = m.describe()["models"] if isinstance(m, Pivot) else [m.engine_model]
        return (source is None or m.source == source) and (target is None or m.target == target) and (model is None or model in models)

    return model_list(state, keep)
