"""The one mask convention, built in one place: a bool tensor where True means "may attend",
broadcast against attention scores of shape (B, H, Tq, Tk). Both the nn.Module path
(transformer.py) and the inference engine (engine.py) build their masks here."""
from __future__ import annotations

import torch


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S) bool, True on real tokens (keys that may be attended)."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, T) bool, True on and below the diagonal: position t sees positions <= t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]
