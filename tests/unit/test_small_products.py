"""Attention's batched products through numpy's OpenBLAS at one torch thread: the same products as torch.bmm."""
import numpy as np
import pytest
import torch
from conftest import random_model, random_sources

import nmt_serve.inference.model_runner as model_runner
import nmt_serve.inference.small_products as small_products
import nmt_serve.inference.row_step as row_step
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.small_products import batched_matmul, through_openblas


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()

    def use(n: int) -> None:
        torch.set_num_threads(n)

    yield use
    torch.set_num_threads(before)


@pytest.fixture
def numpy_products(monkeypatch):
    """Counts the products numpy makes for batched_matmul."""
    calls = []

    def matmul(a, b):
        calls.append((a.shape, b.shape))
        return np.matmul(a, b)

    class Numpy:
        pass

    spy = Numpy()
    spy.matmul = matmul
    monkeypatch.setattr(small_products, "np", spy)
    return calls


@pytest.mark.parametrize("threads", [1, 2])
def test_products_of_cache_views_are_those_of_bmm(threads, torch_threads, numpy_products):
    """Keys as a grouped cache holds them, (G, H, capacity, K, D) cut to T positions, and transposed: strided
    views on both sides, as the step hands them over."""
    torch_threads(threads)
    g = torch.Generator().manual_seed(0)
    G, H, cap, K, D, T = 3, 2, 9, 4, 8, 5
    buffer = torch.randn(G, H, cap, K, D, generator=g)
    keys = buffer[:, :, :T].reshape(G * H, T * K, D)
    queries = torch.randn(G * H, K, D, generator=g)
    scores = batched_matmul(queries, keys.transpose(1, 2))
    assert scores.shape == (G * H, K, T * K)
    assert torch.allclose(scores, torch.bmm(queries, keys.transpose(1, 2)), atol=1e-5, rtol=1e-5)
    weights = torch.softmax(scores, -1)
    assert torch.allclose(batched_matmul(weights, keys), torch.bmm(weights, keys), atol=1e-5, rtol=1e-5)
    assert len(numpy_products) == (2 if threads == 1 else 0)


def test_only_float32_on_the_cpu_at_one_thread_without_autograd_goes_through_numpy(torch_threads):
    torch_threads(1)
    plain = torch.zeros(2, 2, 2)
    assert through_openblas(plain, plain)
    assert not through_openblas(plain.bfloat16(), plain.bfloat16())
    assert not through_openblas(plain.double(), plain.double())
    assert not through_openblas(plain, plain.clone().requires_grad_())
    torch_threads(2)
    assert not through_openblas(plain, plain)


def test_products_that_autograd_follows_keep_their_gradient(torch_threads):
    torch_threads(1)
    a, b = torch.randn(3, 2, 4, requires_grad=True), torch.randn(3, 4, 5)
    batched_matmul(a, b).sum().backward()
    assert torch.allclose(a.grad, b.sum(-1)[:, None, :].expand(3, 2, 4))


@pytest.mark.parametrize("grouped", [False, True])
def test_steps_at_one_thread_give_the_logits_of_full_recomputation(grouped, torch_threads, numpy_products, monkeypatch):
    """Rows that attend through the matmuls (padded sources: a bias per row) and groups of beams (a bias per
    group, query and head) at one thread: every product through numpy, the logits those of the module."""
    torch_threads(1)
    monkeypatch.setattr(model_runner, "MATMUL_ATTENTION_MIN_ROWS", 1)
    monkeypatch.setattr(row_step, "ENABLED", False)  # a few rows' whole step would attend in its own kernel
    model = random_model(seed=21)
    cfg = model.config
    G, K, steps = 3, 3 if grouped else 1, 6
    src = random_sources(G, 7, cfg.src_vocab_size, seed=22)  # padded
    g = torch.Generator().manual_seed(23)
    with torch.inference_mode():
        runner = ModelRunner(model)
        cache = runner.new_cache(*runner.encode(src), capacity=steps)
        if grouped:
            cache.expand(torch.arange(G).repeat_interleave(K), K)
            assert cache.grouped
        src = src.repeat_interleave(K, 0)
        prefix = torch.full((G * K, 1), cfg.decoder_start_id)
        for _ in range(steps):
            reference = model.decode(prefix, model.encode(src)).logits[:, -1]
            assert (runner.step(prefix[:, -1], cache) - reference).abs().max().item() <= 1e-5
            tokens = torch.randint(4, cfg.tgt_vocab_size, (G * K, 1), generator=g)
            prefix = torch.cat([prefix, tokens], dim=1)
    layers = len(runner.decoder_layers)
    assert len(numpy_products) == steps * layers * 4  # scores and values, self- and cross-attention
