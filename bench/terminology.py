"""Terminology on a test set built from Multi30k: are the glossary's terms placed, what does it do to
BLEU against references that use them, and what does it cost in speed.

    python -m bench.terminology [--model checkpoints/multi30k] [--sentences 400] [--threads 2] [--search device]

The set: German test_2016_flickr captions (de-en) holding one to three words of a small lexicon of
caption nouns, each mapped to an English term the model does not use for it ("Mann" -> "guy" where
the model writes "man"); an entry is kept for a sentence only where the unconstrained translation
lacks the term and its reference holds the usual word, which the rewritten reference replaces by
the term (plural -s kept). Reported: the share of outputs holding every term, BLEU (sacreBLEU)
against the rewritten references with and without the glossary, and sentences/s at batch 32 with
and without it (beam 4 both; greedy too); and how the terms fit, for those synonyms, for words the
model never saw, and for function words: the log-prob each term costs against the free translation
(what the service's constraint_strained flag reads) and the outputs with words after their
sentence's end. --search device runs both through the static decoder's
search (DeviceSearch, constraints in its step program: device_constraints.py) instead of the eager
one, on the CPU op by op as the engine's device search runs there. Not part of the test suite.
"""
from __future__ import annotations

import argparse
import gzip
import math
import re
import time

import torch
from torch.nn.utils.rnn import pad_sequence

from bench.common import ROOT, emit, machine, table
from nmt_serve.inference.search import SearchOptions, generate
from nmt_serve.inference.translator import Translator
from nmt_serve.text.glossary import GlossaryEntry, GlossaryIndex, Terminology
from nmt_serve.text.quality_flags import MAX_CONSTRAINT_COST

DATA = ROOT.parent / "shared" / "data" / "multi30k"

# German caption noun -> (the English word the references and the model use, the term the glossary asks for).
# The terms are synonyms the model has seen in training (each 35+ times in Multi30k's English): a caption
# model cannot write fluently around a word it never saw. With such words ("hound" for Hund, "lad" for
# Junge, "lass" for Mädchen: never in its data) every term is still placed, but where the model can fit
# it ("The brown dog is standing on the sandy hound."), 5-7 sentence-BLEU below the free translation.
LEXICON = {
    "Mann": ("man", "guy"), "Frau": ("woman", "lady"), "Kind": ("child", "kid"), "Junge": ("boy", "kid"),
    "Straße": ("street", "road"), "Gebäude": ("building", "structure"), "Gruppe": ("group", "crowd"),
    "Hemd": ("shirt", "top"), "Hut": ("hat", "cap"), "Auto": ("car", "vehicle"), "Strand": ("beach", "shore"),
    "Jacke": ("jacket", "coat"), "Bühne": ("stage", "platform"), "Stadt": ("city", "town"), "Felsen": ("rock", "stone"),
    "Fahrrad": ("bike", "bicycle"), "Baby": ("baby", "infant"), "Bürgersteig": ("sidewalk", "pavement"),
}
UNSEEN = {"Hund": ("dog", "hound"), "Junge": ("boy", "lad"), "Mädchen": ("girl", "lass")}
# function words to targets the model would not write there: up to 7 terms a sentence, none of which fits well
FUNCTION_WORDS = {"auf": "upon", "ein": "one", "einem": "one", "mit": "alongside", "in": "within", "Mann": "fellow", "vor": "ahead of"}
# a sentence's end followed by more words: a term written after the sentence the model had finished
FRAGMENT = re.compile(r"[.!?]\s+\w")


