"""Continuous batching: sentences that join a running search at different steps get exactly what
they get when translated alone (the eager reference search), whatever else runs beside them; for
the eager ContinuousSearch and for ContinuousDeviceSearch over the static decoder (op by op on CPU,
captured as CUDA graphs in the CUDA tests)."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from conftest import random_model, random_sources, record_reads, waits_without_a_step_queued
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import nmt_serve.inference.continuous as continuous
import nmt_serve.inference.continuous_device as continuous_device
import nmt_serve.inference.device_search as device_search
from nmt_serve.inference import greedy_pick
from nmt_serve.engine.attention_maps import searched_entropy
from nmt_serve.inference.continuous import ContinuousSearch, Sentence
from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
from nmt_serve.inference.device_search import DeviceSearch
from nmt_serve.inference.lexical_constraints import LexicalConstraints
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate, max_lengths_for
from nmt_serve.inference.static_decoder import StaticDecoder, bucket_of

SHAPES = [dict(), dict(norm_placement="post"), dict(n_heads=2, d_model=48, d_ff=96, n_decoder_layers=3)]
# lookahead: the device search taking its reads in a step later; grouped: that, over a decoder of the one beam size whose
# rows share their sentence's source keys and values (the engine's on CUDA)
KINDS = ["eager", "device", "lookahead", "grouped"]


def make_search(kind: str, runner: ModelRunner, beam: int, min_length: int = 0, check_every: int = 4, max_rows: int = 64):
    if kind == "eager":
        return ContinuousSearch(runner, beam_size=beam, min_length=min_length)
    if kind == "grouped" and beam == 1:
        pytest.skip("a greedy decoder's groups are its rows: the lookahead kind")
    decoder = StaticDecoder(runner, max_rows=max_rows // beam * beam, max_length=64, group=beam if kind == "grouped" else 1)
    return ContinuousDeviceSearch(DeviceSearch(decoder), beam_size=beam, min_length=min_length, check_every=check_every,
                                  lookahead=kind in ("lookahead", "grouped"))


def alone(runner: ModelRunner, src: list[int], options: SearchOptions):
    return generate(runner, torch.tensor([src], device=runner.device), options)[0]


def sources(n: int, seed: int, vocab: int = 64) -> list[list[int]]:
    src = random_sources(n, 12, vocab, seed=seed)
    return [row[row != 0].tolist() for row in src]


def run_staggered(search: ContinuousSearch, batches: list[list[Sentence]], steps_between: list[int]) -> dict:
    """Add each batch after the given number of steps; step until every sentence is done."""
    results = {}
    for batch, steps in zip(batches, steps_between):
        for _ in range(steps):
            results.update(dict(search.step()))
        search.add(batch)
    while len(search):
        results.update(dict(search.step()))
    return results


def assert_same(got, want) -> None:
    assert [h.tokens for h in got] == [h.tokens for h in want]
    for g, w in zip(got, want):
        assert g.score == pytest.approx(w.score, abs=1e-4)
        assert g.normalized_score == pytest.approx(w.normalized_score, abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", range(len(SHAPES)))
@pytest.mark.parametrize("beam", [1, 2, 4])
def test_staggered_joins_match_each_sentence_alone(kind, shape, beam):
    model = random_model(seed=shape, **SHAPES[shape])
    runner = ModelRunner(model)
    rng = random.Random(shape * 10 + beam)
    srcs = sources(11, seed=shape + beam)
    options = []
    for i in range(len(srcs)):
        options.append(SearchOptions(beam_size=beam, num_hypotheses=rng.randint(1, beam),
                                     max_length=rng.choice([None, 3, 9]), length_penalty=rng.choice([1.0, 0.6])))
    sentences = []
    for i, (src, o) in enumerate(zip(srcs, options)):
        cap = int(max_lengths_for(torch.tensor([src]), 0, o, model.config.max_positions - 1)[0])
        sentences.append(Sentence(i, src, cap, o.length_penalty, o.num_hypotheses))
    search = make_search(kind, runner, beam, check_every=1 + shape)
    results = run_staggered(search, [sentences[:3], sentences[3:4], sentences[4:8], sentences[8:]], [0, 2, 1, 5])
    assert sorted(results) == list(range(len(srcs)))
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options[i]))


def test_rows_switch_to_grouped_beams_mid_run(monkeypatch):
    """A beam batch that starts small (physical reorders) and grows past the threshold switches to
    reordering by ancestry without changing any result."""
    monkeypatch.setattr(continuous, "GROUPED_BEAM_MIN_ROWS", 8)
    runner = ModelRunner(random_model(seed=5))
    srcs = sources(6, seed=9)
    options = SearchOptions(beam_size=4, max_length=10)
    search = ContinuousSearch(runner, beam_size=4)
    batches = [[Sentence(i, srcs[i], 10)] for i in range(len(srcs))]
    search.add(batches[0])
    assert not search.cache.grouped
    results = dict(search.step())
    search.add(batches[1])
    assert search.cache.grouped
    results.update(run_staggered(search, batches[2:], [1, 0, 3, 2]))
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options))


@pytest.mark.parametrize("beam", [1, 2])
def test_joined_rows_attend_through_matmuls_as_through_sdpa(monkeypatch, beam):
    """From MATMUL_ATTENTION_MIN_ROWS rows on a step attends through batched matmuls, with the rows that
    joined later masked by an additive bias: every row at once here, against each sentence alone."""
    import nmt_serve.inference.model_runner as model_runner

    monkeypatch.setattr(model_runner, "MATMUL_ATTENTION_MIN_ROWS", 1)
    monkeypatch.setattr(continuous, "GROUPED_BEAM_MIN_ROWS", 10**9)  # physical rows: the path under test
    runner = ModelRunner(random_model(seed=7))
    srcs = sources(6, seed=13)
    options = SearchOptions(beam_size=beam, max_length=9)
    search = ContinuousSearch(runner, beam_size=beam)
    results = run_staggered(search, [[Sentence(i, srcs[i], 9)] for i in range(len(srcs))], [0, 2, 0, 3, 1, 2])
    monkeypatch.setattr(model_runner, "MATMUL_ATTENTION_MIN_ROWS", 10**9)  # the reference: SDPA throughout
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options))


def test_grouped_beams_from_the_start_hold_each_source_once(monkeypatch):
    """Grouped from the first step: the source side holds one entry per sentence (not per beam) through
    joins that append rows, joins into the rows of sentences that left, and a longer source."""
    monkeypatch.setattr(continuous, "GROUPED_BEAM_MIN_ROWS", 1)
    runner = ModelRunner(random_model(seed=6))
    srcs = sources(7, seed=11)
    srcs[5] = srcs[5] + srcs[4] + srcs[3]  # longer than any before it: the source side widens
    options = SearchOptions(beam_size=3, max_length=9)
    search = ContinuousSearch(runner, beam_size=3)
    batches = [[Sentence(i, srcs[i], 9 if i else 2)] for i in range(len(srcs))]
    search.add(batches[0] + batches[1])
    assert search.cache.grouped and search.cache.cross_kv.size(2) == 2 and search.cache.batch_size == 6
    results = run_staggered(search, batches[2:], [3, 0, 2, 1, 4])
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options if i else SearchOptions(beam_size=3, max_length=2)))


@pytest.mark.parametrize("kind", KINDS)
def test_cancelled_sentences_leave_and_the_rest_are_unchanged(kind):
    runner = ModelRunner(random_model(seed=2))
    srcs = sources(5, seed=4)
    options = SearchOptions(beam_size=2, max_length=12)
    search = make_search(kind, runner, 2)
    search.add([Sentence(i, s, 12) for i, s in enumerate(srcs)])
    search.step()
    search.cancel({1, 3})
    results = {}
    while len(search):
        results.update(dict(search.step()))
    assert sorted(results) == [0, 2, 4]
    for i in results:
        assert_same(results[i], alone(runner, srcs[i], options))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("beam", [1, 2])
def test_min_length_is_kept_per_sentence(kind, beam):
    model = random_model(seed=2, final_logits_bias=True)
    model.logits_bias[model.config.eos_id] = 3.0  # eos likely: without min_length some would end sooner
    runner = ModelRunner(model)
    srcs = sources(4, seed=1)
    options = SearchOptions(beam_size=beam, min_length=4, max_length=8)
    assert any(len(alone(runner, src, replace(options, min_length=0))[0].tokens) + 1 < 4 for src in srcs)
    search = make_search(kind, runner, beam, min_length=4)
    results = run_staggered(search, [[Sentence(0, srcs[0], 8)], [Sentence(i, srcs[i], 8) for i in (1, 2, 3)]], [0, 3])
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options))
        assert all(len(h.tokens) + 1 >= 4 for h in results[i])


def test_a_steady_stream_of_joins_keeps_the_cache_short():
    """Positions that no remaining row reads are dropped as rows leave: under a stream of joins the
    cache length stays near the longest sentence instead of growing with every step."""
    runner = ModelRunner(random_model(seed=7))
    search = ContinuousSearch(runner, beam_size=1)
    longest = 0
    finished = 0
    for step in range(200):
        search.add([Sentence(step, sources(1, seed=step)[0], 6 + step % 5)])
        finished += len(search.step())
        longest = max(longest, search.cache.length if search.cache else 0)
    assert finished >= 190
    assert longest <= 11 + 2 * continuous.DROP_POSITIONS_AT


@pytest.mark.parametrize("beam,grouped", [(1, False), (2, False), (4, True)])
def test_the_source_side_narrows_to_the_longest_running_source_once_the_longest_left(beam, grouped, monkeypatch):
    """A long source widens the source side for every row; once it left, the steps read only as far as the
    longest source still running (not the padding of one that ran before), a longer one joining widens it
    again, and every result is still each sentence's alone."""
    monkeypatch.setattr(continuous, "GROUPED_BEAM_MIN_ROWS", 4 if grouped else 1000)
    runner = ModelRunner(random_model(seed=17))
    search = ContinuousSearch(runner, beam_size=beam)
    prefix = tuple(range(4, 16))  # keeps the short ones running for 12 tokens
    long = Sentence("long", sources(1, seed=40, vocab=64)[0] * 4, 2)  # 48 source tokens, 2 target tokens
    # the short ones keep their cross-attention (the service's quality check), read over the narrowed source
    short = [Sentence(("short", i), src, 14, prefix=prefix, attention_span=(0, len(src) - 1))
             for i, src in enumerate(sources(3, seed=41))]
    widest = max(len(s.src) for s in short)  # 12
    assert len(long.src) == 48 and widest == 12
    want = {long.key: alone(runner, long.src, SearchOptions(beam_size=beam, max_length=2))}
    for s in short:
        want[s.key] = alone(runner, s.src, SearchOptions(beam_size=beam, max_length=14, target_prefix=prefix))
    search.add([long] + short)
    assert search.cache.grouped == grouped and search.cache.source_width == 48
    results = {}
    while "long" not in results:
        results.update(dict(search.step()))
    results.update(dict(search.step()))  # a step begins by tidying up after the ones that left
    assert search.cache.source_width == widest
    # a longer source joins: the source side widens for it
    middle = Sentence("middle", sources(1, seed=42)[0] * 2, 3)  # 24 tokens
    want[middle.key] = alone(runner, middle.src, SearchOptions(beam_size=beam, max_length=3))
    search.add([middle])
    assert search.cache.source_width == 24
    while "middle" not in results:
        results.update(dict(search.step()))
    results.update(dict(search.step()))
    assert search.cache.source_width == widest
    while len(search):
        results.update(dict(search.step()))
    assert sorted(results, key=str) == sorted(want, key=str)
    for key, hyps in want.items():
        assert_same(results[key], hyps)
    for s in short:  # what each read from the source, as when it runs alone
        search = ContinuousSearch(runner, beam_size=beam)
        search.add([s])
        while len(search):
            for key, hyps in search.step():
                for got, by_itself in zip(results[key], hyps):
                    assert got.entropies and got.looks == by_itself.looks
                    assert got.entropies == pytest.approx(by_itself.entropies, abs=1e-5)


