"""App factory: settings -> FastAPI app whose lifespan connects to the engine processes (starting and
supervising them, unless a parent process runs them for several API workers)."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Callable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from nmt_serve.engine.process import addresses
from nmt_serve.engine.protocol import EngineStatus
from nmt_serve.engine.supervisor import EngineSupervisor
from nmt_serve.engine.weights_dir import make_weights_dir
from nmt_serve.garbage_collection import rarer_young_collections
from nmt_serve.service.directions import Pivot, ServedDirection, language_names, named, pivot_directions, served_directions
from nmt_serve.service.docs import install_docs
from nmt_serve.service.engine_client import EngineClient
from nmt_serve.service.engine_connection import EngineConnection
from nmt_serve.service.engine_pool import EnginePool
from nmt_serve.service.errors import install_handlers
from nmt_serve.service.middleware import BodySizeLimit, MetricsMiddleware
from nmt_serve.service.jobs_runner import JobRunner
from nmt_serve.service.jobs_store import JobStore, default_directory
from nmt_serve.service.routers import glossaries, health, jobs, libretranslate, ui, v1
from nmt_serve.service.settings import Settings
from nmt_serve.service.state import ServiceState, capped

log = logging.getLogger("service")


@dataclass(frozen=True)
class Served:
    """What the API process makes of a ready engine's models, all of it together so that requests see one set."""
    models: dict[str, ServedDirection]
    names: dict[str, str]
    through: str  # the pivot language as the models name it (eng_Latn -> en); '' for none
    pivots: dict[str, Pivot]


def served_of(status: EngineStatus, settings: Settings) -> Served:
    """The served directions, language names and pivots of an engine's models, and their language detector built:
    0.85 s for NLLB-200's 40,602 directions, on a thread (StatusFollower) so that the event loop answers meanwhile.
    lingua holds the GIL while it builds, so its seconds (high accuracy over many languages) stall the loop all the
    same (BENCHMARKS.md: about 7 s once, before readiness, over NLLB-200's 75; under 0.4 s in low-accuracy mode)."""
    models = served_directions(status.models, settings.cpu_cost_limit, settings.prefer)
    # the language detector takes seconds to build: before readiness, not on the first "auto" request
    if settings.language_detection:
        from nmt_serve.text.language_detection import detector_for

        detector_for(frozenset(m.source for m in models.values()), settings.language_detection_accuracy)
    names = language_names(models)
    through = named(names, settings.pivot_language)
    return Served(models, names, through, pivot_directions(models, through))


