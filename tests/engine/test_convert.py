"""Hugging Face checkpoints of the families people deploy, converted exactly: tiny random M2M100 /
NLLB-200 and mBART models built from transformers' own config classes (nothing downloaded), their
logits compared with transformers' on the same inputs, through the nn.Module path and the model runner."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from nmt_serve.convert.m2m_100 import m2m_100_to_model  # noqa: E402
from nmt_serve.convert.mbart import mbart_to_model  # noqa: E402
from nmt_serve.inference.model_runner import ModelRunner  # noqa: E402

SHAPE = dict(vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
             dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def randomized(model, std: float = 0.5):
    """Every parameter random (norms and biases too), so that a wrong mapping cannot hide."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, std if "norm" not in name else 0.2).add_(1.0 if name.endswith("norm.weight") or name.endswith("layer_norm.weight") else 0.0)
        if hasattr(model, "final_logits_bias"):
            model.final_logits_bias.normal_()
    return model.eval()


def inputs(pad: int, eos: int, start: int):
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 90, (3, 9), generator=g)
    src[:, -1] = eos
    src[1, 6:] = pad  # right-padded, as we batch
    src[1, 5] = eos
    tgt = torch.randint(4, 90, (3, 7), generator=g)
    tgt[:, 0] = start
    return src, tgt


def hf_logits(hf, src, tgt, pad):
    with torch.no_grad():
        return hf(input_ids=src, attention_mask=(src != pad).long(), decoder_input_ids=tgt).logits


def runner_logits(ours, src, tgt):
    """The fused-weight path the searches use: encode once, then one token at a time with the KV cache."""
    runner = ModelRunner(ours)
    with torch.no_grad():
        states, mask = runner.encode(src)
        cache = runner.new_cache(states, mask, capacity=tgt.size(1))
        return torch.stack([runner.step(tgt[:, t], cache) for t in range(tgt.size(1))], dim=1)


@pytest.mark.parametrize("family", ["m2m_100", "nllb", "mbart"])
def test_logits_equal_transformers(family):
    if family == "mbart":
        config = transformers.MBartConfig(**SHAPE, scale_embedding=True, activation_function="gelu")
        hf = randomized(transformers.MBartForConditionalGeneration(config))
        convert = mbart_to_model
    else:
        config = transformers.M2M100Config(**SHAPE, scale_embedding=True, activation_function="relu")
        hf = randomized(transformers.M2M100ForConditionalGeneration(config))
        convert = m2m_100_to_model
    ours = convert(config.to_dict(), {k: v.clone() for k, v in hf.state_dict().items()})
    src, tgt = inputs(config.pad_token_id, config.eos_token_id, config.eos_token_id)
    expected = hf_logits(hf, src, tgt, config.pad_token_id)
    with torch.no_grad():
        got = ours(src, tgt)
    assert (got - expected).abs().max().item() < 1e-4
    assert (runner_logits(ours, src, tgt) - expected).abs().max().item() < 1e-4


LANGUAGES = ["deu_Latn", "eng_Latn", "fra_Latn"]


def fairseq_spm(directory, fixtures, model_type: str = "bpe"):
    """A tiny sentencepiece model laid out as NLLB's and mBART-50's are (unk=0, bos=1, eos=2, no pad);
    NLLB's is a BPE model, mBART's (XLM-R's, despite the file's name) a unigram one."""
    import sentencepiece as spm

    text = directory / "joint.txt"
    text.write_text("".join((fixtures / f"train300.{lang}").read_text() for lang in ("de", "en", "fr")))
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(directory / "sentencepiece.bpe"), vocab_size=300,
                                   model_type=model_type, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    return directory / "sentencepiece.bpe.model"


@pytest.fixture(scope="module")
def nllb_dir(tmp_path_factory):
    """A Hugging Face NLLB-200 directory at a tiny size: random weights, a fairseq-layout sentencepiece
    model and the language codes in tokenizer_config.json, as the real one ships them."""
    import json
    from pathlib import Path

    directory = tmp_path_factory.mktemp("nllb")
    fairseq_spm(directory, Path(__file__).resolve().parents[1] / "fixtures")
    # two rows more than the tokenizer has ids, as NLLB-200's table (256,206 rows for 256,204 ids)
    config = transformers.M2M100Config(**{**SHAPE, "vocab_size": 300 + 1 + len(LANGUAGES) + 1 + 2}, scale_embedding=True,
                                       decoder_start_token_id=2, forced_eos_token_id=2)
    hf = randomized(transformers.M2M100ForConditionalGeneration(config))
    hf.save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": LANGUAGES, "tokenizer_class": "NllbTokenizer"}))
    return directory


