"""The one place where text becomes a model's source ids: tag, eos, length limit, empty texts."""
from __future__ import annotations

import pytest

from nmt_serve.inference.input_processor import InputProcessor
from nmt_serve.network.tokenizer import Tokenizer


def test_a_bilingual_model_takes_no_tag_and_only_its_own_target(spm_model):
    tokenizer = Tokenizer(spm_model)
    inputs = InputProcessor(tokenizer, target_lang="en", directions=["de-en"], target_tags=None, max_positions=256)
    pieces = tokenizer.encode("Ein Hund.")
    assert not inputs.multilingual and inputs.prefix() == inputs.prefix("en") == []
    assert inputs.tokens("Ein Hund.") == pieces and inputs.count("Ein Hund.") == len(pieces)
    assert inputs.encode("Ein Hund.") == inputs.source_ids(pieces) == pieces + [tokenizer.eos_id]
    with pytest.raises(ValueError, match="translates into 'en', not 'fr'"):
        inputs.tokens("Ein Hund.", "fr")


def test_a_multilingual_model_puts_the_target_tag_first(tagged_spm):
    tokenizer = Tokenizer(tagged_spm)
    tags = {lang: f"<2{lang}>" for lang in ("de", "en", "fr")}
    inputs = InputProcessor(tokenizer, target_lang="mul", directions=["de-en", "en-fr"], target_tags=tags)
    tag = tokenizer.sp.piece_to_id("<2fr>")
    assert inputs.multilingual and inputs.tokens("A dog.", "fr") == [tag] + tokenizer.encode("A dog.")
    assert inputs.count("A dog.") == len(tokenizer.encode("A dog."))  # the tag is not the text's
    assert inputs.tokens("   ", "fr") == []  # nothing to translate: no bare tag goes to the model
    with pytest.raises(ValueError, match="needs target_lang"):
        inputs.tokens("A dog.")
    with pytest.raises(ValueError, match="no target tag for"):
        InputProcessor(tokenizer, target_lang="mul", directions=["de-cs"], target_tags=tags)


def test_eos_and_the_length_limit_are_the_models(spm_model):
    tokenizer = Tokenizer(spm_model)
    no_eos = InputProcessor(tokenizer, target_lang="en", directions=["de-en"], target_tags=None, append_eos=False, max_positions=4)
    assert no_eos.source_ids([7, 8, 9]) == [7, 8, 9]
    assert no_eos.source_ids([7, 8, 9, 10]) == [7, 8, 9, 10]
    with pytest.raises(ValueError, match="source has 5 tokens; this model accepts at most 4"):
        no_eos.source_ids([7, 8, 9, 10, 11])
    with_eos = InputProcessor(tokenizer, target_lang="en", directions=["de-en"], target_tags=None, max_positions=4)
    with pytest.raises(ValueError, match="source has 5 tokens"):
        with_eos.source_ids([7, 8, 9, 10])