class StatusFollower:
    """What the API process learns from each engine's statuses (EngineConnection's on_status, one listener per
    engine): models, load failure, statistics. A new engine's models are made into what requests read on a thread
    (served_of), so the event loop answers meanwhile (health probes, the requests of an engine that restarted with
    the same models). What is served is every model some engine serves, as its newest incarnation named them: the
    engines load one directory alike, but one restarted after it changed serves the new set while the others keep
    theirs, and a call goes only to an engine that names its model (engine_pool.py)."""

    def __init__(self, state: ServiceState, on_load_failure: Callable[[], None] | None = None,
                 on_ready: Callable[[], None] | None = None):
        self.state, self.on_load_failure, self.on_ready = state, on_load_failure, on_ready
        # per engine, the incarnation of the last ready engine whose models are taken in, or being taken in
        self._incarnations: dict[int, str] = {}
        self._engine_models: dict[int, list[dict]] = {}  # per engine, the models its newest ready incarnation named
        self._generation = 0  # one more at each engine's new models: an adoption begun before is superseded
        self._failed = False
        self._adopting: set[asyncio.Task] = set()  # (the loop holds tasks weakly)

    def listener(self, index: int) -> Callable[[EngineStatus], None]:
        return lambda status: self(status, index)

    def __call__(self, status: EngineStatus, index: int = 0) -> None:
        collector, engines = self.state.metrics.engine, self.state.engine.engines if self.state.engine else None
        if engines is None or len(engines) == 1:  # several engines' are merged when /metrics is read (EngineCollector)
            collector.stats, collector.model_stats = status.stats, status.model_stats
        collector.up = status.ready or (engines is not None and engines.ready)
        collector.restarts = engines.losses if engines is not None else 0
        if status.load_error:
            self._fail(status.load_error)
        if status.ready and status.incarnation != self._incarnations.get(index):
            self._incarnations[index] = status.incarnation
            self._engine_models[index] = status.models
            self._generation += 1
            task = asyncio.get_running_loop().create_task(self._adopt(status, self._generation), name="adopt-models")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def adopted(self, timeout: float) -> bool:
        """Wait (up to timeout seconds) until the models of the engines heard of so far are taken in."""
        deadline = time.monotonic() + timeout
        while self._adopting:
            _, pending = await asyncio.wait(set(self._adopting), timeout=max(0.0, deadline - time.monotonic()))
            if pending:
                return False
        return True

    def _fail(self, message: str) -> None:
        if not self._failed:
            self._failed = True
            self.state.load_error = message
            log.error("model loading failed: %s", message)
            if self.on_load_failure:  # a server without its models should stop, not answer 503 forever
                self.on_load_failure()

    async def _adopt(self, status: EngineStatus, generation: int) -> None:
        state = self.state
        every = {m["id"]: m for models in self._engine_models.values() for m in models}  # what some engine serves
        try:
            served = await asyncio.to_thread(served_of, dataclasses.replace(status, models=list(every.values())), state.settings)
        except Exception as exc:  # noqa: BLE001 - the models cannot be served: as a load failure
            log.exception("the engine's models could not be taken in")
            self._fail(f"the engine's models could not be taken in: {type(exc).__name__}: {exc}")
            return
        if generation != self._generation:  # an engine's new models came meanwhile: that adoption takes in every engine's
            return
        state.models, state.names, state.pivots = served.models, served.names, served.pivots
        state.unloaded = status.unloaded
        state.translation_cache.clear()  # answers of the engine before this one's models
        for m in status.models:
            state.metrics.model_load_seconds.labels(model=m["id"]).set(m.get("load_seconds", 0.0))
        log.info("ready: %s%s", capped(state.directions), f"; through {served.through}: {capped(sorted(state.pivots))}" if state.pivots else "")
        if self.on_ready:
            self.on_ready()


def preload_language_models() -> None:
    """The language detector's shared models, loaded while the engine loads its own (the detector for
    the served languages is built once the engine names them, before readiness: StatusFollower)."""
    try:
        from nmt_serve.text.language_detection import preload

        preload()
    except Exception:  # noqa: BLE001 - building the detector at readiness raises it again, where it counts
        log.warning("could not load the language detection models ahead of the engine", exc_info=True)


def start_engine(settings: Settings, on_exit: Callable[[int], None] | None = None, index: int = 0,
                 weights_dir: str = "") -> EngineSupervisor:
    """Engine `index` of the server's, started and kept running; weights_dir: its siblings' (make_weights_dir)."""
    supervisor = EngineSupervisor(settings.engine_config(index, weights_dir), on_exit=on_exit)
    supervisor.start()
    return supervisor


