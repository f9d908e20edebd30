"""One model for many directions: tags, multi-way data, training, checkpoints, the Translator and the
CLIs with a target language, and the service routing each direction to a model."""
import dataclasses
import gzip
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from conftest import make_checkpoint, random_model
from fastapi.testclient import TestClient

from nmt_serve.engine.loader import choose, load_models
from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import (
    CheckpointInfo,
    load_checkpoint,
    read_info,
    save_checkpoint,
)
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.routing import Offer, best, decode_cost, route
from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.service.app import create_app
from nmt_serve.service.directions import served_directions
from nmt_serve.service.settings import Settings
from nmt_serve.training import flag_calibration, model_card
from nmt_serve.training.evaluate import evaluate
from nmt_serve.training.multiway import (
    held_for_validation,
    multiway_pairs,
    pair_corpora,
    pair_texts,
    parse_directions,
    parse_languages,
    parse_weights,
    read_multiway,
    repeated_lines,
    tag_ids,
    target_tag,
)
from nmt_serve.training.train import TrainConfig, Trainer
from nmt_serve.training.train import main as train_main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
LANGS = ["de", "en", "fr"]


def make_multilingual(directory: Path, spm: Path, seed: int = 5, directions=None, metadata=None, **overrides) -> Path:
    """A random multilingual checkpoint over LANGS (every direction unless told)."""
    tok = Tokenizer(spm)
    model = random_model(seed=seed, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, **overrides)
    directions = directions or [f"{s}-{t}" for s, t in parse_directions("all", LANGS)]
    info = CheckpointInfo(model.config, "mul", "mul", "spm.model", "spm.model", metadata or {}, directions=directions,
                          target_tags={lang: target_tag(lang) for lang in LANGS})
    return save_checkpoint(directory, model, info, {"spm.model": spm})


def test_languages_and_directions():
    assert parse_languages("en, de,fr") == ["en", "de", "fr"]
    assert parse_directions("all", ["en", "de", "fr"]) == [("en", "de"), ("en", "fr"), ("de", "en"), ("de", "fr"),
                                                          ("fr", "en"), ("fr", "de")]
    assert parse_directions("en-de,de-en,en-de", ["en", "de"]) == [("en", "de"), ("de", "en")]
    for bad in ("en", "en,en"):
        with pytest.raises(ValueError, match="two or more"):
            parse_languages(bad)
    for bad in ("en-cs", "en-en", "ende"):
        with pytest.raises(ValueError, match="SRC-TGT"):
            parse_directions(bad, ["en", "de"])


def test_multiway_pairs_put_the_target_tag_first(tagged_spm):
    tok = Tokenizer(tagged_spm)
    tags = tag_ids(tok, LANGS)
    assert len(set(tags.values())) == 3 and all(tok.sp.id_to_piece(i) == target_tag(lang) for lang, i in tags.items())
    texts = read_multiway(str(FIXTURES / "val40.{lang}"), LANGS)
    pairs = multiway_pairs(texts, parse_directions("all", LANGS), tok, tags)
    assert len(pairs) == 6 and all(len(p) == 40 for p in pairs.values())
    de_fr = pairs[("de", "fr")]
    assert de_fr.src[0] == [tags["fr"]] + tok.encode(texts["de"][0], add_eos=True)
    assert de_fr.tgt[0] == tok.encode(texts["fr"][0], add_eos=True)
    # the same English sentence is the target of every X-en direction, its source side tagged <2en>
    assert pairs[("fr", "en")].tgt == pairs[("de", "en")].tgt and pairs[("fr", "en")].src[3][0] == tags["en"]
    with pytest.raises(ValueError, match="no piece"):
        tag_ids(tok, ["cs"])
    with pytest.raises(ValueError, match="line-aligned"):
        read_multiway(str(FIXTURES / "{lang}.de"), ["val40", "train300"])
    with pytest.raises(ValueError, match="needs {lang}"):
        read_multiway(str(FIXTURES / "val40.de"), LANGS)


def test_pair_corpora_weigh_pairs_by_origin_and_keep_validation_apart(tmp_path, tagged_spm, caplog):
    tok = Tokenizer(tagged_spm)
    tags = tag_ids(tok, LANGS)
    english = (FIXTURES / "train300.en").read_text().splitlines()[:100]
    (tmp_path / "train.en-fr.en").write_text("\n".join(english) + "\n")
    (tmp_path / "train.en-fr.fr").write_text("\n".join((FIXTURES / "train300.fr").read_text().splitlines()[:100]) + "\n")
    kinds = ["short"] * 20 + ["catalog"] * 80
    (tmp_path / "train.en-fr.origin").write_text("".join(f"{k}\tpkg{i}\tbookworm\n" for i, k in enumerate(kinds)))
    pattern = str(tmp_path / "train.{pair}.{lang}")
    train, valid = pair_corpora(pattern, [("fr", "en"), ("en", "fr")], tok, tags, valid_lines=10,
                                weights=parse_weights("short=3, catalog=0.5"), seed=3)
    assert set(train) == set(valid) == {("fr", "en"), ("en", "fr")}
    data, refs = valid[("fr", "en")]
    assert len(data) == len(refs) == 10 and refs[0] == english[5] and refs[1] == english[15]
    assert data.src[0][0] == tags["en"] and data.tgt[0] == tok.encode(english[5], add_eos=True)
    trained = [tok.decode(t) for t in train[("fr", "en")].tgt]
    assert not set(refs) & set(trained)
    # 18 short lines trained three times each; about half of the 72 catalog lines, each once
    assert trained.count(tok.decode(tok.encode(english[0]))) == 3 and 18 * 3 + 20 < len(trained) < 18 * 3 + 52
    again, _ = pair_corpora(pattern, [("fr", "en")], tok, tags, valid_lines=10,
                            weights=parse_weights("short=3,catalog=0.5"), seed=3)
    assert again[("fr", "en")].tgt == train[("fr", "en")].tgt and ("en", "fr") not in again
    unweighted, _ = pair_corpora(pattern, [("fr", "en")], tok, tags)
    assert len(unweighted[("fr", "en")]) == 100
    # a weight for a kind the corpus lacks (a misspelt one) changes nothing, and the log says so
    with caplog.at_level("WARNING", logger="train"):
        pair_corpora(pattern, [("fr", "en")], tok, tags, weights=parse_weights("shrot=3,catalog=0.5"))
    assert "pair weights for shrot change nothing" in caplog.text and "its kinds: catalog, short" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="train"):
        pair_corpora(pattern, [("fr", "en")], tok, tags, weights=parse_weights("short=3"))
    assert "change nothing" not in caplog.text
    for bad in ("short", "short=x", "short=-1"):
        with pytest.raises(ValueError, match="KIND=WEIGHT"):
            parse_weights(bad)
    (tmp_path / "train.en-fr.origin").unlink()
    with pytest.raises(ValueError, match="origin file"):
        pair_corpora(pattern, [("fr", "en")], tok, tags, weights={"short": 2})


