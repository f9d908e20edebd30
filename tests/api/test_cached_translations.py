"""translation_cache_entries: a sentence asked for again is answered from memory, exactly as the engine gave it."""
from __future__ import annotations

import re
import time

from conftest import ROOT
from fastapi.testclient import TestClient

from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings


def cache_counts(client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'nmt_translation_cache_sentences_total\{result="(\w+)"\} (\S+)', text)}


def test_a_sentence_asked_for_again_comes_from_memory_with_the_same_answer():
    settings = Settings(models_dir=str(ROOT / "checkpoints"), device="cpu", translation_cache_entries=100)
    with TestClient(create_app(settings)) as client:
        deadline = time.time() + 60
        while client.get("/health/ready").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.05)
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
