"""MarianMT interop: random Hugging Face Marian models built here (no download), converted both ways,
give the same logits and the same greedy and beam outputs as Hugging Face."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from conftest import make_checkpoint, random_sources  # noqa: E402
from transformers import MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

from nmt_serve.convert.marian import export_marian, import_marian  # noqa: E402
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate  # noqa: E402
from nmt_serve.inference.translator import Translator  # noqa: E402
from nmt_serve.network.checkpoint import load_checkpoint  # noqa: E402

SHAPES = [
    dict(d_model=32, heads=4, ffn=64, enc=2, dec=2, activation="swish", shared=True, tie=True, scale=True),
    dict(d_model=48, heads=6, ffn=96, enc=1, dec=3, activation="gelu", shared=False, tie=True, scale=True),
    dict(d_model=32, heads=2, ffn=48, enc=3, dec=1, activation="relu", shared=True, tie=False, scale=False),
]


def marian_vocab(spm_model: Path, seed: int, extra: tuple[str, ...] = ()) -> dict[str, int]:
    """A Marian-style vocabulary over the sentencepiece pieces: </s>=0, <unk>=1, shuffled pieces, <pad> last."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]
    random.Random(seed).shuffle(pieces)
    vocab = {"</s>": 0, "<unk>": 1}
    for p in [*extra, *pieces]:
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def build_hf_marian(tmp: Path, spm_model: Path, seed: int, shape: dict, extra: tuple[str, ...] = ()) -> tuple[Path, MarianMTModel]:
    vocab = marian_vocab(spm_model, seed, extra)
    V = len(vocab)
    config = MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=shape["d_model"], encoder_layers=shape["enc"], decoder_layers=shape["dec"],
        encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"], encoder_ffn_dim=shape["ffn"],
        decoder_ffn_dim=shape["ffn"], max_position_embeddings=128, pad_token_id=V - 1, eos_token_id=0,
        decoder_start_token_id=V - 1, forced_eos_token_id=0, activation_function=shape["activation"],
        scale_embedding=shape["scale"], share_encoder_decoder_embeddings=shape["shared"], tie_word_embeddings=shape["tie"],
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # make every parameter matter: norms, biases and the logits bias away from their init
        for name, p in model.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        model.final_logits_bias.normal_(0, 0.5)
        model.final_logits_bias[0, 0] += 2.0  # eos reachable: hypotheses end at different steps
    out = tmp / f"hf-{seed}"
    model.save_pretrained(out)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(spm_model.read_bytes())
    (out / "vocab.json").write_text(json.dumps(vocab))
    if not shape["shared"]:
        (out / "target_vocab.json").write_text(json.dumps(marian_vocab(spm_model, seed + 100)))
    return out, model


@pytest.fixture(params=list(enumerate(SHAPES)), ids=["shared-swish", "separate-gelu", "untied-relu"])
def converted(request, tmp_path, spm_model):
    seed, shape = request.param
    hf_dir, hf_model = build_hf_marian(tmp_path, spm_model, seed, shape)
    ours_dir = import_marian(hf_dir, tmp_path / "ours", "de", "en")
    model, *_ = load_checkpoint(ours_dir)
    return hf_dir, hf_model, ours_dir, model


def sources(model, batch=4, max_len=9, seed=0):
    cfg = model.config
    src = random_sources(batch, max_len, cfg.src_vocab_size - 1, seed=seed, eos=cfg.eos_id, pad=cfg.pad_id)
    src[(src == 1) | (src == 2) | (src == 3)] = 5  # random_sources draws ids from 4 up: keep clear of specials
    src[src == cfg.pad_id] = cfg.pad_id
    return src


def hf_tokens(row: torch.Tensor, eos: int, pad: int) -> list[int]:
    out = []
    for t in row.tolist()[1:]:  # drop the decoder start token
        if t == eos:
            break
        out.append(t)
    return out


