"""Lexical constraints: terms that must appear and sequences that must not, by dynamic beam allocation."""
import pytest
from conftest import random_model, random_sources

from nmt_serve.inference.lexical_constraints import LexicalConstraints, choose_constrained
from nmt_serve.inference.model_runner import ModelRunner
from nmt_serve.inference.search import SearchOptions, generate


def contains(tokens: list[int], seq: tuple[int, ...]) -> bool:
    return any(tuple(tokens[i:i + len(seq)]) == seq for i in range(len(tokens) - len(seq) + 1))


def test_progress_follows_matches_restarts_and_stays_met():
    c = LexicalConstraints(include=((5, 6, 7), (9,)))
    p = c.start()
    for token in (5, 6):
        p = c.advance(p, token)
    assert p == (2, 0) and c.met(p) == 2 and c.wanted(p) == [7, 5, 9]
    assert c.advance(p, 5) == (1, 0)  # broken, and the token starts the term anew
    p = c.advance(c.advance(p, 7), 9)
    assert p == (4, 1) and c.all_met(p) and c.met(p) == 4 and c.wanted(p) == []  # (9,): written, its word still open
    closed = c.advance(p, 1)
    assert closed == (4, 2) and c.advance(closed, 5) == closed


def test_a_term_nested_in_another_goes_on_into_it_and_only_a_whole_word_counts():
    """"zebra" (5, 6) and "zebras" (5, 6, 8), 8 continuing a word: after 5 6 the continuations are banned
    but 8, which goes on into the longer term and breaks the shorter one; a word start closes a term."""
    import math

    import torch

    from nmt_serve.inference.lexical_constraints import mask_lexical

    continuations = torch.zeros(12, dtype=torch.bool)
    continuations[[8, 10]] = True
    c = LexicalConstraints(include=((5, 6), (5, 6, 8)), continuations=continuations)
    p = c.advance(c.advance(c.start(), 5), 6)
    assert p == (2, 2) and c.all_met(p) is False
    lp = torch.zeros(1, 12)
    mask_lexical(lp, [c], [[p]], lambda row: [5, 6], 1, [False], eos=0)
    assert lp[0, 10] == -math.inf and lp[0, 8] == 0 and lp[0, 0] == -math.inf  # 10 banned, 8 allowed, eos not yet
    into = c.advance(p, 8)
    assert into == (0, 3) and c.advance(into, 3) == (0, 4)  # "zebras" written: "zebra" is not, as a word
    assert c.advance(p, 3) == (3, 0) and not c.all_met(c.advance(p, 3))  # "zebra" closed, "zebras" broken


def test_the_sentence_end_waits_for_the_terms_as_eos_does():
    """A row with a term unmet may write neither eos nor a piece that ends the sentence; once every term
    is in, or at the length limit, both are open; constraints without sentence_ends ban eos only."""
    import math

    import torch

    from nmt_serve.inference.lexical_constraints import mask_lexical

    ends = torch.zeros(12, dtype=torch.bool)
    ends[[7, 9]] = True  # "." and "?"
    c = LexicalConstraints(include=((5,),), sentence_ends=ends)
    plain = LexicalConstraints(include=((5,),))
    lp = torch.zeros(4, 12)
    unmet, met = c.start(), c.advance(c.start(), 5)
    mask_lexical(lp, [c, c, plain, c], [[unmet], [met], [unmet], [unmet]], lambda row: [], 1, [False, False, False, True], eos=0)
    assert lp[0].isinf().nonzero().view(-1).tolist() == [0, 7, 9]
    assert not lp[1].isinf().any()  # met
    assert lp[2].isinf().nonzero().view(-1).tolist() == [0]  # no sentence_ends: eos only
    assert not lp[3].isinf().any()  # at the length limit
    assert lp[0, 7] == -math.inf


def test_avoided_sequences_ban_their_last_token_after_the_others():
    c = LexicalConstraints(avoid=((4,), (7, 8)))
    assert c.banned([1, 2]) == [4]
    assert sorted(c.banned([1, 7])) == [4, 8]
    with pytest.raises(ValueError):
        LexicalConstraints(include=((),))


def test_beams_are_taken_round_robin_from_the_banks_most_progress_first():
    c = LexicalConstraints(include=((50,),))
    V, K = 100, 2
    # the best 2K candidates are free tokens of beam 0; the constraint token scores far lower
    scores, indices = [-1.0, -1.1, -1.2, -1.3], [10, 11, 12, 13]
    ended, continuing = choose_constrained(c, [c.start(), c.start()], scores, indices, [(0, 50, -9.0)], K, V, eos=2)
    assert ended == [] and [(b, t) for b, t, _, _ in continuing] == [(0, 10), (0, 50)]
    assert continuing[1][3] == (1,)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_every_term_appears_and_no_avoided_token_does(seed, beam_size):
    model = random_model(seed=seed)
    runner = ModelRunner(model)
    src = random_sources(4, 8, 64, seed=seed)
    opts = SearchOptions(beam_size=beam_size, max_length=20)
    free = generate(runner, src, opts)
    # terms the model does not write by itself, and a token it does write, to avoid
    terms = [((40, 41),), ((42,), (43, 44)), (), ((45,),)]
    avoid = [(free[i][0].tokens[0],) if free[i][0].tokens else (46,) for i in range(4)]
    lexical = [LexicalConstraints(include=t, avoid=(a,)) for t, a in zip(terms, avoid)]
    constrained = generate(runner, src, opts, constraints=lexical)
    for i, (hyps, lex) in enumerate(zip(constrained, lexical)):
        best = hyps[0]
        assert not best.unmet
        for term in lex.include:
            assert contains(best.tokens, term), (i, best.tokens, term)
        assert not any(contains(best.tokens, a) for a in lex.avoid)
    # sentences without constraints beside constrained ones are translated as alone
    assert constrained[2][0].tokens != [] or free[2][0].tokens == []


def test_a_term_that_cannot_fit_gives_the_free_translation_flagged():
    model = random_model(seed=3)
    runner = ModelRunner(model)
    src = random_sources(2, 6, 64, seed=3)
    opts = SearchOptions(beam_size=2, max_length=3)
    lexical = [LexicalConstraints(include=((40, 41, 42, 43),)), None]  # 4 tokens and eos do not fit in 3
    out = generate(runner, src, opts, constraints=lexical)
    free = generate(runner, src, SearchOptions(beam_size=4, max_length=3))
    assert out[0][0].unmet and out[0][0].tokens == free[0][0].tokens
    assert not out[1][0].unmet
