"""Training pipeline: sentencepiece + Transformer from parallel text, resumable.

    python -m nmt_serve.training.train --train-src train.de.gz --train-tgt train.en.gz \
        --valid-src val.de.gz --valid-tgt val.en.gz --source-lang de --target-lang en \
        --run-dir runs/de-en --output checkpoints/de-en

    python -m nmt_serve.training.train --languages en,de,fr,cs --train-data 'train.{lang}.gz' \
        --valid-data 'val.{lang}.gz' --run-dir runs/mul --output checkpoints/mul

The second form trains one multilingual model on multi-way parallel files (every ordered pair of the
languages, or --directions en-fr,fr-en,...), the target language a tag before the source
(nmt_serve/training/multiway.py); the validation score is the mean greedy BLEU over the directions.

Every hyper-parameter is a flag (see --help) or a key of the JSON file given with --config. The run
directory holds the tokenizer, `state.pt` (model, optimizer, schedule, data position: saved every few
minutes and on SIGINT/SIGTERM), the best checkpoints by validation BLEU, and `train.log`. Running the
same command again resumes where it stopped. At the end the best checkpoints are averaged and the
result is exported (float16 weights) to --output.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import logging
import math
import random
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from nmt_serve.cli.common import check_files, fail, require_eval_extra, user_errors
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.network.checkpoint import (
    CheckpointInfo,
    load_checkpoint,
    save_checkpoint,
)
from nmt_serve.network.config import ModelConfig
from nmt_serve.network.tokenizer import Tokenizer, train_sentencepiece
from nmt_serve.network.transformer import Transformer
from nmt_serve.training.data import (
    ParallelData,
    collate,
    read_parallel,
    token_batches,
    tokenize_parallel,
)
from nmt_serve.training.grow import grow
from nmt_serve.training.hardware import cpu_name
from nmt_serve.training.multiway import (
    concatenate,
    multiway_pairs,
    pair_corpora,
    pair_texts,
    parse_directions,
    parse_languages,
    parse_weights,
    read_multiway,
    repeated,
    repeated_lines,
    tag_ids,
    target_tag,
    target_tags,
)

log = logging.getLogger("train")


@dataclass
class TrainConfig:
    train_src: str = ""  # training source text (plain or .gz), one sentence per line
    train_tgt: str = ""  # training target text, line-aligned with train_src
    valid_src: str = ""  # validation source (model selection)
    valid_tgt: str = ""  # validation references
    languages: str = ""  # multilingual: "en,de,fr,cs" (then train_data/valid_data instead of the four files above)
    directions: str = "all"  # multilingual: "all" (every ordered pair) or "en-de,de-en,..."
    train_data: str = ""  # multilingual: multi-way parallel training files, "{lang}" for the code (train.{lang}.gz)
    valid_data: str = ""  # multilingual: validation files, same form
    # multilingual: pairwise corpora beside the multi-way files, a path with {pair} ("en-de", as the corpus
    # names it) and {lang} (corpora/debian-v1/train.{pair}.{lang}); each pair found gives both its directions
    pair_data: str = ""
    pair_directions: str = "all"  # the directions taken from the pair corpora ("all" or "en-de,de-en,..."), among --directions
    pair_weights: str = ""  # repeat pairs by their origin's kind: "ddtp-short=3,catalog=0.5" (others weigh 1)
    pair_valid_lines: int = 150  # pairs of each pair corpus kept apart (evenly spread) to validate on, never trained on
    init_from: str = ""  # a checkpoint to start from: its architecture, tokenizer and weights (fine-tuning)
    # with init_from: a deeper model (0 = the checkpoint's depth) that starts out equal to the checkpoint
    # (nmt_serve/training/grow.py): new layers copy the one below with their output projections at zero
    grow_encoder_layers: int = 0
    grow_decoder_layers: int = 0
    multiway_weight: float = 1.0  # times the multi-way pairs are trained on per epoch beside pair corpora (a fraction: a seeded sample)
    source_lang: str = "src"
    target_lang: str = "tgt"
    run_dir: str = "runs/model"  # scratch: tokenizer, state, best checkpoints, log
    output: str = ""  # final checkpoint directory ("" = run_dir/final)
    spm_model: str = ""  # existing sentencepiece model to reuse (joint vocab); "" = train one
    vocab_size: int = 8000  # joint sentencepiece vocabulary over source + target training text
    spm_type: str = "bpe"
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: str = "relu"
    norm_placement: str = "pre"  # pre-norm trains stably with a short warmup and a high peak rate
    max_sentence_tokens: int = 128  # training pairs longer than this (either side) are skipped
    max_tokens: int = 3000  # padded tokens per batch (rows x longest side)
    lr: float = 1e-3  # peak learning rate, reached at the end of warmup
    warmup_steps: int = 600  # linear warmup, then decay with 1/sqrt(step) (the paper's schedule)
    lr_schedule: str = "inverse_sqrt"  # or "linear": after the warmup straight down to 0 at max_steps (annealing a fine-tune)
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 1.0  # gradient clipping by global norm (0 = off)
    max_epochs: int = 30
    max_steps: int = 0  # 0 = no limit
    max_minutes: float = 0.0  # wall-clock budget for this invocation (0 = none); state is saved at the end
    validate_every: int = 0  # steps between validations (0 = at the end of each epoch)
    valid_max_sentences: int = 0  # 0 = the whole validation set for BLEU
    keep_best: int = 4  # best checkpoints kept (by validation BLEU)
    average_best: int = 4  # checkpoints averaged into the exported model (1 = best only)
    save_every_minutes: float = 10.0
    threads: int = 0  # torch intra-op threads (0 = torch default)
    seed: int = 1
    device: str = "auto"  # auto | cpu | cuda (cuda trains in bfloat16 autocast)
    export_dtype: str = "float16"
    export_only: int = 0  # 1 = do not train: export the best checkpoints of run_dir as they are now (the last step validated first if it was not)
    # 1 = export also when this invocation's max_minutes ends the run before max_epochs/max_steps (a time-boxed
    # run on a lent machine; the run can still be resumed, and exported again when it finishes)
    export_at_stop: int = 0
    # 1 = only make the run's tokenizer (run_dir/spm.model) and stop: prepared on one machine (sentencepiece over
    # the whole training text takes minutes of CPU) for a run on another, which takes it as --spm-model
    tokenizer_only: int = 0

    @classmethod
    def build_parser(cls) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog="nmt-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--config", help="JSON file of TrainConfig keys; flags override it")
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("tuple[float, float]",):
                parser.add_argument(flag, type=float, nargs=2, default=None)
            else:
                kind = {"int": int, "float": float, "str": str}[f.type]
                parser.add_argument(flag, type=kind, default=None)
        return parser

    @classmethod
    def from_args(cls, argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None) -> "TrainConfig":
        """The config of a command line, or a one-line error for a bad --config file, missing data or impossible
        model: found now, not after minutes of tokenizer training."""
        parser = parser or cls.build_parser()
        args = parser.parse_args(argv)
        values = {}
        if args.config:
            check_files(parser, {"--config": args.config})
            with user_errors(parser, OSError, ValueError, about=f"--config {args.config}"):  # ValueError: not JSON, or not UTF-8
                values = json.loads(Path(args.config).read_text(encoding="utf-8"))
            if not isinstance(values, dict):
                fail(parser, f"--config {args.config}: not a JSON object of TrainConfig keys")
            unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                fail(parser, f"--config {args.config}: unknown keys {unknown}")
            for f in dataclasses.fields(cls):
                if f.name in values and not config_value_fits(values[f.name], f.type):
                    fail(parser, f"--config {args.config}: {f.name} {values[f.name]!r}: expected {CONFIG_TYPES[f.type]}")
        values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
        if "adam_betas" in values:
            values["adam_betas"] = tuple(values["adam_betas"])
        cfg = cls(**values)
        for name, least in LEAST.items():
            value = getattr(cfg, name)
            if not value >= least or (name in FRACTIONS and not value < 1):  # `not >=`: NaN is out of range too
                flag = "--" + name.replace("_", "-")
                fail(parser, f"{flag} {value}: expected {'a number from 0 to below 1' if name in FRACTIONS else f'at least {least}'}")
        if cfg.languages:
            with user_errors(parser, ValueError):
                languages = parse_languages(cfg.languages)
                parse_directions(cfg.directions, languages)
                parse_directions(cfg.pair_directions, languages)
                parse_weights(cfg.pair_weights)
                names = ("train_data", "valid_data")
                for name in names:
                    if getattr(cfg, name) and "{lang}" not in getattr(cfg, name):
                        raise ValueError(f"--{name.replace('_', '-')} {getattr(cfg, name)}: put {{lang}} where the language code goes")
            data = {f"--{n.replace('_', '-')} ({lang})": getattr(cfg, n).replace("{lang}", lang)
                    for n in names if getattr(cfg, n) for lang in languages}
            missing = [f"--{n.replace('_', '-')}" for n in names if not getattr(cfg, n)]
        else:
            data = {"--" + name.replace("_", "-"): getattr(cfg, name) for name in ("train_src", "train_tgt", "valid_src", "valid_tgt")}
            missing = [flag for flag, path in data.items() if not path]
        if missing:
            fail(parser, f"{', '.join(missing)} required (flags or keys of --config)")
        if cfg.device not in ("auto", "cpu", "cuda") and not cfg.device.startswith("cuda:"):
            fail(parser, f"--device {cfg.device}: expected auto, cpu or cuda")
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            fail(parser, f"--device {cfg.device}: CUDA is not available here")
        if cfg.pair_data and (not cfg.languages or "{pair}" not in cfg.pair_data or "{lang}" not in cfg.pair_data):
            fail(parser, f"--pair-data {cfg.pair_data}: needs --languages and a path with {{pair}} and {{lang}}")
        if cfg.lr_schedule not in ("inverse_sqrt", "linear"):
            fail(parser, f"--lr-schedule {cfg.lr_schedule}: expected inverse_sqrt or linear")
        if cfg.lr_schedule == "linear" and not cfg.max_steps:
            fail(parser, "--lr-schedule linear ends at --max-steps: give it")
        if (cfg.grow_encoder_layers or cfg.grow_decoder_layers) and not cfg.init_from:
            fail(parser, "--grow-encoder-layers/--grow-decoder-layers grow the --init-from checkpoint: give it")
        if cfg.init_from:
            check_files(parser, {"--init-from": str(Path(cfg.init_from) / "config.json")})
            if cfg.spm_model:
                fail(parser, "--init-from brings its own tokenizer: leave --spm-model out")
        check_files(parser, {**data, "--spm-model": cfg.spm_model})
        for flag, path in data.items():
            if not has_text(path):
                fail(parser, f"{flag} {path}: no text in it")
        if cfg.export_dtype not in EXPORT_DTYPES:
            fail(parser, f"--export-dtype {cfg.export_dtype}: expected {', '.join(EXPORT_DTYPES)}")
        if cfg.export_only and not (Path(cfg.run_dir) / "state.pt").is_file():
            fail(parser, f"--export-only: no checkpoint in {cfg.run_dir} to export (no state.pt: it was never trained)")
        with user_errors(parser, AssertionError):  # ModelConfig's checks (d_model divisible by n_heads, ...)
            ModelConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff, activation=cfg.activation,
                        norm_placement=cfg.norm_placement)
        return cfg


EXPORT_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
# The least value of each numeric field (flag or --config key). Below it a run divides by zero (warmup_steps,
# n_heads), indexes an empty list (keep_best), hands sentencepiece a size it cannot train (vocab_size) or trains
# nothing and exports the untrained model (max_epochs); the rest count or scale something that cannot be negative.
LEAST = {
    **dict.fromkeys(("vocab_size", "d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "max_tokens",
                     "warmup_steps", "max_epochs", "keep_best"), 1),
    **dict.fromkeys(("max_sentence_tokens", "max_steps", "validate_every", "valid_max_sentences", "average_best", "threads",
                     "pair_valid_lines", "grow_encoder_layers", "grow_decoder_layers", "multiway_weight", "max_minutes",
                     "save_every_minutes", "clip_norm", "dropout", "attention_dropout", "label_smoothing"), 0),
}
FRACTIONS = ("dropout", "attention_dropout", "label_smoothing")  # probabilities: also below 1
CONFIG_TYPES = {"int": "an integer", "float": "a number", "str": "a string", "tuple[float, float]": "two numbers"}


def config_value_fits(value, kind: str) -> bool:
    """Whether a --config JSON value has the type of its TrainConfig field (JSON has no tuples)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int)  # true/false read as 1/0, as the flags that take 0/1 mean them
    if kind == "float":
        return number
    if kind == "str":
        return isinstance(value, str)
    return isinstance(value, list) and len(value) == 2 and all(config_value_fits(v, "float") for v in value)


