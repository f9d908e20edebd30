"""Every command-line entry point reports bad input as one line on stderr (`prog: error: ...`) and exit status 2,
never a traceback; `--demo` (what `make translate` runs with nothing piped in) speaks the model's source language.

Each command runs once in a subprocess, as a user runs it; the other bad inputs call its main() in this process,
which is what the subprocess would run, without paying for another interpreter and torch import each.
"""
from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import ROOT

from nmt_serve.cli import translate
from nmt_serve.cli.translate import DEMO_SENTENCES
from nmt_serve.convert import marian
from nmt_serve.training import evaluate, train

DE_EN = str(ROOT / "checkpoints" / "de-en")  # pre-norm, so MarianMT export refuses it
EN_DE = str(ROOT / "checkpoints" / "en-de")


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=120)


def module(name: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return run(sys.executable, "-m", name, *args, stdin=stdin)


def assert_one_line_error(proc: subprocess.CompletedProcess, prog: str, *needles: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    assert_one_line(proc.stderr, prog, *needles)


def assert_one_line(stderr: str, prog: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0]


def main_error(capsys, command, argv: list[str], prog: str, *needles: str) -> None:
    """command.main(argv) stops with status 2 and one error line (any other exception fails the test with its traceback)."""
    with pytest.raises(SystemExit) as stopped:
        command.main(argv)
    assert stopped.value.code == 2
    assert_one_line(capsys.readouterr().err, prog, *needles)


@pytest.fixture
def spanish_model(tmp_path):
    """A checkpoint whose config names a source language with no demo sentences (config only: no weights load)."""
    config = json.loads((ROOT / "checkpoints" / "en-de" / "config.json").read_text())
    config["source_lang"] = "es"
    (tmp_path / "es-de").mkdir()
    (tmp_path / "es-de" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "es-de")


def test_evaluate_missing_source_file(tmp_path):
    proc = module("nmt_serve.training.evaluate", "--model", DE_EN, "--src", str(tmp_path / "nope.de"), "--ref", str(tmp_path / "nope.en"))
    assert_one_line_error(proc, "nmt-evaluate", "--src", "nope.de")


def test_evaluate_other_bad_inputs(tmp_path, capsys):
    (tmp_path / "two.de").write_text("a\nb\n")
    (tmp_path / "one.en").write_text("a\n")
    (tmp_path / "bad.de.gz").write_text("not gzip\n")
    one = str(tmp_path / "one.en")
    main_error(capsys, evaluate, ["--model", str(tmp_path / "nowhere"), "--src", one, "--ref", one], "nmt-evaluate", "nowhere")
    main_error(capsys, evaluate, ["--model", DE_EN, "--src", str(tmp_path / "two.de"), "--ref", one], "nmt-evaluate", "2 lines")
    main_error(capsys, evaluate, ["--model", DE_EN, "--src", str(tmp_path / "bad.de.gz"), "--ref", one], "nmt-evaluate", "bad.de.gz")
    main_error(capsys, evaluate, ["--model", DE_EN, "--src", one, "--ref", one, "--output", str(tmp_path / "no" / "out")],
               "nmt-evaluate", "out")
    # an empty test set: sacreBLEU has no score for it (an IndexError deep inside)
    (tmp_path / "empty.txt").write_text("")
    empty = str(tmp_path / "empty.txt")
    main_error(capsys, evaluate, ["--model", DE_EN, "--src", empty, "--ref", empty, "--device", "cpu"], "nmt-evaluate", "empty")


def test_marian_import_missing_directory(tmp_path):
    proc = module("nmt_serve.convert.marian", "import", str(tmp_path / "nope"), str(tmp_path / "out"), "--source-lang", "de", "--target-lang", "en")
    assert_one_line_error(proc, "nmt-marian", "nope")
    assert not (tmp_path / "out").exists()


def test_marian_export_refuses_a_pre_norm_model(tmp_path, capsys):
    main_error(capsys, marian, ["export", DE_EN, str(tmp_path / "out")], "nmt-marian", "pre-norm")
    assert not (tmp_path / "out").exists()
    (tmp_path / "empty").mkdir()
    main_error(capsys, marian, ["import", str(tmp_path / "empty"), str(tmp_path / "out"), "--source-lang", "de", "--target-lang", "en"],
               "nmt-marian", "config.json")


def test_translate_missing_model(tmp_path):
    proc = module("nmt_serve.cli.translate", "--model", str(tmp_path / "nowhere"), stdin="Hallo\n")
    assert_one_line_error(proc, "nmt-translate", "nowhere")


def test_translate_demo_errors(tmp_path, capsys, spanish_model):
    main_error(capsys, translate, ["--model", str(tmp_path / "nowhere"), "--demo"], "nmt-translate", "nowhere")
    main_error(capsys, translate, ["--model", spanish_model, "--demo"], "nmt-translate", "'es'")


@pytest.mark.parametrize("flags", [["--beam-size", "0"], ["--threads", "-1"], ["--device", "nonsense"]])
def test_translate_bad_option_value(capsys, flags):
    # argparse's own report: the usage, then one error line naming the flag
    with pytest.raises(SystemExit) as stopped:
        translate.main(["--model", DE_EN, *flags])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(f"nmt-translate: error: argument {flags[0]}")


def test_translate_refuses_more_threads_than_the_machine_can_start(capsys):
    # torch would try to start them all and the process would crash (a segfault at 100000)
    main_error(capsys, translate, ["--model", DE_EN, "--threads", "100000"], "nmt-translate", "--threads 100000")


def test_translate_reads_undecodable_input_bytes_as_replacement_characters():
    # "Ein Hund läuft." in Latin-1: the \xe4 is no UTF-8, and must not crash the run or lose the line
    proc = subprocess.run([sys.executable, "-m", "nmt_serve.cli.translate", "--model", DE_EN, "--device", "cpu",
                           "--beam-size", "1", "--progress", "never"],
                          cwd=ROOT, input=b"Ein Hund l\xe4uft.\nZwei Kinder.\n", capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert len(proc.stdout.decode().splitlines()) == 2


def test_translate_names_the_line_too_long_for_the_model(capsys, monkeypatch):
    # one word run past the model's 1024 positions has no place to cut: an error naming the line, not a traceback
    monkeypatch.setattr("sys.stdin", io.StringIO("Hallo.\n" + "x" * 1100 + "\n"))
    main_error(capsys, translate, ["--model", DE_EN, "--device", "cpu", "--beam-size", "1", "--progress", "never"],
               "nmt-translate", "line 2: ", "accepts at most 1024")


def test_translate_stops_quietly_when_the_reader_stops():
    # `nmt-translate < big | head -1`: the reader is gone before the first line is written
    proc = subprocess.Popen([sys.executable, "-m", "nmt_serve.cli.translate", "--model", DE_EN, "--device", "cpu",
                             "--beam-size", "1", "--batch-size", "2", "--progress", "never"],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    _, stderr = proc.communicate("Hallo Welt.\n" * 40, timeout=120)
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert proc.returncode == 1


def test_translate_demo_uses_the_model_source_language(capsys):
    proc = module("nmt_serve.cli.translate", "--model", EN_DE, "--demo", "--beam-size", "1", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0::2] == [f"en: {line}" for line in DEMO_SENTENCES["en"]]
    assert all(line.startswith("de: ") for line in proc.stdout.splitlines()[1::2])
    # and the other way round
    assert translate.main(["--model", DE_EN, "--demo", "--beam-size", "1", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0::2] == [f"de: {line}" for line in DEMO_SENTENCES["de"]]
    assert len(lines) == 2 * len(DEMO_SENTENCES["de"]) and all(line.startswith("en: ") for line in lines[1::2])


def test_train_missing_config_file(tmp_path):
    proc = module("nmt_serve.training.train", "--config", str(tmp_path / "nope.json"), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(proc, "nmt-train", "--config", "nope.json")
    assert not (tmp_path / "run").exists()


def test_train_other_bad_inputs(tmp_path, capsys):
    (tmp_path / "train.json").write_text('{"learning_rate": 0.1}')
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "exists.txt").write_text("a\n")
    data = str(tmp_path / "exists.txt")
    run_dir = ["--run-dir", str(tmp_path / "run")]
    main_error(capsys, train, ["--config", str(tmp_path / "train.json"), *run_dir], "nmt-train", "learning_rate")
    main_error(capsys, train, ["--config", str(tmp_path / "broken.json"), *run_dir], "nmt-train", "broken.json")
    main_error(capsys, train, run_dir, "nmt-train", "--train-src", "required")
    main_error(capsys, train, ["--train-src", data, "--train-tgt", str(tmp_path / "nope.en"), "--valid-src", data, "--valid-tgt", data,
                               *run_dir], "nmt-train", "--train-tgt", "nope.en")
    main_error(capsys, train, [*(arg for flag in ("--train-src", "--train-tgt", "--valid-src", "--valid-tgt") for arg in (flag, data)),
                               "--d-model", "256", "--n-heads", "3", *run_dir], "nmt-train", "n_heads")
    assert not (tmp_path / "run").exists()  # every one found before anything was created


def test_train_refuses_before_training_what_would_fail_later(tmp_path, capsys):
    """Each of these used to end in a traceback, or (the export dtype) only after the whole training."""
    fixtures = ROOT / "tests" / "fixtures"
    (tmp_path / "empty.de").write_text("\n \n")
    (tmp_path / "empty.en").write_text("\n \n")
    data = {"--train-src": fixtures / "train300.de", "--train-tgt": fixtures / "train300.en",
            "--valid-src": fixtures / "val40.de", "--valid-tgt": fixtures / "val40.en"}
    args = lambda **override: [a for flag, path in {**data, **override}.items() for a in (flag, str(path))]  # noqa: E731
    run_dir = ["--run-dir", str(tmp_path / "run"), "--device", "cpu"]
    main_error(capsys, train, [*args(**{"--train-src": tmp_path / "empty.de", "--train-tgt": tmp_path / "empty.en"}), *run_dir], "nmt-train", "--train-src", "no text")
    main_error(capsys, train, [*args(), "--export-dtype", "int4", *run_dir], "nmt-train", "--export-dtype int4")
    main_error(capsys, train, [*args(), "--export-only", "1", *run_dir], "nmt-train", "--export-only", "state.pt")
    for key, value, expected in (("n_heads", "four", "an integer"), ("dropout", "lots", "a number"), ("adam_betas", [0.9], "two numbers")):
        (tmp_path / "config.json").write_text(json.dumps({key: value}))
        main_error(capsys, train, ["--config", str(tmp_path / "config.json"), *args(), *run_dir], "nmt-train", key, expected)
    assert not (tmp_path / "run").exists()  # every one found before anything was created
    # known only once sentencepiece has read the text: its limits, both ways, in one line
    main_error(capsys, train, [*args(), "--vocab-size", "50000", *run_dir], "nmt-train",
               "--vocab-size 50000: too large for this training text (at most ")
    main_error(capsys, train, [*args(), "--vocab-size", "10", *run_dir], "nmt-train",
               "--vocab-size 10: too small for this training text (at least ")
    assert not (tmp_path / "run" / "spm_input.txt").exists()


TRAIN_DATA = [a for flag, name in (("--train-src", "train300.de"), ("--train-tgt", "train300.en"),
                                   ("--valid-src", "val40.de"), ("--valid-tgt", "val40.en"))
              for a in (flag, str(ROOT / "tests" / "fixtures" / name))]
TINY_MODEL = ["--vocab-size", "300", "--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
              "--n-decoder-layers", "1", "--max-tokens", "600", "--device", "cpu"]


@pytest.mark.parametrize("flag, value, expected", [
    ("--warmup-steps", "0", "at least 1"),  # the learning rate divided by it
    ("--n-heads", "0", "at least 1"),  # d_model % n_heads
    ("--keep-best", "0", "at least 1"),  # the worst of no best checkpoints
    ("--max-epochs", "0", "at least 1"),  # no step, and the untrained model exported
    ("--vocab-size", "0", "at least 1"),
    ("--max-steps", "-1", "at least 0"),
    ("--dropout", "1.5", "from 0 to below 1"),
    ("--label-smoothing", "nan", "from 0 to below 1"),
])
def test_train_refuses_impossible_numbers_before_training(tmp_path, capsys, flag, value, expected):
    run_dir = ["--run-dir", str(tmp_path / "run")]
    if flag != "--max-steps":
        run_dir += ["--max-steps", "1"]  # a bound on the run, were one to start
    main_error(capsys, train, [*TRAIN_DATA, *TINY_MODEL, flag, value, *run_dir], "nmt-train", f"{flag} {value}: expected ", expected)
    key = flag[2:].replace("-", "_")
    (tmp_path / "config.json").write_text(json.dumps({key: float(value) if "." in value or value == "nan" else int(value)}))
    main_error(capsys, train, [*TRAIN_DATA, "--config", str(tmp_path / "config.json"), *run_dir], "nmt-train", flag)
    assert not (tmp_path / "run").exists()


def test_train_refuses_data_with_no_training_pair(tmp_path, capsys):
    # every pair is longer than the limit: no step would be taken, and the untrained model exported
    with pytest.raises(SystemExit) as stopped:
        train.main([*TRAIN_DATA, *TINY_MODEL, "--max-sentence-tokens", "1", "--max-epochs", "1",
                    "--run-dir", str(tmp_path / "run"), "--output", str(tmp_path / "out")])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and err[-1].startswith("nmt-train: error: --train-src "), err
    assert "no training pairs" in err[-1] and "--max-sentence-tokens 1" in err[-1]
    assert not (tmp_path / "out").exists()


def test_train_export_only_refuses_a_run_that_never_took_a_step(tmp_path, capsys):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    argv = [*TRAIN_DATA, *TINY_MODEL, "--run-dir", str(run_dir), "--output", str(out), "--export-only", "1"]
    main_error(capsys, train, argv, "nmt-train", "--export-only", f"no checkpoint in {run_dir} to export")
    # a run stopped (Ctrl-C, its --max-minutes) before its first step saves a state, of the initial weights
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        trainer = train.Trainer(train.TrainConfig.from_args([*argv[:-2]]))
        trainer.stop_requested = True
        trainer.run()
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert (run_dir / "state.pt").exists() and trainer.step == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        train.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"nmt-train: error: --export-only: no checkpoint in {run_dir} to export"), err
    assert not out.exists()


@pytest.fixture
def nllb_like(tmp_path):
    """A many-to-many model named by NLLB's codes, which users may call by ISO 639-1 (config only: no weights load)."""
    config = json.loads((ROOT / "checkpoints" / "multi30k" / "config.json").read_text())
    config.pop("directions"), config.pop("target_tags", None)
    config["language_codes"] = {code: code for code in ("deu_Latn", "eng_Latn", "fra_Latn")}
    (tmp_path / "nllb").mkdir()
    (tmp_path / "nllb" / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "nllb")


def test_evaluate_refuses_languages_the_model_does_not_serve(capsys, nllb_like):
    """What make evaluate passes as SRC and TGT: a direction the model lacks is refused, before its weights load."""
    fixtures = ROOT / "tests" / "fixtures"
    test_set = ["--src", str(fixtures / "val40.de"), "--ref", str(fixtures / "val40.fr"), "--device", "cpu"]
    main_error(capsys, evaluate, ["--model", DE_EN, "--source-lang", "fr", *test_set], "nmt-evaluate",
               "--model does not translate from fr; it serves de-en")
    main_error(capsys, evaluate, ["--model", str(ROOT / "checkpoints" / "multi30k"), "--source-lang", "es", "--target-lang", "fr",
                                  *test_set], "nmt-evaluate", "does not translate es->fr")
    main_error(capsys, evaluate, ["--model", DE_EN, "--second-model", EN_DE, *test_set], "nmt-evaluate", "--second-model", "--pivot")
    # languages named by ISO 639-1 or the model's codes are the same languages; the list is of languages, not 6 directions
    main_error(capsys, evaluate, ["--model", nllb_like, "--source-lang", "de", "--target-lang", "fr", "--pivot", "deu_Latn", *test_set],
               "nmt-evaluate", "--pivot deu_Latn", "source language itself")
    main_error(capsys, evaluate, ["--model", nllb_like, "--source-lang", "deu_Latn", "--target-lang", "fr", "--pivot", "es", *test_set],
               "nmt-evaluate", "--pivot es", "does not translate deu_Latn into es (its languages are deu_Latn, eng_Latn, fra_Latn)")
    main_error(capsys, evaluate, ["--model", nllb_like, "--source-lang", "de", "--target-lang", "es", *test_set],
               "nmt-evaluate", "does not translate de->es")
    # a route it has gets as far as loading the weights (which this config-only checkpoint lacks)
    main_error(capsys, evaluate, ["--model", nllb_like, "--source-lang", "de", "--target-lang", "fr", "--pivot", "en", *test_set],
               "nmt-evaluate", "model.safetensors")


def test_evaluate_refuses_a_pivot_that_is_no_pivot(capsys):
    fixtures = ROOT / "tests" / "fixtures"
    test_set = ["--src", str(fixtures / "val40.de"), "--ref", str(fixtures / "val40.en"), "--device", "cpu"]
    multilingual = str(ROOT / "checkpoints" / "multi30k")
    main_error(capsys, evaluate, ["--model", DE_EN, "--pivot", "en", *test_set], "nmt-evaluate", "--pivot en", "target language itself")
    main_error(capsys, evaluate, ["--model", multilingual, "--source-lang", "de", "--target-lang", "en", "--pivot", "de", *test_set],
               "nmt-evaluate", "--pivot de", "source language itself")
    main_error(capsys, evaluate, ["--model", DE_EN, "--target-lang", "en", "--pivot", "fr", *test_set],
               "nmt-evaluate", "--pivot fr", "does not translate de into fr")
    main_error(capsys, evaluate, ["--model", multilingual, "--second-model", DE_EN, "--target-lang", "en", "--pivot", "fr", *test_set],
               "nmt-evaluate", "--second-model does not translate fr into en")


@pytest.mark.parametrize("flags, needle", [
    (["--models-dir", "/nonexistent/models"], "/nonexistent/models"),
    (["--port", "eighty"], "--port"),
])
def test_service_bad_settings(flags, needle):
    proc = module("nmt_serve.service", *flags)
    assert_one_line_error(proc, "python -m nmt_serve.service", needle)


# make: `-o setup` keeps it from (re)installing the virtual environment, PY= runs this interpreter

@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_evaluate_without_data():
    proc = run("make", "-s", "-o", "setup", "evaluate", f"PY={sys.executable}", "DATA=/nonexistent", "SRC=de", "TGT=en")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("make")]
    assert errors == ["nmt-evaluate: error: --src /nonexistent/test_2016_flickr.de.gz: no such file"], proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_evaluate_takes_languages_from_the_model():
    proc = run("make", "-n", "-o", "setup", "evaluate", f"PY={sys.executable}", "MODEL=checkpoints/en-de", "DATA=d")
    assert "--src d/test_2016_flickr.en.gz --ref d/test_2016_flickr.de.gz" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
@pytest.mark.parametrize("target", ["evaluate", "translate"])
def test_make_passes_the_languages_of_a_multilingual_model(target):
    multilingual = "MODEL=checkpoints/multi30k"
    proc = run("make", "-n", "-o", "setup", target, f"PY={sys.executable}", multilingual, "DATA=d", "SRC=de", "TGT=fr")
    assert "--source-lang de --target-lang fr" in proc.stdout, proc.stdout + proc.stderr
    proc = run("make", "-s", "-o", "setup", target, f"PY={sys.executable}", multilingual, "DATA=d")
    assert proc.returncode != 0 and "multilingual: give SRC= and TGT=" in proc.stderr, proc.stderr


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_help_names_the_language_variables():
    proc = run("make", "-s", "help")
    assert proc.returncode == 0 and "SRC=L TGT=L" in proc.stdout and "--source-lang/--target-lang" in proc.stdout, proc.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_evaluate_passes_the_languages_to_a_bilingual_model_too():
    # SRC and TGT given for the default model are passed on as well, and so checked against it
    proc = run("make", "-n", "-o", "setup", "evaluate", f"PY={sys.executable}", "DATA=d", "SRC=de", "TGT=en")
    assert ("--source-lang de --target-lang en --src d/test_2016_flickr.de.gz --ref d/test_2016_flickr.en.gz"
            in proc.stdout), proc.stdout + proc.stderr


def test_scoring_without_the_eval_extra_is_one_line(monkeypatch, capsys):
    """sacrebleu comes with the eval extra (the service image leaves it out): say so, no ImportError."""
    import importlib.util

    from nmt_serve.training import evaluate, train

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sacrebleu" else real(name, *a))
    for main in (evaluate.main, train.main):
        with pytest.raises(SystemExit) as exit_:
            main(["--help"])
        assert exit_.value.code == 2
        assert "nmt-serve[eval]" in capsys.readouterr().err


def test_translate_through_a_pivot_language_is_the_two_translations(capsys, monkeypatch):
    """--pivot en --second-model: de->en by one model, then en->de by the other, as two runs one after the other
    write it (the service's pivot, offline); what cannot be pivoted is refused before any model loads."""
    german = "Ein Mann fährt Fahrrad.\nZwei Hunde spielen im Schnee. Eine Frau liest.\n"
    common = ["--device", "cpu", "--beam-size", "1", "--progress", "never"]

    def translated(lines: str, *args: str) -> str:
        monkeypatch.setattr("sys.stdin", io.StringIO(lines))
        assert translate.main([*args, *common]) == 0
        return capsys.readouterr().out

    english = translated(german, "--model", DE_EN)
    assert translated(german, "--model", DE_EN, "--pivot", "en", "--second-model", EN_DE) == translated(english, "--model", EN_DE)
    for args, message in ((["--model", DE_EN, "--second-model", EN_DE], "give --pivot"),
                          (["--model", DE_EN, "--pivot", "en", "--second-model", DE_EN], "--pivot en: "),
                          (["--model", DE_EN, "--pivot", "fr"], "--pivot fr: "),
                          (["--model", DE_EN, "--source-lang", "de", "--pivot", "de"], "the source language itself")):
        main_error(capsys, translate, [*args, *common], "nmt-translate", message)
