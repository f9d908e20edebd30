"""The one facade that the CLI, the service and the benchmarks use to run a checkpoint.

    translator = Translator.load("checkpoints/de-en", device="auto")
    results = translator.translate(["Ein Hund rennt."], beam_size=4, return_scores=True)
    results[0].text, results[0].hypotheses[0].score

A multilingual checkpoint serves several directions; its calls name the target language:
`translate(texts, target_lang="fr")` (the source language needs no name: the encoder reads it).

Options are keyword-only; optional result fields (scores, attention) stay None unless asked for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import torch

from nmt_serve.inference.attention import attention_backends
from nmt_serve.inference.continuous import Sentence
from nmt_serve.inference.continuous_device import ContinuousDeviceSearch
from nmt_serve.inference.device_search import DeviceSearch
from nmt_serve.inference.host_allocator import keep_freed_memory
from nmt_serve.inference.input_processor import InputProcessor
from nmt_serve.inference.lexical_constraints import LexicalConstraints
from nmt_serve.inference.model_runner import QUANTIZATIONS, ModelRunner
from nmt_serve.inference.search import EMPTY, SearchHypothesis, SearchOptions, check_deadline, generate, max_length_of
from nmt_serve.inference.static_decoder import StaticDecoder
from nmt_serve.network.checkpoint import CheckpointInfo, load_checkpoint
from nmt_serve.network.masks import pad_batch
from nmt_serve.network.tokenizer import UNKNOWN_MARK, Tokenizer, restore_unknowns
from nmt_serve.network.transformer import Transformer

ATTENTION_KINDS = ("cross", "decoder_self", "encoder_self")
# auto: the static decoder (CUDA graphs, bookkeeping on the device) on CUDA, the eager search on CPU;
# eager: always the eager reference search; static: the static decoder everywhere (on CPU it runs
# op by op, for tests: it is slower there than the eager search)
STEP_MODES = ("auto", "eager", "static")
# a target piece that only ends a sentence, and a source with such a mark before a later word
_SENTENCE_END_PIECE = re.compile(r"[.!?\u2026\u3002\uff01\uff1f]+")
_INNER_SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f](?=.*\w)", re.S)
STATIC_LENGTH = 256  # positions of source and target the static decoder holds by default
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """None picks float32 on CPU (half precision is slow there) and float16 on CUDA."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class AttentionMaps:
    """Attention probabilities of one sentence pair, as float32 CPU tensors.

    Rows are target positions: row t is the decoder step that produced target_tokens[t] (the last one
    is the end-of-sentence token). Columns of cross and encoder_self are source_tokens (eos included).
    """

    source_tokens: list[str]
    target_tokens: list[str]
    cross: torch.Tensor  # (L, H, T, S)
    decoder_self: torch.Tensor | None = None  # (L, H, T, T), zero above the diagonal
    encoder_self: torch.Tensor | None = None  # (L, H, S, S)


@dataclass
class TranslationHypothesis:
    text: str  # detokenized
    tokens: list[str]  # target pieces, eos excluded
    score: float | None = None  # sum of token log-probs, eos included (return_scores)
    normalized_score: float | None = None  # score / length ** length_penalty (return_scores)
    constraint_unmet: bool = False  # its terms did not fit within max_length: the free translation


@dataclass
class TranslationResult:
    hypotheses: list[TranslationHypothesis]  # best first; num_hypotheses of them
    attention: AttentionMaps | None = None  # of the best hypothesis (return_attention)

    @property
    def text(self) -> str:
        return self.hypotheses[0].text


@dataclass
class ForcedDecoding:
    """A given target scored by the model, token by token (teacher forcing)."""

    target_text: str
    token_log_probs: list[float] | None  # one per target token, eos included (None: not asked for)
    score: float | None  # their sum
    attention: AttentionMaps


