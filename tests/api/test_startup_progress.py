"""A starting engine says how far it is, again and again until it serves: its statuses carry the phase and
the model it reads, and /health/ready's 503 tells an operator, while a large model loads for minutes."""
from __future__ import annotations

import os
import threading
import time

import pytest
from conftest import make_checkpoint
from fastapi.testclient import TestClient

from nmt_serve.engine.protocol import STARTUP_PHASES, EngineStatus, StartupProgress
from nmt_serve.engine.startup_status import StartupStatus
from nmt_serve.service.app import create_app
from nmt_serve.service.errors import APIError
from nmt_serve.service.settings import Settings
from nmt_serve.service.state import ServiceState


def test_statuses_repeat_where_it_is_and_stop_when_told():
    heard: list[EngineStatus] = []
    published = threading.Event()

    def publish(status: EngineStatus) -> None:
        heard.append(status)
        published.set()

    startup = StartupStatus(publish, "x", interval_s=0.001).start()

    def next_status() -> StartupProgress:
        published.clear()
        published.wait(30)
        published.clear()
        assert published.wait(30)  # one made wholly after the change
        return heard[-1].loading

    assert next_status().phase == "starting"
    startup.set("planning")
    assert next_status().phase == "planning"
    startup.set("loading", models_total=3)
    startup.loading("de-en", 0)
    startup.loading("en-de", 1)
    progress = next_status()
    assert (progress.phase, progress.model, progress.models_loaded, progress.models_total) == ("loading", "en-de", 1, 3)
    assert progress.describe().startswith("loading en-de, model 2 of 3; started ")
    startup.set("first runs", models_loaded=3)
    progress = next_status()
    assert (progress.phase, progress.model, progress.models_loaded) == ("first runs", None, 3)
    startup.stop()  # its thread joined: nothing is published from here on
    count = len(heard)
    time.sleep(0.05)
    assert len(heard) == count
    assert all(not s.ready and s.incarnation == "x" and s.loading for s in heard)
    seconds = [s.loading.seconds for s in heard]
    assert seconds == sorted(seconds)
    phases = [STARTUP_PHASES.index(s.loading.phase) for s in heard]
    assert phases == sorted(phases)
    with pytest.raises(ValueError, match="unknown start-up phase"):
        startup.set("dreaming")


# put on the engine process's PYTHONPATH: it stops that process in reading a tokenizer under `marker` until
# the file `release` exists (the test's own process, started before, is not touched)
HOLD = """
import os, time
import sentencepiece
marker, release = os.environ["NMT_TEST_HOLD_LOADING"].split(os.pathsep)
load = sentencepiece.SentencePieceProcessor.Load
def held(self, *args, **kwargs):
    if marker in str(kwargs.get("model_file") or (args[0] if args else "")):
        while not os.path.exists(release):
            time.sleep(0.01)
    return load(self, *args, **kwargs)
sentencepiece.SentencePieceProcessor.Load = held
"""


def test_ready_says_which_model_a_starting_engine_reads(tmp_path, spm_model, monkeypatch):
    models = tmp_path / "models"
    make_checkpoint(models / "de-en", spm_model, "de", "en", seed=3)
    make_checkpoint(models / "en-de", spm_model, "en", "de", seed=4)
    (tmp_path / "hold").mkdir()
    (tmp_path / "hold" / "sitecustomize.py").write_text(HOLD)
    release = tmp_path / "release"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "hold"), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("NMT_TEST_HOLD_LOADING", f"{os.sep}en-de{os.sep}{os.pathsep}{release}")
    app = create_app(Settings(models_dir=str(models), device="cpu"))
    with TestClient(app, raise_server_exceptions=False) as c:
        try:
            deadline = time.time() + 120
            while True:  # the engine is held in reading en-de: it says so until it is let go
                r = c.get("/health/ready")
                assert r.status_code == 503, r.text
                message = r.json()["error"]["message"]
                if "loading en-de, model 2 of 2; started " in message:
                    break
                assert "failed" not in message and time.time() < deadline, message
                time.sleep(0.05)
            assert message.startswith("models are still loading (") and r.headers["retry-after"] == "1"
            assert c.app.state.service.engine.engines.status.ready is False
            refused = c.post("/v1/translate", json={"text": "A dog runs.", "source": "en", "target": "de"})
            assert refused.status_code == 503 and refused.json()["error"]["type"] == "not_ready"
            assert "loading en-de, model 2 of 2; started " in refused.json()["error"]["message"]
        finally:
            release.touch()
        while c.get("/health/ready").status_code != 200:
            assert time.time() < deadline, "the engine did not become ready"
            time.sleep(0.05)
        assert c.app.state.service.engine.engines.status.loading is None
        r = c.post("/v1/translate", json={"text": "A dog runs.", "source": "en", "target": "de", "max_length": 5})
        assert r.status_code == 200, r.text


def test_a_request_refused_before_readiness_says_why(models_dir):
    state = ServiceState(Settings(models_dir=str(models_dir), device="cpu"))
    assert state.unready_reason() == "models are still loading"
    state.draining = True
    assert state.unready_reason() == "the server is shutting down"
    state.load_error = "CheckpointError: /models/de-en: missing spm.model"
    assert state.unready_reason() == "model loading failed; see the server log"  # the paths stay in the log
    with pytest.raises(APIError) as refused:
        state.require_ready()
    assert (refused.value.status, refused.value.type, refused.value.message) == (503, "not_ready", state.unready_reason())
