"""The memory plan: its figures against what the objects it plans for really hold, and its choices."""
import pytest
import torch
from conftest import tiny_config

from nmt_serve.engine.core import EngineConfig, EngineCore
from nmt_serve.engine.loader import choose, plan_memory
from nmt_serve.engine.memory_plan import GIB, DoesNotFit, ModelNeeds, budget, plan
from nmt_serve.inference.device_search import DeviceSearch
from nmt_serve.inference.static_decoder import StaticDecoder
from nmt_serve.inference.translator import Translator
from nmt_serve.network.config import ModelConfig

# facebook/nllb-200-distilled-600M's shape
NLLB_600M = ModelConfig(src_vocab_size=256206, tgt_vocab_size=256206, d_model=1024, n_heads=16, d_ff=4096, n_encoder_layers=12,
                        n_decoder_layers=12, max_positions=1024, share_embeddings=True, tie_output=True)


def runner_linears_of(layer) -> list:
    return [v for v in vars(layer).values() if hasattr(v, "out_features")] + [layer.ffn.fc1, layer.ffn.fc2]


def runner_linears(runner) -> list:
    found = [runner.cross_kv, runner.output]
    for layer in [*runner.encoder_layers, *runner.decoder_layers]:
        found += runner_linears_of(layer)
    return found