def test_logits_match_hugging_face(converted):
    _, hf_model, _, ours = converted
    cfg = ours.config
    src = sources(ours)
    tgt_in = torch.randint(2, cfg.tgt_vocab_size - 1, (src.size(0), 7))
    tgt_in[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        theirs = hf_model(input_ids=src, attention_mask=(src != cfg.pad_id).long(), decoder_input_ids=tgt_in).logits
        mine = ours(src, tgt_in)
    assert (theirs - mine).abs().max().item() <= 1e-4


@pytest.mark.parametrize("beam_size", [1, 4])
def test_search_matches_hugging_face_generate(converted, beam_size, beam_cache_mode):
    _, hf_model, _, ours = converted
    cfg = ours.config
    for seed in (0, 1):
        src = sources(ours, batch=3, seed=seed)
        with torch.no_grad():
            theirs = hf_model.generate(
                input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam_size, do_sample=False,
                max_new_tokens=12, early_stopping=True, length_penalty=1.0, bad_words_ids=[[cfg.pad_id]],
            )
        mine = generate(ModelRunner(ours), src, SearchOptions(beam_size=beam_size, max_length=12, length_penalty=1.0))
        for row, hyps in zip(theirs, mine):
            assert hyps[0].tokens == hf_tokens(row, cfg.eos_id, cfg.pad_id)


def test_scores_match_hugging_face_generate_where_the_length_limit_ends_a_hypothesis(converted):
    """At max_length generate forces eos at log-prob 0 (ForcedEOSTokenLogitsProcessor): the best hypothesis'
    score is the sum of its tokens' log-probs alone, ours too (search.AT_MAX_EOS), and so the same wins."""
    _, hf_model, _, ours = converted
    cfg = ours.config
    capped = 0
    for beam_size in (2, 4):  # (greedy search has no score in generate's output: its processors act on logits)
        src = sources(ours, batch=3, seed=2)
        with torch.no_grad():
            theirs = hf_model.generate(
                input_ids=src, attention_mask=(src != cfg.pad_id).long(), num_beams=beam_size, do_sample=False, max_new_tokens=6,
                min_new_tokens=5, early_stopping=True, length_penalty=0.0, bad_words_ids=[[cfg.pad_id]], output_scores=True, return_dict_in_generate=True,
            )
        mine = generate(ModelRunner(ours), src, SearchOptions(beam_size=beam_size, min_length=5, max_length=6, length_penalty=0.0))
        for row, hyps, score in zip(theirs.sequences, mine, theirs.sequences_scores.tolist()):
            assert hyps[0].tokens == hf_tokens(row, cfg.eos_id, cfg.pad_id)
            assert hyps[0].score == pytest.approx(score, abs=1e-4)
            capped += len(hyps[0].tokens) + 1 == 6
    assert capped == 6  # eos before the limit is banned: the limit ends every one


def test_tokenizer_matches_marian_tokenizer(converted):
    hf_dir, _, ours_dir, _ = converted
    separate = (hf_dir / "target_vocab.json").exists()
    theirs = MarianTokenizer(
        str(hf_dir / "source.spm"), str(hf_dir / "target.spm"), str(hf_dir / "vocab.json"),
        target_vocab_file=str(hf_dir / "target_vocab.json") if separate else None, separate_vocabs=separate,
    )
    translator = Translator.load(ours_dir, device="cpu")
    for text in ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee ☃."]:
        assert translator.encode_source(text) == theirs(text)["input_ids"]
    ids = translator.tgt_tokenizer.encode("A man rides a bike.")
    assert translator.tgt_tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_export_round_trip_loads_in_hugging_face(converted, tmp_path):
    _, _, ours_dir, ours = converted
    exported = export_marian(ours_dir, tmp_path / "exported")
    hf_model = MarianMTModel.from_pretrained(exported).eval()
    cfg = ours.config
    src = sources(ours, seed=3)
    tgt_in = torch.randint(2, cfg.tgt_vocab_size - 1, (src.size(0), 6))
    tgt_in[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        theirs = hf_model(input_ids=src, attention_mask=(src != cfg.pad_id).long(), decoder_input_ids=tgt_in).logits
        mine = ours(src, tgt_in)
    assert (theirs - mine).abs().max().item() <= 1e-4
    again, *_ = load_checkpoint(import_marian(exported, tmp_path / "again", "de", "en"))
    with torch.no_grad():
        assert (again(src, tgt_in) - mine).abs().max().item() <= 1e-5


def test_models_without_a_marian_equivalent_are_refused(tmp_path, spm_model):
    pre = make_checkpoint(tmp_path / "pre", spm_model, "de", "en", seed=1, norm_placement="pre", positional_layout="halves")
    with pytest.raises(ValueError, match="post-norm"):
        export_marian(pre, tmp_path / "out")
    interleaved = make_checkpoint(tmp_path / "inter", spm_model, "de", "en", seed=1, norm_placement="post")
    with pytest.raises(ValueError, match="interleaved"):
        export_marian(interleaved, tmp_path / "out")


def test_a_multi_target_model_takes_its_target_token_first_as_marian_tokenizer_puts_it(tmp_path, spm_model):
    """opus-mt-en-ROMANCE and the like choose their target by a `>>xx<<` token first in the source: each
    becomes a direction, and the converted model translates as generate does with that token."""
    from nmt_serve.convert.huggingface import UnsupportedModel

    hf_dir, hf_model = build_hf_marian(tmp_path, spm_model, 5, SHAPES[0], extra=(">>fr<<", ">>es<<", ">>pt_br<<"))
    with pytest.raises(UnsupportedModel, match="its >>xx<< tokens"):
        import_marian(hf_dir, tmp_path / "bad", "en", "de")
    ours_dir = import_marian(hf_dir, tmp_path / "ours", "en", None)
    translator = Translator.load(ours_dir, device="cpu")
    assert sorted(translator.directions) == ["en-es", "en-fr", "en-pt_br"]
    theirs = MarianTokenizer(str(hf_dir / "source.spm"), str(hf_dir / "target.spm"), str(hf_dir / "vocab.json"))
    for target in ("es", "fr"):
        text = "Ein Mann fährt Fahrrad."
        src = translator.encode_source(text, target)
        assert src == theirs(f">>{target}<< {text}")["input_ids"] and src[0] == theirs.encoder[f">>{target}<<"]
        with torch.no_grad():
            expected = hf_model.generate(torch.tensor([src]), num_beams=1, do_sample=False, max_new_tokens=10,
                                         bad_words_ids=[[hf_model.config.pad_token_id]])[0]
        [result] = translator.translate([text], target_lang=target, beam_size=1, max_length=10)
        assert result.hypotheses[0].tokens == translator.tgt_tokenizer.pieces(hf_tokens(expected, 0, hf_model.config.pad_token_id))
    from test_service import make_client, wait_ready

    [expected] = translator.translate(["A man rides a bike."], target_lang="es", beam_size=2, max_length=10)
    with make_client(tmp_path / "ours", engine_heartbeat_timeout_s=10) as client:  # the checkpoint alone as a models dir
        wait_ready(client, timeout=120)
        assert {m["id"] for m in client.get("/v1/models").json()["models"]} >= {"en-es", "en-fr"}
        r = client.post("/v1/translate", json={"text": "A man rides a bike.", "source": "en", "target": "es", "beam_size": 2,
                                               "max_length": 10, "split_sentences": False})
        assert r.status_code == 200, r.text
        assert r.json()["translations"][0]["text"] == expected.text
    one = Translator.load(import_marian(hf_dir, tmp_path / "one", "en", "es"), device="cpu")
    assert one.directions == ["en-es"]
    with pytest.raises(UnsupportedModel, match="--target-lang"):  # one target, no tokens: it must be named
        import_marian(build_hf_marian(tmp_path / "plain", spm_model, 6, SHAPES[0])[0], tmp_path / "plain-ours", "en", None)


def test_a_converted_model_is_measured_on_every_named_test_set_and_its_card_says_what_it_is(tmp_path, spm_model):
    """model_card on an nmt-convert checkpoint: Multi30k's split and a pairwise held-out set, recorded where
    routing reads them, and a card that names the upstream model instead of a training run."""
    import gzip

    from nmt_serve.network.checkpoint import read_info
    from nmt_serve.training import model_card

    from nmt_serve.convert.command import convert

    hf_dir, _ = build_hf_marian(tmp_path, spm_model, 0, SHAPES[0])
    (hf_dir / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# opus-mt-de-en\n")
    ours = convert(hf_dir, tmp_path / "opus-mt-de-en", source_lang="de", target_lang="en")
    # as converted: the upstream card kept, and a card of its own with no scores yet
    assert (ours / "UPSTREAM.md").read_text().startswith("---\nlicense: cc-by-4.0")
    card = (ours / "README.md").read_text()
    assert "None measured here yet" in card and "`UPSTREAM.md`" in card and "| weights | float32 safetensors |" in card
    data = tmp_path / "data"
    data.mkdir()
    german, english = ["Ein Hund läuft.", "Zwei Kinder spielen."], ["A dog runs.", "Two children play."]
    for lang, lines in (("de", german), ("en", english)):
        with gzip.open(data / f"test_2016_flickr.{lang}.gz", "wt") as f:
            f.write("\n".join(lines) + "\n")
        (data / f"eval.en-de.{lang}").write_text("\n".join(lines) + "\n")  # one file pair serves both directions
    assert model_card.main(["--model", str(ours), "--data", str(data), "--splits", "test_2016_flickr", "--beam-sizes", "4",
                            "--quantizations", "none", "--pair-tests", f"held-out={data}/eval.{{pair}}.{{lang}}"]) == 0
    assert set(read_info(ours).test_scores()["de-en"]) == {"test_2016_flickr", "held-out"}
    card = (ours / "README.md").read_text()
    assert card.startswith("# de-en Transformer, converted from MarianMT") and str(hf_dir) in card
    assert "| de-en | held-out | beam 4 | float32 |" in card and "| de-en | test_2016_flickr | beam 4 | float32 |" in card
    assert "Trained from scratch" not in card and "## Training" not in card and "float32 safetensors" in card
    assert f"| parameters | {Translator.load(ours, device='cpu').num_parameters():,} |" in card  # read without loading it


def test_the_marian_import_command_writes_the_card_too(tmp_path, spm_model):
    from nmt_serve.convert.marian import main

    hf_dir, _ = build_hf_marian(tmp_path, spm_model, 0, SHAPES[0])
    assert main(["import", str(hf_dir), str(tmp_path / "ours"), "--source-lang", "de", "--target-lang", "en"]) == 0
    assert (tmp_path / "ours" / "README.md").read_text().startswith("# de-en Transformer, converted from MarianMT")
