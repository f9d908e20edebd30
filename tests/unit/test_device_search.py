"""The static decoder and the search with its bookkeeping on the device: the same results as the eager
reference search, through bucket changes, finished rows leaving and every search option; the step
itself against full recomputation, with rows at different positions. On CPU the programs run op by
op; the CUDA tests at the end also capture them as CUDA graphs."""
import time

import pytest
import torch
from conftest import random_model, random_sources, record_reads, waits_without_a_step_queued
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import nmt_serve.inference.device_search as device_search_module
from nmt_serve.inference.device_search import DeviceSearch, supports
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.inference.static_decoder import StaticDecoder, as_words, bucket_of, buckets, length_buckets
from nmt_serve.inference.translator import Translator

SHAPES = [
    dict(),
    dict(norm_placement="pre", activation="gelu"),
    dict(norm_placement="post", activation="swish", positional_layout="halves", final_logits_bias=True),
]


def device_search(model, max_rows=64, max_length=64, check_every=4, lookahead=False, group=1):
    """group: the decoder of one beam size, whose rows share their sentence's source keys and values (as the engine's)."""
    decoder = StaticDecoder(ModelRunner(model), max_rows=max_rows, max_length=max_length, group=group)
    return DeviceSearch(decoder, check_every=check_every, lookahead=lookahead)


def assert_same_results(mine, reference, abs_tol=1e-4):
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=abs_tol)
        assert [h.normalized_score for h in a] == pytest.approx([h.normalized_score for h in b], abs=abs_tol)


