"""Shared fixtures: tiny random models and checkpoints built inside the tests (nothing downloaded)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

from nmt_serve.network.checkpoint import CheckpointInfo, save_checkpoint
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.tokenizer import Tokenizer, train_sentencepiece
from nmt_serve.network.transformer import Transformer

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parent.parent

# torch's threads in this process: at most 2, and the cores shared among pytest-xdist's workers (threads that
# outnumber the cores wait on each other: see BENCHMARKS.md, "Beside busy neighbours")
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
torch.set_num_threads(max(1, min(2, _CORES // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))
# every server the tests start keeps its jobs apart from a real server's (and from earlier runs'): the
# jobs directory is shared by design, and a job left in it would be taken up by the next server
os.environ["NMT_JOBS_DIR"] = tempfile.mkdtemp(prefix="nmt-test-jobs-")
# the engines the tests start (some 80 a run) take admission's starting rate from the settings instead of a
# calibration of 1-2 s of every core: admission admits everything here, as the in-process cores' `admission.rate =
# 1e9` do, and is tested on its own (test_admission, test_engine). NMT_ADMISSION_RATE=0 runs the suite calibrating.
os.environ.setdefault("NMT_ADMISSION_RATE", "1e9")


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip where no CUDA device is usable."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def tiny_config(**overrides) -> ModelConfig:
    values = dict(
        src_vocab_size=64, tgt_vocab_size=64, d_model=32, n_heads=4, d_ff=64,
        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_positions=256,
    )
    values.update(overrides)
    return ModelConfig(**values)


def random_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(tiny_config(**overrides)).eval()
    if model.logits_bias is not None:
        model.logits_bias.normal_()
    return model


def record_reads(monkeypatch, modules, decoder) -> list[tuple[str, object]]:
    """A log of a device search's steps and reads back, in order: ("step", key) for each step program run,
    ("copy", read) when a host_copy.HostCopy is queued (by one of `modules`), ("wait", read) when it is
    waited for."""
    from nmt_serve.inference.host_copy import HostCopy

    log: list[tuple[str, object]] = []

    class Recorded(HostCopy):
        def __init__(self, tensors):
            super().__init__(tensors)
            log.append(("copy", self))

        def wait(self):
            log.append(("wait", self))
            return super().wait()

    for module in modules:
        monkeypatch.setattr(module, "HostCopy", Recorded)
    run = decoder.run

    def recorded_run(key, fn):
        if key[0] != "join":
            log.append(("step", key))
        return run(key, fn)

    monkeypatch.setattr(decoder, "run", recorded_run)
    return log


def waits_without_a_step_queued(log: list[tuple[str, object]]) -> int:
    """Reads waited for, before the last step, with no step queued since the read's copy: the waits that
    leave a GPU idle while the host waits and then works on what it read."""
    steps = [i for i, (kind, _) in enumerate(log) if kind == "step"]
    made = {id(read): i for i, (kind, read) in enumerate(log) if kind == "copy"}
    return sum(1 for i, (kind, read) in enumerate(log)
               if kind == "wait" and i < steps[-1] and not any(made[id(read)] < j < i for j in steps))


def random_sources(batch: int, max_len: int, vocab: int, seed: int = 0, eos: int = 3, pad: int = 0) -> torch.Tensor:
    """(B, S) right-padded sources of different lengths, each ending with eos."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_len + 1, (batch,), generator=g)
    lengths[0] = max_len
    src = torch.full((batch, max_len), pad, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        src[i, : n - 1] = torch.randint(4, vocab, (n - 1,), generator=g)
        src[i, n - 1] = eos
    return src


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory) -> Path:
    """A small joint sentencepiece model trained on the de/en fixture lines."""
    out = tmp_path_factory.mktemp("spm")
    text = out / "joint.txt"
    text.write_text((FIXTURES / "train300.de").read_text() + (FIXTURES / "train300.en").read_text())
    return train_sentencepiece([text], out / "spm", vocab_size=400)


@pytest.fixture(scope="session")
def tagged_spm(tmp_path_factory) -> Path:
    """A joint sentencepiece model of de, en and fr with their target tags as single pieces."""
    languages = ["de", "en", "fr"]
    out = tmp_path_factory.mktemp("mspm")
    text = out / "joint.txt"
    text.write_text("".join((FIXTURES / f"train300.{lang}").read_text() for lang in languages))
    return train_sentencepiece([text], out / "spm", vocab_size=500, user_defined_symbols=[f"<2{lang}>" for lang in languages])


def deb_tree(directory: Path, package: str, copyright_license: str) -> Path:
    """A package's file tree to fill, with its DEBIAN/control and a machine-readable copyright file; build_deb
    makes the .deb."""
    root = directory / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {package}\nVersion: 1.0-1\nArchitecture: all\n"
                                             "Maintainer: Nobody <nobody@example.org>\nDescription: demo\n")
    (root / f"usr/share/doc/{package}").mkdir(parents=True)
    (root / f"usr/share/doc/{package}/copyright").write_text(
        f"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n{copyright_license}")
    return root


