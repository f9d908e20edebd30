"""bench.engines' decoders side by side: lanes (threads) and engine processes decode what one decoder does, in order."""
import multiprocessing

import torch

from bench.engines import (DEFAULT_ENGINES, ENGINES, SIDE_BY_SIDE, _load_engine, run_ours, run_ours_in_engines,
                           run_ours_in_lanes)
from nmt_serve.inference.translator import Translator

SOURCES = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14], [15], [16, 17, 18, 19], [20, 21, 22]]


def test_side_by_side_engines_are_named_and_left_out_by_default():
    side_by_side = [e for e in ENGINES if e.endswith(SIDE_BY_SIDE)]
    assert {"ours, lanes", "ours, engines", "CTranslate2 float32, workers"} <= set(side_by_side)
    assert not set(side_by_side) & set(DEFAULT_ENGINES)
    assert [e for e in ENGINES if e not in side_by_side] == DEFAULT_ENGINES


def test_lanes_and_engine_processes_decode_every_batch_in_order(tiny_checkpoint):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        translator = Translator.load(tiny_checkpoint, device="cpu")
        alone = run_ours(translator, SOURCES, 2, 2, 6)
        assert run_ours_in_lanes(translator, SOURCES, 2, 2, 6, lanes=2) == alone
    finally:
        torch.set_num_threads(before)
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(2, initializer=_load_engine, initargs=(tiny_checkpoint, "none")) as pool:
        assert run_ours_in_engines(pool, SOURCES, 2, 2, 6) == alone
