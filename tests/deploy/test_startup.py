"""Start-up of `python -m nmt_serve.service` as a real process: a device that cannot serve and every bad setting
end it at once with one line on stderr and exit status 2; what serves (device, dtype, attention
kernels) is in the start-up log and in /v1/models."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import free_port, wait_until_ready

ROOT = Path(__file__).resolve().parents[2]


def start(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NMT_")}
    return subprocess.run([sys.executable, "-m", "nmt_serve.service", *args], cwd=ROOT, env=dict(environ, **(env or {})),
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m nmt_serve.service: error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA is not usable")
@pytest.mark.parametrize("how", [("--device", "cuda"), ("--device", "cuda:1"), ("env", "cuda")])
def test_cuda_asked_for_without_cuda_is_one_line_and_exit_2(models_dir, how):
    if how[0] == "env":
        proc = start("--models-dir", str(models_dir), env={"NMT_DEVICE": how[1]})
    else:
        proc = start("--models-dir", str(models_dir), *how)
    assert_one_line_error(proc, "NMT_DEVICE", "not usable")
    assert "Uvicorn" not in proc.stdout + proc.stderr  # refused before the server started


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA is not usable")
def test_auto_with_a_gpu_in_sight_warns_and_reports_what_serves(models_dir):
    port = free_port()
    log = tempfile.TemporaryFile(mode="w+")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("NMT_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_serve.service", "--port", str(port), "--models-dir", str(models_dir), "--device", "auto"],
        cwd=ROOT, env=dict(environ, CUDA_VISIBLE_DEVICES="0"), stdout=log, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(base, 60, alive=lambda: proc.poll() is None)
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
            models = json.load(r)["models"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    log.seek(0)
    text = log.read()
    assert {m["id"] for m in models} == {"de-en", "en-de"}
    for m in models:
        assert (m["device"], m["dtype"], m["attention"]) == ("cpu", "float32", "sdpa:cpu-default")
    warnings = [line for line in text.splitlines() if "WARNING" in line and "device=auto" in line]
    assert len(warnings) == 1 and "CUDA_VISIBLE_DEVICES=0" in warnings[0] and "serving on the CPU" in warnings[0], text
    assert "device cpu, dtype float32, attention sdpa:cpu-default" in text, text


def test_cuda_attention_kernels_are_named():
    from nmt_serve.inference.attention import attention_backend

    assert attention_backend("cuda:0") == "sdpa:flash,efficient,math"
    assert attention_backend("cpu") == "sdpa:cpu-default"


# ------------------------------------------------------------------------------ bad settings
# each fails before anything slow (no torch import, no model): the subprocess ends in about a second

BAD_SETTINGS = [
    (["--port", "abc"], {}, "--port (NMT_PORT) 'abc'"),
    ([], {"NMT_PORT": "abc"}, "--port (NMT_PORT) 'abc'"),
    ([], {"NMT_PORT": "70000"}, "--port (NMT_PORT) '70000'"),
    ([], {"NMT_DEVICE": "tpu"}, "--device (NMT_DEVICE) 'tpu'"),
    (["--device", "gpu"], {}, "--device (NMT_DEVICE) 'gpu'"),
    ([], {"NMT_DTYPE": "x"}, "--dtype (NMT_DTYPE) 'x'"),
    ([], {"NMT_WORKERS": "0"}, "--workers (NMT_WORKERS) '0'"),
    ([], {"NMT_BATCHING": "maybe"}, "--batching (NMT_BATCHING) 'maybe'"),
    (["--batching", "maybe"], {}, "--batching (NMT_BATCHING) 'maybe'"),
    ([], {"NMT_QUANTIZATION": "int4"}, "--quantization (NMT_QUANTIZATION) 'int4'"),
    ([], {"NMT_REQUEST_TIMEOUT_S": "soon"}, "--request-timeout-s (NMT_REQUEST_TIMEOUT_S) 'soon'"),
    (["--api-keys-file", "/nonexistent/keys"], {}, "--api-keys-file (NMT_API_KEYS_FILE): /nonexistent/keys: No such file"),
    ([], {"NMT_API_KEYS_FILE": "/"}, "--api-keys-file (NMT_API_KEYS_FILE): /: Is a directory"),
    (["--models-dir", "/nonexistent/models"], {}, "--models-dir (NMT_MODELS_DIR): models directory not found: /nonexistent/models"),
    ([], {"NMT_MODELS_DIR": "/etc/hostname"}, "--models-dir (NMT_MODELS_DIR): not a directory"),
    (["--prefer", "de-en,opus-mt-fr-en"], {}, "--prefer (NMT_PREFER): opus-mt-fr-en: no checkpoint in"),
    # pydantic ignores variables that are no setting: a typo would leave its setting at the default
    ([], {"NMT_MAX_QUEUE_SENTENCE": "10"}, "NMT_MAX_QUEUE_SENTENCE is not a setting: did you mean NMT_MAX_QUEUE_SENTENCES?"),
]


@pytest.mark.parametrize("args, env, message", BAD_SETTINGS, ids=[m.split(")")[0] + ")" + ("env" if e else "flag") for _, e, m in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_and_exit_2(models_dir, args, env, message):
    defaults = [] if "NMT_MODELS_DIR" in env or "--models-dir" in args else ["--models-dir", str(models_dir)]
    proc = start(*defaults, *args, env=env, timeout=30)
    assert_one_line_error(proc, message)


def test_other_variables_are_named_and_a_relative_models_dir_is_this_directory_s(tmp_path, monkeypatch):
    from nmt_serve.service.settings import Settings, unknown_variables

    assert unknown_variables({"NMT_DATA": "x", "NMT_PORT": "1", "PATH": "/"}) == ([], ["NMT_DATA is not a setting of the service; ignored"])
    monkeypatch.chdir(tmp_path)  # the engine runs in the repository's directory: it gets the path made absolute
    assert Settings(models_dir="models").engine_config()["models_dir"] == str(tmp_path / "models")
    # the engine leaves unloaded what the API would not route to: both use the same limit
    config = Settings(cpu_cost_limit=3.5, prefer="opus-mt-de-en").engine_config()
    assert (config["cpu_cost_limit"], config["prefer"]) == (3.5, "opus-mt-de-en")


def test_an_empty_models_dir_is_one_line_and_exit_2(tmp_path):
    assert_one_line_error(start("--models-dir", str(tmp_path)), "no checkpoints")


def test_an_unreadable_models_dir_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    # root reads any directory whatever its mode, so the refusal the kernel would give is simulated
    import pathlib

    from nmt_serve.service.__main__ import main

    def refuse(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "iterdir", refuse)
    assert main(["--models-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m nmt_serve.service: error: --models-dir (NMT_MODELS_DIR): {tmp_path}: Permission denied"]


def test_help_lists_every_setting(capsys):
    from nmt_serve.service.__main__ import parse_settings
    from nmt_serve.service.settings import Settings

    with pytest.raises(SystemExit) as exit_:
        parse_settings(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all("--" + name.replace("_", "-") in out for name in Settings.model_fields)
    assert "90% of" in out  # a description's own % comes out as written
