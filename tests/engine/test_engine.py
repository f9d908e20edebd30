"""The engine: EngineCore driven directly (calls in, replies out, step by step), and the engine process
behind the service (supervision: a killed engine gives 503 at once and comes back)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import distinct, free_port, post_json, processes, running_server

from nmt_serve.engine.admission import OUTPUT_RATIO
from nmt_serve.engine.core import EngineConfig, EngineCore
from nmt_serve.engine.protocol import (
    BACKGROUND,
    EXPIRED,
    FAILED,
    OUT_OF_MEMORY,
    REFUSED,
    Attention,
    Cancel,
    DecodeOptions,
    Reply,
    Translate,
)
from nmt_serve.inference.continuous import ContinuousSearch
from nmt_serve.inference.translator import Translator

GERMAN = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.", "Hallo",
          "Ein kleines Kind sitzt auf einer Bank.", "Drei Leute warten auf den Bus."]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="module", params=["eager", "static"])
def any_translator(request, tiny_checkpoint):
    """The eager search, and the static decoder as the engine runs it on CUDA (op by op on CPU)."""
    return Translator.load(tiny_checkpoint, device="cpu", step_mode=request.param, static_rows=64, static_length=64, warmup=False)


def core_of(translator, **config) -> EngineCore:
    core = EngineCore({"de-en": translator}, EngineConfig(**config))
    core.admission.rate = 1e9  # admission is tested on its own: here everything is admitted
    return core


@pytest.fixture(scope="module", autouse=True)
def source_tokenizer(tiny_checkpoint):
    """The API process's share: texts tokenized once, the ids sent to the engine."""
    global TOKENIZER
    TOKENIZER = Translator.load(tiny_checkpoint, device="cpu").src_tokenizer


def call(i, texts, beam=2, max_length=8, timeout=30.0, **options) -> Translate:
    return Translate(i, "de-en", [TOKENIZER.encode(t) for t in texts], DecodeOptions(beam_size=beam, max_length=max_length, return_scores=True, **options),
                     time.monotonic() + timeout)


def run(core: EngineCore, *messages, steps: int = 10_000) -> dict:
    """Hand the calls over, then step until nothing runs; replies by call id."""
    replies: dict = {}
    for m in messages:
        replies.update({r.id: r for r in core.handle(m)})
    for _ in range(steps):
        if not core.busy:
            break
        replies.update({r.id: r for r in core.work()})
    return replies


def texts_of(reply: Reply) -> list[str]:
    assert reply.error is None, reply.message
    return [nbest[0].text for nbest in reply.value]


def test_lanes_step_side_by_side_and_give_what_one_loop_gives(translator):
    """Two lanes: the sentences spread over two searches per beam size, whose steps run on two threads;
    every call gets what it gets from one lane, and the engine time counts the overlapped steps once."""
    threads = torch.get_num_threads()
    one, two = core_of(translator), core_of(translator, lanes=2)
    assert torch.get_num_threads() == 1  # the lanes' threads, and the engine's own (joins), run one torch thread each
    torch.set_num_threads(threads)
    calls = lambda: [call(1, GERMAN[:3]), call(2, GERMAN[3:], beam=3, num_hypotheses=2), call(3, GERMAN[:4], beam=1)]  # noqa: E731
    alone, together = run(one, *calls()), run(two, *calls())
    assert {i: texts_of(r) for i, r in alone.items()} == {i: texts_of(r) for i, r in together.items()}
    assert {k[3] for k in two.groups} == {0, 1} and {k[3] for k in one.groups} == {0}
    assert two.config.lanes == 2 and two.stats["sentences_done"] == one.stats["sentences_done"] == len(GERMAN) + 4
    assert two.stats["busy_seconds"] > 0


class Room:
    """A CpuRoom that says what it is told."""

    def __init__(self, free: int):
        self.free, self.others = free, 0.0

    def refresh(self) -> None:
        pass

    def free_cores(self) -> int:
        return self.free


def test_a_search_stepped_alone_takes_the_cores_others_leave_and_lanes_side_by_side_one_each(translator, monkeypatch):
    """Two lanes, threads 0: a round in which one search steps runs it on the engine's thread with the threads the
    room leaves (3 here); a round in which both lanes step runs each on its lane's thread with one; a busy room (1)
    leaves the lone search one too. Every call gets what one lane gives it."""
    threads = torch.get_num_threads()
    lanes, lone = core_of(translator, lanes=2), core_of(translator)
    assert lanes._room is not None and lone._room is None  # one loop with torch's threads has nothing to widen
    assert core_of(translator, lanes=2, threads=1)._room is None  # nor does an operator's thread count
    lanes._room = Room(3)
    seen = []  # (the stepping thread is the engine's, its torch threads)
    step = ContinuousSearch.step

    def watched(search):
        seen.append((threading.current_thread() is threading.main_thread(), torch.get_num_threads()))
        return step(search)

    monkeypatch.setattr(ContinuousSearch, "step", watched)
    try:
        alone = run(lanes, call(1, GERMAN[:1]))
        assert seen and set(seen) == {(True, 3)} and lanes.stats["wide_steps"] == len(seen)
        seen.clear()
        both = run(lanes, call(2, GERMAN[1:5]))  # two sentences a lane; a lane that finishes first leaves the other alone
        assert (False, 1) in seen and set(seen) <= {(False, 1), (True, 3)}
        lanes._room = Room(1)
        seen.clear()
        busy = run(lanes, call(3, GERMAN[:1]))
        assert set(seen) == {(True, 1)}
        assert texts_of(alone[1]) == texts_of(busy[3])
        lanes._room = Room(3)
        plan = [("one search",)]
        assert lanes._lone_threads(plan) == 3 == torch.get_num_threads()
        lanes._attending = (Future(), [])  # a forced decoding runs on the attention thread: the lone search takes one
        assert lanes._lone_threads(plan) == 1 == torch.get_num_threads()
        lanes._attending = None
        one = run(lone, call(1, GERMAN[:1]), call(2, GERMAN[1:5]))
        assert texts_of(one[1]) == texts_of(alone[1]) and texts_of(one[2]) == texts_of(both[2])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("lanes", [1, 2])
def test_join_time_is_counted_apart_from_step_time(translator, lanes):
    """The joining sentences' encoder counts as join time, not step time, whether the lanes' steps
    overlapped or not: busy = joins + steps."""
    threads = torch.get_num_threads()
    core = core_of(translator, lanes=lanes)
    torch.set_num_threads(threads)
    run(core, call(1, GERMAN[:3]), call(2, GERMAN[3:], beam=3))
    s = core.stats
    assert s["joins"] > 0 and s["join_seconds"] > 0 and s["step_seconds"] > 0
    assert s["join_seconds"] + s["step_seconds"] == pytest.approx(s["busy_seconds"])