class Translator:
    def __init__(
        self, model: Transformer, info: CheckpointInfo, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
        device: str | torch.device = "auto", dtype: str | torch.dtype | None = None, quantization: str = "none",
        step_mode: str = "auto", static_rows: int = 1024, static_length: int = STATIC_LENGTH, warmup: bool = True,
        packed_weights: bool = True,
    ):
        """quantization "int8": Linear layers of search run in int8 (CPU, float32 only; faster, with a
        small BLEU cost measured in the model cards); attention maps and forced decoding stay float.
        step_mode: see STEP_MODES. static_rows, static_length: the static decoder's capacity (rows =
        sentences x beams of one step, positions of source and target); searches past it run eagerly, and
        with static_rows=0 every search of this Translator does (the engine's own decoders do the serving).
        warmup: run (capture) the static decoder's greedy and beam-4 steps of every bucket at load, so
        that the first request is as fast as the next ones. packed_weights: on the CPU, the search's Linear
        weights are also held prepacked for oneDNN (faster, a second copy: model_runner.FloatLinear);
        False holds every weight once. On the CPU it also sets the process's malloc (glibc) to keep the memory a
        step frees for the next step (host_allocator.keep_freed_memory)."""
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        if self.device.type == "cpu":  # a step's temporaries reuse the last step's memory (host_allocator.py)
            keep_freed_memory()
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
        if quantization == "int8" and (self.device.type != "cpu" or self.dtype != torch.float32):
            raise ValueError("int8 quantization runs on CPU in float32 (use device='cpu', dtype='float32')")
        if step_mode not in STEP_MODES:
            raise ValueError(f"step_mode must be one of {STEP_MODES}, got {step_mode!r}")
        self.quantization = quantization
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.step_mode = step_mode
        self.static_rows, self.static_length = static_rows, min(static_length, model.config.max_positions)
        self.packed_weights = packed_weights
        self._continuations: torch.Tensor | None = None
        self._sentence_ends: torch.Tensor | None = None
        self._runner = self._new_runner()  # built now: a problem shows at load time
        self._device_search: DeviceSearch | None = None
        self.info = info
        self.config = model.config
        self.src_tokenizer = src_tokenizer
        self.tgt_tokenizer = tgt_tokenizer
        self.inputs = InputProcessor(src_tokenizer, target_lang=info.target_lang, directions=info.served(),
                                     target_tags=(info.target_tags or {}) if info.directions and not info.language_codes else None,
                                     language_codes=info.language_codes, code_pairs=info.directions, source_suffix=info.source_suffix,
                                     append_eos=self.config.append_eos_to_source, max_positions=self.config.max_positions)
        if warmup and self.uses_static_decoder and self.static_rows:  # the device search reads the inputs (a forced first token or not)
            self.device_search().warmup(beam_sizes=(1, 4))

    @classmethod
    def load(
        cls, checkpoint_dir: str | Path, device: str | torch.device = "auto", dtype: str | torch.dtype | None = None,
        quantization: str = "none", **options,
    ) -> "Translator":
        """options: step_mode, static_rows, static_length, warmup, packed_weights (see __init__)."""
        # read in the dtype it will run in: a half-precision model never exists in float32 on the host
        model, info, src_tok, tgt_tok = load_checkpoint(checkpoint_dir, dtype=resolve_dtype(dtype, resolve_device(device)))
        return cls(model, info, src_tok, tgt_tok, device=device, dtype=dtype, quantization=quantization, **options)

    # ------------------------------------------------------------------ inference objects
    def _new_runner(self) -> ModelRunner:
        return ModelRunner(self.model, self.quantization, share_storage=True, packed_weights=self.packed_weights)

    @property
    def runner(self) -> ModelRunner:
        """The fused-weight runner; remade (and the static decoder with it) if the model's weights changed."""
        if not self._runner.is_current():
            self._runner = self._new_runner()
            self._device_search = None
        return self._runner

    @property
    def uses_static_decoder(self) -> bool:
        if self.step_mode == "static":
            return self.quantization == "none"
        return self.step_mode == "auto" and self.device.type == "cuda"

    def device_search(self) -> DeviceSearch:
        """The static decoder's search, made on first use and again when the runner was remade."""
        runner = self.runner
        if self._device_search is None:
            decoder = StaticDecoder(runner, max_rows=self.static_rows, max_length=self.static_length)
            self._device_search = DeviceSearch(decoder, forced_first_token=bool(self.inputs.codes))
        return self._device_search

    def static_memory(self) -> dict | None:
        """The static decoder's memory (buffers, captured graphs and their pool), None if not built."""
        return self._device_search.decoder.memory() if self._device_search is not None else None

    def generate(self, src: torch.Tensor, options: SearchOptions, deadline: float | None = None,
                 constraints: list[LexicalConstraints | None] | None = None) -> list[list[SearchHypothesis]]:
        """src (B, S) right-padded ids on this device -> per sentence, the n-best hypotheses: the static
        decoder where it applies, else the eager search (always, for lexical constraints)."""
        if constraints is not None and any(constraints):
            return generate(self.runner, src, options, deadline, constraints)
        if self.uses_static_decoder and self.static_rows:
            searcher = self.device_search()  # checks the runner is current (a walk over every parameter)
            if searcher.accepts(src, options):
                return searcher.search(src, options, deadline)
            return generate(searcher.decoder.runner, src, options, deadline)
        return generate(self.runner, src, options, deadline)

    @property
    def source_lang(self) -> str:
        return self.info.source_lang  # "mul" for a multilingual model

    @property
    def multilingual(self) -> bool:
        return self.info.multilingual

    @property
    def directions(self) -> list[str]:
        """The directions served: "de-en", ... (one for a bilingual model)."""
        return self.info.served()

    def test_bleu(self) -> dict[str, float]:
        """{direction: sacreBLEU on test_2016_flickr, beam 4, float weights} as the model card recorded it."""
        return self.info.test_bleu()

    @property
    def target_lang(self) -> str:
        return self.info.target_lang

    def num_parameters(self) -> int:
        return self.model.num_parameters()

    # ------------------------------------------------------------------ tokens
    def encode_source(self, text: str, target_lang: str | None = None, source_lang: str | None = None) -> list[int]:
        """Text -> the encoder's ids (input_processor.py)."""
        return self.inputs.encode(text, target_lang, source_lang)

    def _pad(self, seqs: Sequence[Sequence[int]], prefix: int | None = None) -> torch.Tensor:
        return pad_batch(seqs, self.config.pad_id, prefix).to(self.device)

    @staticmethod
    def _length_batches(lengths: list[int], max_batch_tokens: int, max_batch_size: int) -> Iterable[list[int]]:
        """Indices sorted by length, cut into batches whose padded size stays under max_batch_tokens."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        batch: list[int] = []
        for i in order:
            if batch and (len(batch) + 1 > max_batch_size or (len(batch) + 1) * lengths[i] > max_batch_tokens):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    # ------------------------------------------------------------------ translation
    @torch.inference_mode()
    def translate(
        self,
        texts: Sequence[str] | None = None,
        *,
        beam_size: int = 4,
        num_hypotheses: int = 1,
        max_length: int | None = None,
        min_length: int = 0,
        length_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        return_scores: bool = False,
        return_attention: bool = False,
        attention_include: Sequence[str] = ("cross",),
        use_cache: bool = True,
        max_batch_tokens: int = 6000,
        max_batch_size: int = 256,
        deadline: float | None = None,
        target_lang: str | None = None,
        source_lang: str | None = None,
        sources: Sequence[list[int] | None] | None = None,
        target_prefix: Sequence[int] | None = None,
        terms: Sequence[Sequence[str]] | None = None,
        avoid: Sequence[str] = (),
    ) -> list[TranslationResult]:
        """Translate texts (any lengths, any order); results come back in input order. Up to max_batch_size
        sentences (and max_batch_tokens padded tokens) are searched at once; on the static decoder (CUDA), more
        than max_batch_size run as the engine's continuous search (_search_continuous), with the same results.

        target_lang: the language to translate into; required by a multilingual model.
        source_lang: the language of the texts; required by a model of the fairseq families (NLLB-200,
        M2M100, mBART-50), whose source starts with its code.

        sources: instead of texts, the encoder's ids of each (InputProcessor.encode; None for an empty
        text), as the engine gets them from the API process; target_prefix: then what the translations are
        forced to start with (default: the target language's code, for a fairseq-family model).

        deadline: a time.monotonic() value; past it the search raises search.DeadlineExceeded.

        terms: per text, target terms its translation must contain; avoid: terms none may contain
        (inference/lexical_constraints.py; text/glossary.py finds a glossary's terms in a text). A text
        whose terms do not fit within max_length gets its free translation, `constraint_unmet`.
        """
        if isinstance(texts, str):
            raise TypeError("translate() takes a list of texts; wrap a single string in a list")
        if (texts is None) == (sources is None):
            raise TypeError("translate() takes texts or sources, one of the two")
        if sources is None:
            prefix = self.inputs.prefix(target_lang, source_lang)
            sources = [self.inputs.source_ids(prefix + tokens) if (tokens := self.inputs.tokenizer.encode(text)) else None
                       for text in texts]
        options = SearchOptions(
            beam_size=beam_size, num_hypotheses=num_hypotheses, max_length=max_length, min_length=min_length,
            length_penalty=length_penalty, no_repeat_ngram_size=no_repeat_ngram_size, use_cache=use_cache,
            target_prefix=tuple(target_prefix if target_prefix is not None else self.inputs.target_prefix(target_lang)),
        )
        self._check_include(attention_include)
        lexical = self.lexical_constraints(terms, avoid, len(sources), sources) if terms or avoid else None
        results: list[TranslationResult | None] = [
            None if ids is not None else TranslationResult([self._hypothesis(EMPTY, return_scores)] * num_hypotheses)
            for ids in sources]
        todo = [i for i, ids in enumerate(sources) if ids is not None]
        searcher = (self.device_search() if len(todo) > max_batch_size and lexical is None and not return_attention
                    and self.uses_static_decoder and self.static_rows else None)
        if searcher is not None and searcher.accepts_options(options):
            for i, hyps in self._search_continuous(searcher, [sources[i] for i in todo], options, max_batch_size, deadline).items():
                results[todo[i]] = TranslationResult([self._hypothesis(h, return_scores, len(options.target_prefix)) for h in hyps])
            todo = [i for i in todo if results[i] is None]  # those that do not fit the decoder: in batches, below
        lengths = [len(sources[i]) for i in todo]
        for batch in self._length_batches(lengths, max_batch_tokens, max_batch_size):
            indices = [todo[b] for b in batch]
            src = self._pad([sources[i] for i in indices])
            nbest = self.generate(src, options, deadline, [lexical[i] for i in indices] if lexical else None)
            attention = (
                self._attention(src, [h[0].tokens for h in nbest], attention_include) if return_attention else [None] * len(indices)
            )
            for i, hyps, attn in zip(indices, nbest, attention):
                results[i] = TranslationResult([self._hypothesis(h, return_scores, len(options.target_prefix)) for h in hyps], attn)
        if texts is not None:  # the source's characters the tokenizer has no piece for, back where the model wrote <unk>
            for text, result in zip(texts, results):
                if any(UNKNOWN_MARK in h.text for h in result.hypotheses):
                    spans = self.inputs.tokenizer.unknown_spans(text)
                    result.hypotheses = [replace(h, text=restore_unknowns(h.text, spans)) for h in result.hypotheses]
        return results  # type: ignore[return-value]

    def _search_continuous(self, searcher: DeviceSearch, sources: list[list[int]], options: SearchOptions, at_once: int,
                           deadline: float | None) -> dict[int, list[SearchHypothesis]]:
        """{index: n-best} of the sources that fit the static decoder, searched as the engine searches: up to
        `at_once` sentences run, and one joins (by source length) as soon as others leave, where batches one after
        another would compute finished rows until their longest sentence ends and leave the device idle between
        them (on an H200 the engine's search ran 1.5-1.8x the sentences/s of batches of 256: BENCHMARKS.md).
        Each sentence's search is the one it gets alone, as in a batch."""
        search = ContinuousDeviceSearch(searcher, beam_size=options.beam_size, min_length=options.min_length)
        cap = self.config.max_positions - 1
        sentences = [Sentence(i, ids, max_length_of(len(ids), options, cap), options.length_penalty, options.num_hypotheses,
                              options.target_prefix) for i, ids in enumerate(sources)]
        sentences = sorted((s for s in sentences if search.fits(s)), key=lambda s: len(s.src))
        at_once = max(1, min(at_once, search.capacity))
        done: dict[int, list[SearchHypothesis]] = {}
        joined = 0
        while len(done) < len(sentences):
            check_deadline(deadline)
            room = min(at_once - len(search), len(sentences) - joined)
            if room > 0 and search.joinable():
                search.add(sentences[joined:joined + room])
                joined += room
            done.update(search.step())
        return done

    def lexical_constraints(self, terms: Sequence[Sequence[str]] | None, avoid: Sequence[str], n: int,
                            sources: Sequence[Sequence[int] | None] | None = None) -> list[LexicalConstraints | None]:
        """Per text, its terms and the avoided ones as target token ids (None: free). An avoided term is
        avoided in any case a sentence may write it: as given, lower case, capitalized (first in a
        sentence) and upper case, each its own token sequence ("Dog" is not "dog" to the model).
        sources: the texts' encoder ids; a text whose source ends a sentence only at its end (or not at
        all) may not end its translation's sentence before its terms are in (LexicalConstraints.sentence_ends)."""
        if not avoid and not terms:
            return [None] * n
        encode = self.tgt_tokenizer.encode
        forms = dict.fromkeys(f for t in avoid for f in (t, t.lower(), t[:1].upper() + t[1:], t[:1].upper() + t[1:].lower(), t.upper()))
        avoided = tuple(dict.fromkeys(ids for ids in (tuple(encode(t)) for t in forms) if ids))
        out: list[LexicalConstraints | None] = []
        for i, text_terms in enumerate(terms if terms is not None else [()] * n):
            include = tuple(dict.fromkeys(ids for ids in (tuple(encode(t)) for t in text_terms) if ids))
            source = sources[i] if sources is not None else None
            ends = (self.sentence_end_pieces() if include and source is not None
                    and not _INNER_SENTENCE_END.search(self.inputs.tokenizer.decode(list(source))) else None)
            out.append(LexicalConstraints(include, avoided, self.word_continuations(), ends) if include or avoided else None)
        return out

    def sentence_end_pieces(self) -> torch.Tensor:
        """(V,) bool on this device: target pieces that are only a sentence's final mark (".", "?", "!",
        "...", with or without the word-start marker)."""
        if self._sentence_ends is None:
            self._sentence_ends = self._piece_mask(lambda p: bool(_SENTENCE_END_PIECE.fullmatch(p.lstrip("\u2581"))))
        return self._sentence_ends

    def _piece_mask(self, test) -> torch.Tensor:
        """(V,) bool on this device: the target pieces that pass `test` (rows past the pieces: padding, never)."""
        known = min(self.tgt_tokenizer.vocab_size, self.config.tgt_vocab_size)
        pieces = self.tgt_tokenizer.pieces(list(range(known)))
        return torch.tensor([test(p) for p in pieces] + [False] * (self.config.tgt_vocab_size - known), device=self.device)

    def word_continuations(self) -> torch.Tensor:
        """(V,) bool on this device: target pieces that continue a word (a letter or digit first, no
        sentencepiece word-start marker)."""
        if self._continuations is None:
            self._continuations = self._piece_mask(lambda p: p[:1].isalnum())
        return self._continuations

    def _hypothesis(self, h: SearchHypothesis, return_scores: bool, forced: int = 0) -> TranslationHypothesis:
        """forced: the target prefix's tokens at the start of h, which are not the translation's."""
        tokens = h.tokens[forced:]
        return TranslationHypothesis(
            text=self.tgt_tokenizer.decode(tokens),
            tokens=self.tgt_tokenizer.pieces(tokens),
            score=h.score if return_scores else None,
            normalized_score=h.normalized_score if return_scores else None,
            constraint_unmet=h.unmet,
        )

    @staticmethod
    def _check_include(include: Sequence[str]) -> None:
        unknown = set(include) - set(ATTENTION_KINDS)
        if unknown:
            raise ValueError(f"unknown attention kinds {sorted(unknown)}; choose from {ATTENTION_KINDS}")

    # ------------------------------------------------------------------ teacher forcing
    def _teacher_forced(self, src: torch.Tensor, targets: list[list[int]], include: Sequence[str], scores: bool = True):
        """One forward pass over given targets (eos appended here): per-token log-probs (None unless
        `scores`) and attention."""
        cfg = self.config
        with_eos = [t + [cfg.eos_id] for t in targets]
        longest = max((len(t) for t in with_eos), default=0)
        if longest > cfg.max_positions:  # as the source's limit (InputProcessor.source_ids): a caller's error
            raise ValueError(f"the translation has {longest} tokens; this model accepts at most {cfg.max_positions}")
        tgt_in = self._pad([t[:-1] for t in with_eos], prefix=cfg.decoder_start_id)
        tgt_out = self._pad(with_eos)
        with attention_backends(self.device):
            encoder_out = self.model.encode(src, need_weights="encoder_self" in include)
            decoded = self.model.decode(tgt_in, encoder_out, need_weights=True, logits=scores)
        log_probs = (torch.log_softmax(decoded.logits, dim=-1, dtype=torch.float32).gather(-1, tgt_out[..., None])[..., 0]  # (B, T)
                     if scores else None)
        outputs = []
        for b, target in enumerate(with_eos):
            S = int((src[b] != cfg.pad_id).sum())
            T = len(target)

            def stack(maps, rows, cols):
                return torch.stack([m[b, :, :rows, :cols] for m in maps]).float().cpu()  # (L, H, rows, cols)

            attention = AttentionMaps(
                source_tokens=self.src_tokenizer.pieces(src[b, :S].tolist()),
                target_tokens=self.tgt_tokenizer.pieces(target),
                cross=stack(decoded.cross_attention, T, S),
                decoder_self=stack(decoded.self_attention, T, T) if "decoder_self" in include else None,
                encoder_self=stack(encoder_out.self_attention, S, S) if "encoder_self" in include else None,
            )
            outputs.append((log_probs[b, :T].tolist() if scores else None, attention))
        return outputs

    def _attention(self, src: torch.Tensor, targets: list[list[int]], include: Sequence[str]) -> list[AttentionMaps]:
        return [attn for _, attn in self._teacher_forced(src, targets, include)]

    @torch.inference_mode()
    def force_decode(self, source: str, target: str, *, attention_include: Sequence[str] = ("cross",),
                     target_lang: str | None = None, source_lang: str | None = None) -> ForcedDecoding:
        """Score a given translation of `source` and return the attention maps that produce it."""
        return self.force_decode_ids(self.encode_source(source, target_lang, source_lang), target, attention_include=attention_include,
                                     target_prefix=self.inputs.target_prefix(target_lang))

    @torch.inference_mode()
    def force_decode_ids(self, source_ids: list[int], target: str, *, attention_include: Sequence[str] = ("cross",),
                         target_prefix: Sequence[int] = ()) -> ForcedDecoding:
        """force_decode() on the encoder's ids of the source (target_prefix: the ids before the target's)."""
        [forced] = self.force_decode_many([source_ids], [target], attention_include=attention_include,
                                          target_prefixes=[target_prefix])
        return forced

    @torch.inference_mode()
    def force_decode_many(self, sources: Sequence[Sequence[int]], targets: Sequence[str], *,
                          attention_include: Sequence[str] = ("cross",), target_prefixes: Sequence[Sequence[int]] | None = None,
                          scores: bool = True) -> list[ForcedDecoding]:
        """force_decode_ids() of several translations in one padded pass: each weight is read once for
        all of them, where one at a time reads every weight per sentence. scores=False: the attention
        only (no log-probs, and no output layer)."""
        self._check_include(attention_include)
        prefixes = target_prefixes or [()] * len(sources)
        target_ids = [list(prefix) + self.tgt_tokenizer.encode(target) for prefix, target in zip(prefixes, targets)]
        forced = self._teacher_forced(self._pad(sources), target_ids, attention_include, scores=scores)
        return [ForcedDecoding(target, log_probs, float(sum(log_probs)) if scores else None, attention)
                for target, (log_probs, attention) in zip(targets, forced)]

    @torch.inference_mode()
    def score_tokens(self, src_ids: list[int], target_ids: list[int], max_length: int | None = None) -> float:
        """Sum of log-probs of target_ids + eos given source ids: what a search's score is. max_length: the
        search's limit, where eos costs nothing (search.AT_MAX_EOS)."""
        [(log_probs, _)] = self._teacher_forced(self._pad([src_ids]), [target_ids], ())
        return float(sum(log_probs[:-1] if len(log_probs) == max_length else log_probs))
