"""The translation path every endpoint shares: texts as users send them (paragraphs, HTML, an unnamed
source language) in, whole translated texts out.

Each text is cut into the sentences the models were trained on (model.segmentation), every sentence of
the request goes to the engine in one call per model (so they are batched together and with other
requests'), and each text is put back together around its own whitespace and markup. For HTML, only
the text between tags is translated; sentences that hold inline tags are aligned word by word
(the engine's attention, by forced decoding of the translation) so that the tags land on the right
words. Doubtful sentences are flagged (text/quality_flags.py), those with a borderline score after a
look at the same attention.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from fastapi import Request

from nmt_serve.engine.protocol import BACKGROUND, INTERACTIVE, DecodeOptions, EngineHypothesis
from nmt_serve.network.tokenizer import UNKNOWN_MARK, Tokenizer, restore_unknowns
from nmt_serve.service.deadlines import request_timeout, with_deadline
from nmt_serve.service.directions import Pivot, ServedDirection
from nmt_serve.service.errors import APIError, bad_request, timed_out
from nmt_serve.service.state import ServiceState, capped
from nmt_serve.text import protected_spans
from nmt_serve.text.entities import unescape_output
from nmt_serve.text.glossary import GlossaryEntry, Terminology
from nmt_serve.text.glossary import check as check_glossary
from nmt_serve.text.html_markup import AlignedText, HtmlDocument, parse_html
from nmt_serve.text.language_codes import bcp47
from nmt_serve.text.language_detection import UNDETERMINED, Detection, language_name
from nmt_serve.text.quality_flags import CONSTRAINT_UNMET, SentenceFlags, flags_for, needs_attention_check
from nmt_serve.text.segmentation import Segmented, segment
from nmt_serve.text.word_alignment import word_alignment

AUTO = "auto"
FALLBACK_LANGUAGE = "en"  # LibreTranslate's answer when it cannot tell the language (upstream_fallbacks)
INLINE_PREPARE_CHARS = 2000  # above this many characters a request is prepared on a thread
# ... and where detecting the texts' languages ("auto") would take more than INLINE_DETECTION_MS: identify() and
# detect() of a Multi30k caption took 1.4 ms among de/en and 6.8 ms among the 75 of NLLB-200 that lingua knows
# (this project's 2-core VM), about 1.3 ms + 0.07 ms per served language
INLINE_DETECTION_MS = 5.0


def detection_ms(texts: int, languages: int) -> float:
    """About how long detecting the language of `texts` texts among `languages` served ones takes."""
    return texts * (1.3 + 0.07 * languages)


@dataclass
class TextResult:
    text: str  # the whole text translated: sentences re-joined, markup kept
    alternatives: list[str]  # the 2nd..n-th best whole texts (each sentence's k-th best)
    detected: Detection | None  # the source language found, when source was "auto"
    model: str
    score: float | None = None  # sum over its sentences (return_scores)
    normalized_score: float | None = None  # mean over its sentences (return_scores)
    hypothesis_scores: list[float | None] = field(default_factory=list)  # per n-best entry, summed over sentences
    flags: list[SentenceFlags] = field(default_factory=list)
    source_tokens: int = 0
    generated_tokens: int = 0
    sentences: int = 0
    error: str | None = None  # a job's text that could not be translated, given back as it is: why

    @classmethod
    def untranslated(cls, text: str, error: str) -> TextResult:
        return cls(text=text, alternatives=[], detected=None, model="", error=error)


@dataclass
class _Unit:
    """One run of text to translate: the whole text, or one text segment of an HTML document."""

    segmented: Segmented
    first: int  # index of its first sentence in its model's batch
    needs_alignment: bool = False


@dataclass
class _Text:
    model: ServedDirection | None  # None: nothing to translate (source "auto" found the target language)
    detected: Detection | None
    units: list[_Unit]
    document: HtmlDocument | None
    original: str
    protected: bool = False  # a plain text translated as HTML around its protected spans (text/protected_spans.py)
    pivot: Pivot | None = None  # its direction is translated through the pivot language (then model is None)


def _language_name(code: str) -> str:
    return f"{language_name(code)} ({code})"


def resolve_model(state: ServiceState, source: str, target: str, text: str, param: str,
                  upstream_fallbacks: bool = False) -> tuple[ServedDirection | Pivot | None, Detection | None]:
    """The model for a text, or the two through the pivot language where none translates its direction;
    with source "auto", the detected language picks it (None: the text is given back as it is, e.g. it is
    already in the target language).

    The source equal to the target gives the text back (as LibreTranslate does).
    upstream_fallbacks: answer as LibreTranslate does where our own API refuses: with "auto", a text
    with nothing to detect, or in a language no model serves, is taken as English at confidence 0
    (translated from English when a model does, else given back)."""
    if state.to_itself(source, target) or (source == target and upstream_fallbacks):
        return None, None
    if source != AUTO:
        return state.route(source, target), None
    detector = state.detector()
    found = detector.identify(text)
    served = state.sources
    unserved = found is not None and found.language not in served
    candidates = [] if unserved else detector.detect(text)
    if not candidates and upstream_fallbacks:
        english = Detection(FALLBACK_LANGUAGE, 0.0)
        direction = f"{FALLBACK_LANGUAGE}-{target}"
        # no letters at all ("12345"): nothing a model could translate, so it comes back as it is
        return (state.models[direction] if unserved and direction in state.models else None), english
    if not candidates and not upstream_fallbacks and not any(c.isalpha() for c in text):
        return None, None  # no letters ("", "12345", "!!!"): nothing a model could translate, given back as it is
    if unserved:
        looks = ("is in none of the languages the loaded models translate (too short to say which it is)"
                 if found.language == UNDETERMINED else f"looks like {_language_name(found.language)}, which no loaded model translates")
        raise bad_request(f"the text {looks}; served source languages: {', '.join(sorted(served))}", param)
    if not candidates:
        raise bad_request("the source language could not be detected (is there any text?); name it in 'source'", param)
    best = candidates[0]
    if best.language == target:  # already in the target language: given back as is (as LibreTranslate does)
        return None, best
    route = state.models.get(f"{best.language}-{target}") or state.pivots.get(f"{best.language}-{target}")
    if route is None:
        raise bad_request(f"the text looks like {_language_name(best.language)}, but no loaded model translates "
                          f"{best.language}->{target}; loaded pairs: {capped(state.directions)}", param)
    return route, best


def _plain_text(document: HtmlDocument | None, text: str) -> str:
    return " ".join(s.text for s in document.segments) if document is not None else text


def _prepare(state: ServiceState, source: str, target: str, texts: list[str], param: str, format: str,
             split_sentences: bool, upstream_fallbacks: bool = False, check_tokens: bool = True,
             positions: list[int] | None = None) -> tuple[list[_Text], dict[str, list[list[int]]], dict[str, list[str]]]:
    """Each text parsed (HTML), its model found (auto), cut into sentences and tokenized; every sentence
    of the request in one batch per model. positions: each text's index in the request, where the texts are
    some of its texts (a pivot's first hop), for the errors that name one."""
    s = state.settings
    batches: dict[str, list[list[int]]] = {}  # model id -> sentence ids, every text's together
    sentence_texts: dict[str, list[str]] = {}
    prepared: list[_Text] = []
    for i, text in enumerate(texts):
        at = positions[i] if positions is not None else i  # the text's index in the request
        marked = protected_spans.as_html(text) if format == "text" else None
        document = parse_html(marked if marked is not None else text) if format == "html" or marked is not None else None
        try:
            model, detected = resolve_model(state, source, target, _plain_text(document, text), param, upstream_fallbacks)
        except APIError as exc:
            if len(texts) > 1 or positions is not None:  # which of the texts it is
                exc.message = f"text {at}: {exc.message}"
            raise
        if model is None or isinstance(model, Pivot):
            prepared.append(_Text(None, detected, [], None, text, pivot=model))
            continue
        batch = batches.setdefault(model.id, [])
        sources = sentence_texts.setdefault(model.id, [])
        units, tokens = [], 0
        encoded: dict[str, list[int]] = {}  # segment() counts each sentence's tokens: encode it once

        def encode(sentence: str) -> list[int]:
            if sentence not in encoded:
                encoded[sentence] = model.encode(sentence)
            return encoded[sentence]

        pieces = [(seg.text, seg.has_inline) for seg in document.segments] if document is not None else [(text, False)]
        for piece, inline in pieces:
            segmented = segment(piece, model.source, split_sentences=split_sentences, count=lambda t: len(encode(t)),
                                max_tokens=s.max_sentence_tokens)
            units.append(_Unit(segmented, len(batch), inline))
            for sentence in segmented.texts:
                ids = encode(sentence)
                tokens += len(ids)
                batch.append(ids)
                sources.append(sentence)
        if check_tokens:
            state.limits.check_tokens(at, tokens, param)
        prepared.append(_Text(model, detected, units, document, text, protected=marked is not None))
    return prepared, batches, sentence_texts


async def translate_texts(state: ServiceState, request: Request | None, *, source: str, target: str, texts: list[str],
                          options: DecodeOptions, param: str, format: str = "text", split_sentences: bool = True,
                          upstream_fallbacks: bool = False, terminology: Terminology | None = None,
                          attention_check: bool = False, checked: bool = False, timeout: float | None = None,
                          check_tokens: bool = True, positions: list[int] | None = None) -> list[TextResult]:
    """Translate whole texts (plain or HTML) with the request's deadline; every failure is an APIError.
    checked: the caller has checked the texts against its own limits (a document's paragraphs: max_document_chars
    in all, where max_chars_per_text would refuse one long paragraph).
    terminology: glossary entries applied where their source terms occur, and terms to avoid (text/glossary.py).
    upstream_fallbacks: LibreTranslate's answers for source == target and undetectable texts (resolve_model).
    attention_check: the caller shows the flags, so the `detached` check runs as the attention_check
    setting says (the engine's search keeps what it reads; a text changed after translation costs a forced
    decoding; callers that show no flags skip it).
    Without a request it is a job's chunk (jobs_runner.py): background priority in the engine, the
    chunk deadline, the job's own limits (checked when it was submitted).
    A text whose direction no model serves goes through the pivot language (_pivoted). timeout: what is left
    of the request's deadline (a pivot's hops), instead of its own; check_tokens False: the texts are the
    server's own translations (a pivot's second hop), not held to max_tokens_per_text; positions: the texts' indexes
    in the request they are some of (a pivot's first hop), which its errors name."""
    engine = state.require_ready()
    source, target = state.language(source), state.language(target)
    priority = INTERACTIVE if request is not None else BACKGROUND
    if timeout is None:
        timeout = request_timeout(state, request) if request is not None else state.settings.job_chunk_timeout_s
    started = time.monotonic()
    if request is not None:
        if state.settings.admission and (refusal := engine.refusal(timeout, state.settings.admission_margin)):
            state.metrics.refused_early.inc()
            raise refusal
        if not checked:
            state.limits.check_texts(texts, param)
    prepare = lambda: _prepare(state, source, target, texts, param, format, split_sentences, upstream_fallbacks, check_tokens,  # noqa: E731
                                positions)
    # cutting, parsing and tokenizing a long text takes tens of milliseconds (a 20,000-character page:
    # ~80 ms), and so does detecting the language of many texts among many languages: on a thread, so that
    # health probes and other requests are answered meanwhile (lingua holds the GIL for one text at a time)
    big = (sum(len(t) for t in texts) > INLINE_PREPARE_CHARS
           or (source == AUTO and detection_ms(len(texts), len(state.sources)) > INLINE_DETECTION_MS))
    prepared, batches, sentence_texts = await asyncio.to_thread(prepare) if big else prepare()
    if terminology is not None and terminology.glossary and (pivot := next((t.pivot for t in prepared if t.pivot), None)):
        raise glossary_through_pivot(pivot)  # before any text is translated

    # a job's sentences are never checked: nobody reads flags there, and without the search's numbers a check
    # costs a forced decoding
    check = state.settings.attention_check if attention_check and request is not None else "off"

    async def run() -> tuple[dict[str, list[list[EngineHypothesis]]], _Attention]:
        ids = list(batches)
        # scores always: the low-confidence flag reads them (the response shows them only when asked); the
        # source entropy where the `detached` check may read it, and the alignment where inline tags need it
        # (the search keeps them at little cost)
        aligning = any(unit.needs_alignment for t in prepared for unit in t.units)
        scored = replace(options, return_scores=True, return_source_entropy=check != "off", return_alignment=aligning)
        served = {t.model.id: t.model for t in prepared if t.model is not None}
        terms = terminology or Terminology()
        sentence_terms = {m: terms.terms_for(sentence_texts[m]) for m in ids}

        async def translated(model: ServedDirection) -> list[list[EngineHypothesis]]:
            # each distinct sentence once, and none the cache keeps (translation_cache.py)
            async def call(sources: list[list[int]], sources_terms: list[list[str]] | None) -> list[list[EngineHypothesis]]:
                return await engine.translate(model.engine_model, sources, scored, timeout, model.target_prefix, priority,
                                              terms=sources_terms, avoid=terms.avoid)

            cache = state.translation_cache
            nbest, sent, shared = await cache.translate(call, model.engine_model, batches[model.id], scored, model.target_prefix,
                                                        terms=sentence_terms[model.id], avoid=terms.avoid, priority=priority)
            state.metrics.cache.labels(result="hit").inc(len(nbest) - sent - shared)
            state.metrics.cache.labels(result="miss").inc(sent)
            if shared:
                state.metrics.cache.labels(result="shared").inc(shared)
            return nbest

        results = dict(zip(ids, await asyncio.gather(*(translated(served[m]) for m in ids))))
        results = {m: _cleaned(hyps, sentence_texts[m], served[m].inputs.tokenizer, sentence_terms[m]) for m, hyps in results.items()}
        attention = await _attention(engine, prepared, batches, sentence_texts, results, timeout, check)
        return results, attention

    if request is not None:
        results, attention = await with_deadline(state, request, timeout, run())
    else:
        results, attention = await run()  # the engine drops a chunk past its deadline (504)
    pivoted = {}
    if any(t.pivot is not None for t in prepared):  # most requests have none: no coroutine for them
        hops = dict(param=param, format=format, split_sentences=split_sentences, attention_check=attention_check)
        pivoted = await _pivoted(state, request, prepared, options, terminology, timeout, started, hops)
    return [_assemble(state, t, results[t.model.id], sentence_texts[t.model.id], batches[t.model.id], attention, options)
            if t.model is not None else pivoted[i] if t.pivot is not None else _as_is(t, options) for i, t in enumerate(prepared)]


async def _pivoted(state: ServiceState, request: Request | None, prepared: list[_Text], options: DecodeOptions,
                   terminology: Terminology | None, timeout: float, started: float, hops: dict) -> dict[int, TextResult]:
    """{index: result} of the texts whose direction goes through the pivot language, each route's texts
    together: translated into the pivot language (the best translation only), then from it into the target,
    each hop a translation of whole texts as any other (segments, markup, cache) within what is left of the
    request's deadline. Avoided terms are kept out of the second hop's translation (a glossary was refused:
    its target terms would be translated again)."""
    routes: dict[str, list[int]] = {}
    for i, t in enumerate(prepared):
        if t.pivot is not None:
            routes.setdefault(t.pivot.id, []).append(i)
    avoided = Terminology(avoid=terminology.avoid) if terminology is not None and terminology.avoid else None

    def left() -> float | None:  # a job's hops each have the chunk's deadline, as any chunk's call
        if request is None:
            return None
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0:
            state.metrics.dropped.labels(reason="timeout").inc()
            raise timed_out(timeout)
        return remaining

    out: dict[int, TextResult] = {}
    for indexes in routes.values():
        pivot = prepared[indexes[0]].pivot
        positions = indexes if len(prepared) > 1 else None  # what the hops' errors name: the texts as the request has them
        first = await translate_texts(state, request, source=pivot.source, target=pivot.through, checked=True, timeout=left(),
                                      texts=[prepared[i].original for i in indexes], options=replace(options, num_hypotheses=1),
                                      positions=positions, **hops)
        second = await translate_texts(state, request, source=pivot.through, target=pivot.target, checked=True, timeout=left(),
                                       check_tokens=False, texts=[r.text for r in first], options=options, terminology=avoided,
                                       positions=positions, **hops)
        for i, a, b in zip(indexes, first, second):
            out[i] = _chained(a, b, prepared[i].detected, pivot)
    state.metrics.pivoted.inc(len(out))
    return out


def glossary_through_pivot(pivot: Pivot) -> APIError:
    """The 400 for a glossary on a direction translated through the pivot language."""
    return bad_request(f"a glossary needs a model that translates {pivot.source}->{pivot.target} itself; this server "
                       f"translates it through {pivot.through} ({pivot.first.id}, then {pivot.second.id})", "glossary")


def _chained(first: TextResult, second: TextResult, detected: Detection | None, pivot: Pivot) -> TextResult:
    """A text translated through the pivot language: the second hop's translations, scored as the chain (the first
    hop's log-probability added to each of the second's; the normalized score the mean of the two hops'), with
    both hops' flags, each naming its hop (the first's translations are in the pivot language, the second's sources too)."""
    def chain(score: float | None) -> float | None:
        return None if score is None or first.score is None else first.score + score

    normalized = (None if second.normalized_score is None or first.normalized_score is None
                  else (first.normalized_score + second.normalized_score) / 2)
    return TextResult(text=second.text, alternatives=second.alternatives, detected=detected, model=pivot.engine_model,
                      score=chain(second.score), normalized_score=normalized,
                      hypothesis_scores=[chain(s) for s in second.hypothesis_scores],
                      flags=[*(replace(f, direction=f"{pivot.source}-{pivot.through}") for f in first.flags),
                             *(replace(f, direction=f"{pivot.through}-{pivot.target}") for f in second.flags)],
                      source_tokens=first.source_tokens, generated_tokens=first.generated_tokens + second.generated_tokens,
                      sentences=first.sentences)


def terminology(glossary: list | None, avoid: list[str] | None, stored: Terminology | None = None) -> Terminology | None:
    """A request's glossary (entries with source and target, as objects or dicts) and avoided terms, checked
    (text/glossary.py; the error names the `glossary` or `avoid` parameter); None when it has neither.
    stored: a stored glossary's terms (stored_glossary), the request's glossary instead of its own entries."""
    if stored is not None:
        if glossary:
            raise bad_request("give glossary or glossary_id, not both", "glossary_id")
        avoided = tuple(avoid or ())
        if (problem := check_glossary([], list(avoided))) is not None:
            raise bad_request(*problem)
        return Terminology(stored.glossary, avoided, stored.index)
    if not glossary and not avoid:
        return None
    entries = tuple(GlossaryEntry(e["source"], e["target"]) if isinstance(e, dict) else GlossaryEntry(e.source, e.target)
                    for e in glossary or ())
    avoided = tuple(avoid or ())
    if (problem := check_glossary(list(entries), list(avoided))) is not None:
        raise bad_request(*problem)
    return Terminology(entries, avoided)


async def stored_glossary(state: ServiceState, glossary_id: str | None, owner: str | None, source: str,
                          target: str) -> Terminology | None:
    """The terms of a stored glossary (POST /v1/glossaries) for a translation from source to target asked for by
    `owner` (None: anyone's; a job's runner, whose job was checked when it was made); 400 naming glossary_id
    where there is no such glossary of the owner's (deleted meanwhile), or it is for other languages. Read off
    the event loop (a glossary's first read parses its file); a request without one costs nothing."""
    if not glossary_id:
        return None
    found = await asyncio.to_thread(state.glossaries.terms, glossary_id, owner)
    if found is None:
        raise bad_request(f"no glossary {glossary_id} (deleted, or another key's)", "glossary_id")
    record, terms = found
    if source == AUTO:
        raise bad_request(f"a glossary is for one source language ({record['source']}): name it, not auto", "source")
    if (state.language(source), state.language(target)) != (record["source"], record["target"]):
        raise bad_request(f"glossary {glossary_id} is for {record['source']}-{record['target']}, not "
                          f"{state.language(source)}-{state.language(target)}", "glossary_id")
    return terms


def _cleaned(hyps: list[list[EngineHypothesis]], sources: list[str], tokenizer: Tokenizer,
             terms: list[list[str]] | None = None) -> list[list[EngineHypothesis]]:
    """The models' outputs with the source's characters the tokenizer has no piece for put back where
    the model wrote <unk> (network/tokenizer.restore_unknowns), and the character references they
    learned from their data (`&amp;`) decoded once (text/entities.py), before alignment and reassembly;
    terms: per sentence its glossary targets, whose references are the user's, as the source's are."""
    def clean(h: EngineHypothesis, src: str, own: list[str]) -> EngineHypothesis:
        text = h.text
        if UNKNOWN_MARK in text:
            text = restore_unknowns(text, tokenizer.unknown_spans(src))
        if "&" in text:
            text = unescape_output("\n".join([src, *own]), text)
        # what the search kept of its attention was of the text before: the attention of this one is asked for
        return h if text == h.text else replace(h, text=text, source_entropy=None, alignment=None)

    return [[clean(h, src, own) for h in nbest] for nbest, src, own in zip(hyps, sources, terms or [[]] * len(sources))]


def _as_is(text: _Text, options: DecodeOptions) -> TextResult:
    score = 0.0 if options.return_scores else None
    return TextResult(text=text.original, alternatives=[text.original] * (options.num_hypotheses - 1), detected=text.detected,
                      model="", score=score, normalized_score=score, hypothesis_scores=[score] * options.num_hypotheses)


@dataclass
class _Attention:
    """What the pipeline read from the engine's attention, per (model id, sentence index in its batch)."""

    alignments: dict[tuple[str, int], list] = field(default_factory=dict)
    source_entropy: dict[tuple[str, int], float] = field(default_factory=dict)


async def _attention(engine, prepared: list[_Text], batches: dict[str, list[list[int]]], sentence_texts: dict[str, list[str]],
                     results: dict[str, list[list[EngineHypothesis]]], timeout: float, check: str) -> _Attention:
    """The engine's attention over the chosen translations: word alignments of the sentences inside HTML
    segments that hold inline tags, and the source entropy of those the `detached` flag checks (check:
    the attention_check setting), as the search kept it where it did (the text as the model wrote it),
    else by forced decoding, one call per sentence that needs it (only those pay for it)."""
    align = {(t.model.id, unit.first + k) for t in prepared if t.model for unit in t.units if unit.needs_alignment
             for k in range(len(unit.segmented.sentences))}
    served = {t.model.id: t.model for t in prepared if t.model is not None}
    checked = set() if check == "off" else {
        (m, k) for m, hyps in results.items() for k, nbest in enumerate(hyps)
        if check == "all" or needs_attention_check(_mean_logprob(nbest[0]), served[m].flag_thresholds)}
    out = _Attention()
    for m, k in align | checked:  # what the search kept: no forced decoding
        best = results[m][k][0]
        if not best.text:
            continue
        if (m, k) in align and best.alignment is not None:
            out.alignments[(m, k)] = word_alignment(sentence_texts[m][k], best.text, best.source_pieces, best.target_pieces,
                                                    best.alignment)
        if (m, k) in checked and best.source_entropy is not None:
            out.source_entropy[(m, k)] = best.source_entropy
    missing = {mk for mk in align if mk not in out.alignments} | {mk for mk in checked if mk not in out.source_entropy}
    wanted = sorted((m, k) for m, k in missing if results[m][k][0].text)
    if not wanted:
        return out

    async def one(model: ServedDirection, k: int) -> dict:
        return await engine.attention(model.engine_model, timeout, source=batches[model.id][k], target_text=results[model.id][k][0].text,
                                      target_prefix=model.target_prefix, beam_size=1, include=(),
                                      layers=list(range(model.info["n_decoder_layers"])), heads=list(range(model.info["n_heads"])),
                                      encoder_layers=[], average_heads=True, score=False)

    found = await asyncio.gather(*(one(served[m], k) for m, k in wanted))
    for (m, k), maps in zip(wanted, found):
        if (m, k) in align:
            source, target = sentence_texts[m][k], results[m][k][0].text
            out.alignments[(m, k)] = word_alignment(source, target, maps["source_tokens"], maps["target_tokens"], maps["alignment"])
        if (m, k) in checked:
            out.source_entropy[(m, k)] = maps["source_entropy"]
    return out


def _mean_logprob(h: EngineHypothesis) -> float | None:
    """The score per generated token, eos included (what low_confidence reads); where glossary terms were
    placed, the free translation's: the terms' own improbability is the glossary's doing, not doubt about
    the source (it put 66 of 120 well-placed glossaries' sentences under low_confidence's threshold)."""
    if h.free_mean_logprob is not None:
        return h.free_mean_logprob
    return h.score / (h.tokens + 1) if h.score is not None else None


def _assemble(state: ServiceState, text: _Text, hyps: list[list[EngineHypothesis]], sources: list[str], ids: list[list[int]],
              attention: _Attention, options: DecodeOptions) -> TextResult:
    n = options.num_hypotheses
    rebuilt: list[list[str]] = [[] for _ in range(n)]  # per n-best rank, per unit
    aligned: list[AlignedText] = []
    flags: list[SentenceFlags] = []
    scores = [0.0] * n
    normalized, generated, source_tokens, count = [], 0, 0, 0
    for unit in text.units:
        seg, first = unit.segmented, unit.first
        mine = [hyps[first + k] for k in range(len(seg.sentences))]
        best_text, target_spans = seg.rebuild_with_spans([nbest[0].text for nbest in mine])
        rebuilt[0].append(best_text)
        for rank in range(1, n):
            rebuilt[rank].append(seg.rebuild([nbest[min(rank, len(nbest) - 1)].text for nbest in mine]))
        if text.document is not None:
            aligned.append(AlignedText(best_text, _unit_alignment(unit, target_spans, attention.alignments, text.model.id),
                                       list(zip(target_spans, seg.source_spans()))))
        for k, nbest in enumerate(mine):
            best = nbest[0]
            found = flags_for(sources[first + k], best.text, truncated=best.truncated, split=k in seg.long_sentences,
                              long=len(ids[first + k]) > state.settings.max_sentence_tokens,
                              mean_logprob=_mean_logprob(best),
                              source_entropy=attention.source_entropy.get((text.model.id, first + k)),
                              constraint_cost=best.constraint_cost, thresholds=text.model.flag_thresholds)
            if best.constraint_unmet:  # its glossary terms did not fit: this is its free translation
                found = (*found, CONSTRAINT_UNMET)
            if found:
                flags.append(SentenceFlags(count, sources[first + k], best.text, found))
                for flag in found:
                    state.metrics.flags.labels(flag=flag).inc()
            for rank in range(n):
                h = nbest[min(rank, len(nbest) - 1)]
                scores[rank] += h.score or 0.0
            if best.normalized_score is not None:
                normalized.append(best.normalized_score)
            generated += best.tokens
            source_tokens += len(ids[first + k])
            count += 1
    if text.document is not None:
        lang = bcp47(text.model.target)  # a page's <html lang> says it is in the translation's language
        whole = [text.document.rebuild(aligned, lang)] + [
            text.document.rebuild([AlignedText(t) for t in rebuilt[rank]], lang) for rank in range(1, n)]
        if text.protected:
            whole = [protected_spans.from_html(w) for w in whole]
    else:
        whole = [rebuilt[rank][0] for rank in range(n)]
    with_scores = options.return_scores
    return TextResult(
        text=whole[0], alternatives=whole[1:], detected=text.detected, model=text.model.engine_model,
        score=scores[0] if with_scores else None,
        normalized_score=(sum(normalized) / len(normalized) if normalized else 0.0) if with_scores else None,
        hypothesis_scores=[sc if with_scores else None for sc in scores], flags=flags,
        source_tokens=source_tokens, generated_tokens=generated, sentences=count,
    )


def _unit_alignment(unit: _Unit, target_spans: list[tuple[int, int]], alignments: dict, model_id: str):
    """The sentences' word alignments moved into the unit's coordinates (None when not aligned);
    target_spans: where each sentence's translation sits in the unit's translation."""
    if not unit.needs_alignment:
        return None
    out = []
    for k, (src_span, tgt_span) in enumerate(zip(unit.segmented.source_spans(), target_spans)):
        for (ts, te), (ss, se) in alignments.get((model_id, unit.first + k), []):
            out.append(((tgt_span[0] + ts, tgt_span[0] + te), (src_span[0] + ss, src_span[0] + se)))
    return out