def test_buckets():
    assert buckets(20) == [1, 2, 4, 8, 16, 20]
    assert buckets(256, first=32) == [32, 64, 128, 256]
    assert bucket_of(5, buckets(20)) == 8 and bucket_of(17, buckets(20)) == 20
    # positions: powers of two and the sizes halfway between them, as many programs for less padding attended over
    assert length_buckets(256) == [32, 48, 64, 96, 128, 192, 256] and length_buckets(100) == [32, 48, 64, 96, 100]
    assert length_buckets(32, first=32) == [32] and length_buckets(40, first=32) == [32, 40] and length_buckets(20, first=20) == [20]
    assert length_buckets(512, first=20) == [20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 512]
    with pytest.raises(ValueError):
        bucket_of(21, buckets(20))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_row_moves_see_the_cache_as_wide_integers(dtype):
    """Beam reordering and rows leaving gather through an integer view of the cache: the same memory,
    8 bytes an element, and a gather through it moves exactly the bits a gather of the floats moves."""
    cache = torch.randn(2, 6, 3, 16, 64).to(dtype)
    words = as_words(cache)
    assert words.dtype == torch.int64 and words.data_ptr() == cache.data_ptr()
    assert words.shape[-1] == 64 * cache.element_size() // 8
    parent = torch.tensor([2, 2, 0, 5, 1, 1])
    expected = cache[:, parent, :, :9].clone()
    words[:, :6, :, :9] = words[:, parent, :, :9]
    assert torch.equal(cache[:, :, :, :9].view(torch.int16 if dtype != torch.float32 else torch.int32),
                       expected.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert as_words(torch.zeros(4, 3, dtype=torch.float16)).dtype == torch.float16  # 6 bytes a row: left as it is


@pytest.mark.parametrize("overrides", SHAPES)
@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("check_every", [1, 4])
@pytest.mark.parametrize("lookahead", [False, True])
@pytest.mark.parametrize("grouped", [False, True])
def test_device_search_gives_the_reference_results(overrides, beam_size, check_every, lookahead, grouped):
    if grouped and beam_size == 1:
        pytest.skip("a greedy decoder's groups are its rows")
    model = random_model(seed=21, **overrides)
    src = random_sources(11, 9, model.config.src_vocab_size, seed=22)  # 11 sentences: a bucket of 16
    opts = SearchOptions(beam_size=beam_size, num_hypotheses=beam_size, max_length=20)
    reference = generate(ModelRunner(model), src, opts)
    searcher = device_search(model, max_rows=48, check_every=check_every, lookahead=lookahead, group=beam_size if grouped else 1)
    assert_same_results(searcher.search(src, opts), reference)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("options", [
    dict(length_penalty=0.0),
    dict(length_penalty=1.0, min_length=6),
    dict(max_length=3),
    dict(),  # max_length from the source length
    dict(num_hypotheses=2, length_penalty=0.6),
])
@pytest.mark.parametrize("lookahead", [False, True])
def test_device_search_options(beam_size, options, lookahead):
    options = {**options, "num_hypotheses": min(options.get("num_hypotheses", 1), beam_size)}
    model = random_model(seed=23)
    src = random_sources(7, 8, model.config.src_vocab_size, seed=24)
    opts = SearchOptions(beam_size=beam_size, **options)
    reference = generate(ModelRunner(model), src, opts)
    for group in {1, beam_size}:
        assert_same_results(device_search(model, lookahead=lookahead, group=group).search(src, opts), reference)


@pytest.mark.parametrize("lookahead", [False, True])
def test_rows_leave_and_the_bucket_shrinks(lookahead):
    """Sentences that finish early leave the running rows; the rest keep their results."""
    model = random_model(seed=25, final_logits_bias=True)
    cfg = model.config
    model.logits_bias.zero_()
    model.logits_bias[cfg.eos_id] = 3.0  # eos likely enough that sentences end at many different steps
    src = random_sources(37, 10, cfg.src_vocab_size, seed=26)
    for beam_size, group in ((1, 1), (2, 1), (2, 2)):
        opts = SearchOptions(beam_size=beam_size, max_length=40, num_hypotheses=beam_size)
        searcher = device_search(model, max_rows=128, check_every=1, lookahead=lookahead, group=group)
        reference = generate(ModelRunner(model), src, opts)
        lengths = {len(h[0].tokens) for h in reference}
        assert len(lengths) > 3  # really finishing at different steps
        assert_same_results(searcher.search(src, opts), reference)
        # the decoder is reused: a second, different search over the same buffers
        assert_same_results(searcher.search(src[:5], opts), generate(ModelRunner(model), src[:5], opts))


@pytest.mark.parametrize("beam_size", [1, 2])
def test_with_lookahead_no_read_is_waited_for_without_a_step_queued_behind_it(monkeypatch, beam_size):
    """With lookahead, each read back (which sentences still search, the finished ones' hypotheses) is
    waited for only once a later step is queued: on a GPU, that step runs while the host waits and works
    on the read. Without it, every check's read waits with nothing queued. The results are the same."""
    model = random_model(seed=25, final_logits_bias=True)
    cfg = model.config
    model.logits_bias.zero_()
    model.logits_bias[cfg.eos_id] = 3.0  # sentences end at many different steps: the bucket shrinks
    src = random_sources(37, 10, cfg.src_vocab_size, seed=26)
    opts = SearchOptions(beam_size=beam_size, max_length=40, num_hypotheses=beam_size)
    found, idle = {}, {}
    for lookahead in (False, True):
        searcher = device_search(model, max_rows=128, check_every=2, lookahead=lookahead)
        log = record_reads(monkeypatch, [device_search_module], searcher.decoder)
        found[lookahead] = searcher.search(src, opts)
        idle[lookahead] = waits_without_a_step_queued(log)
        assert sum(kind == "wait" for kind, _ in log) >= 8  # checks, and reads of the finished as the bucket shrank
    assert idle[True] == 0 and idle[False] >= 8
    # the same tokens, the scores to float32's rounding: with lookahead the bucket shrinks a step later, so some steps
    # run with more rows, and the CPU's scaled_dot_product_attention with 2 threads splits its work by the batch: a
    # row's attention then rounds differently (16 of 32 rows at a batch of 64 against 32, a 2-core AMD EPYC)
    assert_same_results(found[True], found[False])


@pytest.mark.parametrize("repeat", [1, 4])
def test_sources_load_a_few_sentences_at_a_time_into_the_same_rows(monkeypatch, repeat):
    """load_sources bounds its temporary (LOAD_CHUNK_BYTES): a batch loaded two sentences at a time fills the
    buffer as one loaded at once, each sentence's keys and values in its `repeat` rows; the search's results
    with it are the eager reference's."""
    from nmt_serve.inference import static_decoder

    model = random_model(seed=41)
    cfg = model.config
    src = random_sources(5, 9, cfg.src_vocab_size, seed=42)
    per_sentence = 9 * cfg.n_decoder_layers * 2 * cfg.d_model * 4  # positions x layers x (keys, values) x width, float32
    loaded, calls = [], []
    for budget in (static_decoder.LOAD_CHUNK_BYTES, 2 * per_sentence):
        monkeypatch.setattr(static_decoder, "LOAD_CHUNK_BYTES", budget)
        decoder = StaticDecoder(ModelRunner(model), max_rows=24, max_length=32)
        project = decoder.runner.cross_kv
        decoder.runner.cross_kv = lambda states, project=project: calls.append(budget) or project(states)
        with torch.inference_mode():
            n = decoder.load_sources(src, repeat=repeat, bucket_rows=24)
        loaded.append((n, decoder.cross_kv.clone(), decoder.src_len.clone()))
    assert calls.count(2 * per_sentence) == 3 and len(calls) == 4  # 2 + 2 + 1 sentences against all 5 at once
    (n, whole, lengths), (n2, chunked, lengths2) = loaded
    assert n == n2 == 5 * repeat and torch.equal(lengths, lengths2)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)  # (a smaller matmul may round apart on some CPUs)
    for sentence in range(5):  # its rows hold its own keys and values, alike
        rows = chunked[:, :, sentence * repeat:(sentence + 1) * repeat]
        assert torch.equal(rows, rows[:, :, :1].expand_as(rows))
    options = SearchOptions(beam_size=repeat, max_length=8)  # searched with the two-sentence budget still set
    search = DeviceSearch(StaticDecoder(ModelRunner(model), max_rows=24, max_length=32))
    assert [[h.tokens for h in hyps] for hyps in search.search(src, options)] == \
        [[h.tokens for h in hyps] for hyps in generate(ModelRunner(model), src, options)]
    # a decoder of that beam size holds each sentence's once, in its group's slot
    grouped = StaticDecoder(ModelRunner(model), max_rows=24, max_length=32, group=repeat)
    assert grouped.cross_kv.size(2) == 24 // repeat
    with torch.inference_mode():
        grouped.load_sources(src, repeat=repeat, bucket_rows=24)
    torch.testing.assert_close(grouped.cross_kv[:, :, :5], whole[:, :, :5 * repeat:repeat], rtol=1e-5, atol=1e-6)
    assert torch.equal(grouped.src_len[:5 * repeat], lengths[:5 * repeat])