def test_the_source_side_keeps_its_width_when_the_longest_running_is_nearly_as_long(monkeypatch):
    """Narrowing by a little would soon be undone by a longer join (a copy of the source side): below
    NARROW_SOURCE_AT of the width the source side stays as it is."""
    runner = ModelRunner(random_model(seed=17))
    search = ContinuousSearch(runner, beam_size=1)
    prefix = tuple(range(4, 10))
    src = sources(1, seed=40)[0]  # 12 tokens
    search.add([Sentence("long", src + src[:2], 1), Sentence("short", src, 8, prefix=prefix)])
    assert search.cache.source_width == 14
    for _ in range(3):
        search.step()
    assert search.keys() == ["short"] and search.cache.source_width == 14  # 12 > 0.75 x 14
    monkeypatch.setattr(continuous, "NARROW_SOURCE_AT", 0.9)
    search.add([Sentence("longer", src + src[:4], 1)])
    for _ in range(3):
        search.step()
    assert search.keys() == ["short"] and search.cache.source_width == 12


@pytest.mark.parametrize("beam", [1, 2])
def test_appended_sentences_take_spare_source_entries_and_match_each_alone(beam):
    """A join that appends rows writes the new sources into spare entries of the source side's buffer:
    after the sentences at the end left (their rows cut off), the next wave copies none of the running
    entries, and every result is still each sentence's alone."""
    runner = ModelRunner(random_model(seed=13))
    search = ContinuousSearch(runner, beam_size=beam)
    # the longest source (no join widens the source side), kept running by a forced prefix of 28 tokens
    prefix = tuple(range(4, 32))
    long = Sentence("long", list(range(4, 16)), 30, prefix=prefix)
    want = {"long": alone(runner, long.src, SearchOptions(beam_size=beam, max_length=30, target_prefix=prefix))}
    search.add([long])
    results, in_place = {}, []
    for wave in range(4):  # each within 6 steps: the long one (29 tokens) outlives them
        srcs = sources(4, seed=30 + wave)
        sentences = [Sentence((wave, i), src, 2 + i) for i, src in enumerate(srcs)]
        for s in sentences:
            want[s.key] = alone(runner, s.src, SearchOptions(beam_size=beam, max_length=s.max_length))
        rows, where = search.cache.batch_size, search.cache.cross_kv.data_ptr()
        search.add(sentences)
        assert search.cache.batch_size == rows + 4 * beam  # appended
        in_place.append(search.cache.cross_kv.data_ptr() == where)
        while any(s.key not in results for s in sentences):
            results.update(dict(search.step()))
        results.update(dict(search.step()))  # a step begins by cutting off the rows left at the end
        assert search.cache.batch_size == beam  # only the long one's rows
    while len(search):
        results.update(dict(search.step()))
    assert in_place == [False, True, True, True]  # the first wave grew the buffer
    assert sorted(results, key=str) == sorted(want, key=str)
    for key, hyps in want.items():
        assert_same(results[key], hyps)


