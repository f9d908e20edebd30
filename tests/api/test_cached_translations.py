"""translation_cache_entries: a sentence asked for again is answered from memory, exactly as the engine gave it."""
from __future__ import annotations

import re
import time
from contextlib import contextmanager

from conftest import ROOT
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings


def cache_counts(client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'nmt_translation_cache_sentences_total\{result="(\w+)"\} (\S+)', text)}


@contextmanager
def ready_client():
    settings = Settings(models_dir=str(ROOT / "checkpoints"), device="cpu", translation_cache_entries=100)
    with TestClient(create_app(settings)) as client:
        deadline = time.time() + 60
        while client.get("/health/ready").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.05)
        yield client


def test_a_sentence_asked_for_again_comes_from_memory_with_the_same_answer():
    with ready_client() as client:
        body = {"text": ["Ein Hund rennt über die Wiese. Zwei Kinder spielen.", "Ein Hund rennt über die Wiese."],
                "source": "de", "target": "en", "return_scores": True}
        first = client.post("/v1/translate", json=body)
        assert first.status_code == 200, first.text
        # three sentences, one of them twice: two distinct ones went to the engine
        assert cache_counts(client) == {"hit": 1.0, "miss": 2.0}
        again = client.post("/v1/translate", json=body)
        assert again.json()["translations"] == first.json()["translations"]
        assert cache_counts(client) == {"hit": 4.0, "miss": 2.0}
        # other options are another question
        client.post("/v1/translate", json={**body, "beam_size": 1})
        assert cache_counts(client) == {"hit": 5.0, "miss": 4.0}


def test_the_same_sentences_asked_for_while_in_flight_are_translated_once():
    """With the cache on, a request for sentences another request has in the engine takes that request's answers
    (`shared`) instead of sending them again."""
    import asyncio
    import threading

    with ready_client() as client:
        deadline = time.time() + 60
        state = client.app.state.service
        engine, cache = state.engine, state.translation_cache
        gate, sent, entered = threading.Event(), [], []
        translate, cached = engine.translate, cache.translate

        async def held(model, sources, *args, **kwargs):  # the engine's answer waits until the second request is in
            sent.append(sources)
            await asyncio.to_thread(gate.wait, 60)
            return await translate(model, sources, *args, **kwargs)

        async def counted(*args, **kwargs):
            entered.append(1)
            return await cached(*args, **kwargs)

        engine.translate, cache.translate = held, counted
        body = {"text": ["Ein Hund rennt über die Wiese. Zwei Kinder spielen."], "source": "de", "target": "en"}
        answers = [None, None]

        def post(k):
            answers[k] = client.post("/v1/translate", json=body)

        first = threading.Thread(target=post, args=(0,))
        first.start()
        while not sent:
            assert time.time() < deadline
            time.sleep(0.01)
        second = threading.Thread(target=post, args=(1,))
        second.start()
        # the second request takes its sentences from the first without yielding to the event loop after it enters
        # the cache, so once it has entered, the first request's answer cannot come before it looked
        while len(entered) < 2:
            assert time.time() < deadline
            time.sleep(0.01)
        gate.set()
        first.join(60)
        second.join(60)
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[0].json()["translations"] == answers[1].json()["translations"]
        assert len(sent) == 1  # the engine was asked once
        assert cache_counts(client) == {"hit": 0.0, "miss": 2.0, "shared": 2.0}
