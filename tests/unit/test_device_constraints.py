"""Lexical constraints in the device search (device_constraints.py): the vectorised choice is the eager
choose_constrained, candidate for candidate; the device search with constraints gives the eager
constrained search's results (same tokens, scores within float tolerance, same unmet flags), in one
batch and in the continuous search; free sentences beside constrained ones get exactly what they get
without them. On CPU the programs run op by op; nothing here reads the device inside a step."""
from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import random_model, random_sources

from nmt_serve.inference.continuous import Sentence
from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
from nmt_serve.inference.device_constraints import MAX_TERMS, DeviceConstraints, fits, term_slots
from nmt_serve.inference.device_search import DeviceSearch
from nmt_serve.inference.lexical_constraints import LexicalConstraints, choose_constrained, constraint_candidates
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, beam_search, choose_beams, generate, max_lengths_for
from nmt_serve.inference.static_decoder import StaticDecoder

EOS = 3


def device_search(model, max_rows=64, check_every=4, lookahead=False):
    return DeviceSearch(StaticDecoder(ModelRunner(model), max_rows=max_rows, max_length=64), check_every=check_every, lookahead=lookahead)


def assert_same(mine, reference, abs_tol=1e-4):
    assert len(mine) == len(reference)
    for a, b in zip(mine, reference):
        assert [h.tokens for h in a] == [h.tokens for h in b]
        assert [h.unmet for h in a] == [h.unmet for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=abs_tol)
        assert [h.normalized_score for h in a] == pytest.approx([h.normalized_score for h in b], abs=abs_tol)


def contains(tokens, seq):
    return any(tuple(tokens[i:i + len(seq)]) == seq for i in range(len(tokens) - len(seq) + 1))


def random_constraints(rng: random.Random, V: int, continuations: torch.Tensor | None,
                       sentence_ends: torch.Tensor | None = None) -> LexicalConstraints | None:
    kind = rng.choice(["free", "terms", "avoid", "both"])
    if kind == "free":
        return None
    include = tuple({tuple(rng.randrange(4, V) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3))}) \
        if kind in ("terms", "both") else ()
    avoid = tuple(tuple(rng.randrange(4, V) for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 3))) \
        if kind in ("avoid", "both") else ()
    held = sentence_ends if sentence_ends is not None and rng.random() < 0.5 else None  # per sentence, as its source decides
    return LexicalConstraints(include, avoid, continuations, held)


def random_ends(V: int, seed: int, device: str = "cpu") -> torch.Tensor:
    """A few tokens that end a sentence (held back while a term is unmet)."""
    ends = torch.zeros(V, dtype=torch.bool, device=device)
    ends[torch.randperm(V, generator=torch.Generator().manual_seed(seed + 7))[:5].to(device)] = True
    return ends


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("spare_slots", [False, True])
def test_the_choice_is_the_eager_choice(seed, spare_slots):
    """Random candidates with tied scores across beams, dead beams (-inf), random progress: every
    group's ended hypotheses and continuing beams (with their progress) are the eager ones, in order,
    with as many term slots as needed or all of them."""
    rng = random.Random(seed)
    G, K, V = 6, rng.choice([2, 4, 5]), 14  # a small vocabulary: constraint tokens among the top ones, duplicates
    lexical = [random_constraints(rng, V, None) for _ in range(G)]
    progress = [[tuple(rng.randint(0, len(t)) for t in lex.include) for _ in range(K)] if lex else [] for lex in lexical]
    grid = torch.arange(V, dtype=torch.float32) * -0.5  # each beam's scores distinct, equal ones across beams
    candidates = torch.stack([torch.stack([grid[torch.randperm(V, generator=torch.Generator().manual_seed(seed * 100 + g * K + k))] - rng.choice([0, 0.5, 1])
                                           if rng.random() > 0.2 or k == 0 else torch.full((V,), -math.inf)
                                           for k in range(K)]) for g in range(G)]).view(G, K * V)
    top_scores, top_index = candidates.topk(2 * K, dim=-1)

    state = DeviceConstraints(G, K, V, torch.device("cpu"))
    state.load(torch.arange(G), lexical)
    for g, lex in enumerate(lexical):
        for k, p in enumerate(progress[g]):
            state.progress[g * K + k, : len(p)] = torch.tensor(p, dtype=torch.long)
    terms = MAX_TERMS if spare_slots else term_slots(lexical)
    out = state.choose(candidates, top_scores, top_index, torch.ones(G, dtype=torch.bool), EOS, terms)

    extra = constraint_candidates(candidates, lexical, progress, V)
    for g, lex in enumerate(lexical):
        scores, index = top_scores[g].tolist(), top_index[g].tolist()
        if lex:
            ended, chosen = choose_constrained(lex, progress[g], scores, index, extra[g], K, V, EOS)
        else:
            ended, chosen = choose_beams(scores, index, K, V, EOS)
        mine_ended = [(b, s) for b, s, e in zip(out["beam"][g].tolist(), out["score"][g].tolist(), out["ended"][g].tolist()) if e]
        assert mine_ended == ended
        n = len(lex.include) if lex else 0
        mine = [(b, t, s) + ((tuple(p[:n]),) if lex else ()) for b, t, s, p in zip(
            out["next_beam"][g].tolist(), out["next_token"][g].tolist(), out["next_score"][g].tolist(), out["next_progress"][g].tolist())]
        assert mine == chosen, g