@pytest.mark.skipif(not greedy_pick.available(torch.device("cpu")), reason="needs numba's kernels")
@pytest.mark.parametrize("eos_bias", [1.6, 1.8])
def test_greedy_steps_choose_through_the_kernel_as_through_the_candidates(eos_bias, monkeypatch):
    """The eager search's greedy steps choose in one kernel call (greedy_pick), except where a row has a forced
    token, a lexical constraint or eos not allowed yet: sentences joining at different steps into groups that others
    left, some ending by the model and some at their max length, some keeping their attention, give the same tokens,
    scores and kept attention, bit for bit, with the kernel and without it."""
    model = random_model(seed=1, final_logits_bias=True)
    eos = model.config.eos_id
    model.logits_bias[eos] = eos_bias  # eos likely: some end by the model, some at their max length
    runner = ModelRunner(model)
    srcs = sources(12, seed=7)
    sentences = [Sentence(i, s, 3 + i % 5 * 3, length_penalty=0.6 if i % 2 else 1.0, num_hypotheses=1 + i % 2,
                          attention_span=(0, len(s) - 1) if i % 3 else None,
                          prefix=(9, 11) if i == 5 else ())
                 for i, s in enumerate(srcs)]
    picks = []
    pick = greedy_pick.pick
    monkeypatch.setattr(greedy_pick, "pick", lambda *a: picks.append(a[0].size(0)) or pick(*a))

    def run(batches=(sentences[:5], sentences[5:8], sentences[8:]), between=(0, 2, 4)) -> dict:
        results = run_staggered(ContinuousSearch(runner), batches, between)
        return {key: [(h.tokens, h.score, h.normalized_score, h.entropies, h.looks) for h in hyps]
                for key, hyps in results.items()}

    with_kernel = run()
    assert picks and max(picks) > 5  # rows of several sentences, empty groups among them
    calls = len(picks)
    monkeypatch.setattr(greedy_pick, "ENABLED", False)
    without = run()
    assert len(picks) == calls
    assert with_kernel == without
    lengths = {key: len(hyps[0][0]) for key, hyps in with_kernel.items()}
    assert any(n + 1 < sentences[key].max_length for key, n in lengths.items())  # ended by the model
    assert any(n + 1 == sentences[key].max_length for key, n in lengths.items())  # at its max length
    assert with_kernel[5][0][0][:2] == [9, 11]  # forced while its prefix lasts (the tensor calls)
    # a sentence with a term: while it runs, the steps take the tensor calls, which meet it
    termed = [replace(sentences[3], constraints=LexicalConstraints(include=((40,),))), sentences[4]]
    without = run([termed], [0])
    monkeypatch.setattr(greedy_pick, "ENABLED", True)
    assert run([termed], [0]) == without and 40 in without[3][0][0]
    assert with_kernel[1][0][3] is not None and with_kernel[0][0][3] is None


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("kind", ["device", "lookahead"])
def test_device_slots_are_reused_and_compacted(beam, kind):
    """Under a stream of joins the device search reuses the slots sentences leave, so the rows a step
    computes stay near the sentences running; when most leave, the rest move to the front slots."""
    runner = ModelRunner(random_model(seed=11))
    search = make_search(kind, runner, beam, check_every=2, max_rows=64 * beam)
    want = {}
    results = {}
    for step in range(60):
        src = sources(1, seed=100 + step)[0]
        cap = 4 + step % 6
        want[step] = alone(runner, src, SearchOptions(beam_size=beam, max_length=cap))
        search.add([Sentence(step, src, cap)])
        results.update(dict(search.step()))
        assert search.rows <= 16 * beam  # at most ~9 running: the bucket of 16 groups
    while len(search):
        results.update(dict(search.step()))
    assert sorted(results) == list(range(60))
    for key, hyps in results.items():
        assert_same(hyps, want[key])
    # a big batch, then all but two leave: those two move to the front slots
    srcs = sources(20, seed=5)
    caps = [30 if i in (3, 17) else 3 for i in range(20)]
    search.add([Sentence(i, s, c) for i, (s, c) in enumerate(zip(srcs, caps))])
    assert search.rows == 32 * beam
    results = {}
    for _ in range(6):
        results.update(dict(search.step()))
    assert len(search) == 2 and search.rows == 2 * beam
    while len(search):
        results.update(dict(search.step()))
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, SearchOptions(beam_size=beam, max_length=caps[i])))