def build_deb(root: Path, package: str):
    """dpkg-deb's .deb of a deb_tree, as apt's download gives it (version 1.0-1, hash unchecked)."""
    from nmt_serve.training.corpus.apt import DebFile

    deb = root.parent / f"{package}_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True, capture_output=True)
    return DebFile(package, "1.0-1", deb, "0")


def make_checkpoint(directory: Path, spm_model: Path, source: str, target: str, seed: int, **overrides) -> Path:
    """A random (untrained) checkpoint with a real tokenizer."""
    tok = Tokenizer(spm_model)
    model = random_model(seed=seed, src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, **overrides)
    info = CheckpointInfo(model.config, source, target, "spm.model", "spm.model", {"note": "random test model"})
    return save_checkpoint(directory, model, info, {"spm.model": spm_model})


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, spm_model) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "de-en", spm_model, "de", "en", seed=3)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory, spm_model) -> Path:
    """A models directory as the service expects it: de-en and en-de random checkpoints."""
    root = tmp_path_factory.mktemp("models")
    make_checkpoint(root / "de-en", spm_model, "de", "en", seed=3)
    make_checkpoint(root / "en-de", spm_model, "en", "de", seed=4)
    return root


_SHARED_ENGINES: dict[str, object] = {}


def shared_engine_dir(settings) -> str:
    """The socket directory of an engine process for `settings`' engine configuration, started by the
    first app of the session that asks for it and attached to by every later one (as --workers' API
    processes attach to their parent's engine): an engine of its own costs each app two seconds of
    CPU, most of them importing torch. An app whose test kills, stops or counts its engine starts its own."""
    from nmt_serve.engine.supervisor import EngineSupervisor

    key = json.dumps(settings.engine_config(), sort_keys=True)
    if key not in _SHARED_ENGINES:
        supervisor = EngineSupervisor(settings.engine_config())
        supervisor.start()
        _SHARED_ENGINES[key] = supervisor
    return _SHARED_ENGINES[key].socket_dir


@pytest.fixture(autouse=True)
def _torch_threads_as_they_were():
    """Each test leaves torch's thread count of the test thread as it found it: an EngineCore with lanes sets it
    (one, or a lone search's cores: engine/cpu_room.py), which would otherwise carry into the tests after it."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_engines():
    yield
    for supervisor in _SHARED_ENGINES.values():
        supervisor.stop()


def distinct(text: str, n: int) -> list[str]:
    """n texts of about the same work, all different: a text repeated within a request goes to the engine
    once (service/translation_cache.py), so load made of copies is no load."""
    def letters(i: int) -> str:  # (digits may all be one unknown piece to a small test tokenizer)
        return letters(i // 26) + chr(97 + i % 26) if i >= 26 else chr(97 + i)

    return [f"{text} {letters(i)}" for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(base: str, timeout: float = 60.0, alive=lambda: True) -> None:
    """Poll base/health/ready until it answers 200; fail after `timeout` or once alive() is false."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(base + "/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if not alive() or time.time() > deadline:
            raise AssertionError(f"{base} did not become ready")
        time.sleep(0.1)


CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def headless_chromium():
    """A headless Chromium (the system binary) driven by Playwright; the test skips where either is
    missing (`.ci/run` installs Chromium)."""
    playwright_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM:
        pytest.skip("no Chromium binary installed")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
        )
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def running_server(models_dir: Path, *extra_args: str, port: int | None = None, timeout: float = 60.0):
    """`python -m nmt_serve.service` as a real process on a free loopback port; yields its base URL once ready."""
    port = port or free_port()
    log = tempfile.TemporaryFile(mode="w+")  # not a pipe: nobody reads it, and a full pipe blocks the server
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt_serve.service", "--port", str(port), "--models-dir", str(models_dir), "--device", "cpu", *extra_args],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_ready(base, timeout, alive=lambda: proc.poll() is None)
        except AssertionError:
            log.seek(0)
            raise AssertionError(f"server did not become ready: {log.read()[-2000:]}") from None
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


@pytest.fixture
def torch_products(monkeypatch):
    """The runner's Linears without row_products' kernels: the layouts torch's products read (where numba is not
    installed, or a runner laid out for more threads than one)."""
    from nmt_serve.inference import row_products

    monkeypatch.setattr(row_products, "ENABLED", False)


@pytest.fixture(params=["physical", "grouped"])
def beam_cache_mode(request, monkeypatch):
    """Runs a beam-search test with both ways the KV cache follows beams (see model/cache.py)."""
    import nmt_serve.inference.search

    monkeypatch.setattr(nmt_serve.inference.search, "GROUPED_BEAM_MIN_ROWS", 1 if request.param == "grouped" else 10**9)
    return request.param


def post_json(url: str, body: dict | None, headers: dict | None = None, timeout: float = 60):
    """(status, lower-cased headers, JSON body) of a POST (a GET when body is None); errors are statuses too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read() or b"{}")


def processes(*needles: bytes, parent: int | None = None) -> list[int]:
    """Pids whose command line holds every needle (and whose parent is `parent`, if given)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if all(n in cmdline for n in needles) and (parent is None or ppid == parent):
            found.append(int(entry))
    return found
