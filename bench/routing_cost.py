"""One sentence's latency on CPU against routing's work per token (`network/routing.py`, `decode_cost`):
whether the measure `cpu_cost_limit` compares follows what a user waits for.

    python -m bench.routing_cost [--shapes shipped,gpu-recipe,opus-mt] [--sentences 40] [--rounds 3] [--threads 1]

Each shape is a model of random weights (the same code path as a trained one), greedy search of one
sentence at a time, every output forced to --tokens tokens (min_length = max_length) so that every shape
does the same number of steps; sources are test_2016_flickr's German sentences in the shipped tokenizer's
ids (fewer than any shape's vocabulary). The shapes take turns, --rounds times; each round's median per
sentence is kept, and the table gives the range over rounds and the ratio of medians to the shipped shape's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench.common import ROOT, SHAPES, emit, machine, table, test_sources
from nmt_serve.inference.search import SearchOptions
from nmt_serve.inference.translator import Translator
from nmt_serve.network.checkpoint import CheckpointInfo, read_info
from nmt_serve.network.routing import decode_cost
from nmt_serve.network.tokenizer import Tokenizer
from nmt_serve.network.transformer import Transformer

SHIPPED = ROOT / "checkpoints" / "debian-multi30k"


def shape_configs() -> dict:
    """{name: ModelConfig} of the shapes: the shipped model's, the GPU recipe's (configs/debian-gpu.json),
    OPUS-MT's (bench.common.SHAPES)."""
    shipped = read_info(SHIPPED).config
    recipe = json.loads((ROOT / "configs" / "debian-gpu.json").read_text())
    vocab = recipe["vocab_size"]
    opus = {k: v for k, v in SHAPES["opus-mt"].items() if k != "vocab_size"}
    return {
        "shipped": shipped,
        "gpu-recipe": shipped.__class__(**{**shipped.to_dict(), "src_vocab_size": vocab, "tgt_vocab_size": vocab,
                                           **{k: recipe[k] for k in ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")}}),
        "opus-mt": shipped.__class__(**{**shipped.to_dict(), "src_vocab_size": SHAPES["opus-mt"]["vocab_size"],
                                        "tgt_vocab_size": SHAPES["opus-mt"]["vocab_size"], **opus}),
    }


def build(config) -> Translator:
    """Random weights of the shape, with the shipped tokenizer (fewer pieces than any shape's vocabulary:
    only the search's ids matter here, nothing is detokenized)."""
    torch.manual_seed(0)
    tokenizer = Tokenizer(SHIPPED / read_info(SHIPPED).src_tokenizer)
    info = CheckpointInfo(config, "de", "en", "spm.model", "spm.model", {"note": "random weights"})
    return Translator(Transformer(config).eval(), info, tokenizer, tokenizer, device="cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="shipped,gpu-recipe,opus-mt")
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--tokens", type=int, default=20, help="output tokens every sentence is forced to")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    configs = {name: config for name, config in shape_configs().items() if name in args.shapes.split(",")}
    options = SearchOptions(beam_size=1, min_length=args.tokens, max_length=args.tokens)
    translators = {name: build(config) for name, config in configs.items()}
    inputs = next(iter(translators.values())).inputs  # every shape reads the shipped tokenizer's ids
    sources = [inputs.source_ids(inputs.tokenizer.encode(s)) for s in test_sources("de", args.sentences)]
    medians: dict[str, list[float]] = {name: [] for name in translators}
    for name, t in translators.items():  # a first pass each: lazy allocations out of the timing
        t.generate(t._pad(sources[:2]), options)
    for _ in range(args.rounds):
        for name, t in translators.items():
            times = []
            for ids in sources:
                src = t._pad([ids])
                start = time.perf_counter()
                t.generate(src, options)
                times.append(time.perf_counter() - start)
            medians[name].append(statistics.median(times) * 1000)
    base = statistics.median(medians.get("shipped", next(iter(medians.values()))))
    base_cost = decode_cost(configs.get("shipped", next(iter(configs.values()))))
    rows = [(name, f"{sum(p.numel() for p in translators[name].model.parameters()) / 1e6:.1f}M",
             f"{decode_cost(configs[name]) / 1e6:.2f}M", f"{decode_cost(configs[name]) / base_cost:.2f}",
             f"{min(m):.1f}-{max(m):.1f}", f"{statistics.median(m) / base:.2f}")
            for name, m in medians.items()]
    report = (f"{machine()}, {args.threads} thread(s), greedy, one sentence at a time, "
              f"{args.sentences} sentences forced to {args.tokens} tokens, {args.rounds} rounds (shapes in turn)\n\n"
              + table(["shape", "parameters", "decode_cost (multiply-adds/token)", "cost ratio", "median ms a sentence (rounds)",
                       "latency ratio"], rows))
    return emit(report, args.output)


if __name__ == "__main__":
    raise SystemExit(main())
