"""bench.engines' decoders side by side: lanes (threads) and engine processes decode what one decoder does, in order."""
import multiprocessing

import torch

from bench.engines import (DEFAULT_ENGINES, ENGINES, _load_engine, run_ours, run_ours_in_engines, run_ours_in_lanes,
                           side_by_side)
from nmt_serve.inference.translator import Translator

SOURCES = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19], [20, 21, 22]]


def test_side_by_side_engines_are_named_and_left_out_by_default():
    named = [e for e in ENGINES if side_by_side(e)]
    assert {"ours, lanes", "ours, engines", "ours, engines, own weights", "CTranslate2 float32, workers"} <= set(named)
    assert not set(named) & set(DEFAULT_ENGINES)
    assert [e for e in ENGINES if e not in named] == DEFAULT_ENGINES


def test_lanes_and_engine_processes_decode_every_batch_in_order(tiny_checkpoint, tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        translator = Translator.load(tiny_checkpoint, device="cpu")
        alone = run_ours(translator, SOURCES, 2, 2, 6)
        assert run_ours_in_lanes(translator, SOURCES, 2, 2, 6, lanes=2) == alone
    finally:
        torch.set_num_threads(before)
    spawn = multiprocessing.get_context("spawn")
    for weights_dir in ("", str(tmp_path)):  # a copy each, one copy mapped by both
        with spawn.Pool(2, initializer=_load_engine, initargs=(tiny_checkpoint, "none", weights_dir)) as pool:
            assert run_ours_in_engines(pool, SOURCES, 2, 2, 6) == alone