def vocab_size_error(exc: RuntimeError, vocab_size: int) -> ValueError | None:
    """sentencepiece's refusal of a vocabulary size as a one-line error naming the size it would take (the
    limits depend on the text: its distinct characters, and for unigram and word models its distinct pieces),
    or None for any other failure."""
    message = str(exc)
    if "Vocabulary size too high" in message:  # "... Please set it to a value <= 1677."
        limit = re.search(r"<= ?(\d+)", message)
        return ValueError(f"--vocab-size {vocab_size}: too large for this training text"
                          + (f" (at most {limit.group(1)})" if limit else ""))
    if "Vocabulary size is smaller than required_chars" in message:  # "... 10 vs 66. ..."
        limit = re.search(r"\d+ vs (\d+)", message)
        return ValueError(f"--vocab-size {vocab_size}: too small for this training text"
                          + (f" (at least {limit.group(1)}: a piece for each of its characters and the special tokens)"
                             if limit else ""))
    return None


def has_text(path: str) -> bool:
    """Whether a plain or gzipped data file holds a line that is not blank (read up to the first one)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        return any(line.strip() for line in f)


def inverse_sqrt_lr(step: int, peak: float, warmup: int) -> float:
    """The paper's schedule, parameterised by its peak: linear up to `warmup`, then peak*sqrt(warmup/step)."""
    step = max(step, 1)
    return peak * min(step / warmup, math.sqrt(warmup / step))


