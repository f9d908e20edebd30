"""A few rows' attention through numba's kernel (row_attention): scaled_dot_product_attention's results, read from the
cache's strided keys and values, and the runner's step through it."""
import pytest
import torch
import torch.nn.functional as F

from nmt_serve.inference import row_attention, row_step
from nmt_serve.inference.translator import Translator

pytestmark = pytest.mark.skipif(not row_attention.available(), reason="numba is not installed")


@pytest.mark.parametrize("rows", [1, 2, 5, row_attention.ROWS])
@pytest.mark.parametrize("masked", [False, True])
def test_the_kernel_gives_scaled_dot_product_attentions_results(rows, masked):
    """Queries at the head of each row's fused q/k/v (self-attention) or alone (cross-attention), keys and values
    narrowed from a longer buffer as the cache holds them; positions a mask leaves out change nothing, however large."""
    torch.manual_seed(rows)
    H, D, T, capacity = 4, 16, 7, 12
    buffer = torch.randn(2, rows, H, capacity, D)
    k, v = buffer[0].narrow(2, 0, T), buffer[1].narrow(2, 0, T)  # (N, H, T, D), strided
    mask = None
    if masked:
        mask = torch.rand(rows, 1, 1, T) < 0.6
        mask[..., 0] = True  # every row attends somewhere
        for n, t in (~mask.view(rows, T)).nonzero().tolist():
            buffer[:, n, :, t] = 1e6
    qkv = torch.randn(rows, 3, H, 1, D)
    for q, as_heads in ((qkv, qkv[:, 0]), (qkv[:, 0].reshape(rows, H * D), qkv[:, 0])):
        reference = F.scaled_dot_product_attention(as_heads, k, v, attn_mask=mask).reshape(rows, H * D)
        y = row_attention.attend(q, k, v, mask)
        assert y.shape == (rows, H * D)
        torch.testing.assert_close(y, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("beam", [1, 2])
def test_a_few_rows_step_attends_through_the_kernel_with_the_same_translations(tiny_checkpoint, beam, monkeypatch):
    """A sentence or two stepped alone attend through the kernel, self- and cross-attention, padded sources masked;
    their translations are the ones scaled_dot_product_attention gives, scores to float precision. (Without the
    whole step's kernel, row_step, which attends itself.)"""
    monkeypatch.setattr(row_step, "ENABLED", False)
    with_kernel = Translator.load(tiny_checkpoint, device="cpu")
    monkeypatch.setattr(row_attention, "ENABLED", False)
    without = Translator.load(tiny_checkpoint, device="cpu")
    monkeypatch.setattr(row_attention, "ENABLED", True)
    assert with_kernel.runner.row_attention and not without.runner.row_attention
    calls = []
    kernel = row_attention.attend
    monkeypatch.setattr(row_attention, "attend",
                        lambda q, k, v, mask: calls.append(mask is not None) or kernel(q, k, v, mask))
    sentences = ["ein kleines Haus", "zwei Hunde laufen schnell über die grüne Wiese am Fluss"]  # the first padded
    for texts in (sentences[:1], sentences):
        a = with_kernel.translate(texts, beam_size=beam, max_length=8, return_scores=True)
        b = without.translate(texts, beam_size=beam, max_length=8, return_scores=True)
        assert [r.text for r in a] == [r.text for r in b]
        assert [r.hypotheses[0].score for r in a] == pytest.approx([r.hypotheses[0].score for r in b], abs=1e-4)
    n_layers = with_kernel.config.n_decoder_layers
    assert calls.count(False) >= 2 * n_layers  # a step's self-attention of every layer, and its unpadded cross
    assert True in calls  # the padded sentence's source mask


def test_more_rows_than_the_kernel_takes_attend_through_torch(tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(row_step, "ENABLED", False)
    translator = Translator.load(tiny_checkpoint, device="cpu")
    calls = []
    monkeypatch.setattr(row_attention, "attend", lambda *args: calls.append(1))
    monkeypatch.setattr(row_attention, "ROWS", 0)
    translator.translate(["ein kleines Haus"], beam_size=1, max_length=4)
    assert not calls