def test_the_fairseq_id_layout(nllb_dir):
    """<s>=0, <pad>=1, </s>=2, <unk>=3, piece i -> i + 1, then the language codes, then <mask>."""
    import sentencepiece as spm

    from nmt_serve.convert.fairseq_vocab import fairseq_vocab

    sp = spm.SentencePieceProcessor(model_file=str(nllb_dir / "sentencepiece.bpe.model"))
    vocab = fairseq_vocab(nllb_dir / "sentencepiece.bpe.model", LANGUAGES)
    assert [vocab[t] for t in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
    assert all(vocab[sp.id_to_piece(i)] == i + 1 for i in range(3, sp.get_piece_size()))
    assert [vocab[c] for c in LANGUAGES] == [301, 302, 303] and vocab["<mask>"] == 304


def test_nmt_convert_and_translate_greedy_equal_generate(nllb_dir, tmp_path, capsys):
    """The converted NLLB model, through the Translator as nmt-translate runs it, writes what transformers'
    generate writes: the source `[deu_Latn] + pieces + [</s>]`, the translation forced to start with
    `fra_Latn` (and not returned), greedy, to the same length."""
    from nmt_serve.convert.command import main as convert_main
    from nmt_serve.inference.translator import Translator

    assert convert_main([str(nllb_dir), str(tmp_path / "ours")]) == 0
    assert "NMT_PREFER=ours" in capsys.readouterr().out  # how to serve it beside scored checkpoints
    card = (tmp_path / "ours" / "README.md").read_text()
    assert card.startswith("# Multilingual Transformer, converted from") and "None measured here yet" in card
    translator = Translator.load(tmp_path / "ours", device="cpu")
    assert translator.info.language_codes == {c: c for c in LANGUAGES} and "deu_Latn-fra_Latn" in translator.directions
    hf = transformers.M2M100ForConditionalGeneration.from_pretrained(nllb_dir).eval()
    code = translator.inputs.tokenizer.vocab
    for text in ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball."]:
        src = translator.encode_source(text, "fra_Latn", "deu_Latn")
        assert src[0] == code["deu_Latn"] and src[-1] == code["</s>"]
        assert src[1:-1] == [code.get(p, 3) for p in translator.inputs.tokenizer.sp.encode(text, out_type=str)]
        with torch.no_grad():
            expected = hf.generate(torch.tensor([src]), forced_bos_token_id=code["fra_Latn"], num_beams=1, do_sample=False,
                                   max_new_tokens=12, suppress_tokens=[0, 1], forced_eos_token_id=2)[0].tolist()
        assert expected[:2] == [2, code["fra_Latn"]]
        [result] = translator.translate([text], source_lang="deu_Latn", target_lang="fra_Latn", beam_size=1, max_length=12)
        generated = [i for i in expected[2:] if i != code["</s>"]]
        # token for token (a random model repeats itself, so the text alone would say little)
        assert result.hypotheses[0].tokens == translator.tgt_tokenizer.pieces(generated), (result.hypotheses[0].tokens, expected)
        assert result.text == translator.tgt_tokenizer.decode(generated)
    with pytest.raises(ValueError, match="needs the source language"):
        translator.translate(["Ein Hund."], target_lang="fra_Latn")


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "bin"])
def test_a_sharded_checkpoint_converts_to_the_same_model(nllb_dir, tmp_path, safe):
    """NLLB-200 3.3B ships in shards that an index names: read together they are the same weights."""
    import shutil

    from nmt_serve.convert.command import main as convert_main
    from nmt_serve.network.checkpoint import load_checkpoint

    sharded = tmp_path / "sharded"
    shutil.copytree(nllb_dir, sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    transformers.M2M100ForConditionalGeneration.from_pretrained(nllb_dir).save_pretrained(sharded, max_shard_size="40KB")
    index = "model.safetensors.index.json"
    if not safe:  # as older checkpoints have them (transformers now writes safetensors only)
        from safetensors.torch import load_file

        weight_map = json.loads((sharded / index).read_text())["weight_map"]
        for shard in sorted(set(weight_map.values())):
            torch.save(load_file(sharded / shard), sharded / shard.replace("model", "pytorch_model").replace(".safetensors", ".bin"))
            (sharded / shard).unlink()
        (sharded / index).unlink()
        index = "pytorch_model.bin.index.json"
        (sharded / index).write_text(json.dumps({"weight_map": {
            k: v.replace("model", "pytorch_model").replace(".safetensors", ".bin") for k, v in weight_map.items()}}))
    assert (sharded / index).is_file() and len(set(json.loads((sharded / index).read_text())["weight_map"].values())) > 2
    assert convert_main([str(nllb_dir), str(tmp_path / "whole")]) == 0
    assert convert_main([str(sharded), str(tmp_path / "ours")]) == 0
    whole, ours = load_checkpoint(tmp_path / "whole")[0].state_dict(), load_checkpoint(tmp_path / "ours")[0].state_dict()
    assert whole.keys() == ours.keys() and all(torch.equal(whole[k], ours[k]) for k in whole)


def test_nmt_convert_refuses_what_it_does_not_support(tmp_path, capsys):
    import json

    from nmt_serve.convert.command import main as convert_main

    (tmp_path / "t5").mkdir()
    (tmp_path / "t5" / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(SystemExit) as exit_:
        convert_main([str(tmp_path / "t5"), str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "model_type 't5' is not supported (supported: marian, m2m_100, mbart)" in capsys.readouterr().err


def test_nmt_evaluate_scores_the_converted_model(nllb_dir, tmp_path, capsys):
    """nmt-evaluate takes --source-lang, as nmt-translate does: a fairseq-family source starts with its code."""
    import json

    from nmt_serve.convert.command import convert
    from nmt_serve.training import evaluate

    out = convert(nllb_dir, tmp_path / "nllb")
    (tmp_path / "test.de").write_text("Ein Hund läuft über die Wiese.\nZwei Männer spielen Fußball.\n")
    (tmp_path / "test.fr").write_text("Un chien court.\nDeux hommes jouent au football.\n")
    argv = ["--model", str(out), "--src", str(tmp_path / "test.de"), "--ref", str(tmp_path / "test.fr"), "--device", "cpu",
            "--beam-size", "1", "--target-lang", "fra_Latn", "--json"]
    assert evaluate.main([*argv, "--source-lang", "deu_Latn"]) == 0
    assert json.loads(capsys.readouterr().out)["sentences"] == 2
    assert evaluate.main([*argv, "--source-lang", "de"]) == 0  # by its ISO 639-1 code too
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:  # without it: one line that says the model needs it
        evaluate.main(argv)
    assert exit_.value.code == 2 and "needs the source language" in capsys.readouterr().err


def test_nmt_convert_refuses_to_write_over_the_model_or_files_not_ours(nllb_dir, tmp_path, capsys):
    import shutil

    from nmt_serve.convert.command import main as convert_main

    source = shutil.copytree(nllb_dir, tmp_path / "hf")
    before = (source / "model.safetensors").read_bytes()
    for out, needle in ((source, "the model directory itself"), (source / ".", "the model directory itself"),
                        (tmp_path / "notes", "not one of our checkpoints")):
        (tmp_path / "notes").mkdir(exist_ok=True)
        (tmp_path / "notes" / "todo.txt").write_text("keep me\n")
        with pytest.raises(SystemExit) as exit_:
            convert_main([str(source), str(out)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert (source / "model.safetensors").read_bytes() == before and (tmp_path / "notes" / "todo.txt").is_file()
    # a new, an empty, or an earlier checkpoint's directory is fine
    (tmp_path / "empty").mkdir()
    for out in ("new", "empty", "new"):
        assert convert_main([str(source), str(tmp_path / out)]) == 0
        capsys.readouterr()


@pytest.mark.parametrize("name, damage", [("model.safetensors", b"\x00" * 64), ("sentencepiece.bpe.model", b"not a model"),
                                          ("config.json", b"[]"), ("tokenizer_config.json", b"{not json")],
                         ids=["weights", "tokenizer", "config", "tokenizer-config"])
def test_nmt_convert_names_a_damaged_file(nllb_dir, tmp_path, capsys, name, damage):
    import shutil

    from nmt_serve.convert.command import main as convert_main

    source = shutil.copytree(nllb_dir, tmp_path / "hf")
    (source / name).write_bytes(damage)
    with pytest.raises(SystemExit) as exit_:
        convert_main([str(source), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("nmt-convert: error: ") and str(source / name) in err, err


def _convert_fails(source, out, capsys, *flags) -> str:
    """nmt-convert's one-line error for a directory it refuses."""
    from nmt_serve.convert.command import main as convert_main

    with pytest.raises(SystemExit) as exit_:
        convert_main([str(source), str(out), *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("nmt-convert: error: "), err
    return err


def _edit_json(path, **changes):
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))


@pytest.mark.parametrize("file, changes, needle", [
    ("config.json", {"d_model": None}, "config.json: no 'd_model'"),
    ("config.json", {"vocab_size": None}, "config.json: no 'vocab_size'"),
    ("config.json", {"activation_function": "gelu_new"}, "activation 'gelu_new' is not supported"),
], ids=["d_model", "vocab_size", "activation"])
def test_nmt_convert_names_the_file_and_the_key_it_lacks(nllb_dir, tmp_path, capsys, file, changes, needle):
    import shutil

    source = shutil.copytree(nllb_dir, tmp_path / "hf")
    _edit_json(source / file, **changes)
    assert needle in _convert_fails(source, tmp_path / "out", capsys)
    # a shard index without its map names the index
    shutil.copytree(nllb_dir, tmp_path / "sharded")
    (tmp_path / "sharded" / "model.safetensors").rename(tmp_path / "sharded" / "model-00001-of-00001.safetensors")
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    assert "model.safetensors.index.json: no 'weight_map'" in _convert_fails(tmp_path / "sharded", tmp_path / "out2", capsys)


def test_a_model_bos_token_id_null_converts(nllb_dir, tmp_path):
    """transformers writes `"bos_token_id": null` for some saved models: fairseq's <s> (0) stands."""
    import shutil

    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    source = shutil.copytree(nllb_dir, tmp_path / "hf")
    values = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**values, "bos_token_id": None}))
    translator = Translator.load(convert(source, tmp_path / "out"), device="cpu")
    assert translator.config.bos_id == 0


def test_decoded_text_has_no_language_codes_or_mask(nllb_dir, tmp_path):
    """A model may write a language code or <mask> mid-sentence: they stand for no text, as transformers'
    decode(skip_special_tokens=True) has it."""
    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(convert(nllb_dir, tmp_path / "out"), device="cpu")
    tokenizer, vocab = translator.tgt_tokenizer, translator.tgt_tokenizer.vocab
    pieces = translator.inputs.tokenizer.encode("Ein Hund läuft.")
    ids = [vocab["fra_Latn"], *pieces[:2], vocab["<mask>"], vocab["deu_Latn"], *pieces[2:], vocab["</s>"]]
    assert tokenizer.decode(ids) == tokenizer.decode(pieces) and "Latn" not in tokenizer.decode(ids)
    theirs = transformers.NllbTokenizer.from_pretrained(nllb_dir)
    assert tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_a_directory_transformers_5_saved(nllb_dir, tmp_path, capsys):
    """transformers 5 writes the language codes as `extra_special_tokens` and saves tokenizer.json alone:
    the codes are read there; the missing sentencepiece model is asked for by name, with where to get it."""
    import shutil

    from nmt_serve.convert.command import convert

    source = shutil.copytree(nllb_dir, tmp_path / "hf")
    (source / "tokenizer_config.json").write_text(json.dumps({"extra_special_tokens": LANGUAGES, "tokenizer_class": "NllbTokenizer"}))
    assert convert(source, tmp_path / "out").is_dir()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["language_codes"] == {c: c for c in LANGUAGES}
    (source / "sentencepiece.bpe.model").unlink()
    (source / "tokenizer.json").write_text("{}")
    err = _convert_fails(source, tmp_path / "out2", capsys)
    assert "missing sentencepiece.bpe.model" in err and "copy sentencepiece.bpe.model from the model" in err


def test_an_mbart_25_model_serves_its_pair_as_generate_does(mbart50_dir, tmp_path, capsys):
    """mBART-25 (mbart-large-en-ro, cc25 fine-tunes; MBartTokenizer): the source is `pieces </s> de_DE`, the
    decoder starts with the target's code (config.json's decoder_start_token_id), greedy equal to generate's.
    Its file is sentence.bpe.model; the pair must be named, and a target other than the one config.json
    starts with is refused. Before, such a model was converted as mBART-50 and translated otherwise."""
    import shutil

    from nmt_serve.convert.command import main as convert_main
    from nmt_serve.inference.translator import Translator

    source = shutil.copytree(mbart50_dir, tmp_path / "mbart-large-de-fr")
    (source / "sentencepiece.bpe.model").rename(source / "sentence.bpe.model")
    fr = 300 + 1 + 2  # fairseq ids: 300 pieces + 1, then de_DE, en_XX, fr_XX
    _edit_json(source / "config.json", tokenizer_class="MBartTokenizer", decoder_start_token_id=fr)
    hf = transformers.MBartForConditionalGeneration.from_pretrained(source).eval()
    capsys.readouterr()
    assert "give --source-lang and --target-lang" in _convert_fails(source, tmp_path / "out", capsys)
    assert "its target is fr_XX, not en_XX" in _convert_fails(source, tmp_path / "out", capsys, "--source-lang", "de", "--target-lang", "en")
    assert convert_main([str(source), str(tmp_path / "out"), "--source-lang", "de", "--target-lang", "fr"]) == 0
    capsys.readouterr()
    translator = Translator.load(tmp_path / "out", device="cpu")
    vocab = translator.inputs.tokenizer.vocab
    assert translator.directions == ["de-fr"] and translator.config.decoder_start_id == vocab["fr_XX"] == fr
    text = "Ein Hund läuft über die Wiese."
    src = translator.encode_source(text, "fr")
    assert src[-2:] == [vocab["</s>"], vocab["de_DE"]] and vocab["de_DE"] not in src[:-2]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([src]), decoder_start_token_id=fr, num_beams=1, do_sample=False, max_new_tokens=12,
                               suppress_tokens=[0, 1, fr], forced_eos_token_id=2)[0].tolist()
    [result] = translator.translate([text], target_lang="fr", beam_size=1, max_length=12)
    assert result.hypotheses[0].tokens == translator.tgt_tokenizer.pieces([i for i in expected[1:] if i != vocab["</s>"]])
    # the codes stand for no text, should the model write one
    assert translator.tgt_tokenizer.decode([vocab["en_XX"], *translator.inputs.tokenizer.encode("Hund")]) == "Hund"
    # the engine's own-pieces span leaves out </s> and the code after it
    from nmt_serve.engine.attention_maps import own_pieces

    assert own_pieces(translator, len(src)) == (0, len(src) - 2)
    from test_service import make_client, wait_ready  # the service: the API process's tokens and the engine's suffix

    with make_client(tmp_path / "out", engine_heartbeat_timeout_s=10) as client:
        wait_ready(client, timeout=120)
        r = client.post("/v1/translate", json={"text": text, "source": "de", "target": "fr", "beam_size": 1, "max_length": 12,
                                               "split_sentences": False})
        assert r.status_code == 200 and r.json()["translations"][0]["text"] == result.text, r.text


def test_a_one_to_many_model_serves_its_pairs_only(mbart50_dir, tmp_path, capsys):
    """mBART-50 one-to-many was trained from English only: converted without naming that it is refused
    (its name says what it is); with --source-lang it serves en_XX -> each other language, nothing else,
    in the Translator, in the engine's report and in the service's directions."""
    import shutil

    from nmt_serve.convert.command import main as convert_main
    from nmt_serve.inference.translator import Translator
    from nmt_serve.service.directions import pivot_directions, served_directions

    source = shutil.copytree(mbart50_dir, tmp_path / "mbart-large-50-one-to-many-mmt")
    assert "--source-lang" in _convert_fails(source, tmp_path / "out", capsys)
    # as the Hugging Face cache lays it out, the name a level up
    cached = shutil.copytree(mbart50_dir, tmp_path / "models--facebook--mbart-large-50-many-to-one-mmt" / "snapshots" / "0123abc")
    assert "--target-lang" in _convert_fails(cached, tmp_path / "out", capsys)
    assert "not among this model's 3 language codes" in _convert_fails(source, tmp_path / "out", capsys, "--source-lang", "xx_YY")
    assert convert_main([str(source), str(tmp_path / "out"), "--source-lang", "en"]) == 0
    translator = Translator.load(tmp_path / "out", device="cpu")
    assert sorted(translator.directions) == ["en_XX-de_DE", "en_XX-fr_XX"]
    assert translator.translate(["A dog."], source_lang="en", target_lang="de", beam_size=1, max_length=4)
    with pytest.raises(ValueError, match="does not translate de_DE-fr_XX"):
        translator.translate(["Ein Hund."], source_lang="de", target_lang="fr", beam_size=1, max_length=4)
    info = {"id": "mbart", "source": "mul", "target": "mul", "directions": translator.info.directions,
            "language_codes": translator.info.language_codes, "src_tokenizer": str(tmp_path / "out" / translator.info.src_tokenizer),
            "src_vocab": str(tmp_path / "out" / translator.info.src_vocab)}
    assert sorted(served_directions([info])) == ["en-de", "en-fr"]
    # many-to-one: the targets named
    assert convert_main([str(source), str(tmp_path / "m2o"), "--target-lang", "en_XX"]) == 0
    many_to_one = Translator.load(tmp_path / "m2o", device="cpu").info
    assert sorted(many_to_one.directions) == ["de_DE-en_XX", "fr_XX-en_XX"]
    # together they serve de-fr and fr-de through English, as the service names them
    served = served_directions([info, {**info, "id": "m2o", "directions": many_to_one.directions}])
    assert {d: p.describe()["models"] for d, p in pivot_directions(served, "en").items()} == {
        "de-fr": ["m2o", "mbart"], "fr-de": ["m2o", "mbart"]}


def test_a_conversion_the_loader_refuses_fails_and_leaves_nothing(tmp_path, spm_model, capsys):
    """A Marian model whose target vocabulary has more ids than the decoder has rows is written, then
    refused by the loader: nmt-convert fails naming why and removes what it wrote."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_marian import SHAPES, build_hf_marian, marian_vocab

    hf_dir, _ = build_hf_marian(tmp_path, spm_model, 1, SHAPES[1])
    (hf_dir / "target_vocab.json").write_text(json.dumps(marian_vocab(spm_model, 7, extra=("<x1>", "<x2>"))))
    capsys.readouterr()
    err = _convert_fails(hf_dir, tmp_path / "out", capsys, "--source-lang", "de", "--target-lang", "en")
    assert "the converted model does not load" in err and "target tokenizer" in err
    assert not (tmp_path / "out").exists()


def test_nmt_translate_runs_the_converted_model(nllb_dir, tmp_path):
    import subprocess
    import sys

    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    out = convert(nllb_dir, tmp_path / "nllb")
    text = "Ein Hund läuft über die Wiese."
    [expected] = Translator.load(out, device="cpu").translate([text], source_lang="deu_Latn", target_lang="fra_Latn", beam_size=1)
    proc = subprocess.run([sys.executable, "-m", "nmt_serve.cli.translate", "--model", str(out), "--source-lang", "deu_Latn",
                           "--target-lang", "fra_Latn", "--beam-size", "1", "--device", "cpu", "--no-split-sentences"],
                          input=text + "\n", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == expected.text
    missing = subprocess.run([sys.executable, "-m", "nmt_serve.cli.translate", "--model", str(out), "--device", "cpu"],
                             input=text + "\n", capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "its languages: deu_Latn, eng_Latn, fra_Latn" in missing.stderr


@pytest.mark.parametrize("step_mode", ["eager", "static"])
def test_the_engine_serves_the_converted_model_as_the_translator_does(nllb_dir, tmp_path, step_mode):
    """Calls of two directions in one running batch, each translation forced to start with its target's
    code: the engine's continuous search (eager, and the static decoder as CUDA runs it) gives what the
    Translator's search gives alone, greedy and beam 2, the code left out of the text."""
    import time

    from nmt_serve.convert.command import convert
    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import DecodeOptions, Translate
    from nmt_serve.inference.translator import Translator
    from nmt_serve.network.tokenizer import restore_unknowns

    out = convert(nllb_dir, tmp_path / "nllb")
    reference = Translator.load(out, device="cpu", step_mode="eager")
    translator = Translator.load(out, device="cpu", step_mode=step_mode, static_rows=16, static_length=32)
    texts = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Hallo"]
    for beam in (1, 2):
        core = EngineCore({"nllb": translator}, EngineConfig())
        core.admission.rate = 1e9
        calls = {}
        for i, target in enumerate(["fra_Latn", "eng_Latn"]):
            call = Translate(str(i), "nllb", [translator.inputs.tokens(t, target, "deu_Latn") for t in texts],
                             DecodeOptions(beam_size=beam, max_length=10), time.monotonic() + 60,
                             translator.inputs.target_prefix(target))
            assert core.handle(call) == []
            calls[str(i)] = target
        replies = {}
        while core.busy:
            replies.update({r.id: r for r in core.work()})
        for call_id, target in calls.items():
            expected = reference.translate(texts, source_lang="deu_Latn", target_lang=target, beam_size=beam, max_length=10)
            # the engine answers what the model wrote; the service, like the Translator, puts the source's
            # unknown characters back where it wrote <unk> (a random model writes <unk> freely)
            spans = [translator.inputs.tokenizer.unknown_spans(t) for t in texts]
            got = [restore_unknowns(h[0].text, s) for h, s in zip(replies[call_id].value, spans)]
            assert got == [r.text for r in expected]
            # the forced code is not part of what comes back: as many tokens as the Translator's translation has
            assert [h[0].tokens for h in replies[call_id].value] == [len(r.hypotheses[0].tokens) for r in expected]


@pytest.mark.parametrize("step_mode", ["eager", "static"])
def test_the_search_keeps_the_attention_of_a_translation_forced_to_start_with_its_code(nllb_dir, tmp_path, step_mode):
    """A model with target codes (the first token forced): the source entropy and alignment the search
    keeps, eager or on the device, are those a forced decoding of the translation, code included, reads
    (the source's own pieces leave its language code and </s> out)."""
    import time

    from nmt_serve.convert.command import convert
    from nmt_serve.engine.attention_maps import forced_attention_maps
    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import Attention, DecodeOptions, Translate
    from nmt_serve.inference.translator import Translator

    out = convert(nllb_dir, tmp_path / "nllb")
    translator = Translator.load(out, device="cpu", step_mode=step_mode, static_rows=16, static_length=32)
    cfg = translator.config
    texts = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "Hallo Welt", "Guten Morgen", "Ein Haus"]
    sources = [translator.inputs.tokens(t, "eng_Latn", "deu_Latn") for t in texts]
    prefix = translator.inputs.target_prefix("eng_Latn")
    compared = 0
    for beam in (1, 2):
        core = EngineCore({"nllb": translator}, EngineConfig())
        core.admission.rate = 1e9
        options = DecodeOptions(beam_size=beam, max_length=10, return_source_entropy=True, return_alignment=True)
        assert core.handle(Translate("t", "nllb", sources, options, time.monotonic() + 60, prefix)) == []
        replies = {}
        while core.busy:
            replies.update({r.id: r for r in core.work()})
        for i, nbest in enumerate(replies["t"].value):
            best = nbest[0]
            assert best.source_entropy is not None and len(best.alignment) == best.tokens + 2  # the code's row and eos's
            call = Attention(i, "nllb", sources[i], best.text, 1, ("cross",), list(range(cfg.n_decoder_layers)),
                             list(range(cfg.n_heads)), [], True, time.monotonic() + 60, prefix, score=False)
            [maps] = forced_attention_maps(translator, [call])
            if len(maps["target_tokens"]) != len(best.alignment):  # the text tokenizes otherwise than the model wrote it
                continue
            assert best.source_entropy == pytest.approx(maps["source_entropy"], abs=1e-5)
            assert (best.alignment, best.source_pieces, best.target_pieces) == (
                maps["alignment"], maps["source_tokens"], maps["target_tokens"])
            compared += 1
    assert compared >= 1  # a random model's texts seldom tokenize back as written: test_continuous compares on ids


def test_the_service_serves_the_converted_model_by_either_name_of_a_language(nllb_dir, tmp_path):
    """An NLLB checkpoint behind the API: its languages by ISO 639-1 name (`de`, what LibreTranslate's
    clients and detection use) or by NLLB's own (`deu_Latn`), every pair of them listed, the text the
    offline Translator gives."""
    from test_service import make_client, wait_ready

    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    models = tmp_path / "models"
    out = convert(nllb_dir, models / "nllb")
    text = "Ein Hund läuft über die Wiese."
    [expected] = Translator.load(out, device="cpu").translate([text], source_lang="deu_Latn", target_lang="fra_Latn",
                                                              beam_size=2, max_length=12)
    with make_client(models, engine_heartbeat_timeout_s=10) as client:
        wait_ready(client, timeout=120)
        listed = {m["id"] for m in client.get("/v1/models").json()["models"]}
        assert listed == {f"{s}-{t}" for s in ("de", "en", "fr") for t in ("de", "en", "fr") if s != t}
        assert {lang["code"]: lang["name"] for lang in client.get("/languages").json()} == {"de": "German", "en": "English", "fr": "French"}
        for source, target in (("de", "fr"), ("deu_Latn", "fra_Latn"), ("de", "fra_Latn")):
            r = client.post("/v1/translate", json={"text": text, "source": source, "target": target, "beam_size": 2, "max_length": 12,
                                                   "split_sentences": False})
            assert r.status_code == 200, r.text
            assert r.json()["translations"][0]["text"] == expected.text and r.json()["model"] == "nllb"
        libre = client.post("/translate", json={"q": text, "source": "deu_Latn", "target": "fr"})
        assert libre.status_code == 200, libre.text
        maps = client.post("/v1/attention", json={"text": text, "source": "de", "target": "fr", "beam_size": 1})
        assert maps.status_code == 200, maps.text
        assert maps.json()["source_tokens"][0] == "deu_Latn" and maps.json()["target_tokens"][0] == "fra_Latn"


@pytest.fixture(scope="module")
def mbart50_dir(tmp_path_factory):
    """A Hugging Face mBART-50 directory at a tiny size, laid out as the real one."""
    import json
    from pathlib import Path

    directory = tmp_path_factory.mktemp("mbart50")
    fairseq_spm(directory, Path(__file__).resolve().parents[1] / "fixtures", model_type="unigram")
    config = transformers.MBartConfig(**{**SHAPE, "vocab_size": 300 + 1 + 3 + 1}, scale_embedding=True, decoder_start_token_id=2,
                                      forced_eos_token_id=2)
    randomized(transformers.MBartForConditionalGeneration(config)).save_pretrained(directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": ["de_DE", "en_XX", "fr_XX"]}))
    return directory


def test_mbart50_converted_translates_as_generate_by_either_name(mbart50_dir, tmp_path):
    """mBART-50 through nmt-convert: `[de_DE] + pieces + [</s>]`, `fr_XX` forced, greedy equal to
    generate's; `de`/`fr` name the same languages as `de_DE`/`fr_XX`."""
    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(convert(mbart50_dir, tmp_path / "ours"), device="cpu")
    hf = transformers.MBartForConditionalGeneration.from_pretrained(mbart50_dir).eval()
    vocab = translator.inputs.tokenizer.vocab
    assert translator.inputs.aliases == {"de": "de_DE", "en": "en_XX", "fr": "fr_XX"}
    text = "Ein Hund läuft über die Wiese."
    src = translator.encode_source(text, "fr", "de")
    assert src == translator.encode_source(text, "fr_XX", "de_DE") and src[0] == vocab["de_DE"] and src[-1] == vocab["</s>"]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([src]), forced_bos_token_id=vocab["fr_XX"], num_beams=1, do_sample=False,
                               max_new_tokens=12, suppress_tokens=[0, 1], forced_eos_token_id=2)[0].tolist()
    [result] = translator.translate([text], source_lang="de", target_lang="fr", beam_size=1, max_length=12)
    assert result.hypotheses[0].tokens == translator.tgt_tokenizer.pieces([i for i in expected[2:] if i != vocab["</s>"]])


def test_m2m100_with_its_own_vocab_json_translates_as_generate(tmp_path):
    """M2M100's layout: the ids of its vocab.json, then `__de__`-style language tokens after them."""
    import json
    from pathlib import Path

    import sentencepiece as spm

    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    hf_dir = tmp_path / "m2m100"
    hf_dir.mkdir()
    sp = spm.SentencePieceProcessor(model_file=str(fairseq_spm(hf_dir, Path(__file__).resolve().parents[1] / "fixtures")))
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for i in range(3, sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    (hf_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    languages = ["__de__", "__en__", "__fr__"]
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"additional_special_tokens": languages}))
    config = transformers.M2M100Config(**{**SHAPE, "vocab_size": len(vocab) + len(languages)}, scale_embedding=True,
                                       decoder_start_token_id=2, forced_eos_token_id=2)
    hf = randomized(transformers.M2M100ForConditionalGeneration(config))
    hf.save_pretrained(hf_dir)
    translator = Translator.load(convert(hf_dir, tmp_path / "ours"), device="cpu")
    assert translator.info.language_codes == {"de": "__de__", "en": "__en__", "fr": "__fr__"}
    ids = translator.inputs.tokenizer.vocab
    assert [ids[c] for c in languages] == [len(vocab), len(vocab) + 1, len(vocab) + 2]
    text = "Ein Hund läuft über die Wiese."
    src = translator.encode_source(text, "fr", "de")
    assert src[0] == ids["__de__"] and src[1:-1] == [vocab.get(p, 3) for p in sp.encode(text, out_type=str)]
    with torch.no_grad():
        expected = hf.generate(torch.tensor([src]), forced_bos_token_id=ids["__fr__"], num_beams=1, do_sample=False,
                               max_new_tokens=12, suppress_tokens=[0, 1], forced_eos_token_id=2)[0].tolist()
    [result] = translator.translate([text], source_lang="de", target_lang="fr", beam_size=1, max_length=12)
    assert result.hypotheses[0].tokens == translator.tgt_tokenizer.pieces([i for i in expected[2:] if i != 2])


# no leading or trailing spaces: sentencepiece (ours, fairseq's, CTranslate2's) drops them, transformers'
# tokenizers-based one keeps a trailing one as a piece of its own; the service strips every sentence
TOKENIZER_TEXTS = ["Ein Hund läuft über die Wiese.", "Zwei  Männer spielen\tFußball!", "Größe: 3,5 cm — ça va? «Ja»", "x" * 40,
                   "Ünïcödé ñ ß 東京", "a"]


@pytest.mark.parametrize("family", ["nllb", "mbart50"])
def test_source_and_target_tokens_equal_transformers_own_tokenizer(family, nllb_dir, mbart50_dir, tmp_path):
    """transformers' own tokenizer of the family, built by transformers from the same sentencepiece
    model (it converts it itself; protobuf), tokenizes the source and the target's start as ours does:
    `[source code] + pieces + [</s>]`, and the target code first. Compared as tokens: built from the
    sentencepiece model alone, transformers 5 places <mask> before the language codes, where the
    shipped tokenizer.json (and fairseq, and our vocab.json) put it after them."""
    pytest.importorskip("google.protobuf")
    from nmt_serve.convert.command import convert
    from nmt_serve.inference.translator import Translator

    hf_dir, (src_code, tgt_code), cls = {
        "nllb": (nllb_dir, ("deu_Latn", "fra_Latn"), transformers.NllbTokenizer),
        "mbart50": (mbart50_dir, ("de_DE", "fr_XX"), transformers.MBart50Tokenizer),
    }[family]
    theirs = cls.from_pretrained(hf_dir, src_lang=src_code, tgt_lang=tgt_code)
    translator = Translator.load(convert(hf_dir, tmp_path / "ours"), device="cpu")
    vocab = translator.inputs.tokenizer.vocab
    piece_of = {i: p for p, i in vocab.items()}
    assert theirs.convert_tokens_to_ids([src_code, tgt_code]) != [theirs.unk_token_id] * 2  # the codes are theirs too
    for text in TOKENIZER_TEXTS:
        ours = translator.encode_source(text, tgt_code, src_code)
        expected = theirs(text).input_ids
        assert [piece_of[i] for i in ours] == theirs.convert_ids_to_tokens(expected), text
        # the pieces themselves (not the codes) carry the same ids
        assert [i for i in ours if piece_of[i] not in (src_code, tgt_code)] == [i for i in expected if i < vocab[min(translator.info.language_codes, key=vocab.get)]]
        target = theirs(text_target=text).input_ids
        assert theirs.convert_ids_to_tokens(target[:1]) == [tgt_code]  # the target starts with its code: ours is forced there
        assert translator.inputs.target_prefix(tgt_code) == [vocab[tgt_code]]


def test_a_model_named_by_codes_competes_for_the_directions_the_service_names_alike(nllb_dir, tmp_path, tagged_spm):
    """The engine names a converted NLLB model's directions as the API does (`deu_Latn-fra_Latn` is `de-fr`):
    beside a scored model of the same languages it stays unloaded, and where `prefer` names it the other
    one does, so that no model is loaded that the API would never route to."""
    from test_multilingual import _scores, make_multilingual

    from nmt_serve.convert.command import convert
    from nmt_serve.engine.loader import plan_loads

    root = tmp_path / "models"
    convert(nllb_dir, root / "nllb")
    every = [f"{s}-{t}" for s in ("de", "en", "fr") for t in ("de", "en", "fr") if s != t]
    make_multilingual(root / "multi", tagged_spm, metadata=_scores({d: 30.0 for d in every}))
    plan = plan_loads(root, "cpu")
    assert [name for name, _ in plan.chosen.values()] == ["multi"]
    [left] = plan.unloaded
    assert left["model"] == "nllb" and sorted(left["directions"]) == sorted(every) and left["served_by"] == ["multi"]
    assert "NMT_PREFER=nllb" in left["reason"] and "model_card" in left["reason"]
    plan = plan_loads(root, "cpu", prefer="nllb")
    assert [name for name, _ in plan.chosen.values()] == ["nllb"]
    assert [(u["model"], u["reason"]) for u in plan.unloaded] == [("multi", "prefer names nllb")]


def test_a_model_named_by_codes_is_measured_under_the_names_routing_reads(nllb_dir, tmp_path, tagged_spm, capsys):
    """model_card on a converted NLLB model: measured in the directions between the languages the test files
    hold, each recorded under the service's name (`de-en`, not `deu_Latn-eng_Latn`), so that routing weighs it
    against the other models by them: a set measured that the other model lacks takes the direction."""
    import gzip

    from test_multilingual import _scores, make_multilingual

    from nmt_serve.convert.command import convert
    from nmt_serve.engine.loader import plan_loads
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.training import model_card

    root, data = tmp_path / "models", tmp_path / "data"
    convert(nllb_dir, root / "nllb")
    every = [f"{s}-{t}" for s in ("de", "en", "fr") for t in ("de", "en", "fr") if s != t]
    make_multilingual(root / "multi", tagged_spm, metadata=_scores({d: 30.0 for d in every}))
    data.mkdir()
    lines = {"de": ["Ein Hund läuft.", "Zwei Kinder spielen."], "en": ["A dog runs.", "Two children play."],
             "fr": ["Un chien court.", "Deux enfants jouent."]}
    for lang, text in lines.items():
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("\n".join(text) + "\n")
    for lang in ("de", "en"):  # one pair of files: de-en and en-de
        (data / f"eval.de-en.{lang}").write_text("\n".join(lines[lang]) + "\n")
    common = ["--model", str(root / "nllb"), "--data", str(data), "--splits", "test_2016_flickr", "--beam-sizes", "4",
              "--quantizations", "none", "--pair-tests", f"held-out={data}/eval.{{pair}}.{{lang}}"]
    assert model_card.main(common) == 0
    scores = read_info(root / "nllb").test_scores()
    assert sorted(scores) == sorted(every)
    assert set(scores["de-en"]) == set(scores["en-de"]) == {"test_2016_flickr", "held-out"} and set(scores["de-fr"]) == {"test_2016_flickr"}
    rows = read_info(root / "nllb").metadata["scores"]
    assert any(r["direction"] == "de-fr" and r.get("pivot") == "en" for r in rows)  # through English, as the others
    card = (root / "nllb" / "README.md").read_text()
    assert "| de-en | held-out | beam 4 | float32 |" in card and "None measured here yet" not in card
    # de-en and en-de: measured on more sets than `multi`; the other directions: `multi`'s 30 BLEU
    routes = plan_loads(root, "cpu")
    assert sorted(name for name, _ in routes.chosen.values()) == ["multi", "nllb"] and not routes.unloaded
    # --directions in either naming, checked before the model loads
    assert model_card.main([*common, "--directions", "deu_Latn-fra_Latn,de-fr", "--pivot", ""]) == 0
    assert {r["direction"] for r in read_info(root / "nllb").metadata["scores"]} == {"de-fr"}
    capsys.readouterr()
    for extra, message in ((["--directions", "de-xx"], "--directions de-xx: the model does not translate it"),
                           (["--directions", "de-en", "--splits", "val"], "de-en: --data")):
        with pytest.raises(SystemExit) as refused:
            model_card.main([*common, *extra])
        assert refused.value.code == 2 and message in capsys.readouterr().err


def test_a_measurement_cut_short_resumes_where_it_stopped(nllb_dir, tmp_path, monkeypatch, capsys):
    """model_card keeps each row beside the checkpoint as it measures it: run again with the same settings, it
    measures only the rest; with other settings (or weights) it measures anew; the file goes with the card."""
    import gzip

    from nmt_serve.convert.command import convert
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.training import model_card
    from nmt_serve.training.measured_rows import PARTIAL, row_key

    ours, data = convert(nllb_dir, tmp_path / "nllb"), tmp_path / "data"
    data.mkdir()
    for lang, text in {"de": "Ein Hund läuft.", "en": "A dog runs.", "fr": "Un chien court."}.items():
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write(text + "\n")
    args = ["--model", str(ours), "--data", str(data), "--splits", "test_2016_flickr", "--beam-sizes", "1,4",
            "--quantizations", "none", "--pivot", ""]
    real, calls = model_card.evaluate, []

    def counted(*a, cut_after: int | None = None, **k):
        if cut_after is not None and len(calls) == cut_after:
            raise KeyboardInterrupt  # the run stopped, as by Ctrl-C or a lost machine
        calls.append(k["target_lang"])
        return real(*a, **k)

    monkeypatch.setattr(model_card, "evaluate", lambda *a, **k: counted(*a, cut_after=5, **k))
    with pytest.raises(KeyboardInterrupt):
        model_card.main(args)
    assert len(json.loads((ours / PARTIAL).read_text())["rows"]) == 5
    monkeypatch.setattr(model_card, "evaluate", counted)
    calls.clear()
    assert model_card.main(args) == 0
    assert len(calls) == 6 * 2 - 5 and "5 rows an earlier run measured are kept" in capsys.readouterr().out
    resumed = {row_key(r): r["bleu"] for r in read_info(ours).metadata["scores"]}
    assert len(resumed) == 12 and not (ours / PARTIAL).exists()
    calls.clear()
    assert model_card.main(args) == 0 and len(calls) == 12  # nothing left to resume: all measured again
    assert {row_key(r): r["bleu"] for r in read_info(ours).metadata["scores"]} == resumed
    # cut short again, then run with another beam: its rows are not the earlier ones
    calls.clear()
    monkeypatch.setattr(model_card, "evaluate", lambda *a, **k: counted(*a, cut_after=3, **k))
    with pytest.raises(KeyboardInterrupt):
        model_card.main(args)
    monkeypatch.setattr(model_card, "evaluate", counted)
    calls.clear()
    assert model_card.main([*args, "--beam-sizes", "4"]) == 0 and len(calls) == 6
    assert "of other settings or weights: measuring anew" in capsys.readouterr().out


def test_a_model_named_by_codes_gets_quality_flag_thresholds_under_the_service_names(nllb_dir, tmp_path, capsys):
    """flag_calibration on a converted NLLB model: the directions between the languages with files, translated
    from their source language, recorded as the service names them (where it looks them up)."""
    import gzip
    from pathlib import Path

    from nmt_serve.convert.command import convert
    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.training import flag_calibration

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    ours, data = convert(nllb_dir, tmp_path / "nllb"), tmp_path / "data"
    data.mkdir()
    for lang in ("de", "en", "fr"):
        with gzip.open(data / f"val.{lang}.gz", "wt") as f:
            # a few words of each line (the tiny model takes 64 positions), twice over
            f.write("".join(" ".join(line.split()[:4]) + "\n" for line in (fixtures / f"val40.{lang}").read_text().splitlines() * 2))
    assert flag_calibration.main(["--model", str(ours), "--data", str(data), "--lines", "20", "--beam-size", "1"]) == 0
    measured = read_info(ours).metadata["quality_flags"]["measured_on"]
    assert measured["directions"] == ["de-en", "de-fr", "en-de", "en-fr", "fr-de", "fr-en"] and measured["sentences"] == 120
    # a language without a file is no direction's target either (NLLB-200 would add 201 per language)
    (data / "val.fr.gz").unlink()
    assert flag_calibration.main(["--model", str(ours), "--data", str(data), "--lines", "60", "--beam-size", "1"]) == 0
    assert read_info(ours).metadata["quality_flags"]["measured_on"]["directions"] == ["de-en", "en-de"]
    for directions, message in (("de-xx", "not served"), ("deu_Latn-eng_Latn", "too few")):  # either naming is taken
        with pytest.raises(SystemExit):
            flag_calibration.main(["--model", str(ours), "--data", str(data), "--lines", "20", "--directions", directions])
        assert message in capsys.readouterr().err
