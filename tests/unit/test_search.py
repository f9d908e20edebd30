"""Greedy and beam search: equivalences, scores, constraints, finished rows leaving the batch."""
import pytest
import torch
from conftest import random_model, random_sources

from nmt_serve.inference.cache import KVCache
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import (
    DecoderState,
    SearchOptions,
    beam_search,
    generate,
    greedy_search,
)


def teacher_forced_score(model, src_row: torch.Tensor, tokens: list[int], max_length: int | None = None) -> float:
    """The tokens' log-probs and eos's, but at max_length, where eos costs nothing (search.AT_MAX_EOS)."""
    cfg = model.config
    target = tokens + [cfg.eos_id]
    tgt_in = torch.tensor([[cfg.decoder_start_id] + target[:-1]])
    with torch.no_grad():
        lp = torch.log_softmax(model(src_row[None], tgt_in).float(), -1)[0]
    scores = lp.gather(-1, torch.tensor(target)[:, None])[:, 0]
    return (scores[:-1] if len(target) == max_length else scores).sum().item()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_is_exactly_greedy(seed):
    model = random_model(seed=seed)
    src = random_sources(5, 10, 64, seed=seed)
    opts = SearchOptions(beam_size=1, max_length=14)
    greedy = greedy_search(ModelRunner(model), src, opts)
    beam = beam_search(ModelRunner(model), src, opts)
    for g, b in zip(greedy, beam):
        assert g.tokens == b[0].tokens
        assert g.score == pytest.approx(b[0].score, abs=1e-5)


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("length_penalty", [0.0, 1.0])
def test_beam_hypotheses_sorted_distinct_and_scored_by_teacher_forcing(seed, length_penalty, beam_cache_mode):
    model = random_model(seed=seed)
    src = random_sources(4, 9, 64, seed=seed)
    opts = SearchOptions(beam_size=5, num_hypotheses=5, max_length=12, length_penalty=length_penalty)
    for i, hyps in enumerate(generate(ModelRunner(model), src, opts)):
        assert len(hyps) == 5
        normalized = [h.normalized_score for h in hyps]
        assert normalized == sorted(normalized, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)
        length = int((src[i] != 0).sum())
        for h in hyps:
            assert teacher_forced_score(model, src[i, :length], h.tokens, opts.max_length) == pytest.approx(h.score, abs=1e-4)
            assert h.normalized_score == pytest.approx(h.score / (len(h.tokens) + 1) ** length_penalty, abs=1e-5)


def test_beam_finds_at_least_the_greedy_score():
    model = random_model(seed=5)
    src = random_sources(6, 8, 64, seed=6)
    greedy = generate(ModelRunner(model), src, SearchOptions(beam_size=1, max_length=10, length_penalty=0.0))
    beam = generate(ModelRunner(model), src, SearchOptions(beam_size=6, max_length=10, length_penalty=0.0))
    for g, b in zip(greedy, beam):
        assert b[0].score >= g[0].score - 1e-5


def test_max_and_min_length_are_respected():
    model = random_model(seed=7)
    src = random_sources(4, 8, 64, seed=8)
    for beam_size in (1, 3):
        for hyps in generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, max_length=5)):
            assert all(len(h.tokens) + 1 <= 5 for h in hyps)
        for hyps in generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, min_length=6, max_length=9)):
            assert all(len(h.tokens) >= 6 for h in hyps)


def test_default_max_length_grows_with_the_source():
    model = random_model(seed=9)  # an untrained model rarely says eos: it runs to the cap
    short = random_sources(1, 3, 64, seed=1)
    long = random_sources(1, 20, 64, seed=1)
    opts = SearchOptions(beam_size=1)
    n_short = len(generate(ModelRunner(model), short, opts)[0][0].tokens) + 1
    n_long = len(generate(ModelRunner(model), long, opts)[0][0].tokens) + 1
    assert n_short <= int(1.5 * 3 + 10) and n_long <= int(1.5 * 20 + 10)
    assert n_long > n_short


@pytest.mark.parametrize("beam_size", [1, 3])
def test_no_repeat_ngram(beam_size, beam_cache_mode):
    model = random_model(seed=10)
    src = random_sources(3, 6, 64, seed=11)
    for hyps in generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, max_length=30, no_repeat_ngram_size=2)):
        for h in hyps:
            bigrams = list(zip(h.tokens, h.tokens[1:]))
            assert len(bigrams) == len(set(bigrams))


def test_pad_and_start_tokens_are_never_generated():
    model = random_model(seed=12, final_logits_bias=True)
    model.logits_bias[[0, 2]] = 1e4  # pad and bos would win everywhere if they were allowed
    src = random_sources(3, 6, 64, seed=13)
    for hyps in generate(ModelRunner(model), src, SearchOptions(beam_size=2, num_hypotheses=2, max_length=8)):
        for h in hyps:
            assert 0 not in h.tokens and 2 not in h.tokens


