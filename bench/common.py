"""Shared helpers for the benchmarks: inputs, timing, markdown tables, a Marian twin of a checkpoint."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("NMT_DATA", ROOT.parent / "shared" / "data" / "multi30k"))


def test_sources(lang: str = "de", n: int | None = None) -> list[str]:
    from nmt_serve.training.data import read_lines

    lines = read_lines(DATA / f"test_2016_flickr.{lang}.gz")
    return lines[:n] if n else lines


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"


def timed(fn, repeat: int = 1):
    """Best of `repeat` wall-clock runs: (seconds, result of the last run)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank), nan without values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:,.1f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def emit(report: str, output: str | None) -> int:
    """Print a benchmark's report, and write it to `output` too when one is given; the exit status."""
    print(report)
    if output:
        Path(output).write_text(report)
    return 0


# the real configurations of deployed models (their config.json), for random twins of the same cost per token
SHAPES = {
    # Helsinki-NLP/opus-mt-de-en: 74M parameters
    "opus-mt": dict(d_model=512, n_encoder_layers=6, n_decoder_layers=6, n_heads=8, d_ff=2048, vocab_size=58101,
                    activation="swish"),
}


def marian_twin(checkpoint: Path, out: Path, seed: int = 0, shape: str | None = None) -> Path:
    """A MarianMT directory with the architecture and tokenizer of `checkpoint` (post-norm, since Marian
    has no pre-norm) and random weights: the same amount of work per token for every engine. With a
    `shape` (SHAPES), the architecture is that model's instead, its vocabulary the checkpoint's pieces
    padded with placeholder pieces to the model's size (the output layer's cost is the real one).

    Random weights rarely say eos, so every engine decodes to the length cap: the benchmarks compare
    speed on identical work, not translation quality."""
    from transformers import MarianConfig, MarianMTModel

    from nmt_serve.convert.marian import sentencepiece_vocab

    config = json.loads((checkpoint / "config.json").read_text())
    m = config["model"]
    spm_file = checkpoint / config["src_tokenizer"]
    # OPUS-MT's id layout, which CTranslate2's converter relies on: </s>=0, <unk>=1, ..., <pad> last
    pieces = [p for p in sentencepiece_vocab(spm_file) if p not in ("<pad>", "<unk>", "<s>", "</s>")]
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    activation = "relu"
    if shape is not None:
        real = SHAPES[shape]
        while len(vocab) < real["vocab_size"] - 1:
            vocab[f"▁placeholder{len(vocab)}"] = len(vocab)
        m = {**m, **{k: v for k, v in real.items() if k in m}}
        activation = real["activation"]
    vocab["<pad>"] = len(vocab)
    m = {**m, "pad_id": vocab["<pad>"], "eos_id": 0}
    hf = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=m["d_model"], encoder_layers=m["n_encoder_layers"],
        decoder_layers=m["n_decoder_layers"], encoder_attention_heads=m["n_heads"], decoder_attention_heads=m["n_heads"],
        encoder_ffn_dim=m["d_ff"], decoder_ffn_dim=m["d_ff"], max_position_embeddings=512, activation_function=activation,
        pad_token_id=m["pad_id"], eos_token_id=m["eos_id"], decoder_start_token_id=m["pad_id"], forced_eos_token_id=m["eos_id"],
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True, bad_words_ids=[[m["pad_id"]]],
    )
    torch.manual_seed(seed)
    model = MarianMTModel(hf).eval()
    model.save_pretrained(out)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(spm_file.read_bytes())
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({"separate_vocabs": False}))
    return out


def start_service(port: int, models_dir: Path, flags: list[str], timeout: float = 300.0, root: Path = ROOT) -> subprocess.Popen:
    """`python -m nmt_serve.service` on a loopback port with `flags`, once ready (on CUDA the engine
    captures its graphs first) and, with `--engines N`, once all N engines are (the server is ready with the
    first); its log, which nobody reads, goes to a file, not a pipe that could fill.
    root: the checkout whose code runs (another one: to compare with a revision of it)."""
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "nmt_serve.service", "--port", str(port), "--models-dir", str(models_dir),
                             "--log-level", "warning", *flags], cwd=root, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log  # server_log() reads it
    engines = int(flags[flags.index("--engines") + 1]) if "--engines" in flags else 1
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/ready", timeout=1) as r:
                if r.status == 200 and (engines == 1 or engines_ready(port) == engines):
                    return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    log.seek(0)
    raise RuntimeError(f"server did not start: {log.read()[-2000:]!r}")


def server_log(proc: subprocess.Popen, since: int = 0) -> tuple[str, int]:
    """What a server started by start_service has logged (warnings and worse) from byte `since` on, and where it ends:
    a benchmark that saw answers other than 200 prints why. Read with pread: the server writes through the same
    open file, whose offset a seek here would move under it."""
    fd = proc.log.fileno()
    end = os.fstat(fd).st_size
    return os.pread(fd, end - since, since).decode(errors="replace"), end


def engines_ready(port: int) -> int:
    """The server's ready engines, from its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nmt_engines_ready "):
                return int(float(line.split()[1]))
    return 0


# callgrind counts from the child's os.getloadavg() call to its os.times() call: the measured stretch only
CALLGRIND = ["valgrind", "--tool=callgrind", "--zero-before=os_getloadavg", "--dump-before=os_times"]


def counted_instructions(dump: Path) -> int:
    """The instructions in a callgrind dump: its `totals:` line, the sum of its cost lines, which --zero-before
    reset for every thread. Not its `summary:` line: that adds, for each thread other than the one that
    called the zeroing function, all it ran since it started (the thread that took the engine's models in
    before the count added 17 M instructions to 300 requests, which read as 4% more a request)."""
    with open(dump) as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"{dump}: no totals line")


def run_counted(command: list[str], cwd: Path, callgrind: bool, scratch: Path, per: str) -> dict:
    """Run a benchmark's child, which prints one JSON line with the count of what it measured under `per`;
    with callgrind, under valgrind, the result gains `instructions`: per `per`, those the child ran between
    its os.getloadavg() and os.times() calls."""
    if callgrind:
        command = [*CALLGRIND, f"--callgrind-out-file={scratch}/callgrind.%p", *command]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the measurement failed: {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if callgrind:
        [counted] = scratch.glob("callgrind.*.1")  # the dump at the end of the count
        result["instructions"] = counted_instructions(counted) / result[per]
        for f in scratch.glob("callgrind.*"):
            f.unlink()
    return result