def linear_lr(step: int, peak: float, warmup: int, total: int) -> float:
    """Linear up to `warmup`, then linear down to 0 at `total`: a run that ends annealed."""
    step = max(step, 1)
    if step < warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(total - warmup, 1))


def setup_logging(run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S")
    file_handler = logging.FileHandler(run_dir / "train.log")
    file_handler.setFormatter(fmt)
    log.handlers[:] = [file_handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def say(message: str) -> None:
    """To the log file and, above the progress bar, to stderr."""
    log.info(message)
    tqdm.write(message, file=sys.stderr)


@torch.no_grad()
def translate_ids(model: Transformer, sources: list[list[int]], options: SearchOptions, max_tokens: int = 4000) -> list[list[int]]:
    """Search over pre-tokenized sources (eos included), batched by length; results in input order."""
    model.eval()
    runner = ModelRunner(model)  # fused copies of the weights as they are now
    out: list[list[int]] = [[] for _ in sources]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    start = 0
    while start < len(order):
        end = start
        while end < len(order) and (end - start + 1) * len(sources[order[end]]) <= max_tokens:
            end += 1
        end = max(end, start + 1)
        idx = order[start:end]
        width = max(len(sources[i]) for i in idx)
        src = torch.full((len(idx), width), model.config.pad_id, dtype=torch.long)
        for r, i in enumerate(idx):
            src[r, : len(sources[i])] = torch.tensor(sources[i])
        for i, hyps in zip(idx, generate(runner, src.to(runner.device), options)):
            out[i] = hyps[0].tokens
        start = end
    return out


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        setup_logging(self.run_dir)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                   "cpu" if cfg.device == "auto" else cfg.device)
        # bfloat16 autocast on a GPU (no loss scaling needed); float32 on the CPU, where bfloat16 is slow without AMX
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda")
        self.languages = parse_languages(cfg.languages) if cfg.languages else []
        self.directions = (parse_directions(cfg.directions, self.languages) if self.languages
                           else [(cfg.source_lang, cfg.target_lang)])
        self.stop_requested = False
        self.initial = load_checkpoint(cfg.init_from) if cfg.init_from else None
        self.tokenizer = self.prepare_tokenizer()
        if cfg.tokenizer_only:
            return
        self.model_config = self.initial_config() if self.initial else ModelConfig(
            src_vocab_size=self.tokenizer.vocab_size, tgt_vocab_size=self.tokenizer.vocab_size,
            d_model=cfg.d_model, n_heads=cfg.n_heads, d_ff=cfg.d_ff,
            n_encoder_layers=cfg.n_encoder_layers, n_decoder_layers=cfg.n_decoder_layers,
            dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation=cfg.activation,
            norm_placement=cfg.norm_placement, share_embeddings=True, tie_output=True,
            pad_id=self.tokenizer.pad_id, unk_id=self.tokenizer.unk_id, bos_id=self.tokenizer.bos_id,
            eos_id=self.tokenizer.eos_id, decoder_start_id=self.tokenizer.bos_id,
        )
        torch.manual_seed(cfg.seed)
        self.model = Transformer(self.model_config).to(self.device)
        if self.initial:
            start = self.initial[0].float()
            if cfg.grow_encoder_layers or cfg.grow_decoder_layers:
                start = grow(start, n_encoder_layers=cfg.grow_encoder_layers, n_decoder_layers=cfg.grow_decoder_layers)
            self.model.load_state_dict(start.state_dict())
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay
        )
        self.step = 0  # optimizer updates done
        self.epoch = 0  # current epoch (0-based)
        self.batch_in_epoch = 0  # batches of the current epoch already trained on
        self.best: list[dict] = []  # [{"bleu", "step", "dir"}], best first
        self.train_seconds = 0.0  # accumulated over resumptions
        self.train_threads = torch.get_num_threads()  # threads of the training run (an export may use others)
        self.load_data()
        self.resume()

    # ------------------------------------------------------------------ setup
    def prepare_tokenizer(self) -> Tokenizer:
        cfg = self.cfg
        target = self.run_dir / "spm.model"
        if not target.exists():
            if cfg.spm_model or cfg.init_from:
                source = cfg.spm_model or Path(cfg.init_from) / self.initial[1].src_tokenizer
                shutil.copyfile(source, target)
                say(f"tokenizer: reusing {source}")
            else:
                # sentencepiece reads plain text: write every training side once, uncompressed
                scratch = self.run_dir / "spm_input.txt"
                if self.languages:
                    # the captions' words and the pair corpora's, weighted as training weighs them
                    sides = [repeated_lines(lines, cfg.multiway_weight, cfg.seed) if cfg.pair_data else lines
                             for lines in read_multiway(cfg.train_data, self.languages).values()]
                    if cfg.pair_data:
                        sides += pair_texts(cfg.pair_data, self.pair_directions(), cfg.pair_valid_lines,
                                            parse_weights(cfg.pair_weights), cfg.seed)
                else:
                    sides = list(read_parallel(cfg.train_src, cfg.train_tgt))
                scratch.write_text("\n".join(line for side in sides for line in side) + "\n", encoding="utf-8")
                t0 = time.time()
                tags = [target_tag(lang) for lang in self.languages]
                try:
                    train_sentencepiece([scratch], self.run_dir / "spm", cfg.vocab_size, cfg.spm_type, user_defined_symbols=tags)
                except RuntimeError as exc:
                    if (error := vocab_size_error(exc, cfg.vocab_size)) is None:
                        raise
                    raise error from None
                finally:
                    scratch.unlink()
                say(f"tokenizer: trained {cfg.spm_type} vocab {cfg.vocab_size} in {time.time() - t0:.0f}s")
        return Tokenizer(target)

    def initial_config(self) -> ModelConfig:
        """The starting checkpoint's architecture, with this run's dropout (fine-tuning may want more) and depth."""
        model, info = self.initial[:2]
        if not info.multilingual or info.src_tokenizer != info.tgt_tokenizer:
            raise ValueError(f"--init-from {self.cfg.init_from}: expected a multilingual checkpoint with one joint tokenizer")
        if self.languages:
            tag_ids(self.tokenizer, self.languages)  # every tag must already be a piece of its tokenizer
        return dataclasses.replace(
            info.config, dropout=self.cfg.dropout, attention_dropout=self.cfg.attention_dropout,
            n_encoder_layers=self.cfg.grow_encoder_layers or info.config.n_encoder_layers,
            n_decoder_layers=self.cfg.grow_decoder_layers or info.config.n_decoder_layers,
        )

    def pair_directions(self) -> list[tuple[str, str]]:
        """The directions the pair corpora are trained in."""
        return [d for d in parse_directions(self.cfg.pair_directions, self.languages) if d in self.directions]

    def load_data(self) -> None:
        """self.train: every training pair; self.valid_sets: per direction its pairs and references."""
        cfg = self.cfg
        n = cfg.valid_max_sentences or None
        if self.languages:
            tags = tag_ids(self.tokenizer, self.languages)
            texts = read_multiway(cfg.train_data, self.languages)
            self.train = concatenate(list(multiway_pairs(texts, self.directions, self.tokenizer, tags, cfg.max_sentence_tokens).values()))
            if cfg.multiway_weight != 1.0:
                self.train = repeated(self.train, cfg.multiway_weight, cfg.seed)
            vtexts = {lang: lines[:n] for lang, lines in read_multiway(cfg.valid_data, self.languages).items()}
            valid = multiway_pairs(vtexts, self.directions, self.tokenizer, tags, drop_empty=False)
            self.valid_sets = {f"{s}-{t}": (valid[(s, t)], vtexts[t]) for s, t in self.directions}
            if cfg.pair_data:
                train, valid_pairs = pair_corpora(cfg.pair_data, self.pair_directions(), self.tokenizer, tags,
                                                  cfg.pair_valid_lines, cfg.max_sentence_tokens,
                                                  parse_weights(cfg.pair_weights), cfg.seed)
                self.train = concatenate([self.train, *train.values()])
                for (s, t), (data, refs) in valid_pairs.items():
                    self.valid_sets[f"{s}-{t} pairs"] = (
                        ParallelData(data.src[:n], data.tgt[:n]) if n else data, refs[:n] if n else refs)
                say("pair corpora: " + ", ".join(f"{s}-{t} {len(d)}" for (s, t), d in train.items()))
        else:
            src, tgt = read_parallel(cfg.train_src, cfg.train_tgt)
            self.train = tokenize_parallel(src, tgt, self.tokenizer, self.tokenizer, cfg.max_sentence_tokens)
            vsrc, vtgt = read_parallel(cfg.valid_src, cfg.valid_tgt)
            vsrc, vtgt = vsrc[:n], vtgt[:n]
            self.valid_sets = {"-".join(self.directions[0]): (tokenize_parallel(vsrc, vtgt, self.tokenizer, self.tokenizer, drop_empty=False), vtgt)}
        self.valid = concatenate([data for data, _ in self.valid_sets.values()])
        if not len(self.train):  # else every epoch passes without a step and the untrained model is exported
            files = f"--train-data {cfg.train_data}" if self.languages else f"--train-src {cfg.train_src} and --train-tgt {cfg.train_tgt}"
            raise ValueError(f"{files}: no training pairs: each line pair has an empty side or one longer than "
                             f"--max-sentence-tokens {cfg.max_sentence_tokens}")
        say(
            f"data: {len(self.train)} training pairs ({self.train.num_target_tokens()} target tokens) in "
            f"{len(self.directions)} direction(s), {len(self.valid)} validation pairs"
        )

    def resume(self) -> None:
        state_path = self.run_dir / "state.pt"
        if not state_path.exists():
            say(f"model: {self.model.num_parameters() / 1e6:.2f}M parameters, config {self.model_config}")
            return
        state = torch.load(state_path, map_location=self.device, weights_only=False)
        if state["model_config"] != self.model_config.to_dict():
            raise ValueError(f"{state_path} was saved with another model config; use a fresh --run-dir")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best = state["best"]
        self.train_seconds = state.get("train_seconds", 0.0)
        if self.cfg.export_only and "train_threads" in state:
            self.train_threads = state["train_threads"]
        torch.set_rng_state(state["torch_rng"].cpu())
        random.setstate(state["python_rng"])
        say(f"resumed from step {self.step} (epoch {self.epoch + 1}, batch {self.batch_in_epoch})")

    def save_state(self) -> None:
        state = {
            "model_config": self.model_config.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "best": self.best, "train_seconds": self.train_seconds, "train_threads": self.train_threads,
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
        }
        tmp = self.run_dir / "state.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.run_dir / "state.pt")  # atomic: a crash mid-save keeps the previous state

    def checkpoint_info(self, extra: dict | None = None) -> CheckpointInfo:
        if self.languages:
            return CheckpointInfo(
                config=self.model_config, source_lang="mul", target_lang="mul", src_tokenizer="spm.model",
                tgt_tokenizer="spm.model", metadata=extra or {}, directions=[f"{s}-{t}" for s, t in self.directions],
                target_tags=target_tags({t for _, t in self.directions}),
            )
        return CheckpointInfo(
            config=self.model_config, source_lang=self.cfg.source_lang, target_lang=self.cfg.target_lang,
            src_tokenizer="spm.model", tgt_tokenizer="spm.model", metadata=extra or {},
        )

    # ------------------------------------------------------------------ loop
    def loss_on(self, src, tgt_in, tgt_out) -> tuple[torch.Tensor, int]:
        n_tokens = int((tgt_out != self.model_config.pad_id).sum())  # on the host: no device sync
        src, tgt_in, tgt_out = (t.to(self.device, non_blocking=True) for t in (src, tgt_in, tgt_out))
        with self.autocast:
            logits = self.model(src, tgt_in)  # (B, T, V)
        logits = logits.float()
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)), tgt_out.view(-1), ignore_index=self.model_config.pad_id,
            label_smoothing=self.cfg.label_smoothing, reduction="sum",
        )
        return loss, n_tokens

    def run(self) -> None:
        cfg = self.cfg
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: setattr(self, "stop_requested", True))
        started = time.time()
        last_save = time.time()
        while self.epoch < cfg.max_epochs and not self.budget_spent(started):
            batches = token_batches(self.train, cfg.max_tokens, seed=cfg.seed * 1000 + self.epoch)
            bar = tqdm(
                total=len(batches), initial=self.batch_in_epoch, desc=f"epoch {self.epoch + 1}/{cfg.max_epochs}",
                unit="batch", dynamic_ncols=True, file=sys.stderr, mininterval=2.0,
            )
            window_loss, window_tokens, window_start = 0.0, 0, time.time()
            while self.batch_in_epoch < len(batches):
                if self.budget_spent(started):
                    break
                t0 = time.time()
                self.model.train()
                src, tgt_in, tgt_out = collate(
                    self.train, batches[self.batch_in_epoch], self.model_config.pad_id, self.model_config.decoder_start_id
                )
                loss, n_tokens = self.loss_on(src, tgt_in, tgt_out)
                self.optimizer.zero_grad(set_to_none=True)
                (loss / n_tokens).backward()
                if cfg.clip_norm:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm)
                self.step += 1
                lr = (linear_lr(self.step, cfg.lr, cfg.warmup_steps, cfg.max_steps) if cfg.lr_schedule == "linear"
                      else inverse_sqrt_lr(self.step, cfg.lr, cfg.warmup_steps))
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                self.optimizer.step()
                self.batch_in_epoch += 1
                self.train_seconds += time.time() - t0
                # summed on the device and read every 10 steps: reading it each step would wait for
                # the GPU every step
                window_loss = window_loss + loss.detach()
                window_tokens += n_tokens
                bar.update(1)
                if self.step % 10 == 0:
                    elapsed = time.time() - window_start
                    bar.set_postfix(
                        loss=f"{float(window_loss) / window_tokens:.3f}", tok_s=f"{window_tokens / max(elapsed, 1e-6):.0f}",
                        step=self.step, refresh=False,
                    )
                if self.step % 50 == 0:
                    elapsed = time.time() - window_start
                    log.info(
                        f"step {self.step} epoch {self.epoch + 1} loss {float(window_loss) / window_tokens:.4f} "
                        f"lr {self.optimizer.param_groups[0]['lr']:.2e} tok/s {window_tokens / max(elapsed, 1e-6):.0f}"
                    )
                    window_loss, window_tokens, window_start = 0.0, 0, time.time()
                if cfg.validate_every and self.step % cfg.validate_every == 0:
                    self.validate()
                if time.time() - last_save > cfg.save_every_minutes * 60:
                    self.save_state()
                    last_save = time.time()
                if cfg.max_steps and self.step >= cfg.max_steps:
                    break
            bar.close()
            if self.batch_in_epoch >= len(batches):
                self.epoch += 1
                self.batch_in_epoch = 0
                if not cfg.validate_every:
                    self.validate()
            self.save_state()
            last_save = time.time()
        self.save_state()
        if self.finished() or (self.cfg.export_at_stop and self.step and not self.stop_requested):
            self.export()
        if not self.finished():
            say(f"stopped at step {self.step} (epoch {self.epoch + 1}); run the same command to resume")

    def budget_spent(self, started: float) -> bool:
        cfg = self.cfg
        return (
            self.stop_requested
            or (cfg.max_steps and self.step >= cfg.max_steps)
            or (cfg.max_minutes and time.time() - started > cfg.max_minutes * 60)
        )

    def finished(self) -> bool:
        return self.epoch >= self.cfg.max_epochs or bool(self.cfg.max_steps and self.step >= self.cfg.max_steps)

    # ------------------------------------------------------------------ validation and export
    @torch.no_grad()
    def valid_loss(self) -> float:
        self.model.eval()
        total, tokens = 0.0, 0
        for idx in token_batches(self.valid, self.cfg.max_tokens, seed=0, shuffle=False):
            src, tgt_in, tgt_out = collate(self.valid, idx, self.model_config.pad_id, self.model_config.decoder_start_id)
            tokens += int((tgt_out != self.model_config.pad_id).sum())
            src, tgt_in, tgt_out = (t.to(self.device) for t in (src, tgt_in, tgt_out))
            with self.autocast:
                logits = self.model(src, tgt_in).float()
            total += F.cross_entropy(
                logits.view(-1, logits.size(-1)), tgt_out.view(-1), ignore_index=self.model_config.pad_id, reduction="sum"
            ).item()
        return total / max(tokens, 1)

    def valid_bleus(self, model: Transformer | None = None) -> dict[str, float]:
        """Greedy validation BLEU per direction ("de-en": 40.1, ...), all directions searched as one set."""
        import sacrebleu  # the eval extra: main() checks it is there

        model = model or self.model
        hyps = iter(translate_ids(model, self.valid.src, SearchOptions(beam_size=1)))
        scores = {}
        for name, (data, refs) in self.valid_sets.items():
            texts = [self.tokenizer.decode(next(hyps)) for _ in range(len(data))]
            scores[name] = sacrebleu.corpus_bleu(texts, [refs]).score
        return scores

    def valid_bleu(self, model: Transformer | None = None) -> float:
        """The selection score: the mean of the directions' greedy BLEU."""
        scores = self.valid_bleus(model)
        if len(scores) > 1:
            say("  " + " ".join(f"{d} {b:.1f}" for d, b in scores.items()))
        return sum(scores.values()) / len(scores)

    def validate(self) -> None:
        t0 = time.time()
        loss = self.valid_loss()
        bleu = self.valid_bleu()
        say(
            f"validation at step {self.step} (epoch {self.epoch}): loss {loss:.4f} ppl {math.exp(loss):.2f} "
            f"greedy BLEU {bleu:.2f}{' (mean of the sets)' if len(self.valid_sets) > 1 else ''} ({time.time() - t0:.0f}s)"
        )
        best_dir = self.run_dir / "best"
        if len(self.best) < self.cfg.keep_best or bleu > self.best[-1]["bleu"]:
            path = best_dir / f"step{self.step:06d}"
            save_checkpoint(
                path, self.model, self.checkpoint_info({"step": self.step, "valid_bleu": bleu}),
                {"spm.model": self.run_dir / "spm.model"},
            )
            self.best.append({"bleu": bleu, "step": self.step, "dir": str(path)})
            self.best.sort(key=lambda b: b["bleu"], reverse=True)
            for dropped in self.best[self.cfg.keep_best :]:
                shutil.rmtree(dropped["dir"], ignore_errors=True)
            self.best = self.best[: self.cfg.keep_best]

    def device_name(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return cpu_name()

    def export(self) -> Path:
        """Average the best checkpoints' weights and write the final float16 checkpoint."""
        cfg = self.cfg
        if self.step not in {b["step"] for b in self.best}:
            # the last steps since the last validation are a candidate too: at the end of an annealed
            # (linear) schedule they are usually the best
            self.validate()
        chosen = self.best[: max(1, cfg.average_best)]
        models = [load_checkpoint(b["dir"])[0] for b in chosen]
        averaged = Transformer(self.model_config)
        state = averaged.state_dict()
        for name in state:
            state[name] = torch.stack([m.state_dict()[name].float() for m in models]).mean(0)
        averaged.load_state_dict(state)
        averaged.eval()
        bleu_avg = self.valid_bleu(averaged)
        best_single = load_checkpoint(chosen[0]["dir"])[0]
        bleu_best = chosen[0]["bleu"]
        final, label = (averaged, f"average of {len(chosen)}") if bleu_avg >= bleu_best else (best_single, "best single")
        say(f"export: averaged {len(chosen)} checkpoints -> greedy valid BLEU {bleu_avg:.2f}; best single {bleu_best:.2f}; using {label}")
        output = Path(cfg.output or self.run_dir / "final")
        metadata = {
            "training": {
                "steps": self.step, "epochs": self.epoch, "train_seconds": round(self.train_seconds),
                "threads": self.train_threads,
                "device": self.device_name(),
                "averaged": sorted(b["step"] for b in chosen) if final is averaged else [chosen[0]["step"]],
                "valid_bleu_greedy": round(max(bleu_avg, bleu_best), 2),
                "config": dataclasses.asdict(cfg),
            }
        }
        dtype = EXPORT_DTYPES[cfg.export_dtype]
        save_checkpoint(output, final, self.checkpoint_info(metadata), {"spm.model": self.run_dir / "spm.model"}, dtype=dtype)
        say(f"exported {output}")
        return output


def main(argv: list[str] | None = None) -> None:
    parser = TrainConfig.build_parser()
    require_eval_extra(parser)
    cfg = TrainConfig.from_args(argv, parser)
    # ValueError: training or validation sides of different lengths, no training pairs, a vocabulary size
    # sentencepiece refuses, a run directory of another model
    with user_errors(parser, ValueError):
        trainer = Trainer(cfg)
    if cfg.tokenizer_only:
        say(f"tokenizer: {Path(cfg.run_dir) / 'spm.model'}")
    elif cfg.export_only:
        if not trainer.step:  # a state saved before the first step: exporting would ship the initial weights
            fail(parser, f"--export-only: no checkpoint in {cfg.run_dir} to export (it stopped before its first training step)")
        trainer.export()
    else:
        trainer.run()


if __name__ == "__main__":
    main()