def read(name: str) -> list[str]:
    with gzip.open(DATA / name, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def rewrite(reference: str, usual: str, term: str) -> str:
    def sub(m: re.Match) -> str:
        word = term + (m.group(2) or "")
        return word[0].upper() + word[1:] if m.group(1)[0].isupper() else word
    return re.sub(rf"\b({usual[0]}(?i:{usual[1:]}))(s)?\b", sub, reference, flags=re.IGNORECASE)


def build(translator: Translator, n: int, lexicon: dict = LEXICON) -> tuple[list[str], list[list[GlossaryEntry]], list[str]]:
    sources, references = read("test_2016_flickr.de.gz"), read("test_2016_flickr.en.gz")
    free = [r.text for r in translator.translate(sources, beam_size=4, target_lang="en", max_batch_size=64)]
    entries = {german: GlossaryEntry(german, term) for german, (_, term) in lexicon.items()}
    chosen, glossaries, rewritten = [], [], []
    for src, ref, out in zip(sources, references, free):
        glossary, new_ref = [], ref
        for german, (usual, term) in lexicon.items():
            entry = entries[german]
            if Terminology((entry,)).terms_for([src])[0] and re.search(rf"\b{usual}s?\b", ref, re.IGNORECASE) \
                    and term not in out.lower().split():
                glossary.append(entry)
                new_ref = rewrite(new_ref, usual, term)
        if 1 <= len(glossary) <= 3:
            chosen.append(src)
            glossaries.append(glossary)
            rewritten.append(new_ref)
        if len(chosen) == n:
            break
    return chosen, glossaries, rewritten


def run(translator: Translator, sources: list[str], terms: list[list[str]] | None, beam: int,
        search: str = "eager") -> tuple[list[str], list[bool], float]:
    """The translations at batch 32, whether each left its terms unmet, and the seconds it took."""
    if search == "device":
        return run_device(translator, sources, terms, beam)
    started = time.perf_counter()
    out = []
    for i in range(0, len(sources), 32):
        out += translator.translate(sources[i:i + 32], beam_size=beam, target_lang="en", max_batch_size=32,
                                    terms=terms[i:i + 32] if terms is not None else None)
    return [r.text for r in out], [r.hypotheses[0].constraint_unmet for r in out], time.perf_counter() - started


def run_device(translator: Translator, sources: list[str], terms: list[list[str]] | None, beam: int) -> tuple[list[str], list[bool], float]:
    """run() through the static decoder's search, constrained or not (the eager search only where a
    batch does not fit it)."""
    started = time.perf_counter()
    searcher, inputs = translator.device_search(), translator.inputs
    prefix = inputs.prefix("en", None)
    forced = tuple(inputs.target_prefix("en"))
    options = SearchOptions(beam_size=beam, target_prefix=forced)
    lexical = translator.lexical_constraints(terms, (), len(sources)) if terms is not None else [None] * len(sources)
    texts, unmet = [], []
    for i in range(0, len(sources), 32):
        ids = [torch.tensor(inputs.source_ids(prefix + inputs.tokenizer.encode(s))) for s in sources[i:i + 32]]
        src = pad_sequence(ids, batch_first=True, padding_value=translator.config.pad_id)
        constraints = lexical[i:i + 32]
        if searcher.accepts(src, options, constraints):
            nbest = searcher.search(src, options, constraints=constraints)
        else:
            nbest = generate(translator.runner, src, options, constraints=constraints)
        texts += [translator.tgt_tokenizer.decode(h[0].tokens[len(forced):]) for h in nbest]
        unmet += [h[0].unmet for h in nbest]
    return texts, unmet, time.perf_counter() - started


def strain(translator: Translator, sources: list[str], terms: list[list[str]]) -> list[str]:
    """How well the terms fit (beam 4, those whose free translation lacks them, as the engine searches
    them): the log-prob given up per term against the free translation (EngineHypothesis.constraint_cost,
    percentiles), the share the service flags constraint_strained, and the outputs with words after
    their sentence's end."""
    kw = dict(beam_size=4, target_lang="en", max_batch_size=32, return_scores=True)
    free = translator.translate(sources, **kw)
    con = translator.translate(sources, terms=terms, **kw)
    costs, fragments = [], 0
    for ts, f, c in zip(terms, free, con):
        f, c = f.hypotheses[0], c.hypotheses[0]
        if ts and not c.constraint_unmet and f.text != c.text:
            costs.append((f.score - c.score) / len(ts))
            fragments += bool(FRAGMENT.search(c.text)) and not FRAGMENT.search(f.text)
    costs.sort()
    pct = [costs[min(len(costs) - 1, int(p * len(costs)))] for p in (0.05, 0.5, 0.95, 0.99)] if costs else [math.nan] * 4
    flagged = sum(c > MAX_CONSTRAINT_COST for c in costs)
    return [str(len(costs)), *(f"{v:.1f}" for v in pct), f"{flagged / max(len(costs), 1):.0%}", str(fragments)]


def main(argv: list[str] | None = None) -> int:
    import sacrebleu

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "checkpoints" / "multi30k"))
    parser.add_argument("--sentences", type=int, default=400)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--search", choices=("eager", "device"), default="eager",
                        help="device: the static decoder's search (DeviceSearch) for both, constraints in its step")
    parser.add_argument("--output")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    static = dict(step_mode="static", static_rows=32 * 4, static_length=160, warmup=False) if args.search == "device" else {}
    translator = Translator.load(args.model, device="cpu", **static)
    sources, glossaries, references = build(translator, args.sentences)
    terms = [[e.target for e in g] for g in glossaries]
    rows, speed = [], []
    for beam in (4, 1):
        for _ in range(2):  # alternated, twice: the shared machine's speed drifts
            texts_free, _, t_free = run(translator, sources, None, beam, args.search)
            texts_con, unmet_flags, t_con = run(translator, sources, terms, beam, args.search)
            speed.append((beam, len(sources) / t_free, len(sources) / t_con))
        if beam == 4:
            placed = sum(all(re.search(rf"\b{re.escape(t)}", out, re.IGNORECASE) for t in ts) for ts, out in zip(terms, texts_con))
            unmet = sum(unmet_flags)
            free_placed = sum(all(re.search(rf"\b{re.escape(t)}", out, re.IGNORECASE) for t in ts) for ts, out in zip(terms, texts_free))
            bleu = lambda hyps: sacrebleu.corpus_bleu(hyps, [references]).score  # noqa: E731
            rows.append(["without glossary", f"{free_placed / len(sources):.1%}", f"{bleu(texts_free):.2f}", "-"])
            rows.append(["with glossary", f"{placed / len(sources):.1%}", f"{bleu(texts_con):.2f}", str(unmet)])
    # the same measure with terms the model never saw
    u_sources, u_glossaries, u_references = build(translator, args.sentences // 2, UNSEEN)
    u_terms = [[e.target for e in g] for g in u_glossaries]
    u_free, _, _ = run(translator, u_sources, None, 4, args.search)
    u_con, _, _ = run(translator, u_sources, u_terms, 4, args.search)
    u_placed = sum(all(re.search(rf"\b{re.escape(t)}", text, re.IGNORECASE) for t in ts) for ts, text in zip(u_terms, u_con))
    unseen_rows = [[f"{len(u_sources)} sentences, terms never in the training data (hound, lad, lass)", f"{u_placed / len(u_sources):.1%}",
                    f"{sacrebleu.corpus_bleu(u_free, [u_references]).score:.2f}",
                    f"{sacrebleu.corpus_bleu(u_con, [u_references]).score:.2f}"]]
    index = GlossaryIndex([GlossaryEntry(a, b) for a, b in FUNCTION_WORDS.items()])
    f_sources = read("test_2016_flickr.de.gz")[: args.sentences // 2]
    strain_rows = [["caption nouns to synonyms it knows", *strain(translator, sources, terms)],
                   ["terms never in its training data", *strain(translator, u_sources, u_terms)],
                   ["function words (auf -> upon, ein -> one, ...)", *strain(translator, f_sources, [index.applicable(x) for x in f_sources])]]
    entries = sum(len(g) for g in glossaries)
    report = [f"Machine: {machine()}; {args.threads} thread(s); {args.search} search.",
              f"{len(sources)} sentences of test_2016_flickr (de-en), {entries} glossary entries (1-3 per sentence), model {args.model}.\n",
              table(["beam 4", "outputs holding every term", "BLEU vs rewritten references", "constraint_unmet"], rows), "",
              table(["beam", "sentences/s without", "sentences/s with", "ratio"],
                    [[str(b), f"{a:.1f}", f"{c:.1f}", f"{c / a:.2f}"] for b, a, c in speed]), "",
              table(["beam 4", "outputs holding every term", "BLEU without glossary", "BLEU with"], unseen_rows), "",
              f"How the terms fit: log-prob per term given up against the free translation (constraint_strained above "
              f"{MAX_CONSTRAINT_COST}), and outputs with words after their sentence's end.\n",
              table(["glossary", "sentences with terms placed", "cost p5", "p50", "p95", "p99", "constraint_strained",
                     "words after the end"], strain_rows)]
    return emit("\n".join(report) + "\n", args.output)


if __name__ == "__main__":
    raise SystemExit(main())
