"""A decoder step of a few rows in one kernel call (inference/row_step.py): the logits, the cache's new
position and the attention weights the runner's own step gives, for every layout it takes; every other step is the
runner's own."""
import pytest
import torch

from nmt_serve.inference import row_products, row_step
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.translator import Translator
from tests.conftest import random_model, random_sources

pytestmark = pytest.mark.skipif(not row_step.available(), reason="numba's kernels do not run here")


def stepped(runner: ModelRunner, src: torch.Tensor, kernel: bool, steps: int = 4, cross: bool = False):
    """Logits of each step of greedy decoding from bos, the cache after them, and each step's attention weights."""
    saved = runner.row_step
    runner.row_step = saved if kernel else None
    try:
        with torch.inference_mode():
            cache = runner.new_cache(*runner.encode(src))
            tokens = torch.full((src.size(0),), runner.config.bos_id, dtype=torch.long)
            logits, weights = [], []
            for _ in range(steps):
                kept = [] if cross else None
                logits.append(runner.step(tokens, cache, kept))
                weights += kept or []
                tokens = logits[-1].argmax(-1)
            return logits, cache, weights
    finally:
        runner.row_step = saved


def spy(step: row_step.RowStep, record) -> None:
    """Every call of the step's kernels, on one thread or on several, passes record(args, the kernel's name) first."""
    for name in ("kernel", "split_kernel"):
        if (kernel := getattr(step, name)) is not None:
            setattr(step, name, lambda *args, kernel=kernel, name=name: record(args, name) or kernel(*args))


def runner_of(quantization: str = "none", **config) -> ModelRunner:
    model = random_model(seed=3, **config)
    with torch.no_grad():  # norms of their own, so that one read in another's place shows
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
    runner = ModelRunner(model, quantization)
    if runner.row_step is None:
        pytest.skip("the runner's weights are not laid out for the kernels here (an Intel CPU's small float weights)")
    return runner