def test_a_new_tokenizer_learns_the_pair_corpora_words_but_not_their_validation_lines(tmp_path):
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    english = (FIXTURES / "train300.en").read_text().splitlines()
    german = (FIXTURES / "train300.de").read_text().splitlines()
    # a word the captions never use, on every line of the pair corpus
    (pairs / "train.en-de.en").write_text("".join(f"{line} Quxzywaffle\n" for line in english))
    (pairs / "train.en-de.de").write_text("".join(f"{line} Quxzywaffel\n" for line in german))
    sides = pair_texts(str(pairs / "train.{pair}.{lang}"), [("de", "en")], valid_lines=10)
    held = held_for_validation(300, 10)
    assert len(held) == 10 and [len(side) for side in sides] == [290, 290]
    assert sides[0][0] == german[0] + " Quxzywaffel" and not {german[i] + " Quxzywaffel" for i in held} & set(sides[0])
    # weighted as training weighs the lines: the first 100 x3, the rest once
    (pairs / "train.en-de.origin").write_text("".join(f"{'dictionary' if i < 100 else 'catalog'}\tpkg\tbookworm\n"
                                                      for i in range(300)))
    weighted = pair_texts(str(pairs / "train.{pair}.{lang}"), [("de", "en")], 10, {"dictionary": 3}, seed=1)
    first = sum(1 for i in range(100) if i not in held)
    assert [len(side) for side in weighted] == [3 * first + 290 - first] * 2
    assert weighted[1][:3] == [english[0] + " Quxzywaffle"] * 3
    assert repeated_lines(["a", "b"], 2, seed=1) == ["a", "a", "b", "b"] and len(repeated_lines(["a"] * 1000, 0.5, 1)) < 600
    (pairs / "train.en-de.origin").unlink()

    def tokenizer(run: str, **pair) -> Tokenizer:
        return Trainer(TrainConfig(
            languages="de,en,fr", train_data=str(FIXTURES / "train300.{lang}"), valid_data=str(FIXTURES / "val40.{lang}"),
            run_dir=str(tmp_path / run), vocab_size=500, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
            n_decoder_layers=1, max_tokens=800, valid_max_sentences=4, **pair)).tokenizer

    captions = tokenizer("captions")
    both = tokenizer("both", pair_data=str(pairs / "train.{pair}.{lang}"), pair_valid_lines=10)
    assert len(both.encode("Quxzywaffle")) < len(captions.encode("Quxzywaffle"))
    assert len(both.encode("Quxzywaffle")) <= 2
    # made on one machine for a run on another: the tokenizer alone, no training state
    only = tmp_path / "only"
    train_main(["--languages", "de,en,fr", "--train-data", str(FIXTURES / "train300.{lang}"), "--valid-data",
                str(FIXTURES / "val40.{lang}"), "--run-dir", str(only), "--vocab-size", "500", "--pair-data",
                str(pairs / "train.{pair}.{lang}"), "--pair-valid-lines", "10", "--tokenizer-only", "1"])
    assert (only / "spm.model").is_file() and not (only / "state.pt").exists()
    assert Tokenizer(only / "spm.model").encode("Quxzywaffle") == both.encode("Quxzywaffle")


def test_a_time_boxed_run_exports_as_it_stops_when_asked_and_resumes_afterwards(tmp_path, monkeypatch):
    import time

    def config(run: str, **overrides) -> TrainConfig:
        return TrainConfig(
            languages="de,en", train_data=str(FIXTURES / "train300.{lang}"), valid_data=str(FIXTURES / "val40.{lang}"),
            run_dir=str(tmp_path / run), output=str(tmp_path / run / "final"), vocab_size=300, d_model=32, n_heads=2,
            d_ff=64, n_encoder_layers=1, n_decoder_layers=1, max_tokens=800, warmup_steps=2, valid_max_sentences=4,
            **{"max_minutes": 1, **overrides})

    offset = [0.0]
    real_time, loss_on = time.time, Trainer.loss_on

    def minute_long_step(self, *args):  # each training step takes a minute by the clock: max_minutes 1 ends it
        offset[0] += 61.0
        return loss_on(self, *args)

    with monkeypatch.context() as patched:
        patched.setattr(time, "time", lambda: real_time() + offset[0])
        patched.setattr(Trainer, "loss_on", minute_long_step)
        plain = Trainer(config("plain"))
        plain.run()
        boxed = Trainer(config("boxed", export_at_stop=1))
        boxed.run()
    assert plain.step == boxed.step == 1
    assert (tmp_path / "plain" / "state.pt").is_file() and not (tmp_path / "plain" / "final").exists()
    assert read_info(tmp_path / "boxed" / "final").metadata["training"]["steps"] == boxed.step
    again = Trainer(config("boxed", export_at_stop=1, max_minutes=0, max_steps=boxed.step + 1))
    assert again.step == boxed.step
    again.run()
    assert read_info(tmp_path / "boxed" / "final").metadata["training"]["steps"] == boxed.step + 1