@pytest.mark.parametrize("beam_size", [1, 2, 5])
@pytest.mark.parametrize("check_every", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_search_gives_the_eager_constrained_results(beam_size, check_every, seed):
    """Terms of one to three tokens, avoided sequences, whole-word terms, sentence ends held back, free
    sentences among them; sentences finish at different steps (the bucket shrinks); n-best lists and
    unmet flags agree."""
    model = random_model(seed=seed, final_logits_bias=True)
    V = model.config.tgt_vocab_size
    continuations = torch.zeros(V, dtype=torch.bool)
    continuations[torch.randperm(V, generator=torch.Generator().manual_seed(seed))[: V // 3]] = True
    rng = random.Random(seed)
    src = random_sources(13, 9, model.config.src_vocab_size, seed=seed + 40)
    ends = random_ends(V, seed)
    lexical = [random_constraints(rng, V, continuations if rng.random() < 0.5 else None, ends) for _ in range(13)]
    opts = SearchOptions(beam_size=beam_size, num_hypotheses=min(beam_size, 2), max_length=rng.choice([None, 14]), length_penalty=0.8)
    reference = generate(ModelRunner(model), src, opts, constraints=lexical)
    # one seed of the three through the lookahead path (reads taken in a step later): the same results
    searcher = device_search(model, max_rows=128, check_every=check_every, lookahead=seed == 1)
    assert searcher.accepts(src, opts, lexical)
    mine = searcher.search(src, opts, constraints=lexical)
    assert_same(mine, reference)
    for hyps, lex in zip(mine, lexical):
        if lex and not hyps[0].unmet:
            assert all(contains(hyps[0].tokens, t) for t in lex.include)
        if lex:
            assert not any(contains(hyps[0].tokens, a) for a in lex.avoid)


def test_free_sentences_beside_constrained_ones_are_as_without_them():
    model = random_model(seed=7)
    src = random_sources(9, 8, model.config.src_vocab_size, seed=8)
    opts = SearchOptions(beam_size=4, num_hypotheses=2, max_length=16)
    lexical = [LexicalConstraints(include=((40, 41),), avoid=((12,),)) if i % 2 else None for i in range(9)]
    searcher = device_search(model)
    mixed = searcher.search(src, opts, constraints=lexical)
    alone = searcher.search(src, opts)  # the plain program, no constraint anywhere
    free = [i for i, lex in enumerate(lexical) if lex is None]
    for i in free:
        assert [h.tokens for h in mixed[i]] == [h.tokens for h in alone[i]]
        assert [h.score for h in mixed[i]] == [h.score for h in alone[i]]  # the same float32 sums, bit for bit
    assert any(mixed[i] != alone[i] for i in range(9) if lexical[i])  # the constraints did something


def test_a_term_that_cannot_fit_gives_the_free_translation_flagged():
    model = random_model(seed=3)
    src = random_sources(3, 6, 64, seed=3)
    opts = SearchOptions(beam_size=2, max_length=3)
    lexical = [LexicalConstraints(include=((40, 41, 42, 43),), avoid=((9,),)), None, LexicalConstraints(include=((40,),))]
    mine = device_search(model).search(src, opts, constraints=lexical)
    assert_same(mine, generate(ModelRunner(model), src, opts, constraints=lexical))
    assert mine[0][0].unmet and not mine[1][0].unmet and not mine[2][0].unmet
    free = device_search(model).search(src[:1], SearchOptions(beam_size=4, max_length=3),
                                       constraints=[LexicalConstraints(avoid=((9,),))])
    assert mine[0][0].tokens == free[0][0].tokens


def test_constraints_past_the_buffers_are_left_to_the_eager_search():
    model = random_model(seed=4)
    searcher = device_search(model)
    src = random_sources(2, 6, 64, seed=4)
    many = LexicalConstraints(include=tuple((40 + i,) for i in range(MAX_TERMS + 1)))
    assert fits(None) and fits(LexicalConstraints(include=((40,),))) and not fits(many)
    opts = SearchOptions(beam_size=4, max_length=20)
    assert searcher.accepts(src, opts, [None, LexicalConstraints(include=((40,),))])
    assert not searcher.accepts(src, opts, [None, many])
    # a greedy call with constraints runs CONSTRAINED_MIN_BEAM (2) beams: they must fit the rows
    small = DeviceSearch(StaticDecoder(ModelRunner(model), max_rows=3, max_length=64))
    assert small.accepts(src, SearchOptions(beam_size=1, max_length=20))
    assert not small.accepts(src, SearchOptions(beam_size=1, max_length=20), [None, LexicalConstraints(include=((40,),))])


@pytest.mark.parametrize("check_every", [1, 3])
@pytest.mark.parametrize("lookahead", [False, True])
def test_continuous_device_search_with_constraints_joining_at_different_steps(check_every, lookahead):
    """Constrained and free sentences join a running continuous search; each gets what the eager beam
    search gives it alone (a sentence left unmet comes back flagged, for the engine to redo)."""
    model = random_model(seed=11)
    runner = ModelRunner(model)
    V = model.config.tgt_vocab_size
    rng = random.Random(11)
    srcs = [row[row != 0].tolist() for row in random_sources(12, 10, 64, seed=12)]
    lexical = [random_constraints(rng, V, None, random_ends(V, 11)) for _ in srcs]
    lexical[0] = LexicalConstraints(include=((40, 41, 42, 43),))  # cannot fit in max_length 4
    K = 4
    search = ContinuousDeviceSearch(DeviceSearch(StaticDecoder(runner, max_rows=64, max_length=64)), beam_size=K, check_every=check_every,
                                    lookahead=lookahead)
    options = [SearchOptions(beam_size=K, num_hypotheses=rng.randint(1, 2), max_length=4 if i == 0 else rng.choice([None, 9]))
               for i in range(len(srcs))]
    sentences = [Sentence(i, s, int(max_lengths_for(torch.tensor([s]), 0, o, model.config.max_positions - 1)[0]),
                          o.length_penalty, o.num_hypotheses, (), lex) for i, (s, o, lex) in enumerate(zip(srcs, options, lexical))]
    assert all(search.fits(s) for s in sentences)
    results = {}
    for batch, wait in ((sentences[:4], 0), (sentences[4:5], 2), (sentences[5:9], 1), (sentences[9:], 5)):
        for _ in range(wait):
            results.update(dict(search.step()))
        search.add(batch)
    while len(search):
        results.update(dict(search.step()))
    assert sorted(results) == list(range(len(srcs)))
    assert results[0][0].unmet
    for i, src in enumerate(srcs):
        [want] = beam_search(runner, torch.tensor([src]), options[i], lexical=[lexical[i]])
        assert_same([results[i]], [want])


@pytest.mark.cuda
def test_constrained_steps_captured_as_cuda_graphs_give_the_uncaptured_results():
    """Nothing in the constrained step waits on the host: captured, it replays to the same results."""
    model = random_model(seed=31).cuda()
    runner = ModelRunner(model)
    V = model.config.tgt_vocab_size
    continuations = torch.zeros(V, dtype=torch.bool, device="cuda")
    continuations[: V // 3] = True
    rng = random.Random(31)
    lexical = [random_constraints(rng, V, continuations, random_ends(V, 31, "cuda")) for _ in range(13)]
    src = random_sources(13, 9, 64, seed=32).cuda()
    opts = SearchOptions(beam_size=4, num_hypotheses=2, max_length=20)
    captured = DeviceSearch(StaticDecoder(runner, max_rows=64, max_length=64), check_every=1)
    plain = DeviceSearch(StaticDecoder(runner, max_rows=64, max_length=64, capture=False), check_every=1)
    first = captured.search(src, opts, constraints=lexical)  # captures as it goes
    again = captured.search(src, opts, constraints=lexical)  # replays
    reference = plain.search(src, opts, constraints=lexical)
    assert any(key[0] == "beam-lexical" for key in captured.decoder.graphs)
    assert_same(first, reference, abs_tol=0)
    assert_same(again, reference, abs_tol=0)
    assert_same(first, generate(runner, src, opts, constraints=lexical), abs_tol=1e-3)