@pytest.mark.parametrize("beam", [1, 2])
def test_with_lookahead_reads_are_taken_in_behind_the_next_step_and_nothing_is_lost(beam, monkeypatch):
    """With lookahead a check's read of which sentences still search is taken in by the next step(), once
    that step is queued, and the finished sentences' hypotheses by the one after: no read is waited for
    without a step queued behind it (without lookahead every check's is). A sentence whose result is on
    its way still counts in len() and keys(), and cancelled then, it never comes back. The results are
    each sentence's alone, as without lookahead."""
    runner = ModelRunner(random_model(seed=13))
    srcs = sources(24, seed=31)
    caps = [3 + (7 * i) % 11 for i in range(24)]
    batches = [[Sentence(i, srcs[i], caps[i]) for i in range(a, b)] for a, b in ((0, 8), (8, 9), (9, 16), (16, 24))]
    idle = {}
    for kind in ("device", "lookahead"):
        search = make_search(kind, runner, beam, check_every=2, max_rows=32 * beam)
        log = record_reads(monkeypatch, [continuous_device, device_search], search.decoder)
        results = run_staggered(search, batches, [0, 3, 1, 4])
        assert sorted(results) == list(range(24))
        for i, src in enumerate(srcs):
            assert_same(results[i], alone(runner, src, SearchOptions(beam_size=beam, max_length=caps[i])))
        idle[kind] = waits_without_a_step_queued(log)
        assert sum(k == "wait" for k, _ in log) >= 6
    assert idle["lookahead"] == 0 and idle["device"] >= 6

    search = make_search("lookahead", runner, beam, check_every=1, max_rows=32 * beam)
    search.add([Sentence(i, srcs[i], 3 if i < 2 else 12) for i in range(4)])  # 0 and 1 end by their third step
    steps = [search.step() for _ in range(4)]
    assert steps == [[], [], [], []]  # the third step's read taken in by the fourth, their hypotheses not yet
    assert len(search) == 4 and search.running == 2 and sorted(search.keys()) == [0, 1, 2, 3] and search.room() == 32 - 2
    search.cancel({1, 2})
    results = dict(search.step())
    assert sorted(results) == [0]
    while len(search):
        results.update(dict(search.step()))
    assert sorted(results) == [0, 3]