@pytest.mark.parametrize("beam_size", [1, 3])
def test_finished_sentences_leave_the_batch(beam_size, monkeypatch, beam_cache_mode):
    model = random_model(seed=14, final_logits_bias=True)
    model.logits_bias[3] = -1e4  # eos only where it is forced: each sentence runs to its own max length
    src = random_sources(5, 12, 64, seed=15)
    src_lengths = (src != 0).sum(1)
    max_lens = (src_lengths.double() * 1.5 + 10).long()  # the default cap: 1.5 x source + 10
    rows_per_step = []
    original = DecoderState.log_probs

    def spy(self, prefix, last=None):
        rows_per_step.append((last if last is not None else prefix).size(0))
        return original(self, prefix, last)

    monkeypatch.setattr(DecoderState, "log_probs", spy)
    results = generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, num_hypotheses=beam_size))
    for hyps, cap in zip(results, max_lens.tolist()):
        assert all(len(h.tokens) + 1 == cap for h in hyps)
    # the first step runs one row per sentence (only beam 0 is live), every later one beam_size
    expected = [(beam_size if step else 1) * int((max_lens > step).sum()) for step in range(int(max_lens.max()))]
    assert rows_per_step == expected
    assert rows_per_step[-1] < rows_per_step[0]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_rows_that_stay_keep_their_places_when_sentences_leave(beam_size, monkeypatch, beam_cache_mode):
    """When sentences finish, each of the others keeps its rows where they are unless they lie past the new
    end (those fill the places that were left), so the cache moves few rows (search.survivors_order)."""
    model = random_model(seed=14, final_logits_bias=True)
    model.logits_bias[3] = -1e4  # eos only where it is forced: each sentence runs to its own max length
    src = random_sources(7, 12, 64, seed=16)
    leaving = []
    original = KVCache.reorder

    def spy(self, indices, *, cross=True):
        if indices.numel() < self.batch_size:  # rows leave: the sentence (K rows) each new group comes from
            leaving.append((indices.view(-1, beam_size)[:, 0] // beam_size).tolist())
        return original(self, indices, cross=cross)

    monkeypatch.setattr(KVCache, "reorder", spy)
    free = generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, num_hypotheses=beam_size))
    assert len(leaving) >= 3
    for entries in leaving:
        assert all(e == i or e >= len(entries) for i, e in enumerate(entries)), entries
    assert any(e != i for entries in leaving for i, e in enumerate(entries))  # some did move
    monkeypatch.undo()
    opts = SearchOptions(beam_size=beam_size, num_hypotheses=beam_size)
    alone = [generate(ModelRunner(model), src[i : i + 1], opts)[0] for i in range(src.size(0))]  # each its own answer
    assert [[h.tokens for h in hyps] for hyps in free] == [[h.tokens for h in hyps] for hyps in alone]
    reference = generate(ModelRunner(model), src, SearchOptions(beam_size=beam_size, num_hypotheses=beam_size, use_cache=False))
    assert [[h.tokens for h in hyps] for hyps in free] == [[h.tokens for h in hyps] for hyps in reference]


def test_options_are_validated():
    with pytest.raises(ValueError):
        SearchOptions(beam_size=0)
    with pytest.raises(ValueError):
        SearchOptions(beam_size=2, num_hypotheses=3)
    with pytest.raises(ValueError):
        SearchOptions(max_length=0)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_degenerate_model_is_bounded_by_the_deadline(beam_size, monkeypatch):
    """A model that never says eos, a search allowed 1,000 steps, and a deadline 20 clock ticks away:
    the search gives up at the deadline. The clock is the test's own (one tick per reading), so the
    outcome is the same on a slow machine and a fast one."""
    from types import SimpleNamespace

    import nmt_serve.inference.search as search
    from nmt_serve.inference.search import DeadlineExceeded

    ticks = [0.0]

    def monotonic() -> float:
        ticks[0] += 1.0
        return ticks[0]

    monkeypatch.setattr(search, "time", SimpleNamespace(monotonic=monotonic))
    model = random_model(seed=18, final_logits_bias=True, max_positions=1024)
    model.logits_bias[3] = -1e4  # never says eos on its own
    runner = ModelRunner(model)
    steps = [0]
    step = runner.step

    def counted(*args, **kwargs):
        steps[0] += 1
        return step(*args, **kwargs)

    runner.step = counted
    src = random_sources(4, 8, 64, seed=19)
    with pytest.raises(DeadlineExceeded):
        generate(runner, src, SearchOptions(beam_size=beam_size, max_length=1000), deadline=20.0)
    assert 0 < steps[0] <= 20  # the deadline is read before every step
