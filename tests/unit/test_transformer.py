"""Model invariants: KV cache equals recomputation, causality, padding, attention normalization."""
import itertools
import random

import pytest
import torch
from conftest import random_model, random_sources

import nmt_serve.inference.cache as cache_module
import nmt_serve.inference.model_runner as engine_module
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.cache import KVCache
from nmt_serve.inference.search import SearchOptions, generate, survivors_order
from nmt_serve.network.transformer import causal_mask, padding_mask, sinusoidal_table

SHAPES = [
    dict(),
    dict(norm_placement="pre", activation="gelu"),
    dict(norm_placement="post", activation="swish", positional_layout="halves", final_logits_bias=True),
    dict(share_embeddings=False, tie_output=False, src_vocab_size=50, tgt_vocab_size=70, d_model=48, n_heads=6),
    dict(n_encoder_layers=1, n_decoder_layers=3, d_model=16, n_heads=2, scale_embeddings=False),
]


def teacher_forced_and_cached(model, src, tgt_in):
    full = model(src, tgt_in)
    runner = ModelRunner(model)
    cache = runner.new_cache(*runner.encode(src))
    steps = [runner.step(tgt_in[:, t], cache)[:, None] for t in range(tgt_in.size(1))]
    return full, torch.cat(steps, dim=1)


@pytest.mark.parametrize("overrides", SHAPES)
def test_kv_cache_matches_full_recomputation(overrides):
    model = random_model(seed=1, **overrides)
    cfg = model.config
    src = random_sources(4, 9, cfg.src_vocab_size, seed=2)
    tgt_in = torch.randint(4, cfg.tgt_vocab_size, (4, 40))  # longer than the cache's first capacity: it must grow
    tgt_in[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        full, cached = teacher_forced_and_cached(model, src, tgt_in)
    assert (full - cached).abs().max().item() <= 1e-5


@pytest.mark.parametrize("overrides", SHAPES[:3])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_cached_search_gives_same_outputs(overrides, beam_size, beam_cache_mode):
    model = random_model(seed=4, **overrides)
    src = random_sources(5, 8, model.config.src_vocab_size, seed=5)
    opts = dict(beam_size=beam_size, num_hypotheses=beam_size, max_length=12)
    cached = generate(ModelRunner(model), src, SearchOptions(**opts, use_cache=True))
    recomputed = generate(ModelRunner(model), src, SearchOptions(**opts, use_cache=False))
    for a, b in zip(cached, recomputed):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)


def test_cache_reorder_follows_indices():
    model = random_model(seed=6)
    src = random_sources(3, 6, model.config.src_vocab_size, seed=7)
    tgt_in = torch.randint(4, 64, (3, 5))
    with torch.no_grad():
        runner = ModelRunner(model)
        cache = runner.new_cache(*runner.encode(src))
        for t in range(3):
            runner.step(tgt_in[:, t], cache)
        order = torch.tensor([2, 0, 0])  # a beam-like reorder that also duplicates a row
        cache.reorder(order)
        after = torch.stack([runner.step(tgt_in[order, t], cache) for t in range(3, 5)], 1)
        reference = model(src[order], tgt_in[order])[:, 3:5]
    assert (after - reference).abs().max().item() <= 1e-5
    assert cache.batch_size == 3 and cache.length == 5