@pytest.mark.parametrize("beam", [1, 2])
def test_sentences_joining_at_a_check_fill_the_slots_of_those_that_left_without_a_copy(beam, monkeypatch):
    """Half the running sentences finish at a check, as many join: they take the freed slots, and the
    rows left are not first moved into a smaller bucket (a copy of their cache that the joins undo);
    without joins the bucket shrinks before the next step."""
    runner = ModelRunner(random_model(seed=19))
    search = make_search("device", runner, beam, min_length=3, check_every=4, max_rows=32 * beam)
    copies = []
    keep_rows = search.decoder.keep_rows
    monkeypatch.setattr(search.decoder, "keep_rows", lambda *a, **k: copies.append(1) or keep_rows(*a, **k))
    srcs = sources(30, seed=23)
    # the short ones end at their max_length, by step 4; the others do not (min_length 3 and these seeds)
    caps = [3 if i % 2 == 0 and i < 20 else 20 + i if i < 20 else 10 + 2 * (i - 20) for i in range(30)]
    search.add([Sentence(i, srcs[i], caps[i]) for i in range(20)])
    assert search.rows == 32 * beam
    results = {}
    while not results and search.steps < 5:
        results.update(dict(search.step()))
    assert sorted(results) == list(range(0, 20, 2)) and search.joinable()
    assert search.rows == 16 * beam  # what the next step computes if nobody joins
    search.add([Sentence(i, srcs[i], caps[i]) for i in range(20, 30)])
    assert search.rows == 32 * beam
    search.step()
    assert not copies and len(search) == 20
    while len(search) > 8:  # the rest leave at checks with nobody joining: the bucket shrinks before the next step
        results.update(dict(search.step()))
    assert len(search) and search.rows == bucket_of(len(search), search.state.group_buckets) * beam
    results.update(dict(search.step()))
    assert copies
    while len(search):
        results.update(dict(search.step()))
    options = dict(beam_size=beam, min_length=3)
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, SearchOptions(max_length=caps[i], **options)))


@pytest.mark.parametrize("beam", [1, 2])
def test_the_device_search_summaries_kept_as_sentences_join_equal_them_remade(beam):
    """Joins update what the steps read of the running sentences (the longest source, the first to reach its
    max_length, constraints, kept attention) from the newcomers alone; remade from every slot they are the same."""
    runner = ModelRunner(random_model(seed=17))
    search = make_search("device", runner, beam, check_every=2, max_rows=32 * beam)
    rng = random.Random(3)
    names = ("_running", "_longest_source", "_first_joined", "_first_end", "_terms", "_attention")

    def summaries():
        return tuple(getattr(search, n) for n in names)

    for step in range(40):
        if search.joinable() and search.room():
            joining = []
            for i in range(rng.randint(1, min(3, search.room()))):
                src = sources(1, seed=1000 + 10 * step + i)[0][: rng.randint(2, 12)]
                terms = LexicalConstraints(include=((7, 8),)) if beam > 1 and rng.random() < 0.15 else None
                span = (0, len(src)) if rng.random() < 0.2 else None
                joining.append(Sentence((step, i), src, rng.randint(3, 20), constraints=terms, attention_span=span))
            search.add(joining)
            kept = summaries()
            search._summarize()
            assert summaries() == kept
        search.step()
        kept = summaries()
        search._summarize()
        assert summaries() == kept


