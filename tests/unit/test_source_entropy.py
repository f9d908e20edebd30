"""The attention's source entropy (engine/attention_maps.source_entropy), which the `detached` quality flag
reads: 0 when every target token looks at one source piece, 1 when at all alike, with the language tag and
</s> left out."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nmt_serve.engine.attention_maps import source_entropy
from nmt_serve.inference.translator import AttentionMaps

MULTILINGUAL = SimpleNamespace(inputs=SimpleNamespace(multilingual=True, append_eos=True, suffix=[]))  # <2en> pieces </s>
BILINGUAL = SimpleNamespace(inputs=SimpleNamespace(multilingual=False, append_eos=True, suffix=[]))  # pieces </s>


def maps(rows: list[list[float]], layers: int = 2, heads: int = 3) -> AttentionMaps:
    """A (layers, heads, T, S) map with the same rows everywhere; the last row is the eos step."""
    cross = torch.tensor(rows).expand(layers, heads, -1, -1).clone()
    return AttentionMaps(source_tokens=["x"] * cross.shape[-1], target_tokens=["y"] * cross.shape[-2], cross=cross)


def test_focused_attention_is_zero_and_even_attention_is_one():
    # <2en> a b c </s>; three target tokens then eos, whose row is left out
    focused = [[0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0.2, 0.2, 0.2, 0.2, 0.2]]
    even = [[0, 1 / 3, 1 / 3, 1 / 3, 0]] * 3 + [[0, 0, 0, 0, 1]]
    assert source_entropy(MULTILINGUAL, maps(focused)) == pytest.approx(0.0, abs=1e-6)
    assert source_entropy(MULTILINGUAL, maps(even)) == pytest.approx(1.0, abs=1e-6)


def test_the_tag_and_eos_are_left_out():
    # mass on the tag and on </s> (where short sentences put much of it) does not count as spread
    rows = [[0.3, 0.6, 0.0, 0.0, 0.1], [0.3, 0.0, 0.6, 0.0, 0.1], [0.3, 0.0, 0.0, 0.6, 0.1], [0, 0, 0, 0, 1]]
    assert source_entropy(MULTILINGUAL, maps(rows)) == pytest.approx(0.0, abs=1e-6)
    # a bilingual model has no tag: the first column is a piece of the text
    assert source_entropy(BILINGUAL, maps(rows)) > 0.4


def test_layers_and_heads_are_averaged_before_the_entropy():
    # two heads each focused, on different pieces: together they look at both
    cross = torch.zeros(1, 2, 2, 4)  # <2en> a b </s>, one target token and eos
    cross[0, 0, 0, 1] = cross[0, 1, 0, 2] = 1.0
    cross[:, :, 1, 3] = 1.0
    spread = AttentionMaps(source_tokens=["<2en>", "a", "b", "</s>"], target_tokens=["y", "</s>"], cross=cross)
    assert source_entropy(MULTILINGUAL, spread) == pytest.approx(1.0, abs=1e-6)


def test_a_source_of_one_piece_is_not_spread():
    assert source_entropy(MULTILINGUAL, maps([[0.2, 0.6, 0.2], [0, 0, 1]])) == 0.0
    assert source_entropy(MULTILINGUAL, maps([[0.2, 0.6, 0.2]])) == 0.0  # an empty output: only eos's row
