"""The whole stack learns: a tiny model trained here reverses random digit strings."""
import torch
import torch.nn.functional as F
from conftest import tiny_config

from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.network.masks import pad_batch
from nmt_serve.network.transformer import Transformer
from nmt_serve.training.train import inverse_sqrt_lr

DIGITS = list(range(4, 14))  # ids 4..13 are the digits 0..9; 0-3 are pad, unk, bos, eos


def reverse_pairs(n: int, generator: torch.Generator):
    pairs = []
    for _ in range(n):
        length = int(torch.randint(3, 9, (1,), generator=generator))
        seq = [DIGITS[int(d)] for d in torch.randint(0, 10, (length,), generator=generator)]
        pairs.append((seq + [3], seq[::-1] + [3]))
    return pairs


def test_tiny_model_learns_to_reverse_digit_strings():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    cfg = tiny_config(src_vocab_size=14, tgt_vocab_size=14, d_model=64, d_ff=128, n_heads=4, dropout=0.0)
    model = Transformer(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
    for step in range(1, 401):
        batch = reverse_pairs(64, g)
        src = pad_batch([s for s, _ in batch], cfg.pad_id)
        tgt_in = pad_batch([t[:-1] for _, t in batch], cfg.pad_id, prefix=cfg.decoder_start_id)
        tgt_out = pad_batch([t for _, t in batch], cfg.pad_id)
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.view(-1, 14), tgt_out.view(-1), ignore_index=cfg.pad_id)
        optimizer.zero_grad()
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = inverse_sqrt_lr(step, 2e-3, 100)
        optimizer.step()
    model.eval()

    test = reverse_pairs(200, torch.Generator().manual_seed(123))
    src = pad_batch([s for s, _ in test], cfg.pad_id)
    for beam_size in (1, 4):
        results = generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size))
        exact = sum(r[0].tokens == t[:-1] for r, (_, t) in zip(results, test)) / len(test)
        assert exact >= 0.95, f"beam {beam_size}: exact match {exact:.2f}"