def test_step_rows_at_different_positions_match_recomputation():
    """One step over rows that joined at different times (each at its own position, with its own
    source length) gives each row the logits of decoding its own prefix alone."""
    model = random_model(seed=27)
    cfg = model.config
    decoder = StaticDecoder(ModelRunner(model), max_rows=8, max_length=32)
    src = random_sources(3, 7, cfg.src_vocab_size, seed=28)
    prefixes = torch.randint(4, cfg.tgt_vocab_size, (3, 12))
    prefixes[:, 0] = cfg.decoder_start_id
    with torch.inference_mode():
        decoder.load_sources(src)
        starts = [0, 3, 5]  # row r joins at step starts[r]
        for t in range(10):
            running = [r for r in range(3) if t >= starts[r]]
            for r in range(3):
                decoder.pos[r] = t - starts[r] if t >= starts[r] else 0
                decoder.tokens[r] = prefixes[r, t - starts[r]] if t >= starts[r] else cfg.decoder_start_id
            logits = decoder.step(3, 32)
            for r in running:
                n = t - starts[r] + 1
                full = model(src[r : r + 1], prefixes[r : r + 1, :n])[0, -1]
                assert (logits[r] - full).abs().max().item() <= 1e-4


def test_supports_leaves_what_it_cannot_do_to_the_eager_search():
    model = random_model(seed=29)
    decoder = StaticDecoder(ModelRunner(model), max_rows=8, max_length=32)
    src = random_sources(2, 6, 64, seed=30)
    assert supports(decoder, src, SearchOptions(beam_size=4, max_length=20))
    assert not supports(decoder, src, SearchOptions(beam_size=4, max_length=40))  # past max_length
    assert not supports(decoder, src, SearchOptions(beam_size=8, max_length=20))  # 16 rows > 8
    assert not supports(decoder, src, SearchOptions(beam_size=2, no_repeat_ngram_size=2))
    assert not supports(decoder, src, SearchOptions(beam_size=2, use_cache=False))
    with pytest.raises(ValueError, match="max_positions"):
        StaticDecoder(ModelRunner(model), max_length=10_000)


