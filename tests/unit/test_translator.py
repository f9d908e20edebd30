"""The facade, tokenizer, checkpoint format and command-line translator, on a tiny random checkpoint."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from nmt_serve.network.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee auf einer großen Wiese.", "Hallo"]


@pytest.fixture(scope="module")
def translator(tiny_checkpoint):
    return Translator.load(tiny_checkpoint, device="cpu")


def test_tokenizer_handles_empty_and_unknown_input(spm_model):
    tok = Tokenizer(spm_model)
    assert tok.encode("") == [] and tok.encode("   ", add_eos=True) == [tok.eos_id]
    ids = tok.encode("Ein Mann ☃ 北京")
    assert tok.unk_id in ids
    assert tok.decode(tok.encode("Ein Mann")) == "Ein Mann"
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)


def test_translate_returns_results_in_input_order(translator):
    results = translator.translate(SENTENCES, beam_size=2, max_length=8)
    alone = [translator.translate([s], beam_size=2, max_length=8)[0] for s in SENTENCES]
    assert [r.text for r in results] == [a.text for a in alone]
    assert all(r.hypotheses[0].score is None and r.attention is None for r in results)  # not asked for


def test_empty_strings_translate_to_empty_strings(translator):
    results = translator.translate(["", "Hallo", "  "], beam_size=1, max_length=5, return_scores=True)
    assert results[0].text == "" and results[2].text == ""
    assert results[1].hypotheses[0].score is not None


def test_nbest_scores_match_forced_decoding(translator):
    [result] = translator.translate([SENTENCES[0]], beam_size=4, num_hypotheses=3, max_length=10, return_scores=True)
    assert len(result.hypotheses) == 3
    src_ids = translator.encode_source(SENTENCES[0])
    sp = translator.tgt_tokenizer.sp
    capped = 0
    for h in result.hypotheses:
        ids = [sp.piece_to_id(p) for p in h.tokens]
        assert translator.score_tokens(src_ids, ids, max_length=10) == pytest.approx(h.score, abs=1e-4)
        capped += len(ids) + 1 == 10
    assert capped  # a random model rarely says eos: the limit ends some (there, eos costs nothing)


def test_attention_maps_shapes_and_normalization(translator):
    [result] = translator.translate(
        [SENTENCES[1]], beam_size=2, max_length=10, return_attention=True,
        attention_include=("cross", "decoder_self", "encoder_self"),
    )
    attn = result.attention
    L, H = translator.config.n_decoder_layers, translator.config.n_heads
    S, T = len(attn.source_tokens), len(attn.target_tokens)
    assert attn.source_tokens[-1] == "</s>" and attn.target_tokens[-1] == "</s>"
    assert T == len(result.hypotheses[0].tokens) + 1
    assert attn.cross.shape == (L, H, T, S)
    assert attn.decoder_self.shape == (L, H, T, T)
    assert attn.encoder_self.shape == (translator.config.n_encoder_layers, H, S, S)
    for maps in (attn.cross, attn.decoder_self, attn.encoder_self):
        assert torch.allclose(maps.sum(-1), torch.ones(maps.shape[:-1]), atol=1e-5)
    assert (attn.decoder_self.triu(diagonal=1) == 0).all()


def test_force_decode_scores_a_given_target(translator):
    forced = translator.force_decode(SENTENCES[0], "A man rides a bike.")
    n = len(translator.tgt_tokenizer.encode("A man rides a bike.")) + 1
    assert len(forced.token_log_probs) == n and forced.attention.cross.shape[2] == n
    assert forced.score == pytest.approx(sum(forced.token_log_probs))
    assert all(lp <= 0 for lp in forced.token_log_probs)


def test_force_decode_refuses_a_target_past_the_positions_as_a_callers_error(translator):
    # a ValueError, as a source past them: the engine answers it as the caller's mistake (400), not a failure
    limit = translator.config.max_positions
    text = " ".join(["Hund"] * limit)
    assert len(translator.tgt_tokenizer.encode(text)) + 1 > limit
    with pytest.raises(ValueError, match=f"accepts at most {limit}"):
        translator.force_decode(SENTENCES[0], text)
    fits = translator.tgt_tokenizer.decode(translator.tgt_tokenizer.encode(text)[: limit - 1])
    assert len(translator.force_decode(SENTENCES[0], fits).token_log_probs) <= limit


def test_use_cache_false_gives_the_same_translations(translator):
    a = translator.translate(SENTENCES, beam_size=3, max_length=8, return_scores=True)
    b = translator.translate(SENTENCES, beam_size=3, max_length=8, return_scores=True, use_cache=False)
    assert [r.text for r in a] == [r.text for r in b]


def test_bad_options_fail_clearly(translator):
    with pytest.raises(ValueError, match="num_hypotheses"):
        translator.translate(["Hallo"], beam_size=2, num_hypotheses=3)
    with pytest.raises(TypeError):
        translator.translate("Hallo")
    with pytest.raises(ValueError, match="attention kinds"):
        translator.translate(["Hallo"], return_attention=True, attention_include=("bogus",))
    with pytest.raises(ValueError, match="at most"):
        translator.translate(["Hund " * 400])


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path, tiny_checkpoint):
    model, info, src_tok, _ = load_checkpoint(tiny_checkpoint)
    copy = save_checkpoint(tmp_path / "copy", model, info, {"spm.model": tiny_checkpoint / "spm.model"})
    a = Translator.load(tiny_checkpoint, device="cpu").translate(SENTENCES, beam_size=2, max_length=8, return_scores=True)
    b = Translator.load(copy, device="cpu").translate(SENTENCES, beam_size=2, max_length=8, return_scores=True)
    assert [(r.text, r.hypotheses[0].score) for r in a] == [(r.text, r.hypotheses[0].score) for r in b]
    # tied weights are stored once, and come back tied
    assert "output_proj.weight" not in load_file(str(copy / "model.safetensors"))
    reloaded, *_ = load_checkpoint(copy)
    assert reloaded.output_proj.weight.data_ptr() == reloaded.src_embed.weight.data_ptr()


def test_float16_checkpoint_loads(tmp_path, tiny_checkpoint):
    model, info, *_ = load_checkpoint(tiny_checkpoint)
    half = save_checkpoint(tmp_path / "half", model, info, {"spm.model": tiny_checkpoint / "spm.model"}, dtype=torch.float16)
    assert all(t.dtype == torch.float16 for t in load_file(str(half / "model.safetensors")).values())
    assert Translator.load(half, device="cpu").translate(["Hallo"], beam_size=1, max_length=4)[0].text is not None


def test_a_served_model_holds_its_weights_once_and_still_saves(tmp_path, tiny_checkpoint):
    t = Translator.load(tiny_checkpoint, device="cpu", packed_weights=False)
    before = t.translate(SENTENCES, beam_size=2, max_length=8, return_scores=True)
    layer = t.model.decoder_layers[0].self_attn
    fused = t.runner.decoder_layers[0].self_qkv.weight
    # q, k, v are views into the runner's fused weight; the embedding is the unscaled table itself
    assert layer.q_proj.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
    assert layer.v_proj.weight.data_ptr() == fused[2 * layer.v_proj.weight.size(0):].data_ptr()
    assert t.runner.src_embedding.data_ptr() == t.model.src_embed.weight.data_ptr()
    model_bytes = sum(p.numel() * p.element_size() for p in t.model.parameters())
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in t.model.parameters()}
    assert sum(storages.values()) == model_bytes  # no tensor kept beside them
    copy = save_checkpoint(tmp_path / "copy", t.model, t.info, {"spm.model": tiny_checkpoint / "spm.model"})
    after = Translator.load(copy, device="cpu", packed_weights=False).translate(SENTENCES, beam_size=2, max_length=8,
                                                                          return_scores=True)
    assert [(r.text, r.hypotheses[0].score) for r in before] == [(r.text, r.hypotheses[0].score) for r in after]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("columns", [0, 16])  # one block per thread (Intel), or narrow blocks (AMD's rule, narrower)
# row_products' kernels splitting over threads, on one thread only, or torch's products only
@pytest.mark.parametrize("products", ["split", "kernel", "torch"])
def test_packed_weights_translate_as_the_plain_ones_and_the_model_reads_the_same_weights(tiny_checkpoint, threads, columns, products,
                                                                                         monkeypatch):
    import nmt_serve.inference.model_runner as runner_module
    from nmt_serve.inference import row_products, row_step

    kernels, split = products != "torch", products == "split"
    if kernels and not row_products.available():
        pytest.skip("numba is not installed")
    monkeypatch.setattr(row_products, "ENABLED", kernels)
    monkeypatch.setattr(row_products, "SPLIT", split)
    # the products one by one: the step kernel (test_row_step.py) would take a lone row's whole step, output layer too
    monkeypatch.setattr(row_step, "ENABLED", False)
    if split and not row_products.splits():
        pytest.skip("numba's OpenMP threads do not load here")
    monkeypatch.setattr(runner_module, "BLOCK_COLUMNS", columns)
    monkeypatch.setattr(runner_module, "FEW_ROWS", 1)  # only a lone row reads its layout (an AMD CPU's rule)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        plain = Translator.load(tiny_checkpoint, device="cpu", packed_weights=False)
        packed = Translator.load(tiny_checkpoint, device="cpu")
    finally:
        torch.set_num_threads(before)
    # a lone row: W as it is with the kernels at 1 thread, or at any where they split; else the transposed weight at 1
    # thread and blocks of output columns at more (the tiny model's weights are all wider than 16 columns)
    reads_rows = kernels and (threads == 1 or split)
    one_block = threads == 1 and not columns and not reads_rows
    linears = [packed.runner.output, packed.runner.decoder_layers[0].self_qkv, packed.runner.encoder_layers[0].ffn.fc2]
    assert all((linear.rows is not None) == reads_rows for linear in linears)
    # W replaces the transposed copy; column blocks stay beside it where the kernels do not split (a lone row on more
    # threads reads them)
    assert all(linear.lone_row is None if reads_rows and (not columns or split) else linear.lone_row.dim() == (2 if one_block else 3)
               for linear in linears)
    assert packed.runner.packed_weights and not plain.runner.packed_weights
    assert packed.runner.output.weight.is_mkldnn and not plain.runner.output.weight.is_mkldnn
    # a lone sentence in greedy search runs every product on one row: through the kernel, or the transposed weights
    calls = []
    if reads_rows:
        kernel, split_kernel = row_products._float_rows, row_products._float_split
        monkeypatch.setattr(row_products, "_float_rows", lambda *args: calls.append(args[4:]) or kernel(*args))
        if split:
            monkeypatch.setattr(row_products, "_float_split", lambda *args: calls.append(args[4:]) or split_kernel(*args))
    for beam, sentences in ((1, SENTENCES), (2, SENTENCES), (1, SENTENCES[:1])):
        a = plain.translate(sentences, beam_size=beam, max_length=8, return_scores=True)
        b = packed.translate(sentences, beam_size=beam, max_length=8, return_scores=True)
        assert [r.text for r in a] == [r.text for r in b]
        assert [r.hypotheses[0].score for r in a] == pytest.approx([r.hypotheses[0].score for r in b], abs=1e-4)
    if not columns or split:  # W alone: a lone row goes through the kernel at any thread count
        assert bool(calls) == reads_rows
    else:  # column blocks beside W: a lone row on more threads than one may read them instead
        assert reads_rows or not calls
    assert all(rows <= max(row_products.ROWS, row_products.FLOAT_ROWS_PER_THREAD * torch.get_num_threads()) for rows, *_ in calls)
    out = packed.runner.output
    row = torch.randn(1, 1, packed.config.d_model)
    assert out(row).shape == (1, 1, out.out_features)
    torch.testing.assert_close(out(row)[0], out(row.expand(2, 1, -1).contiguous())[0], atol=1e-4, rtol=1e-4)
    # the model's parameters stay plain tensors, which the nn.Module path (attention maps) reads: views of the fused W
    # the kernel reads, or at 1 block views of the runner's transposed copies (held once), at more (the tiny model's
    # weights all small) of their own
    weight = packed.model.decoder_layers[0].self_attn.q_proj.weight
    qkv = packed.runner.decoder_layers[0].self_qkv
    holder = qkv.rows if reads_rows else qkv.transposed
    assert not weight.is_mkldnn and weight.is_contiguous() == (not one_block)
    assert (holder is not None and weight.untyped_storage().data_ptr() == holder.untyped_storage().data_ptr()) == (one_block or reads_rows)
    [a] = plain.translate(SENTENCES[:1], beam_size=2, max_length=8, return_attention=True)
    [b] = packed.translate(SENTENCES[:1], beam_size=2, max_length=8, return_attention=True)
    assert b.attention.cross.shape[0] == packed.config.n_decoder_layers
    torch.testing.assert_close(b.attention.cross, a.attention.cross, atol=1e-4, rtol=1e-4)


def broken_copy(tmp_path, tiny_checkpoint) -> Path:
    target = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, target)
    return target


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "model.safetensors").unlink(), "missing model.safetensors"),
        (lambda d: (d / "config.json").unlink(), "missing config.json"),
        (lambda d: (d / "spm.model").unlink(), "missing source tokenizer"),
        (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
        (lambda d: edit_config(d, lambda c: c["model"].update(d_ff=99)), "has shape"),
        (lambda d: edit_config(d, lambda c: c["model"].update(bogus=1)), "unknown model config keys"),
        (lambda d: edit_config(d, lambda c: c["model"].update(src_vocab_size=500, tgt_vocab_size=500)), "has 400 pieces"),
        (lambda d: edit_config(d, lambda c: c["model"].update(eos_id=2)), "eos_id"),
        (lambda d: edit_weights(d, lambda w: w.pop("decoder_layers.0.ffn.fc1.bias")), "missing tensors"),
        (lambda d: edit_weights(d, lambda w: w.update(extra=torch.zeros(2))), "unexpected tensors"),
        (lambda d: (d / "model.safetensors").write_bytes(b"garbage"), "cannot read weights"),
    ],
)
def test_bad_checkpoints_fail_clearly(tmp_path, tiny_checkpoint, damage, message):
    target = broken_copy(tmp_path, tiny_checkpoint)
    damage(target)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(target)


def test_missing_directory_fails_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "nowhere")


def edit_config(directory: Path, change) -> None:
    config = json.loads((directory / "config.json").read_text())
    change(config)
    (directory / "config.json").write_text(json.dumps(config))


def edit_weights(directory: Path, change) -> None:
    weights = load_file(str(directory / "model.safetensors"))
    change(weights)
    save_file(weights, str(directory / "model.safetensors"))


def test_command_line_translator_keeps_input_order(tiny_checkpoint, translator):
    lines = SENTENCES + ["", "Eine Frau liest ein Buch."]
    proc = subprocess.run(
        [sys.executable, "-m", "nmt_serve.cli.translate", "--model", str(tiny_checkpoint), "--beam-size", "2",
         "--batch-size", "2", "--max-length", "8", "--device", "cpu"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, cwd=ROOT, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    expected = [r.text for r in translator.translate(lines, beam_size=2, max_length=8)]
    assert out == expected and out[3] == ""
    assert "sent" in proc.stderr  # the progress bar, on stderr


@pytest.mark.cuda
def test_runs_unchanged_on_cuda(tiny_checkpoint):
    cpu = Translator.load(tiny_checkpoint, device="cpu", dtype="float32")
    gpu = Translator.load(tiny_checkpoint, device="cuda", dtype="float32")
    a = cpu.translate(SENTENCES, beam_size=3, max_length=8, return_scores=True)
    b = gpu.translate(SENTENCES, beam_size=3, max_length=8, return_scores=True)
    for x, y in zip(a, b):
        assert x.hypotheses[0].score == pytest.approx(y.hypotheses[0].score, abs=1e-3)
    half = Translator.load(tiny_checkpoint, device="cuda", dtype="float16")
    assert len(half.translate(SENTENCES, beam_size=3, max_length=8, return_attention=True)) == 3


@pytest.mark.cuda
def test_kv_cache_matches_recomputation_on_cuda():
    from conftest import random_model, random_sources

    from nmt_serve.inference.model_runner import ModelRunner

    model = random_model(seed=1).cuda()
    src = random_sources(4, 9, 64, seed=2).cuda()
    tgt = torch.randint(4, 64, (4, 20), device="cuda")
    with torch.no_grad():
        full = model(src, tgt)
        runner = ModelRunner(model)
        cache = runner.new_cache(*runner.encode(src))
        inc = torch.stack([runner.step(tgt[:, t], cache) for t in range(20)], 1)
    assert (full - inc).abs().max().item() <= 1e-4


def test_int8_translator_translates_and_rejects_what_it_cannot_do(tiny_checkpoint):
    translator = Translator.load(tiny_checkpoint, device="cpu", quantization="int8")
    assert translator.quantization == "int8"
    results = translator.translate(SENTENCES, beam_size=2, max_length=8, return_scores=True)
    assert len(results) == len(SENTENCES) and all(r.hypotheses[0].score is not None for r in results)
    with pytest.raises(ValueError, match="float32"):
        Translator.load(tiny_checkpoint, device="cpu", dtype="bfloat16", quantization="int8")
    with pytest.raises(ValueError, match="quantization must be one of"):
        Translator.load(tiny_checkpoint, device="cpu", quantization="int4")


@pytest.mark.parametrize("args, message", [
    (["--model", "/nonexistent"], "checkpoint directory not found"),
    (["--quantization", "int8", "--dtype", "bfloat16"], "int8 quantization runs on CPU in float32"),
])
def test_command_line_translator_reports_load_errors_in_one_line(tiny_checkpoint, args, message):
    if args[0] != "--model":
        args = ["--model", str(tiny_checkpoint), "--device", "cpu", *args]
    proc = subprocess.run([sys.executable, "-m", "nmt_serve.cli.translate", *args], input="Hallo\n", capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