def beam_cache(rows: int, length: int, capacity: int = 8, seed: int = 0) -> KVCache:
    """A cache of `rows` rows holding `length` random positions of 2 layers (3 heads of 4)."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(torch.randn(2, 2, rows, 3, 5, 4, generator=g), None, capacity)
    cache._make_room()
    if length > cache.capacity:
        cache._grow(length)
    cache._self_kv.copy_(torch.randn(cache._self_kv.shape, generator=g))
    cache.length = length
    return cache


@pytest.mark.skipif(cache_module._move_kernel() is None, reason="needs numba's kernels")
def test_beam_reorders_move_rows_within_the_buffer_as_a_copy_into_the_spare_one_does(monkeypatch):
    """A reorder within sentences (cross=False) on the CPU copies the rows that change in place (row_kernels.move_rows):
    every parent pattern of up to 4 rows (chains, swaps, cycles, one parent for all), random ones of 7, a grown
    cache and one with nothing stored yet give the rows the index_select into the spare buffer gives."""
    patterns = [list(p) for n in range(1, 5) for p in itertools.product(range(n), repeat=n)]
    rng = random.Random(0)
    patterns += [[rng.randrange(7) for _ in range(7)] for _ in range(100)] + [rng.sample(range(7), 7) for _ in range(20)]
    for i, parents in enumerate(patterns):
        length = (0, 3, 8, 21)[i % 4]  # 21: past the first capacity, the buffer grown
        moved, copied = beam_cache(len(parents), length, seed=i), beam_cache(len(parents), length, seed=i)
        buffer = moved._self_kv.data_ptr()
        index = torch.tensor(parents)
        monkeypatch.setattr(cache_module, "MOVE_ROWS", True)
        moved.reorder(index, cross=False)
        monkeypatch.setattr(cache_module, "MOVE_ROWS", False)
        copied.reorder(index, cross=False)
        assert moved._self_kv.data_ptr() == buffer, "moved within its own buffer"
        assert torch.equal(moved.self_kv.narrow(4, 0, length), copied.self_kv.narrow(4, 0, length)), parents
        assert moved.length == copied.length == length and moved.batch_size == len(parents)
    # a parent that is not a row is refused before anything moves, as the index_select refuses it
    monkeypatch.setattr(cache_module, "MOVE_ROWS", True)
    cache = beam_cache(3, 4)
    before = cache.self_kv.clone()
    with pytest.raises(IndexError):
        cache.reorder(torch.tensor([0, 1, 3]), cross=False)
    assert torch.equal(cache.self_kv, before)


def test_causality_future_tokens_do_not_change_past_logits():
    model = random_model(seed=8, norm_placement="pre")
    src = random_sources(2, 7, 64, seed=9)
    tgt = torch.randint(4, 64, (2, 10))
    with torch.no_grad():
        base = model(src, tgt)
        for t in range(0, 9):
            changed = tgt.clone()
            changed[:, t + 1 :] = torch.randint(4, 64, changed[:, t + 1 :].shape)
            out = model(src, changed)
            assert (out[:, : t + 1] - base[:, : t + 1]).abs().max().item() <= 1e-6
            assert (out[:, t + 1 :] - base[:, t + 1 :]).abs().max().item() > 1e-3  # the change is visible later


def test_extra_padding_does_not_change_encoder_states():
    model = random_model(seed=10)
    src = random_sources(3, 6, 64, seed=11)
    padded = torch.cat([src, torch.zeros(3, 7, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model.encode(src).states
        b = model.encode(padded).states
    real = src != 0
    assert (a[real] - b[:, :6][real]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("beam_size", [1, 4])
def test_sentence_alone_and_in_a_batch_give_identical_tokens(beam_size):
    model = random_model(seed=12)
    src = random_sources(6, 12, 64, seed=13)
    opts = SearchOptions(beam_size=beam_size, max_length=15)
    batched = generate(ModelRunner(model), src, opts)
    for i in range(src.size(0)):
        length = int((src[i] != 0).sum())
        alone = generate(ModelRunner(model), src[i : i + 1, :length], opts)
        assert alone[0][0].tokens == batched[i][0].tokens


def test_masks_follow_one_convention():
    tokens = torch.tensor([[5, 6, 3, 0], [5, 3, 0, 0]])
    pm = padding_mask(tokens, pad_id=0)
    assert pm.shape == (2, 1, 1, 4) and pm.dtype == torch.bool
    assert pm[0, 0, 0].tolist() == [True, True, True, False]
    cm = causal_mask(3, torch.device("cpu"))[0, 0]
    assert cm.tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_sinusoidal_layouts():
    inter = sinusoidal_table(5, 8, "interleaved")
    halves = sinusoidal_table(5, 8, "halves")
    assert torch.allclose(inter[:, 0::2], halves[:, :4]) and torch.allclose(inter[:, 1::2], halves[:, 4:])
    assert torch.allclose(inter[0], torch.tensor([0.0, 1.0] * 4))


def test_attention_probabilities_are_normalized_and_causal():
    model = random_model(seed=14)
    src = random_sources(3, 7, 64, seed=15)
    tgt = torch.randint(4, 64, (3, 6))
    with torch.no_grad():
        enc = model.encode(src, need_weights=True)
        dec = model.decode(tgt, enc, need_weights=True)
        fast = model.decode(tgt, model.encode(src)).logits
    assert (dec.logits - fast).abs().max() <= 1e-5  # explicit path == SDPA fast path
    for maps in (enc.self_attention, dec.self_attention, dec.cross_attention):
        for probs in maps:
            assert torch.allclose(probs.sum(-1), torch.ones_like(probs.sum(-1)), atol=1e-5)
    for probs in dec.self_attention:
        assert (probs.triu(diagonal=1) == 0).all()
    for probs in dec.cross_attention:  # padded source positions get no attention
        assert (probs.masked_select(~padding_mask(src, 0).expand_as(probs)) == 0).all()


@pytest.mark.parametrize("overrides", SHAPES)
@pytest.mark.parametrize("padded", [True, False])
def test_engine_encoder_matches_the_module_encoder(overrides, padded):
    model = random_model(seed=3, **overrides)
    cfg = model.config
    src = random_sources(4, 9, cfg.src_vocab_size, seed=4)
    if not padded:  # every row full length: the runner then attends without a mask
        src = torch.randint(4, cfg.src_vocab_size, (4, 9))
    with torch.inference_mode():
        reference = model.encode(src)
        states, src_mask = ModelRunner(model).encode(src)
    assert torch.equal(src_mask, reference.src_mask)
    real = src_mask.view(*src.shape, 1)  # the states of real tokens; the padding's are zeros (its rows are skipped)
    assert (states - reference.states).masked_fill(~real, 0).abs().max().item() <= 1e-5
    assert (states.masked_select(~real) == 0).all()
    assert bool(real.all()) != padded


def test_encoder_and_cross_keys_of_a_padded_batch_are_each_sentences_alone():
    """With padding, the encoder's Linears and the cross-attention keys/values run on the real tokens'
    rows only: a sentence's states and keys/values are those it gets alone, and the padding's are zeros."""
    model = random_model(seed=5)
    lengths = [9, 3, 6, 1]
    src = torch.full((4, 9), model.config.pad_id, dtype=torch.long)
    g = torch.Generator().manual_seed(6)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, model.config.src_vocab_size, (n,), generator=g)
    runner = ModelRunner(model)
    with torch.inference_mode():
        states, mask = runner.encode(src)
        kv = runner.source_kv(states, mask)  # (n_layers, 2, B, H, S, D)
        for i, n in enumerate(lengths):
            alone, alone_mask = runner.encode(src[i : i + 1, :n])
            assert bool(alone_mask.all())
            assert (states[i, :n] - alone[0]).abs().max().item() <= 1e-5
            assert (states[i, n:] == 0).all()
            assert (kv[:, :, i, :, :n] - runner.source_kv(alone)[:, :, 0]).abs().max().item() <= 1e-5
            assert (kv[:, :, i, :, n:] == 0).all()
        assert (runner.source_kv(states)[:, :, :, :, :1] - kv[:, :, :, :, :1]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("rows,grouped", [(1, False), (3, False), (20, False), (8, True)])
def test_a_step_keeping_its_cross_attention_decodes_what_it_decodes_without(rows, grouped, monkeypatch):
    """The averaged cross-attention weights a step hands back (`cross`) change nothing in its logits, bit for bit:
    few rows keep the fused kernel and score the weights after the step, many rows and groups take them from the
    matmuls they attend through anyway. The weights are those the matmuls give, padding included."""
    import nmt_serve.inference.model_runner as model_runner

    model = random_model(seed=8)
    runner = ModelRunner(model)
    K = 4 if grouped else 1
    src = random_sources(rows // K, 7, model.config.src_vocab_size, seed=9)  # padded: a source mask
    with torch.inference_mode():
        states, mask = runner.encode(src)

        def step(cross, **patch):
            for name, value in patch.items():
                monkeypatch.setattr(model_runner, name, value)
            cache = runner.new_cache(states, mask)
            if grouped:
                cache.expand(torch.arange(rows // K).repeat_interleave(K), K)
            tokens = torch.arange(4, 4 + rows) % model.config.tgt_vocab_size
            for _ in range(3):
                logits = runner.step(tokens, cache, cross)
                tokens = logits.argmax(-1)
            monkeypatch.undo()
            return logits

        kept = []
        assert torch.equal(step(kept), step(None))
        assert kept[0].shape == (rows, src.size(1))
        by_matmuls = []
        step(by_matmuls, MATMUL_ATTENTION_MIN_ROWS=1)
        assert (kept[-1] - by_matmuls[-1]).abs().max().item() <= 1e-6
        assert torch.allclose(kept[-1].sum(-1), torch.ones(rows))


def test_engine_knows_when_the_weights_changed_in_place():
    model = random_model(seed=11)
    src = random_sources(3, 7, model.config.src_vocab_size, seed=12)
    opts = dict(beam_size=2, max_length=10)
    runner = ModelRunner(model)
    assert runner.is_current()  # while nothing changes
    before = generate(runner, src, SearchOptions(**opts))
    with torch.no_grad():  # as an optimizer step or load_state_dict changes weights
        model.decoder_layers[0].self_attn.k_proj.weight.mul_(-4.0)
        model.encoder_layers[0].ffn.fc1.bias.add_(1.0)
    assert not runner.is_current()
    after = generate(ModelRunner(model), src, SearchOptions(**opts))
    reference = generate(runner, src, SearchOptions(**opts, use_cache=False))  # the module path reads the model
    assert [h[0].tokens for h in after] == [h[0].tokens for h in reference]
    assert [h[0].tokens for h in after] != [h[0].tokens for h in before]


def test_engine_knows_when_a_weight_was_replaced():
    """Not only writes in place: a parameter swapped for another tensor, deep in the module tree, counts too."""
    model = random_model(seed=13)
    runner = ModelRunner(model)
    layer = model.decoder_layers[-1].cross_attn.q_proj
    layer.weight = torch.nn.Parameter(layer.weight.detach().clone())
    assert not runner.is_current()
    runner = ModelRunner(model)
    assert runner.is_current()
    layer.bias = None  # a slot left empty is no tensor, and not an error
    assert not runner.is_current()


@pytest.mark.parametrize("overrides", SHAPES[:3])
def test_int8_engine_stays_close_to_float(overrides):
    model = random_model(seed=13, **overrides)
    cfg = model.config
    src = random_sources(4, 9, cfg.src_vocab_size, seed=14)
    tokens = torch.randint(4, cfg.tgt_vocab_size, (4,))
    with torch.inference_mode():
        float_engine = ModelRunner(model)
        int8_engine = ModelRunner(model, "int8")
        assert int8_engine.quantization == "int8"
        logits = []
        for runner in (float_engine, int8_engine):
            cache = runner.new_cache(*runner.encode(src), capacity=4)
            logits.append(runner.step(tokens, cache))
    f, q = logits
    assert not torch.equal(f, q)  # really quantized
    assert (f - q).abs().max().item() <= 0.1 * f.abs().max().item()


def test_quantization_is_validated():
    model = random_model(seed=15)
    with pytest.raises(ValueError, match="quantization must be one of"):
        ModelRunner(model, "int4")


def test_grouped_cache_follows_beam_ancestry_and_groups_that_leave():
    """A cache that reorders by ancestry (keys/values stay put) gives the logits of full recomputation,
    as the physically reordered cache does, through beam-like reorders and a sentence leaving."""
    model = random_model(seed=16)
    cfg = model.config
    G, K, steps = 3, 3, 7
    src = random_sources(G, 6, cfg.src_vocab_size, seed=17).repeat_interleave(K, 0)  # K rows per sentence
    g = torch.Generator().manual_seed(18)
    with torch.inference_mode():
        runner = ModelRunner(model)
        grouped = runner.new_cache(*runner.encode(src[::K]), capacity=steps, group_size=K)  # the source once per group
        physical = runner.new_cache(*runner.encode(src), capacity=steps)
        assert grouped.grouped and not physical.grouped
        prefix = torch.full((G * K, 1), cfg.decoder_start_id)
        for t in range(steps):
            reference = model.decode(prefix, model.encode(src)).logits[:, -1]
            for cache in (grouped, physical):
                assert (runner.step(prefix[:, -1], cache) - reference).abs().max().item() <= 1e-5
            rows = prefix.size(0)
            parents = (torch.arange(rows) // K) * K + torch.randint(0, K, (rows,), generator=g)  # within the group
            leaving = t == 3
            if leaving:  # the middle sentence is done: its K rows go
                parents = torch.cat([parents[:K], parents[2 * K :]])
            for cache in (grouped, physical):
                cache.reorder(parents, cross=leaving)
            tokens = torch.randint(4, cfg.tgt_vocab_size, (parents.numel(), 1), generator=g)
            prefix, src = torch.cat([prefix[parents], tokens], dim=1), src[parents]
        assert grouped.batch_size == physical.batch_size == 2 * K


def test_survivors_keep_their_places_and_the_last_fill_the_gaps():
    assert survivors_order([True, False, True, True, False, True]) == [0, 5, 2, 3]
    assert survivors_order([False, False, True, True]) == [2, 3]
    assert survivors_order([True, True, False]) == [0, 1]
    assert survivors_order([True, True]) == [0, 1]
    assert survivors_order([False, False]) == []


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("alive", [[True, False, True, True, False, True], [False, True, True, True, True, True],
                                   [True, False, False, False, True, True]])  # the last: most move, one copy of all
def test_rows_leaving_move_in_place_what_the_full_copy_would(group_size, alive, monkeypatch):
    """Sentences leaving with the others in survivors_order: the cache moves only the rows that change
    places, within its buffers, and ends as the copy of every row into the spare buffer ends."""
    model = random_model(seed=21)
    cfg = model.config
    G, K = len(alive), group_size
    src = random_sources(G, 7, cfg.src_vocab_size, seed=22)
    g = torch.Generator().manual_seed(23)
    order = torch.tensor(survivors_order(alive))
    rows = (order[:, None] * K + torch.arange(K)).view(-1)
    caches = []
    with torch.inference_mode():
        runner = ModelRunner(model)
        for in_place in (True, False):
            states, mask = runner.encode(src)
            cache = runner.new_cache(states, mask, capacity=8, group_size=K)  # grouped: the source once per group
            for t in range(3):
                runner.step(torch.randint(4, cfg.tgt_vocab_size, (G * K,), generator=torch.Generator().manual_seed(t)), cache)
            if K > 1:  # beams reordered within their groups first: the table of where each history lies is not the identity
                parents = (torch.arange(G * K) // K) * K + torch.randint(0, K, (G * K,), generator=g)
                cache.reorder(parents, cross=False)
                g.manual_seed(23)
            if not in_place:
                monkeypatch.setattr(KVCache, "_move_in_place", lambda self, rows, entries: False)
            buffer = cache._self_kv
            cache.reorder(rows, cross=True)
            monkeypatch.undo()
            assert (cache._self_kv is buffer) == (in_place and 2 * int((order != torch.arange(order.numel())).sum()) <= order.numel())
            tokens = torch.randint(4, cfg.tgt_vocab_size, (rows.numel(),), generator=torch.Generator().manual_seed(9))
            caches.append((cache, runner.step(tokens, cache)))
    (a, logits_a), (b, logits_b) = caches
    assert a.batch_size == b.batch_size == rows.numel() and a.length == b.length == 4
    assert torch.equal(a.self_kv.narrow(4, 0, a.length), b.self_kv.narrow(4, 0, b.length))  # (L, 2, rows or groups, H, positions, ...)
    assert torch.equal(a.cross_kv, b.cross_kv)
    assert (a.src_mask is None) == (b.src_mask is None) and (a.src_mask is None or torch.equal(a.src_mask, b.src_mask))
    if K > 1:
        assert torch.equal(a.ancestors[: a.batch_size, : a.length], b.ancestors[: b.batch_size, : b.length])
    assert torch.equal(logits_a, logits_b)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the lone row's layouts sit beside oneDNN's packed weights")
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("out_features", [48, 50, 2])  # 50: not a multiple of 3, so 3 blocks share columns; 2: fewer than 3
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("few_rows", [1, 8, 64])  # an AMD CPU's rule and an Intel one's, whatever this CPU is
@pytest.mark.parametrize("large", [False, True])  # past FEW_ROWS_ELEMENTS: the blocks are views of one transposed copy
@pytest.mark.parametrize("columns", [0, 16])  # one block per thread (Intel), or blocks 16 columns wide (AMD's rule, narrower)
def test_float_linear_lone_row_layouts_compute_the_linear(threads, out_features, with_bias, few_rows, large, columns, monkeypatch, torch_products):
    """A lone row, or up to FEW_ROWS rows, through the lone row's layout (transposed at 1 block,
    column blocks at more), in whatever leading shape they come, and more rows through the packed
    weight, all give F.linear's result."""
    monkeypatch.setattr(engine_module, "FEW_ROWS", few_rows)
    monkeypatch.setattr(engine_module, "BLOCK_COLUMNS", columns)
    if large:
        monkeypatch.setattr(engine_module, "FEW_ROWS_ELEMENTS", 0)
    torch.manual_seed(22)
    weight = torch.randn(out_features, 32)
    bias = torch.randn(out_features) if with_bias else None
    linear = engine_module.FloatLinear(weight, bias, packed=True, lone_row=threads)
    # 48 columns: 3 blocks of 16; 50: 4 blocks of 14, 12 apart (neighbours share columns); 2: 1 below 2 threads
    blocks = threads if large or not columns else max(threads, {48: 3, 50: 4, 2: 1}[out_features])
    assert linear.lone_row is not None and linear.lone_row.dim() == (2 if blocks == 1 else 3)
    if blocks > 1:
        assert linear.lone_row.size(0) == blocks
        assert (linear.transposed is not None) == large
        assert not large or linear.lone_row.untyped_storage().data_ptr() == linear.transposed.untyped_storage().data_ptr()
        assert torch.equal(linear.transposed if large else weight.t(), weight.t())
    inputs = (torch.randn(1, 32), torch.randn(1, 1, 32), torch.randn(32), torch.randn(2, 32), torch.randn(2, 3, 32),
              torch.randn(5, 1, 32), torch.randn(8, 32), torch.randn(9, 32), torch.randn(3, 5, 32), torch.randn(0, 32),
              torch.randn(64, 32), torch.randn(5, 13, 32))
    with torch.inference_mode():
        for x in inputs:
            y = linear(x)
            assert y.shape == (*x.shape[:-1], out_features)
            assert y.is_contiguous()
            assert torch.allclose(y, torch.nn.functional.linear(x, weight, bias), atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the lone row's layouts sit beside oneDNN's packed weights")
def test_a_large_weight_takes_fewer_rows_through_the_row_kernel(monkeypatch):
    """Past FLOAT_ROWS_ELEMENTS a weight's product takes ROWS rows a thread the kernel splits over, not
    FLOAT_ROWS_PER_THREAD: its work outweighs oneDNN's fixed cost per call sooner."""
    from nmt_serve.inference import row_products

    if not row_products.splits():
        pytest.skip("numba's OpenMP threads do not load here")
    weight, bias = torch.randn(48, 32), torch.randn(48)
    rows = {}
    for limit in (1 << 19, 0):  # the weight small, then counted large
        monkeypatch.setattr(row_products, "FLOAT_ROWS_ELEMENTS", limit)
        linear = engine_module.FloatLinear(weight, bias, packed=True, lone_row=2)
        calls = []
        kernel = row_products._float_split
        monkeypatch.setattr(row_products, "_float_split", lambda *args: calls.append(args[4]) or kernel(*args))
        threads = torch.get_num_threads()
        torch.set_num_threads(2)
        try:
            with torch.inference_mode():
                for n in (3, 4, 5, 8, 9):
                    x = torch.randn(n, 32)
                    torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        finally:
            torch.set_num_threads(threads)
            monkeypatch.setattr(row_products, "_float_split", kernel)
        rows[limit] = calls
    assert rows == {1 << 19: [3, 4, 5, 8], 0: [3, 4]}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="the lone row's layouts sit beside oneDNN's packed weights")