def test_translator_step_modes_agree(tiny_checkpoint):
    sentences = ["Ein Hund läuft.", "Zwei Kinder spielen im Schnee mit einem Ball.", "", "Hallo"]
    eager = Translator.load(tiny_checkpoint, device="cpu", step_mode="eager")
    static = Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=32, static_length=64)
    assert not eager.uses_static_decoder and static.uses_static_decoder
    for options in (dict(beam_size=1), dict(beam_size=4, num_hypotheses=2), dict(beam_size=2, no_repeat_ngram_size=2)):
        a = eager.translate(sentences, return_scores=True, max_length=12, **options)
        b = static.translate(sentences, return_scores=True, max_length=12, **options)
        assert [[h.tokens for h in r.hypotheses] for r in a] == [[h.tokens for h in r.hypotheses] for r in b]
    assert static.static_memory()["buffers_bytes"] > 0 and eager.static_memory() is None
    with pytest.raises(ValueError, match="step_mode"):
        Translator.load(tiny_checkpoint, device="cpu", step_mode="fast")


def test_translate_runs_more_sentences_than_a_batch_continuously(tiny_checkpoint, monkeypatch):
    """Past one batch the static decoder's translate() joins sentences as others leave (the engine's search):
    the same hypotheses as the eager search's, in input order, sentences that do not fit it in batches."""
    from nmt_serve.inference import translator as translator_module

    sentences = [f"Ein Hund läuft {i} mal über die Wiese." if i % 3 else "Hallo" for i in range(11)] + [""]
    eager = Translator.load(tiny_checkpoint, device="cpu", step_mode="eager")
    static = Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=16, static_length=64)
    joins = []
    add = translator_module.ContinuousDeviceSearch.add
    monkeypatch.setattr(translator_module.ContinuousDeviceSearch, "add", lambda self, s: joins.append(len(s)) or add(self, s))
    for options in (dict(beam_size=1), dict(beam_size=4, num_hypotheses=2, length_penalty=0.6), dict(beam_size=2, min_length=3)):
        joins.clear()
        a = eager.translate(sentences, return_scores=True, max_length=12, max_batch_size=3, **options)
        b = static.translate(sentences, return_scores=True, max_length=12, max_batch_size=3, **options)
        assert [[(h.tokens, round(h.score, 4)) for h in r.hypotheses] for r in a] == [[(h.tokens, round(h.score, 4)) for h in r.hypotheses]
                                                                                     for r in b]
        # 11 sentences, at most 3 running (16 rows hold 4 of beam 4): joins while others run
        assert sum(joins) == 11 and len(joins) > 3 and max(joins) <= 3
    # a deadline past ends it as it ends a batch
    from nmt_serve.inference.search import DeadlineExceeded

    with pytest.raises(DeadlineExceeded):
        static.translate(sentences, max_length=12, max_batch_size=3, deadline=time.monotonic() - 1)
    # a source longer than the decoder's 64 positions goes through the batches instead
    long = ["Hund " * 80, *sentences[:4]]
    assert [r.hypotheses[0].tokens for r in static.translate(long, beam_size=1, max_length=8, max_batch_size=2)] == \
        [r.hypotheses[0].tokens for r in eager.translate(long, beam_size=1, max_length=8, max_batch_size=2)]


