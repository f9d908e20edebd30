"""App factory: settings -> FastAPI app whose lifespan loads the models and runs the batcher."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from .batcher import Batcher
from .errors import install_handlers
from .middleware import BodySizeLimit, MetricsMiddleware
from .models import load_models
from .routers import health, libretranslate, translate, ui
from .settings import Settings
from .state import ServiceState

log = logging.getLogger("service")


async def load_and_start(state: ServiceState, on_load_failure: Callable[[], None] | None = None) -> None:
    """Load every model off the event loop, then start the batcher and turn ready."""
    s = state.settings
    # Every torch call of the process runs on this one thread, loading included. torch's OpenMP keeps a
    # thread team per calling thread, and an idle team spins: with work on two threads, decoding ran
    # 3x slower on 2 cores (measured). torch's thread count is a per-thread setting, so it is set here.
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-worker")

    def load():
        if s.threads:
            import torch

            torch.set_num_threads(s.threads)
        return load_models(s.models_dir, s.device, s.dtype, s.quantization, s.step_mode)

    try:
        models = await asyncio.get_running_loop().run_in_executor(worker, load)
    except asyncio.CancelledError:  # shut down while loading
        worker.shutdown(wait=False)
        raise
    except Exception as exc:
        worker.shutdown(wait=False)
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.error("model loading failed: %s", state.load_error)
        if on_load_failure:  # a server without its models should stop, not answer 503 forever
            on_load_failure()
        return
    state.models = models
    for m in models.values():
        state.metrics.model_load_seconds.labels(model=m.id).set(m.load_seconds)
    state.batcher = Batcher(models, s, state.metrics, worker)
    await state.batcher.start()
    state.ready = True
    log.info("ready: %s", ", ".join(sorted(models)))


def create_app(settings: Settings | None = None, on_load_failure: Callable[[], None] | None = None) -> FastAPI:
    state = ServiceState(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loading = asyncio.create_task(load_and_start(state, on_load_failure))  # liveness answers while models load
        yield
        state.ready = False
        loading.cancel()
        if state.batcher:
            await state.batcher.stop()

    app = FastAPI(
        title="nmt-serve",
        version="0.1.0",
        description="Translation with from-scratch Transformer models: batched translation, attention maps, "
        "LibreTranslate-compatible endpoints, health and Prometheus metrics. Every error has the shape "
        '{"error": {"type", "message", "param"}}.',
        lifespan=lifespan,
    )
    app.state.service = state
    install_handlers(app)
    app.include_router(translate.router)
    app.include_router(libretranslate.router)
    app.include_router(health.router)
    app.include_router(ui.router)
    ui.mount_viewer(app)

    # the last added is the outermost: CORS, then metrics (sees every status), then the body limit
    app.add_middleware(BodySizeLimit, max_bytes=state.settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=state.metrics)
    if state.settings.origins():
        app.add_middleware(
            CORSMiddleware, allow_origins=state.settings.origins(), allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-timeout"],
        )
    return app