def test_multilingual_training_resumes_exports_and_translates(tmp_path):
    run_dir = tmp_path / "run"

    def config(**overrides):
        return TrainConfig(
            languages="de,en,fr", train_data=str(FIXTURES / "train300.{lang}"), valid_data=str(FIXTURES / "val40.{lang}"),
            run_dir=str(run_dir), output=str(tmp_path / "mul"), vocab_size=500, d_model=32, n_heads=2, d_ff=64,
            n_encoder_layers=1, n_decoder_layers=1, max_tokens=800, warmup_steps=5, lr=3e-3, validate_every=3,
            valid_max_sentences=8, keep_best=2, average_best=2, **overrides)

    first = Trainer(config(max_steps=3))
    assert len(first.train) == 6 * 300 and len(first.valid) == 6 * 8
    first.run()
    log = (run_dir / "train.log").read_text()
    assert "in 6 direction(s)" in log and "(mean of the sets)" in log and "fr-de " in log
    second = Trainer(config(max_steps=5))
    assert second.step == 3
    second.run()
    info = read_info(tmp_path / "mul")
    assert info.multilingual and info.source_lang == "mul" and len(info.directions) == 6
    assert info.target_tags == {"de": "<2de>", "en": "<2en>", "fr": "<2fr>"}
    assert info.metadata["training"]["steps"] == 5 and info.metadata["training"]["device"]
    translator = Translator.load(tmp_path / "mul", device="cpu")
    report = evaluate(translator, (FIXTURES / "val40.fr").read_text().splitlines()[:4],
                      (FIXTURES / "val40.de").read_text().splitlines()[:4], beam_size=2, target_lang="de")
    assert report["sentences"] == 4
    pivoted = evaluate(translator, (FIXTURES / "val40.fr").read_text().splitlines()[:4],
                       (FIXTURES / "val40.de").read_text().splitlines()[:4], beam_size=2, target_lang="de", pivot="en")
    assert pivoted["pivot"] == "en"

    # fine-tuned from that checkpoint on a pairwise corpus beside the multi-way files
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for lang in ("en", "de"):
        (pairs / f"train.en-de.{lang}").write_text((FIXTURES / f"train300.{lang}").read_text())
    tuned = Trainer(dataclasses.replace(
        config(max_steps=2), validate_every=2, run_dir=str(tmp_path / "tune"), output=str(tmp_path / "tuned"),
        init_from=str(tmp_path / "mul"), pair_data=str(pairs / "train.{pair}.{lang}"), pair_directions="de-en,fr-de",
        pair_valid_lines=10, dropout=0.2))
    start, _, tuned_tok, _ = load_checkpoint(tmp_path / "mul")
    assert all(torch.equal(v.float(), tuned.model.state_dict()[k]) for k, v in start.state_dict().items())
    assert tuned.model_config.dropout == 0.2 and tuned_tok.vocab_size == tuned.tokenizer.vocab_size
    # only de-en comes from the pair corpus (fr-de has none), its 10 validation lines never trained on
    assert len(tuned.train) == 6 * 300 + 290 and len(tuned.valid_sets["de-en pairs"][0]) == 8
    held = set(tuned.valid_sets["de-en pairs"][1])
    english = (FIXTURES / "train300.en").read_text().splitlines()
    assert held <= set(english) and "en-de pairs" not in tuned.valid_sets
    tuned.run()
    assert "de-en pairs" in (tmp_path / "tune" / "train.log").read_text()
    assert read_info(tmp_path / "tuned").directions == info.directions

    # its model card: every direction, split and beam, and the two non-English directions through English
    data = tmp_path / "data"
    data.mkdir()
    for lang in LANGS:
        lines = (FIXTURES / f"val40.{lang}").read_text().splitlines()[:6]
        for split in ("val", "test_2016_flickr"):
            with gzip.open(data / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
    assert model_card.main(["--model", str(tmp_path / "mul"), "--data", str(data), "--quantizations", "none"]) == 0
    scores = json.loads((tmp_path / "mul" / "config.json").read_text())["metadata"]["scores"]
    assert len(scores) == 6 * 2 * 2 + 2 and {s["direction"] for s in scores if s.get("pivot") == "en"} == {"de-fr", "fr-de"}
    card = (tmp_path / "mul" / "README.md").read_text()
    assert "6 directions" in card and "| fr-de |" in card and "through en" in card
    assert Translator.load(tmp_path / "mul", device="cpu").test_bleu().keys() == set(info.directions)
    # a pairwise held-out set measured afterwards joins the recorded scores, and routing sees both
    for lang in ("de", "fr"):
        (data / f"eval.fr-de.{lang}").write_text("\n".join((FIXTURES / f"val40.{lang}").read_text().splitlines()[6:9]) + "\n")
    assert model_card.main(["--model", str(tmp_path / "mul"), "--splits", "", "--beam-sizes", "4", "--keep-scores",
                            "--quantizations", "none", "--pair-tests", f"held={data}/eval.{{pair}}.{{lang}}"]) == 0
    again = json.loads((tmp_path / "mul" / "config.json").read_text())["metadata"]["scores"]
    assert len(again) == len(scores) + 2 and {r["direction"] for r in again if r["split"] == "held"} == {"de-fr", "fr-de"}
    assert read_info(tmp_path / "mul").test_scores()["fr-de"].keys() == {"test_2016_flickr", "held"}
    assert "Held-out test set `held`" in (tmp_path / "mul" / "README.md").read_text()
    # and its speed on this machine, timed beside the scores it keeps
    assert model_card.main(["--model", str(tmp_path / "mul"), "--data", str(data), "--splits", "", "--keep-scores",
                            "--quantizations", "none", "--speed", "fr-de", "--speed-sentences", "4", "--threads", "1"]) == 0
    speed = read_info(tmp_path / "mul").metadata["speed"]
    assert speed["sentences"] == 4 and speed["threads"] == 1 and speed["greedy_batch1_p50_ms"] <= speed["greedy_batch1_p90_ms"]
    assert len(json.loads((tmp_path / "mul" / "config.json").read_text())["metadata"]["scores"]) == len(again)
    card = (tmp_path / "mul" / "README.md").read_text()
    assert "## Speed" in card and "fr-de, the first 4 sentences" in card
    # written again from the recorded scores, with notes after the introduction
    notes = tmp_path / "notes.md"
    notes.write_text("**Status: a test model.**\n")
    assert model_card.main(["--model", str(tmp_path / "mul"), "--render-only", "--notes", str(notes)]) == 0
    again = (tmp_path / "mul" / "README.md").read_text()
    assert again.replace("\n**Status: a test model.**\n", "") == card
    assert again.index("**Status: a test model.**") < again.index("## Scores")


def test_a_fine_tune_grows_the_model_weighs_the_captions_and_anneals(tmp_path, tagged_spm):
    start = make_multilingual(tmp_path / "start", tagged_spm, norm_placement="pre")
    cfg = TrainConfig(
        languages="de,en,fr", train_data=str(FIXTURES / "train300.{lang}"), valid_data=str(FIXTURES / "val40.{lang}"),
        run_dir=str(tmp_path / "run"), output=str(tmp_path / "grown"), init_from=str(start), grow_encoder_layers=4,
        multiway_weight=2.0, lr_schedule="linear", max_steps=3, warmup_steps=1, lr=1e-3, max_tokens=800,
        validate_every=3, valid_max_sentences=4, keep_best=1, average_best=1)
    trainer = Trainer(cfg)
    original = load_checkpoint(start)[0].eval()
    assert trainer.model_config.n_encoder_layers == 4 and original.config.n_encoder_layers < 4
    assert len(trainer.train) == 2 * 6 * 300
    src, tgt = torch.randint(5, 400, (2, 6)), torch.randint(5, 400, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(trainer.model.eval()(src, tgt), original(src, tgt), rtol=0, atol=1e-5)
    trainer.run()
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0  # annealed: the last step's rate
    assert read_info(tmp_path / "grown").config.n_encoder_layers == 4
    with pytest.raises(SystemExit):
        TrainConfig.from_args(["--languages", "de,en", "--train-data", str(FIXTURES / "train300.{lang}"),
                               "--valid-data", str(FIXTURES / "val40.{lang}"), "--grow-encoder-layers", "6"])
    with pytest.raises(SystemExit):
        TrainConfig.from_args(["--languages", "de,en", "--train-data", str(FIXTURES / "train300.{lang}"),
                               "--valid-data", str(FIXTURES / "val40.{lang}"), "--lr-schedule", "linear"])


def test_a_model_records_its_own_flag_thresholds_and_the_service_uses_them(tmp_path, tagged_spm, monkeypatch):
    path = make_multilingual(tmp_path / "mul", tagged_spm)
    data = tmp_path / "data"
    data.mkdir()
    for lang in LANGS:
        with gzip.open(data / f"val.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write((FIXTURES / f"val40.{lang}").read_text())
    assert flag_calibration.main(["--model", str(path), "--data", str(data), "--lines", "20", "--beam-size", "1"]) == 0
    info = read_info(path)
    recorded = info.metadata["quality_flags"]
    assert recorded["measured_on"]["sentences"] == 6 * 20 and recorded["measured_on"]["directions"] == sorted(info.served())
    assert recorded["directions"] == {}  # 20 sentences a direction: too few for thresholds of its own
    thresholds = info.flag_thresholds()
    assert set(thresholds) == {"min_mean_logprob", "max_source_entropy", "attention_check_below"}
    assert info.flag_thresholds("de-en") == thresholds  # the pooled ones serve every direction
    # percentiles of the model's own signals: the 5th under the 30th, an entropy between 0 and 1
    assert thresholds["min_mean_logprob"] <= thresholds["attention_check_below"] < 0 < thresholds["max_source_entropy"] <= 1
    translator = Translator.load(path, device="cpu")
    sources = (FIXTURES / "val40.de").read_text().splitlines()[:20]
    scores = sorted(s for s, _ in flag_calibration.signals(translator, sources, target_lang="en", beam_size=1))
    assert scores[0] <= flag_calibration.percentile(scores, 5) <= scores[2]
    with pytest.raises(SystemExit):  # too few sentences for a 99th percentile
        flag_calibration.main(["--model", str(path), "--data", str(data), "--lines", "5", "--directions", "de-en"])

    # with enough sentences each direction gets its own: those of its own signals, not the pooled ones
    monkeypatch.setattr(flag_calibration, "MIN_SENTENCES", 20)
    assert flag_calibration.main(["--model", str(path), "--data", str(data), "--lines", "20", "--beam-size", "1"]) == 0
    info = read_info(path)
    own = info.metadata["quality_flags"]["directions"]
    assert sorted(own) == sorted(info.served())
    assert own["de-en"] == dataclasses.asdict(flag_calibration.thresholds_of(
        flag_calibration.signals(translator, sources, target_lang="en", beam_size=1)))
    assert info.flag_thresholds("de-en") == own["de-en"] and info.flag_thresholds("xx-yy") == info.flag_thresholds()
    assert len({tuple(t.values()) for t in own.values()}) > 1  # the directions differ
    section = model_card.flags_section(json.loads((path / "config.json").read_text()))
    assert "## Quality flags" in section and f"| de-en | {own['de-en']['min_mean_logprob']} |" in section

    # the service flags each direction's sentences by that direction's thresholds: an impossible bar for
    # de-en alone flags every de-en sentence, and en-de keeps its own
    payload = json.loads((path / "config.json").read_text())
    payload["metadata"]["quality_flags"]["directions"]["de-en"].update(min_mean_logprob=0.0, attention_check_below=0.0)
    (path / "config.json").write_text(json.dumps(payload))
    with TestClient(create_app(Settings(models_dir=str(tmp_path), device="cpu")), raise_server_exceptions=False) as client:
        deadline = time.time() + 60
        while client.get("/health/ready").status_code != 200:
            assert time.time() < deadline
            time.sleep(0.05)
        listed = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
        assert listed["de-en"]["quality_flags"]["min_mean_logprob"] == 0.0
        assert listed["en-de"]["quality_flags"] == own["en-de"]
        r = client.post("/v1/translate", json={"text": ["Ein Hund läuft.", "Zwei Männer."], "source": "de", "target": "en"})
        assert r.status_code == 200, r.text
        assert all("low_confidence" in t["flags"][0]["flags"] for t in r.json()["translations"])


def test_translator_needs_and_uses_the_target_language(tmp_path, tagged_spm, tiny_checkpoint):
    path = make_multilingual(tmp_path / "mul", tagged_spm)
    translator = Translator.load(path, device="cpu")
    assert translator.multilingual and "fr-de" in translator.directions
    tag = Tokenizer(tagged_spm).sp.piece_to_id("<2de>")
    assert translator.encode_source("Ein Hund.", "de")[0] == tag
    with pytest.raises(ValueError, match="needs target_lang"):
        translator.translate(["Un chien."])
    with pytest.raises(ValueError, match="needs target_lang"):
        translator.translate(["Un chien."], target_lang="cs")
    # the tag changes what the encoder reads, so what the model makes of the source
    scores = {lang: translator.force_decode("Un chien court.", "Ein Hund.", target_lang=lang).score for lang in LANGS}
    assert len(set(scores.values())) == 3
    forced = translator.force_decode("Un chien.", "Ein Hund.", target_lang="de")
    assert forced.attention.source_tokens[0] == "<2de>"
    bilingual = Translator.load(tiny_checkpoint, device="cpu")
    assert bilingual.inputs.prefix("en") == [] and bilingual.directions == ["de-en"]
    with pytest.raises(ValueError, match="translates into 'en'"):
        bilingual.translate(["Ein Hund."], target_lang="fr")


def test_checkpoint_keeps_directions_and_refuses_a_missing_tag(tmp_path, tagged_spm):
    path = make_multilingual(tmp_path / "mul", tagged_spm, directions=["de-fr", "fr-de"])
    _, info, _, _ = load_checkpoint(path)
    assert info.directions == ["de-fr", "fr-de"] and info.multilingual
    config = json.loads((path / "config.json").read_text())
    config["target_tags"] = {"de": "<2de>"}
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"no target tag for \['fr'\]"):
        Translator.load(path, device="cpu")


def _info(mid, path, directions=None, tags=None, test_bleu=None, source=None, target=None):
    return dict(id=mid, source=source or "mul", target=target or "mul", directions=directions, target_tags=tags,
                test_bleu=test_bleu, src_tokenizer=str(path / "spm.model"),
                test_scores={d: {"test_2016_flickr": b} for d, b in (test_bleu or {}).items()})


def test_each_direction_goes_to_the_model_with_the_best_recorded_score(tmp_path, tagged_spm, tiny_checkpoint):
    mul = make_multilingual(tmp_path / "multi", tagged_spm)
    tags = {lang: target_tag(lang) for lang in LANGS}
    every = [f"{s}-{t}" for s, t in parse_directions("all", LANGS)]
    bilingual = _info("de-en", tiny_checkpoint, ["de-en"], None, {"de-en": 40.1}, "de", "en")
    served = served_directions([bilingual, _info("multi", mul, every, tags, {"de-en": 39.0, "fr-de": 30.0})])
    assert sorted(served) == sorted(every)
    assert served["de-en"].engine_model == "de-en" and not served["de-en"].multilingual
    fr_de = served["fr-de"]
    assert fr_de.engine_model == "multi" and fr_de.source == "fr" and fr_de.target == "de"
    assert fr_de.encode("Un chien.")[0] == Tokenizer(tagged_spm).sp.piece_to_id("<2de>")
    assert fr_de.describe()["test_bleu"] == 30.0 and fr_de.describe()["multilingual"] is True
    # a better multilingual score takes the direction; without scores the bilingual model goes first
    served = served_directions([bilingual, _info("multi", mul, every, tags, {"de-en": 41.0})])
    assert served["de-en"].engine_model == "multi"
    served = served_directions([_info("de-en", tiny_checkpoint, None, None, None, "de", "en"), _info("multi", mul, every, tags)])
    assert served["de-en"].engine_model == "de-en"


def _scores(bleu: dict[str, float]) -> dict:
    return {"scores": [{"direction": d, "split": "test_2016_flickr", "beam_size": 4, "bleu": b} for d, b in bleu.items()]}


def test_the_engine_leaves_a_checkpoint_unloaded_when_every_direction_it_serves_goes_elsewhere(tmp_path, tagged_spm, spm_model, caplog):
    every = [f"{s}-{t}" for s, t in parse_directions("all", LANGS)]
    root = tmp_path / "models"
    make_checkpoint(root / "de-en", spm_model, "de", "en", seed=3)
    make_multilingual(root / "multi", tagged_spm, metadata=_scores({d: 30.0 for d in every}))

    def score_bilingual(bleu: float) -> None:
        config = json.loads((root / "de-en" / "config.json").read_text())
        config["metadata"].update(_scores({"de-en": bleu}))
        (root / "de-en" / "config.json").write_text(json.dumps(config))

    score_bilingual(31.0)
    assert sorted(load_models(root, "cpu", None)) == ["de-en", "multi"]  # the bilingual model keeps de-en
    score_bilingual(29.0)
    with caplog.at_level("INFO", logger="nmt_serve.engine.loader"):
        loaded = load_models(root, "cpu", None)
    assert list(loaded) == ["multi"]
    assert "not loading de-en" in caplog.text and "goes to multi" in caplog.text
    # a recorded score beats none, whatever the kind of model
    assert route([Offer("a", "de-en"), Offer("b", "de-en", {"test": 40.0}, True), Offer("b", "fr-de", {}, True)]) == {
        "de-en": "b", "fr-de": "b"}


def test_routing_compares_models_over_every_test_set_any_was_measured_on():
    captions = Offer("captions", "de-en", {"test_2016_flickr": 43.3})
    general = Offer("general", "de-en", {"test_2016_flickr": 42.5, "debian-eval-short": 24.0}, multilingual=True)
    # measured on package descriptions too: a few BLEU on captions do not take the direction back
    assert best([captions, general]) is general
    measured = Offer("captions", "de-en", {"test_2016_flickr": 43.3, "debian-eval-short": 1.1})
    assert best([measured, general]) is general
    # over the same sets, the better mean wins; then bilingual before multilingual, then the name
    better = Offer("better", "de-en", {"test_2016_flickr": 30.0, "debian-eval-short": 40.0}, multilingual=True)
    assert best([better, general]) is better
    twin = Offer("twin", "de-en", dict(general.scores))
    assert best([general, twin]) is twin
    assert route([general, captions, Offer("captions", "en-de", {"test_2016_flickr": 40.0})]) == {
        "de-en": "general", "en-de": "captions"}


def test_decode_cost_counts_each_layer_weight_once_and_the_output_layer():
    model = random_model(seed=0, n_encoder_layers=2, n_decoder_layers=3, d_ff=96)
    layers = [m for stack in (model.encoder_layers, model.decoder_layers) for m in stack.modules() if isinstance(m, torch.nn.Linear)]
    config = model.config
    assert decode_cost(config) == sum(m.weight.numel() for m in layers) + model.output_proj.weight.numel()
    shipped = ModelConfig(src_vocab_size=10000, tgt_vocab_size=10000)
    gpu_recipe = ModelConfig(src_vocab_size=16000, tgt_vocab_size=16000, d_model=384, n_heads=6, d_ff=1536, n_encoder_layers=6)
    assert 2.9 < decode_cost(gpu_recipe) / decode_cost(shipped) < 3.0


def test_on_cpu_a_model_far_costlier_than_the_cheapest_does_not_take_a_direction_by_scores():
    small = Offer("small", "de-en", {"test_2016_flickr": 42.0, "eval-short": 30.0}, cost=8.0e6)
    large = Offer("large", "de-en", {"test_2016_flickr": 45.0, "eval-short": 38.0}, cost=24.0e6)
    assert best([small, large]) is large  # a GPU: by scores
    assert best([small, large], cost_limit=2.0) is small
    assert best([small, large], cost_limit=3.0) is large
    # the limit is relative to the cheapest candidate of the direction, and an unknown cost passes
    alone = Offer("large", "fr-de", {"test_2016_flickr": 30.0}, cost=24.0e6)
    unknown = Offer("converted", "de-en", {"test_2016_flickr": 45.0, "eval-short": 39.0})
    assert best([small, large, unknown], cost_limit=2.0) is unknown
    assert route([small, large, alone], cost_limit=2.0) == {"de-en": "small", "fr-de": "large"}
    # a tiny model with no scores does not set the bar: it would not serve, and the scored ones still may
    tiny = Offer("tiny-converted", "de-en", {}, cost=0.1e6)
    assert best([small, large, tiny], cost_limit=2.0) is small and best([large, tiny], cost_limit=2.0) is large


def test_the_engine_on_cpu_keeps_the_cheaper_model_and_says_why(tmp_path, tagged_spm, spm_model, caplog):
    root = tmp_path / "models"
    make_multilingual(root / "small", tagged_spm, directions=["de-en"], metadata=_scores({"de-en": 30.0}))
    make_multilingual(root / "large", tagged_spm, directions=["de-en", "en-de"], metadata=_scores({"de-en": 35.0, "en-de": 30.0}),
                      d_model=48, n_heads=4, d_ff=128)
    costs = {p.name: decode_cost(info.config) for p in (root / "small", root / "large") for info in [read_info(p)]}
    assert 2.0 < costs["large"] / costs["small"] < 4.0
    assert sorted(name for name, _ in choose(root, "cpu", cpu_cost_limit=0.0).values()) == ["large"]
    assert sorted(name for name, _ in choose(root, "cpu", cpu_cost_limit=4.0).values()) == ["large"]
    # the larger one still serves the direction only it offers; de-en goes to the cheaper one
    chosen = choose(root, "cpu", cpu_cost_limit=2.0)
    assert sorted(name for name, _ in chosen.values()) == ["large", "small"]
    infos = [dict(_info(name, root / name, info.directions, info.target_tags, {d: b for d, b in info.test_bleu().items()}),
                  decode_cost=costs[name], device="cpu", test_scores=info.test_scores()) for name, info in chosen.values()]
    served = served_directions(infos, cpu_cost_limit=2.0)
    assert {d: m.engine_model for d, m in served.items()} == {"de-en": "small", "en-de": "large"}
    assert served_directions(infos, cpu_cost_limit=0.0)["de-en"].engine_model == "large"
    on_gpu = [dict(info, device="cuda:0") for info in infos]
    assert served_directions(on_gpu, cpu_cost_limit=2.0)["de-en"].engine_model == "large"
    # a model every direction of which goes to a cheaper one is not loaded, and the log says why
    make_multilingual(root / "large", tagged_spm, directions=["de-en"], metadata=_scores({"de-en": 35.0}),
                      d_model=48, n_heads=4, d_ff=128)
    with caplog.at_level("INFO", logger="nmt_serve.engine.loader"):
        chosen = choose(root, "cpu", cpu_cost_limit=2.0)
    assert sorted(name for name, _ in chosen.values()) == ["small"]
    assert "not loading large" in caplog.text and "work per token is" in caplog.text and "cpu_cost_limit 2" in caplog.text


def test_a_preferred_model_serves_what_it_can_whatever_scores_and_cost():
    shipped = Offer("shipped", "de-en", {"test_2016_flickr": 42.0, "eval-short": 30.0}, True, cost=8.0e6)
    converted = Offer("opus-mt-de-en", "de-en", {}, cost=74.0e6)
    nllb = Offer("nllb", "de-en", {}, True, cost=600.0e6)
    assert best([shipped, converted, nllb], cost_limit=2.0) is shipped
    assert best([shipped, converted, nllb], cost_limit=2.0, prefer=["opus-mt-de-en"]) is converted
    assert best([shipped, converted, nllb], prefer=["nllb", "opus-mt-de-en"]) is nllb  # the first named first
    # a direction no preferred model serves is routed as before
    other = [Offer("shipped", "fr-de", {"test_2016_flickr": 30.0}, True), Offer("nllb", "fr-de", {}, True)]
    assert route([shipped, converted, *other], prefer=["opus-mt-de-en"]) == {"de-en": "opus-mt-de-en", "fr-de": "shipped"}


def test_a_converted_model_beside_the_shipped_ones_serves_when_preferred(tmp_path, tagged_spm, spm_model, caplog):
    every = [f"{s}-{t}" for s, t in parse_directions("all", LANGS)]
    root = tmp_path / "models"
    make_multilingual(root / "multi", tagged_spm, metadata=_scores({d: 30.0 for d in every}))
    make_checkpoint(root / "de-en", spm_model, "de", "en", seed=3)
    # larger, as a converted OPUS-MT is, and with no scores on this project's test sets
    make_checkpoint(root / "opus-mt-de-en", spm_model, "de", "en", seed=4, d_model=64, d_ff=256)
    with caplog.at_level("INFO", logger="nmt_serve.engine.loader"):
        assert sorted(name for name, _ in choose(root, "cpu").values()) == ["multi"]
    # two checkpoints of one pair are named by their directories, and the log says how to use the unscored one
    assert "not loading opus-mt-de-en" in caplog.text and "NMT_PREFER=opus-mt-de-en" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="nmt_serve.engine.loader"):
        chosen = choose(root, "cpu", cpu_cost_limit=2.0, prefer="opus-mt-de-en")
    assert sorted(name for name, _ in chosen.values()) == ["multi", "opus-mt-de-en"]
    assert "not loading de-en" in caplog.text and "prefer names opus-mt-de-en" in caplog.text
    infos = [dict(_info(name, path, info.directions, info.target_tags, info.test_bleu(), info.source_lang, info.target_lang),
                  path=str(path), decode_cost=decode_cost(info.config), device="cpu", test_scores=info.test_scores())
             for path, (name, info) in chosen.items()]
    assert served_directions(infos)["de-en"].engine_model == "multi"
    served = served_directions(infos, prefer="opus-mt-de-en")
    assert served["de-en"].engine_model == "opus-mt-de-en" and served["fr-de"].engine_model == "multi"
    # a multilingual model named by its directory takes every direction it serves
    assert {m.engine_model for m in served_directions(infos, prefer="multi").values()} == {"multi"}
    with pytest.raises(ValueError, match=r"opus-mt-en-de: no checkpoint in .* is called that \(models: de-en, multi, opus-mt-de-en\)"):
        choose(root, "cpu", prefer="opus-mt-de-en, opus-mt-en-de")


def test_the_service_answers_from_the_preferred_model(tmp_path, tagged_spm, spm_model):
    from test_service import make_client, wait_ready

    root = tmp_path / "models"
    make_multilingual(root / "multi", tagged_spm, metadata=_scores({"de-en": 30.0, "fr-de": 30.0}))
    make_checkpoint(root / "opus-mt-de-en", spm_model, "de", "en", seed=4)
    with make_client(root, prefer="opus-mt-de-en", engine_heartbeat_timeout_s=10) as client:
        wait_ready(client, timeout=120)
        listing = client.get("/v1/models").json()
        models = {m["id"]: m["model"] for m in listing["models"]}
        assert models["de-en"] == "de-en" and models["fr-de"] == "multi"  # the only de-en checkpoint: named by its pair
        assert listing["unloaded"] == []
        for (source, target), model in {("de", "en"): "de-en", ("fr", "de"): "multi"}.items():
            reply = client.post("/v1/translate", json={"text": ["Ein Hund."], "source": source, "target": target, "max_length": 4})
            assert reply.status_code == 200 and reply.json()["model"] == model, reply.text
    with make_client(root, engine_heartbeat_timeout_s=10) as client:
        wait_ready(client, timeout=120)
        listing = client.get("/v1/models").json()
        assert {m["model"] for m in listing["models"]} == {"multi"}
        [unloaded] = listing["unloaded"]
        assert (unloaded["model"], unloaded["directions"], unloaded["direction_count"], unloaded["served_by"]) == (
            "de-en", ["de-en"], 1, ["multi"])
        assert unloaded["path"].endswith("opus-mt-de-en") and "NMT_PREFER=opus-mt-de-en" in unloaded["reason"]


def test_cli_translate_needs_a_direction_of_a_multilingual_model(tmp_path, tagged_spm):
    path = make_multilingual(tmp_path / "mul", tagged_spm)
    run = lambda *args, **kw: subprocess.run([sys.executable, "-m", "nmt_serve.cli.translate", "--model", str(path), *args],  # noqa: E731
                                             capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)
    missing = run("--demo")
    assert missing.returncode == 2 and "name --source-lang and --target-lang" in missing.stderr
    unknown = run("--source-lang", "fr", "--target-lang", "cs", "--demo")
    assert unknown.returncode == 2 and "does not translate fr->cs" in unknown.stderr
    ok = run("--source-lang", "fr", "--target-lang", "de", "--beam-size", "1", "--max-length", "5", input="Un chien court.\n")
    assert ok.returncode == 0, ok.stderr[-1000:]
    assert len(ok.stdout.splitlines()) == 1


@pytest.fixture(scope="module")
def mixed_models(tmp_path_factory, tagged_spm, spm_model) -> Path:
    """A models directory with a bilingual de-en checkpoint and a multilingual one over de, en, fr."""
    from conftest import make_checkpoint

    root = tmp_path_factory.mktemp("mixed")
    make_checkpoint(root / "de-en", spm_model, "de", "en", seed=3)
    make_multilingual(root / "multi", tagged_spm)
    return root


def test_service_serves_every_direction_of_both_models(mixed_models):
    from test_service import make_client, metric, wait_for, wait_ready

    fast = {"beam_size": 2, "max_length": 6}
    # a slow engine status under a loaded test machine is not what this test is about
    with make_client(mixed_models, engine_heartbeat_timeout_s=10) as client:
        wait_ready(client, timeout=120)
        models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
        assert set(models) == {f"{s}-{t}" for s, t in parse_directions("all", LANGS)}
        assert models["de-en"]["model"] == "de-en" and not models["de-en"]["multilingual"]  # no scores: bilingual first
        assert models["fr-de"]["model"] == "multi" and models["fr-de"]["multilingual"]
        assert models["de-en"]["decode_cost"] > 0 and models["de-en"]["device"] == "cpu"  # what CPU routing compared
        assert client.get("/health").json()["models"] == sorted(models)
        languages = {lang["code"]: lang["targets"] for lang in client.get("/languages").json()}
        assert languages == {"de": ["en", "fr"], "en": ["de", "fr"], "fr": ["de", "en"]}
        alone = {}
        for source, target in parse_directions("all", LANGS):
            response = client.post("/v1/translate", json={"text": ["Un chien court. Deux enfants jouent."], "source": source,
                                                          "target": target, **fast})
            assert response.status_code == 200, response.text
            assert response.json()["model"] == models[f"{source}-{target}"]["model"]
            assert response.json()["usage"]["sentences"] == 2
            alone[(source, target)] = response.json()["translations"][0]["text"]

        # the multilingual model's directions one after the other, then at once: at once they share one
        # running batch (fewer steps), and each caller gets its own result
        mine = [d for d in alone if models["-".join(d)]["model"] == "multi"]

        def post(d):
            return client.post("/v1/translate", json={"text": ["Un chien court. Deux enfants jouent."], "source": d[0],
                                                      "target": d[1], **fast})

        sent = [2 * len(alone)]  # sentences sent so far: the engine's counters lag behind its replies

        def settled() -> bool:  # every sentence sent has joined and none runs: the step count is final
            return (metric(client, "nmt_engine_sentences_joined_total") == sent[0]
                    and metric(client, "nmt_engine_running_sentences") == 0)

        def steps_of(run) -> tuple[float, list]:
            wait_for(settled)
            steps = metric(client, "nmt_engine_steps_total")
            replies = run()
            sent[0] += 2 * len(mine)
            wait_for(settled)
            return metric(client, "nmt_engine_steps_total") - steps, replies

        steps_alone, _ = steps_of(lambda: [post(d) for d in mine])
        with ThreadPoolExecutor(len(mine)) as pool:
            steps_together, together = steps_of(lambda: list(pool.map(post, mine)))
        assert [r.json()["translations"][0]["text"] for r in together] == [alone[d] for d in mine]
        # how many of them meet in one batch depends on when each arrives (the engine test below shows
        # the sharing without a race); sharing never costs a step
        assert steps_together <= steps_alone, (steps_together, steps_alone)
        # the French text found by detection, then routed to the multilingual model
        auto = client.post("/v1/translate", json={"text": "Un homme en chemise bleue est debout sur une échelle.",
                                                  "source": "auto", "target": "de", **fast})
        assert auto.status_code == 200 and auto.json()["translations"][0]["detected_language"]["language"] == "fr"
        # attention of a multilingual direction: the tag is the first source token
        maps = client.post("/v1/attention", json={"text": "Un chien.", "source": "fr", "target": "de", "beam_size": 1})
        assert maps.status_code == 200, maps.text
        assert maps.json()["source_tokens"][0] == "<2de>"
        assert maps.json()["model"] == "multi"  # the checkpoint, as /v1/translate names it
        # HTML with inline tags: aligned through the engine's attention of the multilingual model
        html = client.post("/translate", json={"q": "<p>Un <b>chien</b> court.</p>", "source": "fr", "target": "de",
                                               "format": "html"})
        assert html.status_code == 200, html.text
        assert html.json()["translatedText"].startswith("<p>")
        missing = client.post("/v1/translate", json={"text": "Un chien.", "source": "fr", "target": "cs"})
        assert missing.status_code == 400 and "fr-de" in missing.json()["error"]["message"]


def test_the_directions_of_a_multilingual_model_share_one_running_batch(mixed_models):
    """Calls of four directions, all waiting before the first step, join one running batch: one join,
    and fewer steps than the same calls one after the other; each gets what it gets alone."""
    import time

    from nmt_serve.engine.core import EngineConfig, EngineCore
    from nmt_serve.engine.protocol import DecodeOptions, Translate
    from nmt_serve.inference.translator import Translator

    translator = Translator.load(mixed_models / "multi", device="cpu")
    directions = [("fr", "de"), ("fr", "en"), ("de", "fr"), ("en", "fr")]

    def calls(first: int) -> list[Translate]:
        return [Translate(str(first + i), "multi", [translator.inputs.tokens("Un chien court.", target)],
                          DecodeOptions(beam_size=2, max_length=6), time.monotonic() + 60) for i, (_, target) in enumerate(directions)]

    def run(core: EngineCore, messages: list[Translate], together: bool) -> dict[str, str]:
        """together: every call is taken before the first step; else each after the previous one finished."""
        replies, queue = {}, list(messages)
        while queue or core.busy:
            if not core.busy:
                taking, queue = (queue, []) if together else (queue[:1], queue[1:])
                for message in taking:
                    assert core.handle(message) == []
            for reply in core.work():
                replies[reply.id] = reply.value[0][0].text
        return replies

    alone, together = EngineCore({"multi": translator}, EngineConfig()), EngineCore({"multi": translator}, EngineConfig())
    for core in (alone, together):
        core.admission.rate = 1e9
    one_by_one = run(alone, calls(0), together=False)
    at_once = run(together, calls(0), together=True)
    assert at_once == one_by_one and len(at_once) == len(directions)
    assert together.stats["joins"] == 1 and alone.stats["joins"] == len(directions)
    assert together.stats["steps"] < alone.stats["steps"]