def test_the_lanes_share_max_batch_sentences(translator):
    """max_batch_sentences bounds the sentences running per model and beam size, whatever the lanes (the
    memory plan counts on it)."""
    threads = torch.get_num_threads()
    core = core_of(translator, lanes=2, max_batch_sentences=4)
    torch.set_num_threads(threads)
    for m in (call(1, GERMAN, beam=2), call(2, GERMAN, beam=2)):
        core.handle(m)
    most = 0
    while core.busy:
        core.work()
        most = max(most, sum(len(g.search) for k, g in core.groups.items() if k[1] == 2))
    assert most == 4


def test_calls_get_what_each_text_gets_alone(any_translator):
    core = core_of(any_translator)
    replies = run(core, call(1, GERMAN[:3]), call(2, GERMAN[3:], beam=3, num_hypotheses=2), call(3, ["", GERMAN[0]], beam=1))
    for i, (texts, beam, n) in {1: (GERMAN[:3], 2, 1), 2: (GERMAN[3:], 3, 2), 3: (["", GERMAN[0]], 1, 1)}.items():
        alone = [any_translator.translate([t], beam_size=beam, num_hypotheses=n, max_length=8, return_scores=True)[0] for t in texts]
        got = replies[i].value
        for nbest, want in zip(got, alone):
            assert [h.text for h in nbest] == [h.text for h in want.hypotheses]
            for h, w in zip(nbest, want.hypotheses):
                assert h.score == pytest.approx(w.score, abs=1e-4)
    assert core.calls == {} and core.admission.pending == 0


def test_a_short_call_is_not_stuck_behind_a_long_one(any_translator):
    """Continuous batching: a call that arrives while a long batch runs joins at the next step and
    leaves as soon as it is done."""
    core = core_of(any_translator)
    core.handle(call(1, GERMAN * 4, max_length=60))
    for _ in range(3):
        core.work()
    core.handle(call(2, ["Hallo"], max_length=3))
    finished = []
    while core.busy:
        finished += [r.id for r in core.work()]
    assert finished == [2, 1]


def test_full_queue_and_admission_refuse_at_once(translator):
    core = core_of(translator, max_queue_sentences=3, retry_after_s=7)
    [reply] = core.handle(call(1, GERMAN[:4]))
    assert reply.error == REFUSED and reply.retry_after == 7
    core = core_of(translator)
    core.admission.rate = 10.0  # decode units per second: a slow engine
    assert core.handle(call(1, GERMAN[:2], timeout=30)) == []  # nothing ahead: always admitted
    [refused] = core.handle(call(2, GERMAN[:2], timeout=1))
    assert refused.error == REFUSED and refused.retry_after >= 1
    assert core.stats["refused_units"] > 0


def test_cancelled_and_expired_calls_leave_and_never_run(any_translator):
    core = core_of(any_translator)
    core.handle(call(1, GERMAN[:2], max_length=20))
    core.handle(call(2, ["Verschwunden"]))
    core.handle(call(3, ["Zu spät"], timeout=0.01))
    core.handle(Cancel(2))  # waiting: its sentence never joins
    time.sleep(0.05)
    replies = {}
    while core.busy:
        replies.update({r.id: r for r in core.work()})
    assert replies[3].error == EXPIRED and texts_of(replies[1])
    assert 2 not in replies
    assert core.stats["sentences_joined"] == 2  # only call 1's
    # a running call can be cancelled too: its rows leave at the next step
    core.handle(call(4, GERMAN[:3], max_length=50))
    core.work()
    core.handle(Cancel(4))
    assert core.work() == [] and not core.busy and core.calls == {}
    assert core.admission.pending == 0


def test_a_failing_input_fails_only_its_own_call(translator, monkeypatch):
    original = ContinuousSearch.add

    def fragile(self, sentences):
        if any(s.src == translator.encode_source("KAPUTT") for s in sentences):
            raise RuntimeError("this input breaks the model")
        return original(self, sentences)

    monkeypatch.setattr(ContinuousSearch, "add", fragile)
    core = core_of(translator)
    replies = run(core, call(1, ["Hallo"]), call(2, ["KAPUTT"]), call(3, ["Ein Hund"]), call(4, ["Eine Katze", "Hallo"]))
    assert replies[2].error == FAILED
    assert all(replies[i].error is None for i in (1, 3, 4))


