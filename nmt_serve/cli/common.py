"""What the command-line entry points share: errors reported the way argparse reports a bad flag, and
the options that choose how a model is loaded.

A wrong path, an unusable checkpoint or an impossible option value is the user's mistake, like a bad
flag: it gets one line, `prog: error: ...`, and exit status 2. A traceback would bury the one line that
says what to fix. Nothing here imports torch at module level: `python -m nmt_serve.service` uses it too.
"""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from nmt_serve.inference.translator import Translator
    from nmt_serve.network.checkpoint import CheckpointInfo


def fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    # not parser.error(): the flags parsed fine, so printing the usage again would only hide the message
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def describe(exc: BaseException) -> str:
    """The message of an exception, without Python's decoration ("[Errno 2] ...", a KeyError's quotes)."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__


@contextmanager
def user_errors(parser: argparse.ArgumentParser, *kinds: type[BaseException], about: str = "") -> Iterator[None]:
    """Report an exception of `kinds` raised in the block as this command's one-line error, after `about:`
    when the exception's own message would not say which input was wrong (a JSON or gzip error).

    Name only the kinds the block raises for bad input: anything else is a bug and keeps its traceback.
    """
    try:
        yield
    except kinds as exc:
        fail(parser, f"{about}: {describe(exc)}" if about else describe(exc))


def check_files(parser: argparse.ArgumentParser, files: dict[str, str]) -> None:
    """Fail on the first {flag: path} whose path is not a file, before any slow work (or a run directory) starts."""
    for flag, path in files.items():
        if path and not Path(path).is_file():
            fail(parser, f"{flag} {path}: {'not a file' if Path(path).exists() else 'no such file'}")


def check_model(parser: argparse.ArgumentParser, model_dir: str) -> "CheckpointInfo":
    """The checkpoint's config, or a one-line error; reads no weights, so it costs nothing before slow work."""
    from nmt_serve.network.checkpoint import CheckpointError, read_info

    with user_errors(parser, CheckpointError):
        info = read_info(model_dir)
    return info


def require_eval_extra(parser: argparse.ArgumentParser) -> None:
    """Scoring needs sacrebleu, which the eval extra brings (the service image leaves it out)."""
    import importlib.util

    if importlib.util.find_spec("sacrebleu") is None:
        fail(parser, "sacrebleu is not installed: pip install 'nmt-serve[eval]' (or run make setup)")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def device_name(text: str) -> str:
    import torch

    if text != "auto":
        try:
            torch.device(text)
        except RuntimeError:  # torch's own message lists every device type it knows of
            raise argparse.ArgumentTypeError(f"{text!r} is not a device (auto, cpu, cuda, cuda:N, ...)") from None
    return text


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """--model and the flags that decide where and how it runs (translate and evaluate take the same)."""
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda (default auto)")
    parser.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"], help="default: float32 on CPU, float16 on CUDA")
    parser.add_argument("--quantization", default="none", choices=["none", "int8"],
                        help="int8: quantized Linear layers, faster on CPU at a small BLEU cost (see the model card)")
    parser.add_argument("--step-mode", default="auto", choices=["auto", "eager", "static"],
                        help="auto: the static decoder (CUDA graphs) on CUDA, the eager search on CPU; eager: always the eager search")


def load_translator(parser: argparse.ArgumentParser, args: argparse.Namespace, model: str | None = None) -> "Translator":
    """args.model (or `model`, with the same options) loaded; a problem is one line and exit status 2."""
    from nmt_serve.inference.translator import Translator
    from nmt_serve.network.checkpoint import CheckpointError

    # CheckpointError: a missing or broken checkpoint; ValueError: options it cannot run with (cuda on a CPU machine)
    with user_errors(parser, CheckpointError, ValueError):
        translator = Translator.load(model or args.model, device=args.device, dtype=args.dtype, quantization=args.quantization,
                                     step_mode=args.step_mode)
    return translator