def test_device_search_takes_joins_right_after_a_check():
    """Joins cost an encoder run: the device search takes them when nothing runs or right after it read
    which sentences finished, once every check_every steps."""
    runner = ModelRunner(random_model(seed=13))
    search = make_search("device", runner, 1, check_every=3)
    assert search.joinable()
    search.add([Sentence(0, [5, 6, 3], 20)])
    assert search.joinable()  # nothing has run since
    pattern = []
    for _ in range(6):
        search.step()
        pattern.append(search.joinable())
    assert pattern == [False, False, True, False, False, True]
    assert ContinuousSearch(runner).joinable()
    # with lookahead a check's read is taken in a step later, and the results handed over the step after:
    # joins come at both (the next calls of the callers just answered join without waiting for a check)
    search = make_search("lookahead", runner, 1, check_every=3)
    search.add([Sentence(0, [5, 6, 3], 20), Sentence(1, [5, 3], 2)])  # 1 ends at its max_length: read at step 2
    pattern = []
    for _ in range(8):
        done = search.step()
        pattern.append((search.joinable(), [key for key, _ in done]))
    # read queued at steps 2 and 5 (three steps apart), taken in at 3 and 6, 1's result handed over at 4
    assert pattern == [(False, []), (False, []), (True, []), (True, [1]), (False, []), (True, []), (False, []), (False, [])]


def test_device_search_refuses_what_does_not_fit():
    runner = ModelRunner(random_model(seed=12))
    search = make_search("device", runner, 2, max_rows=8)  # 4 sentences of 2 beams
    assert search.room() == 4
    assert not search.fits(Sentence(0, [5] * 65, 10)) and not search.fits(Sentence(0, [5, 3], 64))
    with pytest.raises(ValueError):
        search.add([Sentence(i, [5, 3], 5) for i in range(5)])
    search.add([Sentence(i, [5, 3], 5) for i in range(4)])
    assert search.room() == 0


@pytest.mark.cuda
@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_staggered_joins_match_each_sentence_alone_on_cuda(kind, beam):
    """The same on a GPU (the device search's steps captured as CUDA graphs), in float32 (float16
    rounding may break near-ties differently per batch shape)."""
    model = random_model(seed=7).cuda()
    runner = ModelRunner(model)
    srcs = sources(11, seed=8)
    options = SearchOptions(beam_size=beam, max_length=9)
    sentences = [Sentence(i, src, 9) for i, src in enumerate(srcs)]
    search = make_search(kind, runner, beam)
    results = run_staggered(search, [sentences[:3], sentences[3:4], sentences[4:8], sentences[8:]], [0, 2, 1, 5])
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, options))


def test_join_chunks_take_group_buckets_within_the_token_limit():
    from nmt_serve.inference.device_search import join_chunk

    groups, lengths = [1, 2, 4, 8, 16], [32, 64]
    assert join_chunk([3] * 11, groups, lengths, 10_000) == (8, 32)  # then 2 and 1
    assert join_chunk([3] * 3, groups, lengths, 10_000) == (2, 32)
    # the longest of a chunk sets its padded length; past the limit the chunk halves
    assert join_chunk([3] * 7 + [40], groups, lengths, 10_000) == (8, 64)
    assert join_chunk([3] * 7 + [40], groups, lengths, 300) == (4, 32)
    assert join_chunk([50], groups, lengths, 10) == (1, 64)  # one sentence joins whatever the limit


@pytest.mark.parametrize("beam", [1, 3])
def test_a_large_join_runs_in_chunks_and_matches_each_sentence_alone(monkeypatch, beam):
    """One join of 13 sentences of 2-50 tokens: programs of group-bucket sizes, each padded to the
    length bucket of its longest (32, 48 or 64 here), split further past join_tokens."""
    runner = ModelRunner(random_model(seed=21))
    lengths = [2, 50, 7, 33, 12, 3, 40, 9, 5, 31, 20, 2, 45]
    rng = random.Random(4)
    srcs = [[rng.randrange(4, 64) for _ in range(n - 1)] + [2] for n in lengths]
    decoder = StaticDecoder(runner, max_rows=16 * beam, max_length=64)
    search = ContinuousDeviceSearch(DeviceSearch(decoder), beam_size=beam, join_tokens=256)
    programs = []
    join_program = search.device_search.join_program
    monkeypatch.setattr(search.device_search, "join_program", lambda K, n, W, m: programs.append((n, W)) or join_program(K, n, W, m))
    search.add([Sentence(i, s, 8) for i, s in enumerate(srcs)])
    assert sum(n for n, _ in programs) == 13 and all(n * W <= 256 or n == 1 for n, W in programs)
    assert {W for _, W in programs} == {32, 48, 64}
    results = {}
    while len(search):
        results.update(dict(search.step()))
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, SearchOptions(beam_size=beam, max_length=8)))


def test_warmup_runs_the_join_programs_and_leaves_every_group_free():
    runner = ModelRunner(random_model(seed=22))
    device_search = DeviceSearch(StaticDecoder(runner, max_rows=8, max_length=64))
    steps = device_search.warmup(beam_sizes=(2,))
    with_joins = DeviceSearch(StaticDecoder(runner, max_rows=8, max_length=64)).warmup(beam_sizes=(2,), join_tokens=64)
    # groups of 2 rows: 1, 2 and 4 sentences; lengths 32, 48 and 64; joins within 64 positions: (1, 32), (2, 32), (1, 48),
    # (1, 64)
    assert with_joins == steps + 4
    # the steps that keep the rows' attention: one more per step bucket
    assert DeviceSearch(StaticDecoder(runner, max_rows=8, max_length=64)).warmup(beam_sizes=(2,), attention=True) == 2 * steps
    slots = device_search.slots(2)
    assert not slots.alive.any()
    search = ContinuousDeviceSearch(device_search, beam_size=2)
    src = sources(1, seed=23)[0]
    search.add([Sentence(0, src, 6)])
    results = {}
    while len(search):
        results.update(dict(search.step()))
    assert_same(results[0], alone(runner, src, SearchOptions(beam_size=2, max_length=6)))