def test_out_of_memory_in_a_step_fails_its_batch_and_the_engine_goes_on(translator, monkeypatch):
    core = core_of(translator)
    core.handle(call(1, ["Hallo"]))
    core.work()
    with monkeypatch.context() as m:
        m.setattr(ContinuousSearch, "step", lambda self: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")))
        [reply] = core.work()
    assert reply.error == OUT_OF_MEMORY
    assert texts_of(run(core, call(2, ["Hallo"]))[2])


@pytest.mark.parametrize("beam", [1, 2])
@pytest.mark.parametrize("step_mode", ["eager", "static"])
def test_a_model_that_gives_no_translation_fails_its_call_not_the_engine(translator, tiny_checkpoint, beam, step_mode):
    """Weights of NaN: every hypothesis scores NaN; the eager search keeps none, the static decoder's
    greedy step keeps them with their NaN scores. With admission off nothing screened the model at
    start-up, so the call's completion meets an n-best with no translation in it."""
    broken = Translator.load(tiny_checkpoint, device="cpu", step_mode=step_mode, static_rows=64, static_length=64, warmup=False)
    with torch.no_grad():
        for p in broken.model.parameters():
            p.fill_(float("nan"))
    core = EngineCore({"de-en": translator, "broken": broken}, EngineConfig(admission=False))
    replies = run(core, dataclasses.replace(call(1, ["Hallo"], beam=beam), model="broken"), call(2, ["Ein Hund"], beam=beam))
    assert replies[1].error == FAILED and "no translation" in replies[1].message
    assert texts_of(replies[2])
    assert texts_of(run(core, call(3, ["Eine Katze"], beam=beam))[3])
    # refused at start-up however admission starts: by the calibration's rounds, by a given rate's check of every
    # model (the broken one second here), or with admission off
    for config, models in ((EngineConfig(), {"broken": broken}), (EngineConfig(admission_rate=5000.0), {"de-en": translator, "broken": broken}),
                           (EngineConfig(admission=False), {"de-en": translator, "broken": broken})):
        with pytest.raises(RuntimeError, match="no translation of the calibration text"):
            EngineCore(models, config).first_runs()


def test_a_given_admission_rate_is_where_admission_starts_and_nothing_is_calibrated(translator, monkeypatch):
    core = EngineCore({"de-en": translator}, EngineConfig(admission_rate=1234.0))
    monkeypatch.setattr(core, "calibrate", lambda *args, **kwargs: pytest.fail("calibrated despite admission_rate"))
    core.first_runs()
    assert core.admission.rate == 1234.0
    measured = EngineCore({"de-en": translator}, EngineConfig())
    rounds = []
    monkeypatch.setattr(measured, "calibrate", lambda *args, **kwargs: rounds.append(1))
    measured.first_runs()
    assert rounds == [1]


def test_a_call_that_cannot_be_taken_in_fails_alone_and_the_engine_goes_on(translator, tiny_checkpoint, monkeypatch):
    """Taking a call in can fail for that call alone (here the search of another model cannot be made:
    out of memory): that call fails, its admitted work is freed, and the engine serves the others. A
    fault of the device itself (a CUDA error) is every call's: it still ends the engine process, whose
    supervisor starts a new one."""
    other = Translator.load(tiny_checkpoint, device="cpu")
    core = EngineCore({"de-en": translator, "other": other}, EngineConfig())
    core.admission.rate = 1e9
    fault = {"error": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")}
    new_search = core._new_search

    def fails_for_other(model_id, beam, kind):
        if model_id == "other":
            raise fault["error"]
        return new_search(model_id, beam, kind)

    monkeypatch.setattr(core, "_new_search", fails_for_other)
    replies = run(core, dataclasses.replace(call(1, GERMAN[:2]), model="other"), call(2, ["Ein Hund"]))
    assert replies[1].error == OUT_OF_MEMORY, replies[1]
    assert texts_of(replies[2])
    assert not core.calls and core.admission.pending == 0 and core._queued_sentences == 0
    assert texts_of(run(core, call(3, ["Eine Katze"]))[3])
    fault["error"] = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        core.handle(dataclasses.replace(call(4, ["Hallo"]), model="other"))


def test_a_text_whose_result_cannot_be_completed_fails_its_call_not_the_engine(translator, tiny_checkpoint, monkeypatch):
    """What follows a finished search belongs to its call: here a text with a term, translated free first
    without it, is to join again with its term, and that fails. Only that call fails; the call beside it
    and later calls are served."""
    other = Translator.load(tiny_checkpoint, device="cpu")
    core = EngineCore({"de-en": translator, "other": other}, EngineConfig(admission=False))
    join = core._join

    def fails_with_terms(state, index, terms):
        if terms:  # the text again, with its terms (its free translation lacks them)
            raise RuntimeError("no constraints today")
        return join(state, index, terms)

    monkeypatch.setattr(core, "_join", fails_with_terms)
    # a long term that the free translation of a random model does not hold
    unfit = dataclasses.replace(call(1, ["Hallo"], beam=4, max_length=3), model="other",
                                terms=[["supercalifragilistic expialidocious"]])
    replies = run(core, unfit, call(2, ["Ein Hund"], beam=4))
    assert replies[1].error == FAILED and "no constraints today" in replies[1].message
    assert texts_of(replies[2])
    assert not core.calls
    assert texts_of(run(core, call(3, ["Eine Katze"], beam=4))[3])


def test_batching_off_runs_one_call_at_a_time(any_translator):
    core = core_of(any_translator, batching=False)
    run(core, *[call(i, [t]) for i, t in enumerate(GERMAN)])
    assert core.stats["joins"] == len(GERMAN)
    core = core_of(any_translator)
    run(core, *[call(i, [t]) for i, t in enumerate(GERMAN)])
    assert core.stats["joins"] == 1


def attention_call(i, translator, text, target_text=None, *, score=True) -> Attention:
    return Attention(i, "de-en", translator.inputs.tokens(text), target_text, 2, ("cross",), [0, 1], [0, 1, 2, 3], [], True,
                     time.monotonic() + 60, score=score)


@pytest.mark.parametrize("lanes", [1, 2])
def test_attention_calls_run_beside_the_steps(any_translator, lanes, monkeypatch):
    """An attention call waits for the next round; with lanes it runs on a thread of its own while the
    sentences go on stepping, without them between steps on the engine's thread."""
    threads = torch.get_num_threads()
    core = core_of(any_translator, lanes=lanes)
    torch.set_num_threads(threads)
    where = []
    attend = core._attend
    monkeypatch.setattr(core, "_attend", lambda calls: where.append(threading.current_thread().name) or attend(calls))
    core.handle(call(1, GERMAN[:2]))
    core.work()
    assert core.handle(attention_call(2, any_translator, "Ein Hund")) == []  # waits for the round
    assert core.busy
    replies = run(core)
    reply = replies[2]
    assert reply.error is None and len(reply.value["cross"]) == 2 and len(reply.value["cross"][0]) == 1
    assert core.stats["attention_calls"] == 1 and core.stats["attention_seconds"] > 0
    assert texts_of(replies[1])
    assert where == (["engine-attention_0"] if lanes > 1 else [threading.current_thread().name])
    assert not core.busy


def test_attention_calls_of_a_round_are_forced_decoded_together_as_each_alone(translator):
    """The calls that give their translation run in one padded pass: each gets the maps, score and
    entropy it gets alone; a call that does not want the score gets None (the output layer is skipped)."""
    sources = GERMAN[:5]
    targets = ["A man rides a bike.", "Two dogs play in the snow .", "A woman reads", "Hello", "A small child sits on a bench."]
    calls = lambda: [attention_call(i, translator, s, t, score=i % 2 == 0) for i, (s, t) in enumerate(zip(sources, targets))]  # noqa: E731
    alone = {}
    for c in calls():
        [reply] = run(core_of(translator), c).values()
        alone[reply.id] = reply.value
    together = {i: r.value for i, r in run(core_of(translator), *calls()).items()}
    assert sorted(together) == sorted(alone) == list(range(5))
    for i, maps in together.items():
        one = alone[i]
        assert maps["source_tokens"] == one["source_tokens"] and maps["target_tokens"] == one["target_tokens"]
        assert maps["alignment"] == one["alignment"]
        assert maps["source_entropy"] == pytest.approx(one["source_entropy"], abs=1e-5)
        assert torch.allclose(torch.tensor(maps["cross"]), torch.tensor(one["cross"]), atol=1e-5)
        if i % 2 == 0:
            assert maps["score"] == pytest.approx(one["score"], abs=1e-4) and maps["score"] < 0
        else:
            assert maps["score"] is None and one["score"] is None
    forced = translator.force_decode_ids(translator.inputs.source_ids(translator.inputs.tokens(sources[0])), targets[0])
    assert together[0]["score"] == pytest.approx(forced.score, abs=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_search_keeps_the_source_entropy_and_alignment_a_forced_decoding_reads(any_translator, beam):
    """return_source_entropy, return_alignment: the search (eager, or the device search's programs) keeps,
    token by token, the cross-attention's entropy over the source's own pieces and where it looks most;
    each translation's equal what a forced decoding of it reads (the `detached` check and inline tags then
    need no attention call)."""
    core = core_of(any_translator)
    texts = GERMAN + ["Ein Hund", "Zwei Männer und eine Frau stehen vor einem großen Haus in der Stadt."]
    replies = run(core, call(1, texts, beam=beam, max_length=40, return_source_entropy=True, return_alignment=True),
                  call(2, texts, beam=beam, max_length=40))  # in one batch: rows with and without
    reply, plain = replies[1], replies[2]
    assert texts_of(reply) == texts_of(plain)
    assert all(nbest[0].source_entropy is None and nbest[0].alignment is None for nbest in plain.value)  # not asked for
    entropies = [nbest[0].source_entropy for nbest in reply.value]
    assert None not in entropies
    compared = 0
    for text, nbest, entropy in zip(texts, reply.value, entropies):
        [maps] = run(core, attention_call(3, any_translator, text, nbest[0].text)).values()
        if len(maps.value["target_tokens"]) != nbest[0].tokens + 1:  # the text tokenizes otherwise than the model wrote it
            continue
        assert entropy == pytest.approx(maps.value["source_entropy"], abs=1e-5), text
        best = nbest[0]
        assert (best.alignment, best.source_pieces, best.target_pieces) == (
            maps.value["alignment"], maps.value["source_tokens"], maps.value["target_tokens"]), text
        compared += 1
    assert compared >= 1  # the tiny model's texts seldom tokenize back as written: test_continuous compares on ids
    assert len(set(round(e, 4) for e in entropies)) > 1 and all(0.0 <= e <= 1.0 for e in entropies)


def test_a_failing_attention_call_fails_alone(translator, monkeypatch):
    """A pass that fails is retried call by call: only the call that breaks it gets the error; an expired
    call is answered as such, and a call for no model at once."""
    core = core_of(translator)
    good = attention_call(1, translator, GERMAN[0], "A man rides a bike.")
    bad = attention_call(2, translator, GERMAN[1], "Two dogs.")
    late = attention_call(3, translator, GERMAN[2], "A woman.")
    original = translator.force_decode_many

    def breaks_on_dogs(sources, targets, **kw):
        if "Two dogs." in targets:
            raise RuntimeError("broken")
        return original(sources, targets, **kw)

    monkeypatch.setattr(translator, "force_decode_many", breaks_on_dogs)
    for c in (good, bad, late):
        assert core.handle(c) == []
    [unknown] = core.handle(Attention(4, "xx-yy", [5], "x", 1, (), [0], [0], [], True, time.monotonic() + 5))
    assert unknown.error is not None and "no model" in unknown.message
    late.deadline = time.monotonic() - 1  # it passed while the call waited for the round
    replies = run(core)
    assert replies[1].error is None and replies[1].value["alignment"]
    assert replies[2].error == FAILED and "broken" in replies[2].message
    assert replies[3].error == EXPIRED


# ---------------------------------------------------------------------------------------- the process


def test_a_killed_engine_gives_503_at_once_and_comes_back(models_dir):
    port = free_port()
    with running_server(models_dir, port=port) as base:
        [api] = processes(b"-m\0nmt_serve.service", f"{port}".encode())
        [engine] = processes(b"nmt_serve.engine.process", parent=api)  # the engine runs in its own process
        # at the API process's priority (engine_nice, default 0: a niced engine starves beside busy neighbours)
        assert os.getpriority(os.PRIO_PROCESS, engine) == os.getpriority(os.PRIO_PROCESS, api)
        # seconds of work: the random model writes 250 tokens for 60 of these 64 texts
        slow = {"text": distinct("Verschwunden Verschwunden", 64), "beam_size": 8, "max_length": 250}
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(post_json, base + "/v1/translate", slow)
            while float(re.search(r"^nmt_engine_running_sentences (\S+)", urllib.request.urlopen(base + "/metrics").read().decode(), re.M)[1]) < 48:
                assert not waiting.done(), waiting.result()
                time.sleep(0.05)
            os.kill(engine, signal.SIGKILL)
            status, headers, body = waiting.result(timeout=30)
            ready_status = post_json(base + "/health/ready", None)[0]
            down = urllib.request.urlopen(base + "/metrics").read().decode()
        assert status == 503 and body["error"]["type"] == "engine_unavailable" and headers.get("retry-after")
        # answered by the engine's loss, not by the request's deadline (a 504) nor after the restart (a 200):
        # readiness, asked after the answer, still says the engine is down
        assert ready_status == 503
        # what an alert reads: down, and counted, as soon as the API process knows (not at the next status)
        assert "nmt_engine_up 0.0" in down and "nmt_engine_restarts_total 1.0" in down
        deadline = time.time() + 60
        while post_json(base + "/health/ready", None)[0] != 200:
            assert time.time() < deadline, "the engine did not come back"
            time.sleep(0.1)
        assert processes(b"nmt_serve.engine.process", parent=api) != [engine]
        assert post_json(base + "/v1/translate", {"text": "Hallo", "max_length": 5})[0] == 200
        metrics = urllib.request.urlopen(base + "/metrics").read().decode()
        assert "nmt_engine_restarts_total 1.0" in metrics


def test_an_engine_whose_api_process_was_killed_exits(models_dir):
    """SIGKILL of the API process (the OOM killer) leaves nobody to call or stop its engine: the engine
    notices it lost its parent and exits, its socket directory removed, rather than holding its memory."""
    port = free_port()
    with running_server(models_dir, port=port):
        [api] = processes(b"-m\0nmt_serve.service", f"{port}".encode())
        [engine] = processes(b"nmt_serve.engine.process", parent=api)
        socket_dir = json.loads(Path(f"/proc/{engine}/cmdline").read_bytes().split(b"\0")[-2])["socket_dir"]
        assert Path(socket_dir).is_dir()
        os.kill(api, signal.SIGKILL)
        deadline = time.time() + 20
        while Path(f"/proc/{engine}").exists() and Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.time() < deadline, "the orphaned engine is still running"
            time.sleep(0.1)
        assert not Path(socket_dir).exists()


def test_the_engine_process_spins_its_openmp_threads_briefly_unless_told_otherwise(monkeypatch):
    """The engine starts with GNU OpenMP's spin count lowered (supervisor.OPENMP_SPINCOUNT), or the operator's."""
    from nmt_serve.engine import supervisor

    started = []
    monkeypatch.setattr(supervisor.subprocess, "Popen", lambda *args, **kwargs: started.append(kwargs) or SimpleNamespace(pid=1))
    monkeypatch.setattr(supervisor.log, "info", lambda *args: None)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    engine = supervisor.EngineSupervisor(dict(models_dir="models", device="cpu"))
    try:
        engine._spawn()
        monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
        engine._spawn()
    finally:
        shutil.rmtree(engine.socket_dir, ignore_errors=True)
    assert [kwargs["env"]["GOMP_SPINCOUNT"] for kwargs in started] == [supervisor.OPENMP_SPINCOUNT, "300000"]
    assert started[0]["env"]["PATH"] == os.environ["PATH"]  # the rest of the environment as it is


def test_an_engine_whose_supervisor_died_while_it_loaded_exits(models_dir, tmp_path):
    """The process that started the engine dies before the engine has loaded its models (here: at once,
    before the engine's interpreter is up): once it serves, the engine finds its supervisor gone and
    exits, its socket directory removed, rather than serve nobody for ever."""
    import subprocess
    import sys

    from conftest import ROOT

    start = ("import json, os, sys; from nmt_serve.engine.supervisor import EngineSupervisor; "
             "s = EngineSupervisor(dict(models_dir=sys.argv[1], device='cpu')); s._spawn(); "
             "open(sys.argv[2], 'w').write(json.dumps([s.pid, s.socket_dir])); os._exit(0)")
    started = tmp_path / "engine.json"
    subprocess.run([sys.executable, "-c", start, str(models_dir), str(started)], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine, socket_dir = json.loads(started.read_text())

    def running() -> bool:
        try:
            return Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    try:
        deadline = time.time() + 90
        while running():
            assert time.time() < deadline, "the orphaned engine is still running"
            time.sleep(0.2)
        assert not Path(socket_dir).exists()  # it loaded, then left as an engine whose supervisor is gone does
    finally:
        if running():
            os.kill(engine, signal.SIGKILL)


def test_a_live_engine_that_answers_nothing_for_seconds_is_not_taken_for_dead(models_dir):
    """A stopped engine (SIGSTOP: as starved of CPU as it can be) sends no status for 4 s, longer than
    the 3 s after which the service used to call it lost; the waiting request is answered once it
    runs again, and nothing was counted as a restart."""
    port = free_port()
    with running_server(models_dir, port=port) as base:
        [api] = processes(b"-m\0nmt_serve.service", f"{port}".encode())
        [engine] = processes(b"nmt_serve.engine.process", parent=api)
        with ThreadPoolExecutor(1) as pool:
            os.kill(engine, signal.SIGSTOP)
            try:
                waiting = pool.submit(post_json, base + "/v1/translate", {"text": "Ein Hund rennt.", "max_length": 8})
                time.sleep(4.0)
                assert not waiting.done(), waiting.result()
            finally:
                os.kill(engine, signal.SIGCONT)
            status, _, body = waiting.result(timeout=30)
        assert status == 200, body
        assert "nmt_engine_restarts_total 0.0" in urllib.request.urlopen(base + "/metrics").read().decode()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_stuck_engine_is_killed_and_restarted(models_dir, workers):
    """A stopped engine (SIGSTOP: no handler runs, as in a deadlock) that stays silent past the heartbeat
    timeout is killed by its supervisor and a new one serves: in the API process, and with several
    API workers in their parent (which reads no status)."""
    port = free_port()
    with running_server(models_dir, "--engine-heartbeat-timeout-s", "2", "--workers", str(workers), port=port) as base:
        [supervisor] = [p for p in processes(b"-m\0nmt_serve.service", f"{port}".encode())
                        if processes(b"nmt_serve.engine.process", parent=p)]
        [engine] = processes(b"nmt_serve.engine.process", parent=supervisor)
        os.kill(engine, signal.SIGSTOP)
        try:
            deadline = time.time() + 90
            while processes(b"nmt_serve.engine.process", parent=supervisor) in ([engine], []):
                assert time.time() < deadline, "the stopped engine was not replaced"
                time.sleep(0.2)
            assert not Path(f"/proc/{engine}").exists() or Path(f"/proc/{engine}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            while post_json(base + "/health/ready", None)[0] != 200:
                assert time.time() < deadline, "the new engine did not become ready"
                time.sleep(0.1)
            assert post_json(base + "/v1/translate", {"text": "Hallo", "max_length": 5})[0] == 200
            assert "nmt_engine_restarts_total 1.0" in urllib.request.urlopen(base + "/metrics").read().decode()
        finally:  # should it still be there, the stopped engine would hold up the server's shutdown
            if engine in processes(b"nmt_serve.engine.process", parent=supervisor):
                os.kill(engine, signal.SIGKILL)


def test_the_connection_notices_an_exited_engine_process_at_once():
    """Its statuses name the engine's process; once that process is gone (here: one that exited),
    what waits fails within the watch interval, however long the heartbeat timeout."""
    import asyncio
    import subprocess
    import sys

    from nmt_serve.engine.protocol import EngineStatus
    from nmt_serve.service.engine_connection import EngineConnection, EngineUnavailable

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    async def scenario():
        connection = EngineConnection("inproc://unused-calls", "inproc://unused-status", heartbeat_timeout_s=60)
        connection.status, connection.last_status_at = EngineStatus("x", True, pid=gone.pid), time.monotonic()
        waiting = asyncio.get_running_loop().create_future()
        connection._pending["call"] = waiting
        watch = asyncio.create_task(connection._watch())
        started = time.monotonic()
        try:
            with pytest.raises(EngineUnavailable, match="exited"):
                await asyncio.wait_for(waiting, 5)
        finally:
            watch.cancel()
        return time.monotonic() - started, connection

    took, connection = asyncio.run(scenario())
    assert took < 60 / 4 and connection.losses == 1 and not connection.ready  # the watch, not the heartbeat
    assert EngineStatus("y", True).pid == os.getpid()  # made in this process, it names this process


def test_the_heartbeat_holds_an_engine_that_serves_not_one_that_loads_its_models():
    """An engine loading its models (minutes for a large one) whose progress statuses stop coming (their thread
    held up by a slow disk or a starved CPU) is not taken for stuck, so not lost, whereas an engine that served
    and went as silent is."""
    import asyncio

    from nmt_serve.engine.protocol import EngineStatus
    from nmt_serve.service.engine_connection import WATCH_INTERVAL_S, EngineConnection, EngineUnavailable

    async def scenario():
        connections, waiting = {}, {}
        for name, ready in (("loading", False), ("serving", True)):  # both silent for 10 s, past the 0.5 s timeout
            connection = EngineConnection(f"inproc://{name}-calls", f"inproc://{name}-status", heartbeat_timeout_s=0.5)
            connection.status, connection.last_status_at = EngineStatus(name, ready), time.monotonic() - 10
            waiting[name] = connection._pending["call"] = asyncio.get_running_loop().create_future()
            connections[name] = connection
        # the loading engine's watch first: each of its checks comes before the serving engine's
        watches = [asyncio.create_task(connections[name]._watch()) for name in ("loading", "serving")]
        try:
            with pytest.raises(EngineUnavailable, match="stopped answering"):
                await asyncio.wait_for(waiting["serving"], 30)
            await asyncio.sleep(4 * WATCH_INTERVAL_S)  # a few more checks of the loading one
        finally:
            for watch in watches:
                watch.cancel()
        return connections, waiting

    connections, waiting = asyncio.run(scenario())
    assert connections["serving"].losses == 1 and not connections["serving"].ready
    assert connections["loading"].losses == 0 and not waiting["loading"].done()


def test_a_joining_worker_waits_for_an_engine_that_serves_not_for_its_progress(tmp_path):
    """A worker joining a starting engine hears its progress at once; it starts taking connections only once the
    engine serves (or cannot), or its siblings would take traffic it answers with 503."""
    import asyncio

    import zmq

    from nmt_serve.engine.protocol import EngineStatus, StartupProgress, dumps
    from nmt_serve.service.engine_connection import EngineConnection

    context = zmq.Context()
    status = context.socket(zmq.PUB)
    status.bind(f"ipc://{tmp_path}/status")

    async def scenario():
        connection = EngineConnection(f"ipc://{tmp_path}/calls", f"ipc://{tmp_path}/status", heartbeat_timeout_s=60)
        await connection.start()
        try:
            async def publish_until_settled(message: EngineStatus, within: float) -> bool:
                waiting = asyncio.ensure_future(connection.wait_for_settled(within))
                while not waiting.done():
                    status.send(dumps(message))
                    await asyncio.sleep(0.01)
                return waiting.result()

            loading = EngineStatus("x", False, loading=StartupProgress("loading", 1.0, "de-en", 0, 2))
            assert not await publish_until_settled(loading, 0.5)
            assert connection.status is not None and connection.status.loading is not None  # heard, all the same
            return await publish_until_settled(EngineStatus("x", True), 30)
        finally:
            await connection.stop()

    try:
        assert asyncio.run(scenario())
    finally:
        status.close(0)
        context.term()


def test_the_io_thread_answers_what_needs_no_step_while_the_main_thread_is_busy(translator):
    """serve_calls screens calls on its own thread: here the main loop never runs (as if inside a
    long step), yet a refusal comes back, the admitted call waits in the inbox, and the main
    thread's replies are routed to their caller."""
    import queue
    import threading

    import zmq

    from nmt_serve.engine.process import REPLIES_ADDRESS, serve_calls
    from nmt_serve.engine.protocol import dumps, loads

    core = core_of(translator, max_queue_sentences=2)
    context = zmq.Context()
    calls, client = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    calls.bind("inproc://calls-test")
    client.connect("inproc://calls-test")
    replies_out, replies_in = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    replies_out.bind(REPLIES_ADDRESS)
    replies_in.connect(REPLIES_ADDRESS)
    inbox, done = queue.Queue(), threading.Event()
    io = threading.Thread(target=serve_calls, args=(calls, replies_in, core, inbox, {"at": None}, done), daemon=True)
    io.start()
    try:
        client.send(dumps(call(1, GERMAN[:2])))
        assert inbox.get(timeout=5).id == 1  # admitted: for the main thread
        client.send(dumps(call(2, GERMAN[:1])))  # 3 sentences > max_queue_sentences: refused right here
        assert client.poll(5000)
        refused = loads(client.recv())
        assert refused.id == 2 and refused.error == REFUSED and inbox.empty()
        replies_out.send_multipart([b"1", dumps(Reply(1, value="translated"))])
        assert client.poll(5000) and loads(client.recv()).value == "translated"
        # several calls in one message, and the main thread's replies of one round in one message: each
        # caller gets its replies together
        client.send_multipart([dumps(call(3, GERMAN[:1])), dumps(call(4, GERMAN[:1]))])  # refused: the queue holds 2
        assert client.poll(5000) and [loads(frame).id for frame in client.recv_multipart()] == [3, 4]
        client.send_multipart([dumps(call(4, [])), dumps(call(3, []))])  # nothing to queue: for the main thread
        assert [inbox.get(timeout=5).id for _ in range(2)] == [4, 3]
        replies_out.send_multipart([b"4", dumps(Reply(4, value="four")), b"3", dumps(Reply(3, value="three"))])
        assert client.poll(5000) and [loads(frame).value for frame in client.recv_multipart()] == ["four", "three"]
        for i in range(200):  # more messages than one round takes (CALL_MESSAGES_PER_ROUND): every one is answered
            client.send(dumps(call(100 + i, GERMAN[:1])))
        answered = []
        while len(answered) < 200 and client.poll(5000):
            answered += [loads(frame).id for frame in client.recv_multipart()]
        assert sorted(answered) == list(range(100, 300))
    finally:
        done.set()
        io.join(timeout=5)
        for socket in (calls, client, replies_out, replies_in):
            socket.close(linger=0)
        context.term()
    assert not io.is_alive()


def test_several_api_workers_share_one_engine_and_its_translation_cache(models_dir):
    """With a cache, the engine keeps it for both workers: every repeat is answered from it, whichever
    worker takes it (each worker kept its own before, so a repeat reaching the other one was searched again)."""
    with running_server(models_dir, "--workers", "2", "--translation-cache-entries", "100") as base:
        first = [post_json(base + "/v1/translate", {"text": t, "max_length": 6}) for t in GERMAN]
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda t: post_json(base + "/v1/translate", {"text": t, "max_length": 6}), GERMAN * 3))
        assert [r[0] for r in first + results] == [200] * (len(first) + len(results))
        assert [r[2]["translations"] for r in results] == [r[2]["translations"] for r in first] * 3
        deadline = time.time() + 60  # the engine's counters reach the workers with its next status
        while True:
            metrics = urllib.request.urlopen(base + "/metrics").read().decode()
            hits = float(re.search(r"^nmt_engine_cache_hits_total (\S+)", metrics, re.M).group(1))
            if hits >= 3 * len(GERMAN) or time.time() > deadline:
                break
            time.sleep(0.1)
        assert "nmt_engine_up 1.0" in metrics
        assert hits == 3 * len(GERMAN), metrics


def test_the_engine_answers_a_kept_sentence_without_a_search(translator):
    core = core_of(translator, translation_cache_entries=10)
    first = run(core, call(1, GERMAN[:3]))[1]
    admitted, steps = core.stats["admitted_units"], core.stats["steps"]
    # two kept, one new: only the new one is searched and admitted
    mixed = run(core, call(2, [GERMAN[1], GERMAN[4], GERMAN[0]]))[2]
    assert texts_of(mixed)[0::2] == texts_of(first)[1::-1] and core.stats["cache_hits"] == 2
    assert core.stats["admitted_units"] > admitted and core.stats["steps"] > steps
    # all kept: the reply comes as the call is taken in, nothing admitted, no step
    admitted, steps = core.stats["admitted_units"], core.stats["steps"]
    [reply] = core.handle(call(3, GERMAN[:2]))
    assert texts_of(reply) == texts_of(first)[:2] and [h.score for h, *_ in reply.value] == [h.score for h, *_ in first.value[:2]]
    assert (core.stats["admitted_units"], core.stats["steps"], core.stats["cache_hits"]) == (admitted, steps, 4)
    # other options are another question; no cache, no hit
    run(core, call(4, GERMAN[:1], beam=1))
    assert core.stats["cache_hits"] == 4
    plain = core_of(translator)
    run(plain, call(1, GERMAN[:1]), call(2, GERMAN[:1]))
    assert plain.stats["cache_hits"] == 0


def test_a_text_another_call_has_in_the_engine_takes_its_answer(translator):
    """With the cache on (several API workers), a text asked for while another call's search of it runs is not
    searched again: it takes that answer when it comes, in its own call's reply."""
    core = core_of(translator, translation_cache_entries=10)
    replies = run(core, call(1, GERMAN[:3]), call(2, [GERMAN[1], GERMAN[4], GERMAN[0]]), call(3, GERMAN[:1]))
    first, second, third = texts_of(replies[1]), texts_of(replies[2]), texts_of(replies[3])
    assert second[0::2] == first[1::-1] and third == first[:1]
    assert [h.score for h, *_ in replies[3].value] == [h.score for h, *_ in replies[1].value[:1]]
    # four distinct texts searched once each; three taken from another call's search, none from the kept ones
    assert (core.stats["sentences_done"], core.stats["shared_sentences"], core.stats["cache_hits"]) == (4, 3, 0)
    assert not core._answering and not core._sharing
    # without the cache each call searches its own
    plain = core_of(translator)
    run(plain, call(1, GERMAN[:2]), call(2, GERMAN[:2]))
    assert (plain.stats["sentences_done"], plain.stats["shared_sentences"]) == (4, 0)


def test_a_text_waiting_on_a_call_that_leaves_is_searched_in_its_place(translator):
    core = core_of(translator, translation_cache_entries=10)
    alone = texts_of(run(core_of(translator), call(9, GERMAN[:2]))[9])
    core.handle(call(1, GERMAN[:2]))
    core.handle(call(2, GERMAN[:2]))
    core.handle(call(3, GERMAN[1:2]))
    core.handle(Cancel(1))  # before any step: call 2's texts are searched instead, and call 3 waits on call 2's
    replies = run(core)
    assert set(replies) == {2, 3} and texts_of(replies[2]) == alone and texts_of(replies[3]) == alone[1:]
    assert (core.stats["sentences_done"], core.stats["shared_sentences"]) == (2, 1)
    assert not core._answering and not core._sharing
    # a call that fails (its deadline) hands its texts over too
    core.handle(call(4, GERMAN[2:3], timeout=30))
    core.handle(call(5, GERMAN[2:3]))
    replies = {r.id: r for r in core._drop(4, None)}
    replies.update(run(core))
    assert set(replies) == {5} and texts_of(replies[5]) == texts_of(run(core_of(translator), call(9, GERMAN[2:3]))[9])


def test_an_interactive_text_does_not_wait_on_a_background_search(translator):
    core = core_of(translator, translation_cache_entries=10)
    job = dataclasses.replace(call(1, GERMAN[:1]), priority=BACKGROUND)
    replies = run(core, job, call(2, GERMAN[:1]))
    assert texts_of(replies[1]) == texts_of(replies[2])
    assert (core.stats["sentences_done"], core.stats["shared_sentences"]) == (2, 0)


def test_engine_errors_map_to_statuses():
    from nmt_serve.service.engine_client import EngineClient
    from nmt_serve.service.errors import APIError

    for kind, status in [(REFUSED, 503), (EXPIRED, 504), (OUT_OF_MEMORY, 503), (FAILED, 500), ("invalid", 400), ("shutting_down", 503)]:
        with pytest.raises(APIError) as caught:
            EngineClient._value(Reply(1, error=kind, message="m", retry_after=2.5), 1.0)
        assert caught.value.status == status
        if kind == REFUSED:
            assert caught.value.headers["Retry-After"] == "3"


def test_the_device_search_runs_what_fits_and_the_eager_search_the_rest(tiny_checkpoint):
    """With the static decoder, sentences within its positions run in the device search, longer ones
    in an eager search beside it; both get what they get alone."""
    translator = Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=64, static_length=32,
                                 warmup=False)
    core = core_of(translator)
    assert core.warmup() > 0
    replies = run(core, call(1, GERMAN[:3], max_length=20), call(2, GERMAN[3:5], max_length=40))
    assert set(core.groups) == {("de-en", 2, "device", 0), ("de-en", 2, "eager", 0)}
    for i, (texts, cap) in {1: (GERMAN[:3], 20), 2: (GERMAN[3:5], 40)}.items():
        alone = [translator.translate([t], beam_size=2, max_length=cap)[0].text for t in texts]
        assert texts_of(replies[i]) == alone
    memory = core.model_info()[0]["static_decoder"]
    assert memory["graphs"] == 0 and memory["buffers_bytes"] > 0  # CPU: nothing captured


def test_batch_size_follows_the_device_unless_set(translator):
    assert EngineCore({"de-en": translator}, EngineConfig()).config.max_batch_sentences == 64  # CPU
    assert EngineCore({"de-en": translator}, EngineConfig(max_batch_sentences=8)).config.max_batch_sentences == 8


def test_the_api_process_does_not_import_torch():
    """Only the engine process pays for torch (its import time and some 200 MB per API worker)."""
    import subprocess
    import sys

    code = "import sys, nmt_serve.service.app, nmt_serve.service.__main__; assert 'torch' not in sys.modules, 'torch imported'"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


def test_calibration_keeps_its_best_round(translator, monkeypatch):
    """A start-up round that something else slowed down does not set the admission rate: of three
    rounds, the best one does. The engine's clock is a fake here, so that the first round of each
    calibration is 100x slower than the others whatever this machine's speed or load."""
    import nmt_serve.engine.core as core_module

    core = core_of(translator)
    rounds, clock = {"n": 0}, {"t": 0.0}
    new_search, run_step = core._new_search, EngineCore._run_step

    def counting_new_search(*args):  # a round makes its searches first (one lane: one search)
        rounds["n"] += 1
        return new_search(*args)

    def timed_step(search):
        clock["t"] += 1.0 if rounds["n"] == 1 else 0.01
        return run_step(search)

    monkeypatch.setattr(core_module.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(core, "_new_search", counting_new_search)
    monkeypatch.setattr(EngineCore, "_run_step", staticmethod(timed_step))
    core.calibrate(rounds=1)
    held_up = core.admission.rate
    rounds["n"] = 0
    core.calibrate(rounds=3, within_s=1e9)
    assert rounds["n"] == 3 and core.admission.rate > 2 * held_up


def test_a_calibration_round_still_going_at_its_time_is_cut_short(any_translator, tiny_checkpoint, monkeypatch):
    """A large model on a CPU took 36 s for one round: a round still going at `within_s` stops after its
    current step, its rate from the tokens made so far, its sentences gone from the searches (the engine
    then serves as it would have; on the static decoder, its rows are free again). With weights of NaN and
    no sentence finished before the cut, a sentence of two tokens still refuses the model. The engine's clock
    is a fake: every step takes 1 s, whatever this machine's speed."""
    import nmt_serve.engine.core as core_module

    clock, steps = {"t": 0.0}, {"n": 0}
    run_step = EngineCore._run_step

    def timed_step(search):
        clock["t"] += 1.0
        steps["n"] += 1
        return run_step(search)

    monkeypatch.setattr(core_module.time, "perf_counter", lambda: clock["t"])
    monkeypatch.setattr(EngineCore, "_run_step", staticmethod(timed_step))
    whole = EngineCore({"de-en": any_translator}, EngineConfig(lanes=1))
    whole.calibrate(rounds=1, within_s=1e9)
    full_steps, full_rate = steps["n"], whole.admission.rate
    assert full_steps > 4  # (the random model runs to its length limit)

    steps["n"] = 0
    core = EngineCore({"de-en": any_translator}, EngineConfig(lanes=1))
    core.calibrate(rounds=3, within_s=2.5)
    # cut after the step that went past 2.5 s, no further rounds; nothing had finished: 2 steps of the scores' check
    assert steps["n"] == 3 + 2
    assert core.admission.rate == pytest.approx(full_rate, rel=0.5) and core.admission.output_ratio == OUTPUT_RATIO
    monkeypatch.setattr(EngineCore, "_run_step", staticmethod(run_step))
    core.admission.rate = 1e9
    reference = run(core_of(any_translator), call(1, ["Ein Hund rennt.", "Zwei Kinder"]))[1]
    assert texts_of(run(core, call(1, ["Ein Hund rennt.", "Zwei Kinder"]))[1]) == texts_of(reference)

    broken = Translator.load(tiny_checkpoint, device="cpu", step_mode="eager")
    with torch.no_grad():
        for p in broken.model.parameters():
            p.fill_(float("nan"))
    monkeypatch.setattr(EngineCore, "_run_step", staticmethod(timed_step))
    with pytest.raises(RuntimeError, match="no translation of the calibration text"):
        EngineCore({"broken": broken}, EngineConfig(lanes=1)).calibrate(within_s=0.5)


def test_calls_an_engine_would_not_take_are_failed_and_never_sent_once_it_is_lost():
    """Calls wait in the client while the engine's queue is full (ZeroMQ's high-water mark); when the engine is
    lost they fail with the others, and the engine that comes next never gets them."""
    import asyncio
    import tempfile

    import zmq

    from nmt_serve.engine.protocol import EngineStatus
    from nmt_serve.service.engine_connection import EngineConnection, EngineUnavailable

    class Full:  # the calls socket of an engine whose queue is full, until `taking`
        taking, sent = False, []

        def send_multipart(self, frames, flags=0):
            if not self.taking:
                raise zmq.Again()
            self.sent.append(frames)

    directory = tempfile.mkdtemp()

    async def scenario():
        connection = EngineConnection(f"ipc://{directory}/calls", f"ipc://{directory}/status", heartbeat_timeout_s=60)
        await connection.start()
        connection.status, connection.last_status_at = EngineStatus("x", True), time.monotonic()
        calls, full = connection._calls, Full()
        connection._calls = full
        try:
            waiting = asyncio.ensure_future(connection.call(Translate(connection.new_id(), "m", [[1]], DecodeOptions(), time.monotonic() + 60)))
            await asyncio.sleep(0.05)  # several tries to send
            assert not waiting.done() and len(connection._outbox) == 1
            connection.engine_lost("the engine process exited", down=True)
            with pytest.raises(EngineUnavailable):
                await waiting
            full.taking = True
            await asyncio.sleep(0.05)
            assert full.sent == [] and connection._outbox == []
        finally:
            connection._calls = calls
            await connection.stop()

    asyncio.run(scenario())


def test_the_engine_connection_gets_every_reply_of_many_calls_at_once():
    """The calls socket is read from the event loop directly: 2,000 calls from 64 coroutines against an
    engine stand-in that answers at once (replies arrive while other calls are being sent, which the
    socket's edge-triggered descriptor would not announce again; several to a message) all get their own
    reply, and calls made in one turn of the loop go out in one message; a call
    made while no engine takes calls waits, and its deadline still ends it."""
    import asyncio
    import tempfile

    import zmq

    from nmt_serve.engine.protocol import EngineStatus, dumps, loads
    from nmt_serve.service.engine_connection import EngineConnection

    directory = tempfile.mkdtemp()
    calls_address = f"ipc://{directory}/calls"
    context = zmq.Context()
    batches = []  # calls per message
    router = context.socket(zmq.ROUTER)
    router.bind(calls_address)

    def engine():
        while True:
            identity, *payloads = router.recv_multipart()  # the calls of one turn of the client's event loop
            messages = [loads(payload) for payload in payloads]
            if any(message.id == "stop" for message in messages):
                return
            batches.append(len(messages))
            replies = [dumps(Reply(message.id, value=message.sources)) for message in messages]
            for part in (replies[: len(replies) // 2], replies[len(replies) // 2:]):  # one message, or several
                if part:
                    router.send_multipart([identity, *part])

    thread = threading.Thread(target=engine, daemon=True)
    thread.start()

    async def scenario():
        connection = EngineConnection(calls_address, f"ipc://{directory}/status", heartbeat_timeout_s=60)
        await connection.start()
        connection.status, connection.last_status_at = EngineStatus("x", True), time.monotonic()
        ids = iter(range(2000))
        answers = {}

        async def caller():
            for i in ids:
                message = Translate(connection.new_id(), "m", [[i]], DecodeOptions(), time.monotonic() + 60)
                answers[i] = (await connection.call(message)).value

        try:
            await asyncio.wait_for(asyncio.gather(*(caller() for _ in range(64))), 60)
        finally:
            await connection.stop()
        lonely = EngineConnection(f"ipc://{directory}/nobody", f"ipc://{directory}/status", heartbeat_timeout_s=60)
        await lonely.start()
        lonely.status, lonely.last_status_at = EngineStatus("y", True), time.monotonic()
        try:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(lonely.call(Translate(lonely.new_id(), "m", [[1]], DecodeOptions(), time.monotonic() + 60)), 0.3)
            assert not lonely._pending  # the abandoned call is forgotten
        finally:
            await lonely.stop()
        return answers

    try:
        answers = asyncio.run(scenario())
    finally:
        stopper = context.socket(zmq.DEALER)
        stopper.connect(calls_address)
        stopper.send(dumps(Translate("stop", "m", [], DecodeOptions(), 0.0)))
        thread.join(10)
        stopper.close(0)
        router.close(0)
        context.term()
    assert answers == {i: [[i]] for i in range(2000)}
    assert sum(batches) == 2000 and max(batches) > 1  # calls made in one turn of the loop went out together