def create_app(settings: Settings | None = None, on_load_failure: Callable[[], None] | None = None,
               on_ready: Callable[[], None] | None = None) -> FastAPI:
    state = ServiceState(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        s = state.settings
        rarer_young_collections()
        loop = asyncio.get_running_loop()
        engines: EnginePool | None = None

        def engine_exited(index: int, code: int) -> None:  # on a supervisor's thread
            if engines is not None:
                loop.call_soon_threadsafe(lambda: engines.engine_lost(index, f"the engine process exited (code {code})", down=True))

        if s.language_detection:
            threading.Thread(target=preload_language_models, name="language-models", daemon=True).start()
        if s.engine_dirs:  # a parent process runs the engines for several API workers
            places = [addresses(directory) for directory in s.engine_dirs]
        else:
            weights_dir = make_weights_dir(s.engines, s.device, s.shared_weights)
            state.supervisors = [start_engine(s, functools.partial(engine_exited, i), i, weights_dir) for i in range(s.engines)]
            places = [supervisor.addresses for supervisor in state.supervisors]
        follower = StatusFollower(state, on_load_failure, on_ready)
        engines = EnginePool([EngineConnection(calls, status, heartbeat_timeout_s=s.engine_heartbeat_timeout_s,
                                               on_status=follower.listener(i)) for i, (calls, status) in enumerate(places)],
                             stall_s=s.engine_stall_s)
        state.engine = EngineClient(engines, on_resend=state.metrics.resent.inc, engines_cache=s.engine_cache_entries > 0)
        await engines.start()
        state.metrics.engine.liveness = lambda: (sum(c.ready for c in engines.connections), engines.stalled(), engines.losses)
        if len(engines) > 1:
            state.metrics.engine.statistics = engines.stats
        app.state.jobs = JobRunner(state, JobStore(s.jobs_dir or default_directory(), s.job_ttl_s))
        state.metrics.jobs.counts = app.state.jobs.store.counts
        app.state.jobs.start()
        if s.engine_dirs:
            # a worker joining the engines: until one serves (a starting one's progress does not count) and the
            # models it names are taken in, it would answer 503 to traffic its siblings serve; uvicorn accepts
            # connections only once this returns
            if await engines.wait_for_settled(s.engine_heartbeat_timeout_s):
                await follower.adopted(s.engine_heartbeat_timeout_s)
        yield
        state.draining = True
        await app.state.jobs.stop()  # the job in hand stays on disk, for the next runner
        await engines.stop()
        # side by side: each may take up to graceful_shutdown_s to finish what it runs
        await asyncio.gather(*(loop.run_in_executor(None, supervisor.stop, s.graceful_shutdown_s) for supervisor in state.supervisors))

    app = FastAPI(
        title="nmt-serve",
        version="0.1.0",
        description="Translation with from-scratch Transformer models: continuous batching in an engine process, "
        "attention maps, LibreTranslate-compatible endpoints, health and Prometheus metrics. Every error has the shape "
        '{"error": {"type", "message", "param"}}, except on the LibreTranslate-compatible routes, which answer '
        'LibreTranslate\'s {"error": "message"}.',
        lifespan=lifespan, docs_url=None, redoc_url=None,  # install_docs serves them without a CDN
    )
    app.state.service = state
    install_handlers(app, plain_errors=libretranslate.is_libretranslate_path)
    # FastAPI tries the routers in this order, each route in Python: the two translate routes' routers first
    # (LibreTranslate's /translate after jobs and glossaries spent 8% more of its CPU on finding its route)
    app.include_router(v1.router)
    app.include_router(libretranslate.router)
    app.include_router(jobs.router)
    app.include_router(glossaries.router)
    app.include_router(health.router)
    app.include_router(ui.router)
    ui.mount_viewer(app)
    install_docs(app)

    # the last added is the outermost: CORS, then metrics (sees every status), then the body limit
    # an uploaded file may be larger than a JSON body: its form fields and multipart framing on top
    upload_limit = max(state.settings.max_body_bytes, state.settings.max_file_bytes + 65536)
    app.add_middleware(BodySizeLimit, max_bytes=state.settings.max_body_bytes, body_timeout_s=state.settings.body_timeout_s,
                       body_min_rate=state.settings.body_min_rate,
                       plain_errors=libretranslate.is_libretranslate_path,
                       path_limits={"/translate_file": upload_limit, "/v1/translate_file": upload_limit,
                                    "/v1/jobs": state.settings.max_job_bytes, "/v1/jobs/file": state.settings.max_job_bytes})
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    if state.settings.origins():
        app.add_middleware(
            CORSMiddleware, allow_origins=state.settings.origins(), allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type", "x-request-timeout", "idempotency-key"],
            # what a browser client reads of a job's answer, or of a refusal
            expose_headers=["idempotent-replayed", "retry-after"],
        )
    return app