@pytest.mark.parametrize("quantization", ["none", "int8"])
@pytest.mark.parametrize("placement,activation", [("post", "relu"), ("pre", "gelu"), ("pre", "swish")])
@pytest.mark.parametrize("rows,padded", [(1, False), (2, False), (2, True), (4, True)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_kernel_steps_as_the_runner_does(quantization, placement, activation, rows, padded, threads, monkeypatch):
    """Logits and the cache's keys and values to float precision. The runner's own int8 step of more than
    row_products.ROWS rows quantizes its rows for fbgemm, where the kernel keeps them in float32: the reference reads
    them through row_products' kernel too."""
    monkeypatch.setattr(row_products, "ROWS", max(row_products.ROWS, rows))
    runner = runner_of(quantization, norm_placement=placement, activation=activation)
    src = random_sources(rows, 7, runner.config.src_vocab_size, seed=4)
    if not padded:
        src = src.masked_fill(src == runner.config.pad_id, 5)
    calls = []
    spy(runner.row_step, lambda args, name: calls.append((name, args[-1])))  # which kernel each step calls, on what
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        logits, cache, _ = stepped(runner, src, kernel=True)
        expected, expected_cache, _ = stepped(runner, src, kernel=False)
    finally:
        torch.set_num_threads(before)
    assert (cache.src_mask is not None) == padded
    split = min(threads, row_products._max_threads) if runner.row_step.split_kernel is not None else 1
    assert calls == [("split_kernel" if split > 1 else "kernel", split)] * 4  # each step on its threads, in one call
    for got, want in zip(logits, expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert cache.length == expected_cache.length == 4
    torch.testing.assert_close(cache.self_kv[..., :4, :], expected_cache.self_kv[..., :4, :], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_step_keeping_its_attention_weights_steps_as_without_them(threads):
    """The cross-attention weights come from the queries the kernel keeps: the logits bit for bit what the kernel
    gives without them, the weights the runner's own (on 2 threads each thread's rows attend in a part of their own)."""
    runner = runner_of()
    src = random_sources(3, 7, runner.config.src_vocab_size, seed=4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        logits, _, weights = stepped(runner, src, kernel=True, cross=True)
        assert all(torch.equal(a, b) for a, b in zip(logits, stepped(runner, src, kernel=True)[0]))
    finally:
        torch.set_num_threads(before)
    _, _, expected = stepped(runner, src, kernel=False, cross=True)
    assert len(weights) == len(expected) == 4 and weights[0].shape == (3, src.size(1))
    for got, want in zip(weights, expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_other_steps_are_the_runners_own(threads):
    """More rows than the kernel takes on the step's threads, and a grouped cache (beams), step as before."""
    runner = runner_of()
    calls = []
    spy(runner.row_step, lambda args, _: calls.append(args[1]))
    V = runner.config.src_vocab_size
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        most = row_step.ROWS_PER_THREAD * (threads if row_products.splits() else 1)
        stepped(runner, random_sources(most, 5, V), kernel=True, steps=1)
        stepped(runner, random_sources(most + 1, 5, V), kernel=True, steps=1)
    finally:
        torch.set_num_threads(before)
    assert calls == [most]
    calls.clear()
    with torch.inference_mode():
        cache = runner.new_cache(*runner.encode(random_sources(1, 5, V)))
        cache.expand(torch.zeros(2, dtype=torch.long), 2)
        runner.step(torch.tensor([4, 5]), cache)
        assert cache.grouped and calls == []


def test_rows_that_joined_a_running_batch_attend_from_their_own_first_position():
    """Continuous batching: a sentence joins a running one (appended, then in the row of one that left); the
    kernel's steps give the runner's own logits, the joined rows attending only to positions of their own."""
    runner = runner_of()
    V = runner.config.src_vocab_size
    calls = []
    spy(runner.row_step, lambda args, _: calls.append(args[1]))

    def run(with_kernel: bool) -> list[torch.Tensor]:
        saved = runner.row_step
        runner.row_step = saved if with_kernel else None
        logits = []
        try:
            with torch.inference_mode():
                cache = runner.new_cache(*runner.encode(random_sources(1, 6, V, seed=1)))
                tokens = torch.tensor([4])
                for step in range(7):
                    if step in (2, 4):  # a sentence joins: appended, then in the first row's place
                        states, mask = runner.encode(random_sources(1, 4 + step, V, seed=step))
                        cache.join(runner.source_kv(states), None, None if step == 2 else torch.tensor([0]))
                        tokens = torch.cat([tokens, tokens[:1]]) if step == 2 else tokens
                    logits.append(runner.step(tokens, cache))
                    tokens = logits[-1].argmax(-1)
                assert cache.start is not None
        finally:
            runner.row_step = saved
        return logits

    got = run(True)
    assert calls == [1, 1, 2, 2, 2, 2, 2]
    for a, b in zip(got, run(False)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("beam", [1, 2])
def test_translations_are_the_runners_own(tiny_checkpoint, beam, monkeypatch):
    with_kernel = Translator.load(tiny_checkpoint, device="cpu")
    monkeypatch.setattr(row_step, "ENABLED", False)
    without = Translator.load(tiny_checkpoint, device="cpu")
    assert with_kernel.runner.row_step is not None and without.runner.row_step is None
    texts = ["ein kleines Haus", "zwei Hunde laufen schnell über die grüne Wiese am Fluss"]
    for batch in (texts[:1], texts):
        a = with_kernel.translate(batch, beam_size=beam, max_length=12, return_scores=True)
        b = without.translate(batch, beam_size=beam, max_length=12, return_scores=True)
        assert [r.text for r in a] == [r.text for r in b]
        assert [r.hypotheses[0].score for r in a] == pytest.approx([r.hypotheses[0].score for r in b], abs=1e-4)


@pytest.mark.parametrize("embedding_norm,big_output", [(True, False), (False, True), (True, True)])
def test_ends_the_kernel_does_not_read_stay_the_runners(embedding_norm, big_output, monkeypatch):
    """An embedding with a norm of its own (mBART's) is embedded by the runner, and an output layer the kernel does
    not read (an int8 one too large for row_products: fbgemm's) is the runner's; the rest of the step is the kernel's,
    and the logits what the runner's own step gives."""
    if big_output:  # the layers' int8 weights within row_products' limit, the output layer past it
        monkeypatch.setattr(row_products, "INT8_MAX_BYTES", 4000)
    runner = runner_of("int8" if big_output else "none", norm_placement="pre", embedding_norm=embedding_norm,
                       src_vocab_size=200, tgt_vocab_size=200)
    assert (runner.row_step.embeds, runner.row_step.output_rows > 0) == (not embedding_norm, not big_output)
    calls = []
    spy(runner.row_step, lambda args, _: calls.append(args[1]))
    src = random_sources(2, 7, runner.config.src_vocab_size, seed=4)
    logits, _, _ = stepped(runner, src, kernel=True)
    expected, _, _ = stepped(runner, src, kernel=False)
    assert calls == [2] * 4
    for got, want in zip(logits, expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_an_int8_output_layer_of_more_rows_than_row_products_takes_is_the_runners(quantization):
    """The kernel computes the logits of a float step of any rows it takes, an int8 one's up to row_products.ROWS rows
    (past them fbgemm's quantized product is the faster, as the runner's own output layer has it)."""
    runner = runner_of(quantization)
    most = row_step.ROWS_PER_THREAD
    outputs = []
    spy(runner.row_step, lambda args, _: outputs.append((args[1], args[-3] != 0)))
    V = runner.config.src_vocab_size
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rows in range(1, most + 1):
            logits, _, _ = stepped(runner, random_sources(rows, 5, V, seed=rows), kernel=True, steps=1)
            expected, _, _ = stepped(runner, random_sources(rows, 5, V, seed=rows), kernel=False, steps=1)
            if quantization == "none" or rows <= row_products.ROWS:  # the runner's own int8 step quantizes more rows
                torch.testing.assert_close(logits[0], expected[0], atol=1e-4, rtol=1e-4)
    finally:
        torch.set_num_threads(before)
    limit = row_products.ROWS if quantization == "int8" else most
    assert outputs == [(rows, rows <= limit) for rows in range(1, most + 1)]


@pytest.mark.skipif(not row_products.splits(), reason="numba's OpenMP pool does not serve here")
@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_a_step_on_two_threads_is_the_step_on_one_even_where_one_thread_does_all_of_it(quantization, monkeypatch):
    """The step on several threads (one parallel region, its phases' parts taken by whichever thread asks first) gives
    the logits and the cache of the step on one, bit for bit. Where numba's pool runs the region's two iterations one
    after the other (a share of one thread), the first takes every part and the second finds them done: the step ends,
    the same, rather than waiting for a thread that does not come."""
    import threading

    import numba

    runner = runner_of(quantization, norm_placement="pre", activation="gelu")
    assert runner.row_step.split_kernel is not None
    src = random_sources(3, 7, runner.config.src_vocab_size, seed=5)
    calls = []
    spy(runner.row_step, lambda args, name: calls.append((name, args[-1])))
    before = torch.get_num_threads()
    results = {}
    try:
        for label, threads, alone in (("one", 1, False), ("two", 2, False), ("two, in turn", 2, True)):
            torch.set_num_threads(threads)
            if alone:  # the region's iterations on one thread of the pool, in turn
                monkeypatch.setattr(row_products, "_share", lambda n: numba.set_num_threads(1) or n)
            done = threading.Thread(target=lambda label=label: results.__setitem__(label, stepped(runner, src, kernel=True)),
                                    daemon=True)
            done.start()
            done.join(120)
            assert not done.is_alive(), f"the step on {label} thread(s) did not end"
    finally:
        torch.set_num_threads(before)
        row_products._pool.__dict__.clear()  # numba's share is set again at the next split
    assert calls == [("kernel", 1)] * 4 + [("split_kernel", 2)] * 8
    for label in ("two", "two, in turn"):
        logits, cache, _ = results[label]
        for got, want in zip(logits, results["one"][0]):
            assert torch.equal(got, want), label
        assert torch.equal(cache.self_kv[..., :4, :], results["one"][1].self_kv[..., :4, :]), label