@pytest.mark.cuda
def test_joins_are_captured_once_per_bucket_on_cuda():
    """After a warm-up with the joins and the steps that keep attention, a continuous search on a GPU
    captures nothing new, joins included, and its results are each sentence's alone; the attention kept
    by the replayed programs is the eager search's."""
    model = random_model(seed=24).cuda()
    runner = ModelRunner(model)
    device_search = DeviceSearch(StaticDecoder(runner, max_rows=32, max_length=64))
    device_search.warmup(beam_sizes=(1,), join_tokens=1024, attention=True)
    captured = len(device_search.decoder.graphs)
    srcs = sources(11, seed=25)
    search = ContinuousDeviceSearch(device_search, beam_size=1, join_tokens=1024)
    sentences = [Sentence(i, s, 9, attention_span=(0, len(s)) if i % 2 else None) for i, s in enumerate(srcs)]
    results = run_staggered(search, [sentences[:7], sentences[7:]], [0, 3])
    assert len(device_search.decoder.graphs) == captured
    eager = run_staggered(ContinuousSearch(runner, beam_size=1), [sentences], [0])
    for i, src in enumerate(srcs):
        assert_same(results[i], alone(runner, src, SearchOptions(beam_size=1, max_length=9)))
        if i % 2:
            assert results[i][0].looks == eager[i][0].looks
            assert results[i][0].entropies == pytest.approx(eager[i][0].entropies, abs=1e-4)
        else:
            assert results[i][0].entropies is None