def test_step_attention_by_matmul_gives_the_sdpa_results(tiny_checkpoint, monkeypatch):
    """The step's attention as two products around a softmax (static_decoder.STEP_ATTENTION "matmul", the
    alternative gpu-rows.sh's step-attention stage times) translates as scaled_dot_product_attention does."""
    from nmt_serve.inference import static_decoder

    sentences = ["Ein Hund läuft.", "Zwei Kinder spielen im Schnee mit einem Ball.", "Hallo", "Eine Frau liest ein Buch im Park."]
    q, k, v = torch.randn(3, 2, 1, 8), torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)[:, None, None, :]
    want = static_decoder.attend(q[:2], k[:2], v[:2], mask[:2])
    results = {}
    for impl in ("sdpa", "matmul"):
        monkeypatch.setattr(static_decoder, "STEP_ATTENTION", impl)
        translator = Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=32, static_length=64)
        results[impl] = [[h.tokens for h in r.hypotheses] for beam in (1, 4)
                         for r in translator.translate(sentences, beam_size=beam, num_hypotheses=beam, max_length=12)]
    torch.testing.assert_close(static_decoder.attend(q[:2], k[:2], v[:2], mask[:2]), want)
    assert torch.isfinite(static_decoder.attend(q, k, v, mask)).all()  # a row with nothing to attend: no NaN
    assert results["matmul"] == results["sdpa"]


def test_static_decoder_is_remade_when_the_weights_change(tiny_checkpoint):
    translator = Translator.load(tiny_checkpoint, device="cpu", step_mode="static", static_rows=16, static_length=64)
    translator.translate(["Hallo Welt"], beam_size=2, max_length=8)
    first = translator.device_search()
    with torch.no_grad():
        translator.model.decoder_layers[0].ffn.fc1.weight.mul_(-2.0)
    assert translator.device_search() is not first


cuda = pytest.mark.cuda