@pytest.mark.parametrize("few_rows,columns", [(1, 16), (64, 0), (1, 0)])  # an AMD CPU's rules (narrower blocks for the tiny model), an Intel one's, a mix
@pytest.mark.parametrize("large_from", [None, 1024])  # None: every weight of the tiny model is small; 1024: d_model^2 is, the others not
def test_weights_and_rows_are_what_the_objects_hold(tiny_checkpoint, few_rows, columns, large_from, monkeypatch, torch_products):
    import nmt_serve.inference.model_runner as runner_module

    monkeypatch.setattr(runner_module, "FEW_ROWS", few_rows)
    monkeypatch.setattr(runner_module, "BLOCK_COLUMNS", columns)
    if large_from:
        monkeypatch.setattr(runner_module, "FEW_ROWS_ELEMENTS", large_from)
    plain = Translator.load(tiny_checkpoint, device="cpu", packed_weights=False)
    needs = ModelNeeds("de-en", plain.config, "float32", max_length=64)
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in plain.model.parameters()}
    assert needs.weights_bytes() == sum(storages.values())  # held once
    assert needs.weights_split() == (sum(storages.values()), 0)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):  # the runner also keeps the weights laid out for a lone row on n threads
            torch.set_num_threads(n)
            packed = Translator.load(tiny_checkpoint, device="cpu")
            linears = runner_linears(packed.runner)
            # the blocks of columns: n for a large weight, or without `columns`; else columns wide, n at least
            shapes = {id(linear): tuple(linear.lone_row.shape[1:] if linear.lone_row.dim() == 3 else linear.lone_row.shape)
                      for linear in linears}
            blocks = {id(linear): (n if not columns or linear.out_features * shapes[id(linear)][0] > (large_from or 10**9)
                                   else max(n, -(-linear.out_features // columns))) for linear in linears}
            assert all(linear.weight.is_mkldnn and linear.lone_row.dim() == (2 if blocks[id(linear)] == 1 else 3) for linear in linears)
            assert all(linear.lone_row.size(0) == blocks[id(linear)] for linear in linears if linear.lone_row.dim() == 3)
            if columns and not large_from:  # the tiny model's Linears are wider than 16 columns: none at 1 block
                assert all(linear.lone_row.dim() == 3 for linear in linears)
            # at 1 block a lone row reads a transposed copy where the output is at least as wide as the
            # input or more rows than one read it, else a view of the model's own weight; at more, blocks
            # of columns, views into a transposed copy for a large weight, a copy for a small one
            own = {p.untyped_storage().data_ptr() for p in packed.model.parameters()}
            views = [linear.lone_row for linear in linears if linear.transposed is None and not linear.lone_row.is_contiguous()]
            assert all(w.shape[0] > w.shape[1] and w.untyped_storage().data_ptr() in own for w in views)
            # the feed-forward layers' second weight (C_in = d_ff > C_out), where only a lone row reads it
            assert (len(views) > 0) == (n == 1 and (few_rows == 1 or large_from is not None) and (not columns or large_from is not None))
            # the model's weights live in the transposed copies: nothing of the model's own is held beside them
            copied = [linear for linear in linears if linear.transposed is not None]
            assert (len(copied) > 0) == ((n == 1 and not columns) or large_from is not None)
            assert all(linear.transposed.untyped_storage().data_ptr() in own for linear in copied)
            held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in [*packed.model.parameters(), *(linear.lone_row for linear in linears)]}
            packed_bytes = sum(linear.weight.numel() * linear.weight.element_size() for linear in linears)
            packed_needs = ModelNeeds("de-en", packed.config, "float32", max_length=64, packed_weights=True, lone_row_threads=n)
            assert packed_needs.weights_bytes() == sum(held.values()) + packed_bytes
            assert packed_needs.weights_split() == (sum(held.values()), packed_bytes)  # plain tensors, opaque ones
            assert packed_needs.weights_bytes() == sum(storages.values()) + packed_bytes + sum(
                linear.lone_row.numel() * 4 for linear in linears if linear.transposed is None and linear.lone_row.dim() == 3)
            # the nn.Module path reads the shared weights as the runner does
            src = torch.tensor([[5, 6, 7, plain.config.eos_id]])
            with torch.inference_mode():
                torch.testing.assert_close(packed.model.encode(src).states, plain.model.encode(src).states, atol=1e-5, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)
    decoder = StaticDecoder(plain.runner, max_rows=12, max_length=64)
    kv = sum(t.numel() * t.element_size() for t in (decoder.self_kv, decoder.cross_kv))
    assert needs.row_bytes() * 12 == kv
    half = ModelNeeds("de-en", plain.config, "float16", max_length=64, device="cuda")
    assert half.row_bytes() * 2 == needs.row_bytes() and half.weights_bytes() * 2 == sum(storages.values())
    # a beam size's decoder on CUDA holds a sentence's source once for its rows: what the plan counts for them
    grouped = StaticDecoder(plain.runner, max_rows=12, max_length=64, group=4)
    on_cuda = ModelNeeds("de-en", plain.config, "float32", max_length=64, device="cuda")
    assert on_cuda.row_bytes(4) * 12 == sum(t.numel() * t.element_size() for t in (grouped.self_kv, grouped.cross_kv)) < kv
    # the device search's state, its kept attention made: what the plan counts per row, but for the
    # beams' constants (first_k: 2K bools) and the rounding up of a group's share
    for K in (1, 4):
        slots = DeviceSearch(StaticDecoder(plain.runner, max_rows=12, max_length=64)).slots(K)
        slots.attention()
        tensors = [t for t in vars(slots).values() if isinstance(t, torch.Tensor)]
        tensors += [t for buffers in slots.kept.buffers() for t in buffers]
        held = sum(t.numel() * t.element_size() for t in tensors) - (2 * K if K > 1 else 0)
        assert 0 <= needs.search_bytes_per_row(K) * 12 - held < 12


@pytest.mark.parametrize("columns", [0, 16])  # W alone, or column blocks beside it (AMD's rule, narrower)
@pytest.mark.parametrize("split,layout", [(True, 1), (True, 2), (False, 1)])
def test_a_lone_row_reading_w_as_it_is_is_planned_as_held(tiny_checkpoint, columns, split, layout, monkeypatch):
    """Laid out for 1 thread with row_products' kernels, or for 2 where they split over threads, the runner's lone row
    reads the model's own weights (the fused ones views of the weight it reads): the plan counts the parameters, the
    column blocks kept beside them where the kernels do not split, and the packed copies."""
    import nmt_serve.inference.model_runner as runner_module
    from nmt_serve.inference import row_products

    if not row_products.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_products, "SPLIT", split)
    if split and not row_products.splits():
        pytest.skip("numba's OpenMP threads do not load here")
    monkeypatch.setattr(runner_module, "FEW_ROWS", 1)
    monkeypatch.setattr(runner_module, "BLOCK_COLUMNS", columns)
    threads = torch.get_num_threads()
    torch.set_num_threads(layout)
    try:
        packed = Translator.load(tiny_checkpoint, device="cpu")
    finally:
        torch.set_num_threads(threads)
    linears = runner_linears(packed.runner)
    assert all(linear.rows is not None and linear.weight.is_mkldnn and linear.transposed is None for linear in linears)
    # the tiny model's weights are wider than 16 columns
    assert all((linear.lone_row is None) == (not columns or split) for linear in linears)
    parameters = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in packed.model.parameters()}
    assert all(linear.rows.untyped_storage().data_ptr() in parameters for linear in linears)
    blocks = sum(linear.lone_row.untyped_storage().nbytes() for linear in linears if linear.lone_row is not None)
    packed_bytes = sum(linear.weight.numel() * linear.weight.element_size() for linear in linears)
    needs = ModelNeeds("de-en", packed.config, "float32", packed_weights=True, lone_row_threads=layout)
    assert needs.weights_split() == (sum(parameters.values()) + blocks, packed_bytes)


def test_int8_counts_the_packed_copy_beside_the_float_weights():
    cfg = tiny_config()
    assert ModelNeeds("m", cfg, "float32", "int8").weights_bytes() > ModelNeeds("m", cfg, "float32").weights_bytes()


@pytest.mark.parametrize("kernels", [True, False])
def test_int8_keeps_no_float_copy_for_a_lone_row_at_any_thread_count(tiny_checkpoint, kernels, monkeypatch):
    """The int8 runner's lone row reads int8 weights, so at 1 or 2 threads its Linears hold no float
    matrix beside them (only biases and scales), and the plan counts none: row_products' kernel reads the
    decoder step's int8 values as they are (a plain copy, which the plan counts), torch's path fbgemm's."""
    from nmt_serve.inference import row_products
    from nmt_serve.inference.model_runner import lone_row_threads

    if kernels and not row_products.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_products, "ENABLED", kernels)
    # the tiny model's self-attention q/k/v (96 x 32) the largest weight the kernel takes: not its output layer
    monkeypatch.setattr(row_products, "INT8_MAX_BYTES", 96 * 32)
    splits, calls, shared = kernels and row_products.splits(), [], 0
    if splits:  # the threads each product of a row or two splits over: 2, or all numba's pool has on a 1-CPU machine
        import numba

        shared = min(2, numba.config.NUMBA_NUM_THREADS)
        split_kernel = row_products._int8_split
        monkeypatch.setattr(row_products, "_int8_split", lambda *args: calls.append(args[-1]) or split_kernel(*args))
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            calls.clear()
            int8 = Translator.load(tiny_checkpoint, device="cpu", quantization="int8")
            linears = runner_linears(int8.runner)
            held = [v for linear in linears for v in vars(linear).values() if isinstance(v, torch.Tensor)]
            # (the output layer's oneDNN path holds its scales and bias; where oneDNN's int8 kernel is not exact
            # there is none, and fbgemm's packed weights are no tensor)
            assert linears and all(t.dim() == 1 for t in held if t.is_floating_point())
            assert lone_row_threads(n, packed=True, quantization="int8") == 0
            step = [linear for layer in int8.runner.decoder_layers for linear in runner_linears_of(layer)] + [int8.runner.output]
            assert int8.runner.output.rows is None and int8.runner.output.out_features * int8.config.d_model > 96 * 32
            assert all((linear.rows is not None) == kernels for linear in step[:-1])
            assert all(linear.rows is None for layer in int8.runner.encoder_layers for linear in runner_linears_of(layer))
            assert all(linear.rows.dtype == torch.int8 for linear in step if linear.rows is not None)
            small = int8.runner.decoder_layers[0].self_out
            with torch.inference_mode():
                for rows in (1, 2, 3):
                    x = torch.randn(rows, int8.config.d_model)
                    fbgemm = torch.ops.quantized.linear_dynamic(x, small.packed, True)
                    if kernels and rows <= row_products.ROWS:  # the int8 values times the row in float32
                        dequantized = small.rows.float() * small.rows_scale[:, None]
                        reference = torch.nn.functional.linear(x, dequantized, small.rows_bias)
                        torch.testing.assert_close(small(x), reference, atol=1e-5, rtol=1e-5)
                        assert not torch.equal(small(x), fbgemm)
                    else:
                        assert torch.equal(small(x), fbgemm)
            assert calls == ([shared] * 4 if splits and n == 2 else [])  # two calls each of one and two rows
    finally:
        torch.set_num_threads(threads)
    # what the plan counts for the plain int8 values: the decoder step's weights, a byte each, a scale and a bias per output
    cfg = int8.config
    with_rows = ModelNeeds("m", cfg, "float32", "int8").weights_split()[0]
    monkeypatch.setattr(row_products, "ENABLED", False)
    without = ModelNeeds("m", cfg, "float32", "int8").weights_split()[0]
    step_bytes = sum(linear.rows.numel() + 4 * (linear.rows_scale.numel() + linear.rows_bias.numel())
                     for linear in step if linear.rows is not None)
    assert with_rows - without == step_bytes


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_the_plain_tensors_planned_are_what_engines_map_from_one_copy(tmp_path, spm_model, quantization):
    """weights_split's plain bytes against what share_weights maps (shared_weights.py): the runner's tensors but for
    its position tables, which the plan leaves out (a few MB at most); its opaque packed copies stay private."""
    from nmt_serve.inference.model_runner import lone_row_threads
    from nmt_serve.inference.shared_weights import share_weights
    from tests.conftest import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "de-en", spm_model, "de", "en", seed=5, d_model=64, d_ff=256)
    translator = Translator.load(checkpoint, device="cpu", quantization=quantization)
    runner = translator.runner
    needs = ModelNeeds("de-en", translator.config, "float32", quantization, packed_weights=runner.packed_weights,
                       lone_row_threads=lone_row_threads(torch.get_num_threads(), packed=runner.packed_weights,
                                                         quantization=quantization))
    plain, packed = needs.weights_split()
    shared = share_weights(runner, tmp_path, "de-en")
    tables = sum(t.numel() * t.element_size() for t in (runner.src_positions, runner.tgt_positions))
    assert plain <= shared.shared_bytes + shared.private_bytes <= plain + tables
    assert packed > 0  # oneDNN's packed copies or int8's, not in the file
    assert ModelNeeds(**{**vars(needs), "shared_by": 2}).weights_bytes() == -(-plain // 2) + packed


def test_engines_mapping_one_copy_each_plan_their_share_where_the_directory_has_room(models_dir, tmp_path, monkeypatch):
    from nmt_serve.engine import loader

    chosen = choose(models_dir)

    def weights(**kwargs) -> dict[str, tuple[int, int]]:
        memory = plan_memory(chosen, "cpu", None, budget_gb=4, max_batch_sentences=8, max_batch_tokens=512, **kwargs)
        return {m: (plan["weights_bytes"], plan["weights_shared_by"]) for m, plan in memory.models.items()}

    copies = weights(engines=2)  # no directory: a copy each
    shared = weights(engines=2, weights_dir=str(tmp_path))
    assert all(by == 1 for _, by in copies.values()) and all(by == 2 for _, by in shared.values())
    assert all(0 < shared[m][0] < copies[m][0] for m in copies)
    assert weights(engines=1, weights_dir=str(tmp_path)) == weights(engines=1)
    monkeypatch.setattr(loader, "weights_room", lambda path: 1024)  # a container's full /dev/shm: a copy each
    assert weights(engines=2, weights_dir=str(tmp_path)) == copies


def test_the_room_for_weights_is_the_free_space_and_what_the_directory_holds(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from nmt_serve.engine import weights_dir

    assert weights_dir.weights_room(str(tmp_path)) > 0 and weights_dir.weights_room(str(tmp_path / "gone")) == 0
    monkeypatch.setattr(weights_dir.os, "statvfs", lambda path: SimpleNamespace(f_bavail=10, f_frsize=4096))
    (tmp_path / "m.1.abc.weights").write_bytes(bytes(5000))  # an engine that restarts maps it
    (tmp_path / "m.1.abc.weights.77.partial").write_bytes(bytes(3000))
    assert weights_dir.weights_room(str(tmp_path)) == 10 * 4096 + 5000


def test_the_plan_runs_as_many_sentences_as_fit_and_no_more_than_asked():
    cfg = tiny_config()
    needs = [ModelNeeds("a", cfg, "float32"), ModelNeeds("b", cfg, "float32", beams=(1,))]
    fixed = sum(n.weights_bytes() for n in needs) + max(n.join_bytes(100) for n in needs)
    per_sentence = sum(n.sentence_bytes() for n in needs)
    roomy = plan(needs, budget_bytes=fixed + 1000 * per_sentence, budget_source="test", max_batch_sentences=64, max_batch_tokens=100)
    assert roomy.sentences == 64
    tight = plan(needs, budget_bytes=fixed + 10 * per_sentence + per_sentence // 2, budget_source="test", max_batch_sentences=64,
                 max_batch_tokens=100)
    assert tight.sentences == 10 and tight.planned_bytes <= tight.budget_bytes
    assert tight.models["a"]["beams"]["4"]["rows"] == 40 and list(tight.models["b"]["beams"]) == ["1"]
    with pytest.raises(DoesNotFit, match="do not fit the memory budget") as refused:
        plan(needs, budget_bytes=fixed + per_sentence - 1, budget_source="test", max_batch_sentences=64, max_batch_tokens=100)
    assert "\n" not in str(refused.value) and "a weights" in str(refused.value)


def test_nllb_600m_in_float16_holds_256_rows_of_256_tokens_within_8_gib():
    greedy = ModelNeeds("nllb", NLLB_600M, "float16", beams=(1,), max_length=256)
    assert 615_000_000 < greedy.parameters()[0] < 616_000_000
    memory = plan([greedy], budget_bytes=8 * GIB, budget_source="test", max_batch_sentences=256, max_batch_tokens=4096)
    assert memory.sentences == 256 and memory.planned_bytes < 8 * GIB
    # with beam 4 beside greedy from the start, the same budget holds fewer sentences, said by the plan
    both = plan([ModelNeeds("nllb", NLLB_600M, "float16", beams=(1, 4))], budget_bytes=8 * GIB, budget_source="test",
                max_batch_sentences=256, max_batch_tokens=4096)
    assert 16 <= both.sentences < 256


def test_budget_from_the_setting_or_the_free_memory():
    assert budget(2.5, "cpu") == (int(2.5 * GIB), "--memory-budget-gb / NMT_MEMORY_BUDGET_GB")
    free, source = budget(0, "cpu")
    assert 0 < free and "%" in source


def test_several_engines_share_the_budget_and_the_device(monkeypatch):
    from nmt_serve.engine import memory_plan

    assert budget(3.0, "cpu", engines=2) == (int(1.5 * GIB), "--memory-budget-gb / NMT_MEMORY_BUDGET_GB, a 1/2 share")
    # the engines start at once, each finding the device (nearly) free: each takes a share of all of it
    monkeypatch.setattr(memory_plan, "free_memory", lambda device: (100 * GIB, 100 * GIB, "free on cuda:0"))
    assert budget(0, "cuda:0", engines=4)[0] == int(25 * GIB * memory_plan.AUTO_SHARE)
    assert budget(0, "cuda:0")[0] == int(100 * GIB * memory_plan.AUTO_SHARE)
    # one that restarts beside the others finds their shares held: no more than what is free
    monkeypatch.setattr(memory_plan, "free_memory", lambda device: (40 * GIB, 100 * GIB, "free on cuda:0"))
    assert budget(0, "cuda:0", engines=2)[0] == int(40 * GIB * memory_plan.AUTO_SHARE)


def test_the_engine_runs_the_planned_sentences_and_reports_the_plan(models_dir):
    chosen = choose(models_dir)
    memory = plan_memory(chosen, "cpu", None, budget_gb=0, max_batch_sentences=8, max_batch_tokens=512)
    assert memory.sentences == 8 and set(memory.models) == {"de-en", "en-de"}
    assert all(m["packed_weights"] for m in memory.models.values())  # a roomy budget: packed
    # a budget that packed copies would cut short of the sentences asked for: plain weights, every sentence
    needs = [ModelNeeds(m, info.config, "float32", beams=(1, 4), max_length=min(256, info.config.max_positions)) for m, info in chosen.values()]
    fixed = sum(n.weights_bytes() for n in needs) + max(n.join_bytes(512) for n in needs)
    room = fixed + 8 * sum(n.sentence_bytes() for n in needs) + 1024
    tight = plan_memory(chosen, "cpu", None, budget_gb=room / GIB, max_batch_sentences=8, max_batch_tokens=512)
    assert tight.sentences == 8 and not any(m["packed_weights"] for m in tight.models.values())
    with pytest.raises(DoesNotFit):
        plan_memory(chosen, "cpu", None, budget_gb=0.0001)
    translator = Translator.load(models_dir / "de-en", device="cpu")
    small = plan([ModelNeeds("de-en", translator.config, "float32")], budget_bytes=GIB, budget_source="test", max_batch_sentences=5,
                 max_batch_tokens=64)
    core = EngineCore({"de-en": translator}, EngineConfig(max_batch_sentences=64), memory=small)
    assert core.config.max_batch_sentences == 5
    [info] = core.model_info()
    assert info["memory"]["running_sentences"] == 5 and info["memory"]["beams"]["4"]["rows"] == 20


def test_engines_spread_over_a_nodes_gpus_and_share_a_device_they_run_on():
    from nmt_serve.engine.loader import engine_device

    # four engines, two GPUs: two on each, each taking half of its GPU
    assert [engine_device("cuda", i, 4, 2) for i in range(4)] == [("cuda:0", 2), ("cuda:1", 2), ("cuda:0", 2), ("cuda:1", 2)]
    # three engines on two GPUs: the first GPU holds two of them
    assert [engine_device("auto", i, 3, 2) for i in range(3)] == [("cuda:0", 2), ("cuda:1", 1), ("cuda:0", 2)]
    # one GPU, a named GPU, or the CPU: all of them on it
    assert engine_device("cuda", 1, 2, 1) == ("cuda", 2)
    assert engine_device("cuda:1", 0, 2, 4) == ("cuda:1", 2)
    assert engine_device("cpu", 1, 2, 0) == ("cpu", 2) and engine_device("auto", 1, 2, 0) == ("auto", 2)