@pytest.mark.parametrize("out_features,in_features", [(48, 32), (50, 96), (2, 32)])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("columns", [0, 16])  # no column blocks (Intel's rule), or 16 wide (AMD's, narrower)
@pytest.mark.parametrize("split", [True, False])  # numba's OpenMP threads split the outputs, or do not load
def test_a_lone_row_reads_w_as_it_is_through_the_row_kernel(out_features, in_features, with_bias, columns, split, monkeypatch):
    """Laid out for 1 thread, a weight only a lone row reads is held as it is, (C_out, C_in), W itself (no copy):
    one or two rows go through row_products' kernel, and a few more (FLOAT_ROWS_PER_THREAD a thread it splits over),
    more through the packed weight, in whatever leading shape they come, all giving F.linear's result. W replaces the transposed copy. Where the kernel splits over threads, one or
    two rows stepped on two threads go through the split kernel, column blocks are not kept, and a layout for 2
    threads reads W too. Where it does not, column blocks stay beside W, a lone row stepped on two threads reads
    them, and a layout for 2 threads keeps the torch layouts alone. Where a few rows read the layout (an Intel CPU's
    small weights) the torch layouts stay alone."""
    from nmt_serve.inference import row_products

    if not row_products.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_products, "SPLIT", split)
    if split and not row_products.splits():
        pytest.skip("numba's OpenMP threads do not load here")
    import numba

    shared = min(2, numba.config.NUMBA_NUM_THREADS)  # a split's threads: 2, or all numba's pool has on a 1-CPU machine
    monkeypatch.setattr(engine_module, "FEW_ROWS", 1)
    monkeypatch.setattr(engine_module, "BLOCK_COLUMNS", columns)
    torch.manual_seed(23)
    weight = torch.randn(out_features, in_features)
    bias = torch.randn(out_features) if with_bias else None
    calls = []
    kernel, split_kernel = row_products._float_rows, row_products._float_split
    monkeypatch.setattr(row_products, "_float_rows", lambda *args: calls.append((args[4], 1)) or kernel(*args))
    if split:
        monkeypatch.setattr(row_products, "_float_split", lambda *args: calls.append(args[4::3]) or split_kernel(*args))
    inputs = (torch.randn(1, in_features), torch.randn(2, in_features), torch.randn(1, 1, in_features), torch.randn(in_features),
              torch.randn(3, in_features), torch.randn(2, 3, in_features), torch.randn(0, in_features), torch.randn(40, in_features),
              torch.randn(4, 2 * in_features)[:2, ::2])  # two rows, not contiguous
    threads = torch.get_num_threads()
    for layout in (1, 2) if split else (1,):
        linear = engine_module.FloatLinear(weight, bias, packed=True, lone_row=layout)
        assert linear.rows is weight or linear.rows.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
        blocks = columns and out_features > columns and not split
        assert linear.transposed is None and linear.weight.is_mkldnn
        assert linear.lone_row is None if not blocks else linear.lone_row.dim() == 3
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                calls.clear()
                with torch.inference_mode():
                    for x in inputs:
                        y = linear(x)
                        assert y.shape == (*x.shape[:-1], out_features) and y.is_contiguous()
                        torch.testing.assert_close(y, torch.nn.functional.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
                # (rows, threads) of the contiguous inputs of at most two rows, or FLOAT_ROWS_PER_THREAD a thread the
                # kernel splits over (one where it does not); on two threads they split where the kernel splits, and a
                # lone row reads the blocks where there are some
                if n == 1:
                    assert calls == [(1, 1), (2, 1), (1, 1), (1, 1), (3, 1), (0, 1)]
                elif split:  # up to FLOAT_ROWS_PER_THREAD a thread: the 6 rows of (2, 3, C) too
                    assert calls == [(1, shared), (2, shared), (1, shared), (1, shared), (3, shared), (6, shared), (0, shared)]
                else:
                    assert calls == ([(2, 1), (3, 1)] if blocks else [(1, 1), (2, 1), (1, 1), (1, 1), (3, 1), (0, 1)])
        finally:
            torch.set_num_threads(threads)
    assert (engine_module.FloatLinear(weight, bias, packed=True, lone_row=2).rows is None) != split
    assert engine_module.FloatLinear(weight, bias, packed=True, lone_row=0).rows is None
    assert engine_module.FloatLinear(weight.bfloat16(), None, packed=True, lone_row=1).rows is None
    monkeypatch.setattr(engine_module, "FEW_ROWS", 8)  # a few rows read a small weight's transposed copy: kept
    assert engine_module.FloatLinear(weight, bias, packed=True, lone_row=1).rows is None
    monkeypatch.setattr(engine_module, "FEW_ROWS_ELEMENTS", 0)  # ... but only a lone row reads a large one's
    assert engine_module.FloatLinear(weight, bias, packed=True, lone_row=1).rows is not None
    monkeypatch.setattr(row_products, "ENABLED", False)
    assert engine_module.FloatLinear(weight, bias, packed=True, lone_row=1).rows is None


def test_a_split_gives_the_one_thread_kernels_results(monkeypatch):
    """The split kernels give every output the same sum as the one-thread kernels, float32 and int8, one to nine rows
    (the kernel takes four at a time, then the rest one by one), whatever the number of threads (more than numba's pool
    holds included): identical results, each the product's."""
    from nmt_serve.inference import row_products

    if not row_products.splits():
        pytest.skip("numba's OpenMP threads do not load here")
    torch.manual_seed(5)
    weight, bias = torch.randn(37, 64), torch.randn(37)
    int8, scale = torch.randint(-127, 128, (37, 64), dtype=torch.int8), torch.rand(37)
    for rows in (1, 2, 4, 5, 9):
        x = torch.randn(rows, 64)
        one = row_products.float_rows(x, weight, bias, rows)
        one_int8 = row_products.int8_rows(x, int8, scale, bias, rows)
        torch.testing.assert_close(one, torch.nn.functional.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(one_int8, torch.nn.functional.linear(x, int8.float() * scale[:, None], bias),
                                   atol=1e-4, rtol=1e-5)
        for threads in (2, 3, 64):
            assert torch.equal(row_products.float_rows(x, weight, bias, rows, threads), one)
            assert torch.equal(row_products.int8_rows(x, int8, scale, bias, rows, threads), one_int8)


def test_a_split_takes_as_many_of_numbas_threads_as_it_splits_over():
    """numba's pool is as large as the machine: a split over 2 threads sets this thread's share of it to 2 (numba's
    setting is thread-local), not more, not fewer, in a thread whose share was something else."""
    import threading

    import numba

    from nmt_serve.inference import row_products

    if not row_products.splits() or numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba's OpenMP threads do not load here, or this machine has one CPU")
    seen = []

    def run():
        numba.set_num_threads(1)
        row_products.float_rows(torch.randn(1, 8), torch.randn(4, 8), torch.randn(4), 1, 2)
        seen.append(numba.get_num_threads())
        row_products.float_rows(torch.randn(1, 8), torch.randn(4, 8), torch.randn(4), 1, 10_000)
        seen.append(numba.get_num_threads())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [2, numba.config.NUMBA_NUM_THREADS]


def test_the_kernels_leave_torchs_threads_as_they_were():
    """numba's threading layer sets the OpenMP runtime's threads as it loads, and torch may share that runtime: a
    process that set torch's threads keeps them once the kernels load (in a process of its own: they load once)."""
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(1)\n"
            "from nmt_serve.inference import row_products, row_step\n"
            "print(row_products.splits(), row_step.available(), torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[2] == "1", out


def test_a_large_int8_weight_stays_with_fbgemm(monkeypatch):
    """Past INT8_MAX_BYTES a weight streams from memory, where fbgemm reads it as fast and splits it over its threads:
    its rows go through fbgemm, and no plain copy of it is held; a smaller weight's through the kernel."""
    from nmt_serve.inference import row_products

    if not row_products.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_products, "INT8_MAX_BYTES", 48 * 32 - 1)
    large = engine_module.Int8Linear(torch.randn(48, 32), torch.randn(48), step=True)
    monkeypatch.setattr(row_products, "INT8_MAX_BYTES", 48 * 32)
    small = engine_module.Int8Linear(torch.randn(48, 32), torch.randn(48), step=True)
    assert large.rows is None and small.rows is not None
    x = torch.randn(1, 32)
    with torch.inference_mode():
        assert torch.equal(large(x), torch.ops.quantized.linear_dynamic(x, large.packed, True))
        assert not torch.equal(small(x), torch.ops.quantized.linear_dynamic(x, small.packed, True))


def test_without_numba_the_runner_keeps_torchs_products(monkeypatch):
    """Where numba cannot be imported, row_products is unavailable and the Linears lay their weights out for torch's
    products, with the same results."""
    import sys

    from nmt_serve.inference import row_products

    monkeypatch.setitem(sys.modules, "numba", None)  # import numba raises ImportError
    row_products._kernels.cache_clear()
    try:
        assert not row_products.available()
        weight, bias = torch.randn(48, 32), torch.randn(48)
        linear = engine_module.FloatLinear(weight, bias, packed=True, lone_row=1)
        int8 = engine_module.Int8Linear(weight, bias, step=True)
        assert linear.rows is None and linear.lone_row is not None and int8.rows is None
        x = torch.randn(1, 32)
        with torch.inference_mode():
            torch.testing.assert_close(linear(x), torch.nn.functional.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
            assert torch.equal(int8(x), torch.ops.quantized.linear_dynamic(x, int8.packed, True))
    finally:
        row_products._kernels.cache_clear()


def test_few_rows_take_the_lone_row_layout_of_small_weights_only(monkeypatch, torch_products):
    """Past FEW_ROWS_ELEMENTS (an output layer, a wide feed-forward weight) the packed weight was the
    faster at a few rows: there only a lone row reads the lone row's layout."""
    monkeypatch.setattr(engine_module, "FEW_ROWS", 8)
    small = engine_module.FloatLinear(torch.randn(64, 32), None, packed=True, lone_row=1)
    large = engine_module.FloatLinear(torch.randn(engine_module.FEW_ROWS_ELEMENTS // 32 + 1, 32), None, packed=True, lone_row=1)
    assert (small.few_rows, large.few_rows) == (8, 1)
    with torch.inference_mode():
        x = torch.randn(4, 32)
        assert torch.allclose(large(x), torch.nn.functional.linear(x, large.lone_row.t()), atol=1e-5)


def test_lone_row_blocks_follow_the_cpu_vendor(monkeypatch):
    """On AMD a small weight's lone-row layout is blocks 32 columns wide, at any thread count; a large
    weight's (the output layer), and every weight elsewhere, one block per thread."""
    assert engine_module.block_columns("AuthenticAMD") == 32
    assert engine_module.block_columns("GenuineIntel") == engine_module.block_columns("") == 0
    assert engine_module.BLOCK_COLUMNS == engine_module.block_columns(engine_module.cpu_vendor())
    monkeypatch.setattr(engine_module, "BLOCK_COLUMNS", 32)
    assert [engine_module.lone_row_blocks(o, i, 2) for o, i in [(768, 256), (256, 1024), (1000, 256), (8000, 256)]] == [24, 8, 32, 2]
    assert [engine_module.lone_row_blocks(o, i, 1) for o, i in [(256, 256), (16, 256), (8000, 256)]] == [8, 1, 1]
    # measured for MKL's float32 products only: a bfloat16 weight keeps one block per thread
    assert engine_module.lone_row_blocks(768, 256, 2, float32=False) == 2
    if engine_module.onednn_runs(torch.ones(1, dtype=torch.bfloat16)):
        assert engine_module.FloatLinear(torch.randn(768, 256, dtype=torch.bfloat16), None, packed=True, lone_row=2).lone_row.size(0) == 2
    monkeypatch.setattr(engine_module, "BLOCK_COLUMNS", 0)
    assert [engine_module.lone_row_blocks(o, i, t) for o, i, t in [(768, 256, 2), (256, 256, 1), (8000, 256, 3)]] == [2, 1, 3]


def test_few_rows_follow_the_cpu_vendor():
    """Up to 64 rows take the lone row's layout on Intel CPUs (measured faster there up to 64 rows, not
    at 256), only a lone row elsewhere (AMD: the packed weights were faster from 2 rows on)."""
    assert engine_module.few_rows("GenuineIntel") == 64
    assert engine_module.few_rows("AuthenticAMD") == engine_module.few_rows("") == 1
    assert engine_module.FEW_ROWS == engine_module.few_rows(engine_module.cpu_vendor())


@pytest.mark.parametrize("few_rows", [1, 64])
def test_a_wider_input_is_copied_where_more_rows_than_one_read_it(few_rows, monkeypatch, torch_products):
    """At 1 thread a lone row reads a wider-input weight as it is (a view, nothing more to hold); where
    several rows read the layout, the transposed copy (ATen's product on the view lost to the packed
    weight at 32 rows). Weights past FEW_ROWS_ELEMENTS take a lone row only, so the view again."""
    monkeypatch.setattr(engine_module, "FEW_ROWS", few_rows)
    weight = torch.randn(32, 128)  # C_in > C_out
    small = engine_module.FloatLinear(weight, None, packed=True, lone_row=1)
    assert small.lone_row.is_contiguous() == (few_rows > 1)
    assert small.lone_row.is_contiguous() or small.lone_row.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    large = engine_module.FloatLinear(torch.randn(8, engine_module.FEW_ROWS_ELEMENTS // 8 + 8), None, packed=True, lone_row=1)
    assert large.few_rows == 1 and not large.lone_row.is_contiguous()
    assert engine_module.lone_row_copies(32, 128) == (few_rows > 1)
    assert engine_module.lone_row_copies(128, 32)


def test_int8_linear_quantizes_every_call_even_a_lone_row():
    """A lone row of a small layer goes through the int8 weights too (no float fallback): its result is
    fbgemm's, not float32's, and stays close to it."""
    weight, bias = torch.randn(64, 32), torch.randn(64)
    linear = engine_module.Int8Linear(weight, bias)
    with torch.inference_mode():
        for x in (torch.randn(1, 32), torch.randn(3, 1, 32), torch.randn(40, 32)):
            quantized = linear(x)
            reference = torch.nn.functional.linear(x, weight, bias)
            assert quantized.shape == reference.shape
            assert torch.equal(quantized, torch.ops.quantized.linear_dynamic(x, linear.packed, True))
            assert not torch.equal(quantized, reference)
            assert (quantized - reference).abs().max().item() <= 0.1 * reference.abs().max().item()


def test_the_int8_output_layer_is_close_to_float32_on_this_cpu_at_every_row_count():
    """oneDNN's u8 x s8 kernel overflows on CPUs without VNNI (AVX2 only: an AMD EPYC here gave relative errors of
    0.1-0.35 at 64 rows, and 8,160 for 16,256 on the probe): there the output layer stays on fbgemm, whose 7-bit
    activations do not overflow. Wherever this runs, every row count is close to float32."""
    torch.manual_seed(5)
    weight, bias = torch.randn(512, 256) * 0.1, torch.randn(512) * 0.01
    wide = engine_module.Int8Linear(weight, bias, wide=True)
    for rows in (1, engine_module.ONEDNN_INT8_MIN_ROWS - 1, engine_module.ONEDNN_INT8_MIN_ROWS, 256):
        x = torch.randn(rows, 256)
        with torch.inference_mode():
            reference = torch.nn.functional.linear(x, weight, bias)
            error = (wide(x) - reference).abs().max().item() / reference.abs().max().item()
        assert error < 0.03, (rows, error)


@pytest.mark.skipif(not engine_module.onednn_int8_runs(), reason="needs oneDNN's quantized linear, exact on this CPU (VNNI)")
def test_int8_output_layer_takes_onednn_from_its_row_count_with_the_same_weights():
    """The output layer's int8 call switches to oneDNN's kernel at ONEDNN_INT8_MIN_ROWS rows: it reads the
    same int8 weights (same scales), so both kernels stay close to float32 and to each other."""
    torch.manual_seed(21)
    weight, bias = torch.randn(4096, 64) * 0.1, torch.randn(4096) * 0.01
    wide, narrow = engine_module.Int8Linear(weight, bias, wide=True), engine_module.Int8Linear(weight, bias)
    assert wide.onednn is not None and narrow.onednn is None
    rows = engine_module.ONEDNN_INT8_MIN_ROWS
    x = torch.randn(2, rows, 64)  # (batch, rows, C): leading dimensions are kept
    calls = []
    original = torch.ops.onednn.qlinear_pointwise
    with torch.inference_mode():
        reference = torch.nn.functional.linear(x, weight, bias)
        fbgemm = narrow(x)
        torch.ops.onednn.qlinear_pointwise = lambda *a: calls.append(1) or original(*a)
        try:
            onednn = wide(x)
            below = wide(x[0, : engine_module.ONEDNN_INT8_MIN_ROWS - 1])  # fewer rows: fbgemm
        finally:
            torch.ops.onednn.qlinear_pointwise = original
    assert len(calls) == 1 and onednn.shape == reference.shape
    assert torch.equal(below, narrow(x[0, : engine_module.ONEDNN_INT8_MIN_ROWS - 1]))
    scale = reference.abs().max().item()
    assert not torch.equal(onednn, fbgemm)
    assert (onednn - reference).abs().max().item() <= 0.05 * scale
    assert (onednn - fbgemm).abs().max().item() <= 0.05 * scale


def test_loading_a_checkpoint_draws_no_random_weights(tiny_checkpoint):
    """A model built on the meta device to load a checkpoint into is not randomly initialized: torch draws
    random meta tensors in Python refs whose first call imports torch._dynamo (over a second of every
    engine's start). In a fresh process: the checkpoint loads, and torch._dynamo is never imported."""
    import subprocess
    import sys

    code = ("import sys; from nmt_serve.network.checkpoint import load_checkpoint; "
            f"model = load_checkpoint({str(tiny_checkpoint)!r})[0]; "
            "assert not any(p.is_meta for p in model.parameters()); print('torch._dynamo' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("overrides", [dict(), dict(positional_layout="learned")])
def test_a_model_built_on_the_meta_device_loads_to_the_same_outputs(overrides):
    """The meta-built model (no initialization, the position table computed by finish_load) computes what
    the model whose weights it was given computes."""
    model = random_model(seed=5, **overrides)
    with torch.device("meta"):
        empty = type(model)(model.config)
    empty.load_state_dict(model.state_dict(), strict=False, assign=True)
    empty.finish_load()
    empty.eval()
    src = random_sources(3, 7, model.config.src_vocab_size)
    tgt = random_sources(3, 5, model.config.tgt_vocab_size, seed=1)
    assert torch.equal(model(src, tgt), empty(src, tgt))


def test_a_checkpoints_tensors_load_aligned(tmp_path, spm_model):
    """Every tensor of a loaded model starts on a 64-byte boundary, however the file laid them out (safetensors
    keeps a float32 file's offsets: a weight's vector loads would straddle cache lines)."""
    from safetensors.torch import load_file

    from nmt_serve.network.checkpoint import ALIGNMENT, load_checkpoint
    from tests.conftest import make_checkpoint

    directory = make_checkpoint(tmp_path / "ckpt", spm_model, "de", "en", seed=5)
    raw = load_file(str(directory / "model.safetensors"))
    assert any(t.data_ptr() % ALIGNMENT for t in raw.values())  # the file's own offsets are not all aligned
    model = load_checkpoint(directory)[0]
    tensors = list(model.state_dict().values())
    assert tensors and all(t.data_ptr() % ALIGNMENT == 0 for t in tensors)
    assert all(t.dtype == torch.float32 for t in tensors if t.is_floating_point())


def test_the_kernels_compile_where_numba_is_installed():
    """Where numba is installed every kernel compiles: a kernel that stopped compiling would otherwise only turn the
    kernels' tests into skips."""
    pytest.importorskip("numba")
    from nmt_serve.inference import beam_pick, greedy_pick, row_attention, row_products, row_step, top_k

    assert row_products.available() and row_step.available() and row_attention.available()
    assert greedy_pick.available(torch.device("cpu")) and top_k._kernel() is not None
    assert beam_pick.available(torch.device("cpu"))