class HostTensors(TorchDispatchMode):
    """Records every op that takes or gives a tensor off the meta device (other than a 0-dim scalar):
    inside a captured program that would be a copy from or to the host."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((args, kwargs, out))[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and t.dim() > 0:
                self.seen.append(str(func))
        return out


@pytest.mark.parametrize("overrides", SHAPES[:2])
def test_the_programs_never_read_the_device_nor_the_host(overrides):
    """What a CUDA graph captures must not wait for the device (no .item(), bool(), .tolist(), nonzero or
    boolean-mask indexing, no shape that depends on values) and must not copy from the host. On the
    meta device every read of values raises, and HostTensors sees any tensor off it: running every kind
    of program there (steps of each beam size, constrained steps, joins) shows both without a GPU."""
    model = random_model(seed=41, **overrides).to("meta")
    decoder = StaticDecoder(ModelRunner(model), max_rows=16, max_length=64, capture=False)
    searcher = DeviceSearch(decoder, check_every=4)

    def run(key, fn):
        with HostTensors() as host:
            decoder.run(key, fn)
        assert host.seen == [], f"{key} copies from the host: {host.seen}"

    programs = 0
    with torch.inference_mode():
        for K in (1, 3):
            slots = searcher.slots(K)
            for G in slots.group_buckets[:2]:
                for L in decoder.length_buckets:
                    run(*searcher.program(K, G, L))
                    programs += 1
                    if K > 1:
                        slots.constraints()
                        run(*searcher.program(K, G, L, 2))
                        programs += 1
                for min_length in (0, 2):
                    run(*searcher.join_program(K, G, 32, min_length))
                    programs += 1
        # per beam size 2 group buckets x 3 lengths (32, 48, 64), twice with constraints at beam 3; 2 x 2 joins
        assert decoder.length_buckets == [32, 48, 64] and programs == (6 + 4) + (12 + 4)
        # a decoder of beam size 3 alone, its rows' source shared by groups: steps (with attention kept) and joins
        grouped = StaticDecoder(ModelRunner(model), max_rows=15, max_length=64, capture=False, group=3)
        searcher, decoder = DeviceSearch(grouped, check_every=4), grouped
        for G in searcher.slots(3).group_buckets[:2]:
            run(*searcher.program(3, G, 48, attention=True))
            run(*searcher.join_program(3, G, 32, 0))
        with pytest.raises(ValueError, match="groups of 3"):
            searcher.slots(1)
        # and either kind of fault is caught
        with pytest.raises(RuntimeError, match="meta"):
            decoder.run(("reads",), lambda: decoder.pos.fill_(int(decoder.src_len.max())))
        with pytest.raises(AssertionError, match="copies from the host"):
            run(("copies",), lambda: decoder.pos[:2].copy_(torch.tensor([1, 2])))

@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("grouped", [False, True])
def test_captured_graphs_give_the_eager_static_results_on_cuda(dtype, beam_size, grouped):
    model = random_model(seed=31).to("cuda", dtype)
    src = random_sources(13, 9, 64, seed=32).cuda()
    opts = SearchOptions(beam_size=beam_size, num_hypotheses=beam_size, max_length=20)
    runner = ModelRunner(model)
    group = beam_size if grouped else 1  # grouped: the engine's decoder of one beam size
    captured = DeviceSearch(StaticDecoder(runner, max_rows=64, max_length=64, group=group), check_every=1)
    assert captured.decoder.capture
    eager = DeviceSearch(StaticDecoder(runner, max_rows=64, max_length=64, capture=False, group=group), check_every=1)
    first = captured.search(src, opts)  # captures as it goes
    again = captured.search(src, opts)  # replays
    reference = eager.search(src, opts)
    assert_same_results(first, reference, abs_tol=0)
    assert_same_results(again, reference, abs_tol=0)
    memory = captured.decoder.memory()
    assert memory["graphs"] > 0 and memory["buffers_bytes"] > 0
    if dtype == torch.float32:
        assert_same_results(first, generate(runner, src, opts), abs_tol=1e-3)


@cuda
@pytest.mark.parametrize("beam_size", [1, 4])
def test_translate_continuously_on_cuda_gives_the_batches_results(tiny_checkpoint, beam_size):
    """translate() past one batch (the continuous search, captured joins and steps, reads a step later) against
    the same sentences in batches of generate() on the same static decoder."""
    translator = Translator.load(tiny_checkpoint, device="cuda", dtype="float32", static_rows=64, static_length=64)
    texts = [f"Ein Hund läuft {i} mal über die Wiese." if i % 3 else "Zwei Kinder spielen." for i in range(40)]
    continuous = translator.translate(texts, beam_size=beam_size, max_length=16, max_batch_size=8)
    batches = [r for i in range(0, 40, 8) for r in translator.translate(texts[i:i + 8], beam_size=beam_size, max_length=16,
                                                                         max_batch_size=8)]
    assert [r.hypotheses[0].tokens for r in continuous] == [r.hypotheses[0].tokens for r in batches]


@cuda
def test_warmup_captures_every_bucket_on_cuda():
    model = random_model(seed=33).to("cuda", torch.float16)
    searcher = DeviceSearch(StaticDecoder(ModelRunner(model), max_rows=64, max_length=64))
    programs = searcher.warmup(beam_sizes=(1, 4))
    # group buckets 1-64 (greedy) and 1-16 (4 beams) x length buckets 32, 48, 64
    assert programs == len(searcher.decoder.graphs) == (7 + 5) * 3
    src = random_sources(3, 9, 64, seed=34).cuda()
    searcher.search(src, SearchOptions(beam_size=4, max_length=20))
    assert len(searcher.decoder.graphs) == programs  # nothing new to capture
