"""Parallel text: reading, tokenizing, and length-bucketed batches by token count."""
from __future__ import annotations

import gzip
import random
from dataclasses import dataclass
from pathlib import Path

from nmt_serve.network.masks import pad_batch
from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.training.corpus.markup import unescape_entities


def read_lines(path: str | Path, entities: bool = True) -> list[str]:
    """Lines of a plain or gzipped UTF-8 text file, without trailing newlines. With `entities`,
    character entities are unescaped (`&amp;` -> `&`): a few lines of Multi30k's training side carry
    them, and a model should learn the character, which is what users type."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return [unescape_entities(line) for line in lines] if entities else lines


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}")
    return src, tgt


@dataclass
class ParallelData:
    src: list[list[int]]  # source ids, eos appended
    tgt: list[list[int]]  # target ids, eos appended (decoder input gets the start token prepended)

    def __len__(self) -> int:
        return len(self.src)

    def num_target_tokens(self) -> int:
        return sum(len(t) for t in self.tgt)


def tokenize_parallel(
    src_lines: list[str], tgt_lines: list[str], src_tok: Tokenizer, tgt_tok: Tokenizer,
    max_tokens_per_sentence: int | None = None, drop_empty: bool = True,
) -> ParallelData:
    src_ids, tgt_ids = [], []
    for s, t in zip(src_lines, tgt_lines):
        if drop_empty and (not s.strip() or not t.strip()):
            continue
        si, ti = src_tok.encode(s, add_eos=True), tgt_tok.encode(t, add_eos=True)
        if max_tokens_per_sentence and max(len(si), len(ti)) > max_tokens_per_sentence:
            continue
        src_ids.append(si)
        tgt_ids.append(ti)
    return ParallelData(src_ids, tgt_ids)


def token_batches(data: ParallelData, max_tokens: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Indices grouped into batches of similar length whose padded size (rows x longest side) stays
    under max_tokens. With shuffle, lengths get a little noise and the batch order is random, both
    from `seed`, so an epoch's batches can be rebuilt exactly when training resumes."""
    rng = random.Random(seed)
    keys = [max(len(s), len(t)) + (rng.random() if shuffle else 0.0) for s, t in zip(data.src, data.tgt)]
    order = sorted(range(len(data)), key=keys.__getitem__)
    batches, current, longest = [], [], 0
    for i in order:
        n = max(len(data.src[i]), len(data.tgt[i]) + 1)
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(data: ParallelData, indices: list[int], pad_id: int, start_id: int):
    """-> src (B, S), decoder input (B, T), decoder target (B, T): input = start + y, target = y + eos."""
    src = pad_batch([data.src[i] for i in indices], pad_id)
    tgt = [data.tgt[i] for i in indices]
    tgt_in = pad_batch([t[:-1] for t in tgt], pad_id, prefix=start_id)
    tgt_out = pad_batch(tgt, pad_id)
    return src, tgt_in, tgt_out
