"""Admission by predicted work: the arithmetic, and the service refusing at once what could not finish
before its deadline while everything it admits completes (no 504)."""
from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from conftest import distinct

from nmt_serve.engine.admission import Admission
from nmt_serve.service.app import create_app
from nmt_serve.service.settings import Settings


def test_cost_counts_source_expected_output_and_beam():
    a = Admission(rate=100.0)
    a.output_ratio = 1.0
    assert a.cost([10], beam_size=1) == 22.0  # 10 source + 10 expected output + 2
    assert a.cost([10, 5], beam_size=4) == 4 * 22.0 + 4 * 12.0


def test_admits_what_finishes_in_time_and_refuses_the_rest():
    a = Admission(rate=100.0, margin=0.8)  # 100 units/s, 80% of a deadline may be spent waiting
    assert a.admit(500.0, timeout=1.0) is None  # nothing ahead: always admitted
    assert a.pending == 500.0
    retry = a.admit(10.0, timeout=1.0)  # 510 units ahead = 5.1 s > 0.8 s
    assert retry == 5.0 and a.pending == 500.0 and a.refused_units == 10.0
    assert a.admit(10.0, timeout=10.0) is None  # a longer deadline fits: 5.1 s <= 8 s
    a.release(510.0)
    assert a.pending == 0.0
    a.release(5.0)
    assert a.pending == 0.0  # never negative


def test_rate_and_output_ratio_follow_measured_batches():
    a = Admission(rate=100.0)
    for _ in range(30):
        a.observe(texts=4, source_tokens=40, output_tokens=80, beam_size=2, seconds=0.5)  # 2 x 128 / 0.5 = 512/s
    assert a.rate == pytest.approx(512.0, rel=1e-3)
    assert a.output_ratio == pytest.approx(2.0, rel=1e-3)
    a.observe(texts=1, source_tokens=0, output_tokens=5, beam_size=1, seconds=0.1)  # nothing to learn from
    assert a.rate == pytest.approx(512.0, rel=1e-3)


def test_a_flood_gets_fast_refusals_and_every_admitted_request_completes(models_dir):
    """Many heavy requests at once with a short deadline: each is answered 200 or 503 (never 504);
    the first is admitted and finishes, the refused ones come back before any translation is done.

    The admitted work is predicted from the rate measured at start-up, which a busy machine (or a fast
    one, where the deadline's floor admits many requests) can miss by some factor; a margin of 0.2 lets
    the admitted work take five times its prediction, so the test checks the refusals, not the clock.
    The flood is sized from the measured rate so that it always outgrows what can be admitted."""
    margin = 0.2

    async def flood():
        app = create_app(Settings(models_dir=str(models_dir), device="cpu", max_queue_sentences=100_000,
                                  admission_margin=margin, admission_rate=0))  # calibrated, whatever NMT_ADMISSION_RATE says
        async with app.router.lifespan_context(app):
            state = app.state.service
            for _ in range(600):
                if state.ready:
                    break
                await asyncio.sleep(0.05)
            assert state.ready
            rate = state.metrics.engine.stats["rate_units_per_second"]
            assert 1.0 < rate < 1e9  # calibrated at start-up
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                body = {"text": distinct("Ein Hund rennt über die große grüne Wiese im Park.", 8), "beam_size": 4, "max_length": 20}
                cost = Admission(rate).cost([len(state.models["de-en"].encode(text)) for text in body["text"]], 4)
                # a deadline of ten requests' work (at least 1 s, for the service's own overheads) admits
                # about margin x 10 = 2 of them; a flood of twice what the deadline could admit
                timeout = max(1.0, 10 * cost / rate)
                requests = max(40, 2 * math.ceil(margin * timeout * rate / cost) + 4)
                headers = {"x-request-timeout": f"{timeout:.3f}"}
                responses = await asyncio.gather(*[client.post("/v1/translate", json=body, headers=headers)
                                                   for _ in range(requests)])
            for _ in range(40):  # the engine publishes its statistics every 0.1 s
                if state.metrics.engine.stats["pending_units"] == 0.0:
                    break
                await asyncio.sleep(0.05)
            return responses, state.metrics.engine.stats["pending_units"]

    responses, pending = asyncio.run(flood())
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 1 and statuses.count(503) >= 1
    for r in responses:
        if r.status_code == 503:
            error = r.json()["error"]
            assert error["type"] == "overloaded" and "deadline" in error["message"]
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert len(r.json()["translations"]) == 8
    assert pending == 0.0  # everything admitted was released