class ExternalReads(TorchDispatchMode):
    """The storages an op sequence reads that it did not make itself (what a captured graph's replay
    reads at the addresses of its capture), and the ops themselves with their shapes and every argument
    that is not a tensor (what the replay repeats whatever Python holds by then)."""

    def __init__(self):
        super().__init__()
        self.made, self.read, self.ops = set(), set(), []

    @staticmethod
    def _storage(t: torch.Tensor):
        try:
            return t.untyped_storage().data_ptr()
        except NotImplementedError:  # an opaque tensor (oneDNN's packed weights): the object stands for it
            return ("opaque", id(t))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves = tree_flatten((args, kwargs))[0]
        for t in leaves:
            if isinstance(t, torch.Tensor) and self._storage(t) not in self.made:
                self.read.add(self._storage(t))
        self.ops.append((str(func), [tuple(t.shape) if isinstance(t, torch.Tensor) else repr(t) for t in leaves]))
        out = func(*args, **(kwargs or {}))
        self.made.update(self._storage(t) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


def record_programs(monkeypatch) -> tuple[dict, list]:
    """From here on, each StaticDecoder program's first run (by decoder and key, as graphs are kept) and the
    keys of later runs that read a tensor the first did not, or ran other ops, shapes or constants."""
    first, later = {}, []
    run = StaticDecoder.run

    def recording_run(self, key, fn):
        with ExternalReads() as reads:
            run(self, key, fn)
        program = (id(self), *key)
        if program not in first:
            first[program] = reads
        elif reads.read - first[program].read or reads.ops != first[program].ops:
            later.append(key)

    monkeypatch.setattr(StaticDecoder, "run", recording_run)
    return first, later


@pytest.mark.parametrize("beam", [1, 3])
def test_every_run_of_a_program_reads_what_its_first_run_read(monkeypatch, beam):
    """A CUDA graph replays its capture: the same ops on the same shapes with the same constants, reading
    the tensors at the addresses it was captured with. So every later run of a program (a step, a join)
    must run the ops of its first run and read no tensor that run did not: no buffer remade in between,
    no fresh tensor or changing Python value in its closure that its key leaves out. Checked on CPU
    through a stream of joins of 0-9 sentences of 3-40 tokens (at beam 3 some with lexical constraints,
    some keeping their attention), cancellations, slots freed and compacted; then offline searches on a device search of their own."""
    first, later = record_programs(monkeypatch)
    decoder = StaticDecoder(ModelRunner(random_model(seed=26)), max_rows=32 * beam, max_length=64, group=beam)  # as the engine's
    search = ContinuousDeviceSearch(DeviceSearch(decoder), beam_size=beam, check_every=2)
    rnd = random.Random(beam)
    key = 0
    for step in range(60):
        n = rnd.choice([0, 0, 1, 2, 3, 5, 9])
        if search.joinable() and n <= search.room():
            srcs = [[rnd.randrange(4, 64) for _ in range(rnd.randint(3, 40))] for _ in range(n)]
            terms = [LexicalConstraints(include=((40, 41),), avoid=((12,),)) if beam > 1 and rnd.random() < 0.3 else None
                     for _ in range(n)]
            spans = [(0, len(src)) if rnd.random() < 0.3 else None for src in srcs]  # some keep their attention
            search.add([Sentence(key + i, src, rnd.randint(3, 20), constraints=c, attention_span=span)
                        for i, (src, c, span) in enumerate(zip(srcs, terms, spans))])
            key += n
        if step % 7 == 3:
            search.cancel({key - 1})
        search.step()
    while len(search):
        search.step()
    offline = DeviceSearch(StaticDecoder(decoder.runner, max_rows=32 * beam, max_length=64), check_every=2)
    for i, (n, length) in enumerate([(3, 9), (11, 30), (2, 5), (11, 12), (3, 40)]):
        options = SearchOptions(beam_size=beam, num_hypotheses=beam, max_length=6 + 3 * i, min_length=i % 3, length_penalty=0.5 * i)
        offline.search(random_sources(n, length, 64, seed=i), options)
    kinds = [program[1] for program in first]
    assert kinds.count("join") >= 3 and len(first) >= 10  # several join and step programs, each run again and again
    assert not beam > 1 or "beam-lexical" in kinds
    assert any(kind.endswith("-attention") for kind in kinds)
    assert later == []
    # a program whose closure holds a new tensor on each run is caught
    fresh = [torch.ones(2, dtype=torch.long) for _ in range(2)]
    reads = [ExternalReads(), ExternalReads()]
    for r, ones in zip(reads, fresh):
        with r:
            decoder.tokens[:2].add_(ones)
    assert reads[1].read - reads[0].read


def forced_attention(model, src: list[int], tokens: list[int], span: tuple[int, int]) -> tuple[float, list[int]]:
    """The reference: a teacher-forced pass over the translation (eos appended), its cross-attention
    averaged over layers and heads: each target row's entropy over the span renormalised, eos's row left
    out, the mean over log(span) (attention_maps.source_entropy); and each row's most attended source
    position (the maps' alignment)."""
    cfg = model.config
    with torch.inference_mode():
        encoded = model.encode(torch.tensor([src]))
        decoded = model.decode(torch.tensor([[cfg.decoder_start_id] + tokens]), encoded, need_weights=True, logits=False)
    cross = torch.stack(decoded.cross_attention)[:, 0].mean(dim=(0, 1))  # (T, S)
    rows = cross[:-1] if cross.size(0) > 1 else cross
    own = rows[:, span[0]:span[1]]
    p = own / own.sum(dim=-1, keepdim=True)
    entropy = float(-(p * p.clamp_min(1e-9).log()).sum(dim=-1).mean() / torch.log(torch.tensor(float(own.size(1)))))
    return entropy, cross.argmax(dim=-1).tolist()


@pytest.mark.parametrize("beam", [1, 2, 4])
@pytest.mark.parametrize("search", ["eager", "eager-grouped", "eager-tensors", "device", "device-lexical", "lookahead-lexical"])
def test_the_search_keeps_each_translations_source_entropy_and_alignment(beam, search, monkeypatch):
    """Sentences with an attention_span get, per hypothesis, the cross-attention's entropy of every target
    token and the source position it attends most, following their beams; they are a teacher-forced
    pass's over the hypothesis. Rows without a span keep none, and their translations do not change.
    The eager search (its beams grouped or not; the numbers reckoned in Python or, for many weights, in
    tensor ops) and the device search, whose steps keep them in device buffers (with lexical constraints
    on some sentences: its constrained programs)."""
    if search.endswith("-lexical") and beam == 1:
        pytest.skip("lexical constraints run beam search")
    monkeypatch.setattr(continuous, "GROUPED_BEAM_MIN_ROWS", 8 if search == "eager-grouped" else 1000)
    monkeypatch.setattr(continuous, "ATTENTION_ROWS_ON_HOST", 0 if search == "eager-tensors" else 10**6)
    model = random_model(seed=3)
    runner = ModelRunner(model)
    srcs = sources(12, seed=beam)
    spans = [(i % 2, len(s) - 1) if i % 3 else None for i, s in enumerate(srcs)]  # a language tag's place left out, or not
    terms = [LexicalConstraints(include=((40,),)) if search.endswith("-lexical") and i % 4 == 1 else None for i in range(len(srcs))]
    sentences = [Sentence(i, s, 12, num_hypotheses=beam, attention_span=span, constraints=c)
                 for i, (s, span, c) in enumerate(zip(srcs, spans, terms))]
    kind = search.split("-")[0]
    results = run_staggered(make_search(kind, runner, beam), [sentences[:4], sentences[4:7], sentences[7:]], [0, 2, 3])
    plain = run_staggered(make_search(kind, runner, beam), [[replace(s, attention_span=None) for s in sentences]], [0])
    checked = 0
    for i, span in enumerate(spans):
        assert [h.tokens for h in results[i]] == [h.tokens for h in plain[i]]
        for h in results[i]:
            if span is None:
                assert h.entropies is None and h.looks is None
                continue
            assert len(h.entropies) == len(h.looks) == len(h.tokens) + 1  # eos's row too
            entropy, alignment = forced_attention(model, srcs[i], h.tokens, span)
            assert h.looks == alignment
            if span[1] - span[0] < 2:  # one piece: nowhere else to look
                assert searched_entropy(h.entropies, span) == 0.0
                continue
            assert searched_entropy(h.entropies, span) == pytest.approx(entropy, abs=1e-5)
            checked += 1
    assert checked >= 4
