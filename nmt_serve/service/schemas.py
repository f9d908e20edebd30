"""Request and response bodies (pydantic), kept apart from the engine."""
from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from nmt_serve.service.limits import unpaired_surrogate

if TYPE_CHECKING:
    from nmt_serve.service.pipeline import TextResult


def _integral(value):
    # JSON Schema's integer includes 4.0; a strict int alone would refuse it
    return int(value) if isinstance(value, float) and value.is_integer() else value


# an integer as the schema says one: 4 or 4.0, never "4" or true (which lax validation would coerce); the
# bound of an optional one goes inside (outside, pydantic writes it to the schema as "ge", unread)
Integer = Annotated[int, Field(strict=True), BeforeValidator(_integral)]
PositiveInteger = Annotated[int, Field(strict=True, ge=1), BeforeValidator(_integral)]


class RequestBody(BaseModel):
    """A request body: every string in it valid Unicode, or a 422 naming the field (a lone surrogate would
    fail deep in the segmenter, the tokenizer or the response's encoder)."""

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value):
        if problem := unpaired_surrogate(value):
            raise ValueError(f"the value {problem}")
        return value


class GlossaryTerm(RequestBody):
    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, max_length=200, description="the term as it occurs in the source text")
    target: str = Field(min_length=1, max_length=200, description="its translation, placed as written")


class WithTerminology(RequestBody):
    """The terminology options, the same for a translation and a job."""

    glossary: list[GlossaryTerm] | None = Field(
        None, max_length=64, description="terminology: where an entry's source term occurs in a sentence (case- and "
        "inflection-tolerant: README, terminology), its target term appears in that sentence's translation, as written "
        "(constrained beam search, at least 2 beams). A term that cannot be placed within max_length leaves that "
        "sentence's free translation, flagged constraint_unmet; one the model cannot fit well is placed and flagged "
        "constraint_strained")
    avoid: list[Annotated[str, Field(min_length=1, max_length=200)]] | None = Field(
        None, max_length=64, description="target terms no translation may contain (as they tokenize when written)")
    glossary_id: str | None = Field(None, pattern="^[0-9a-f]{32}$", description="a stored glossary's entries as the "
                                    "glossary (POST /v1/glossaries): its source and target languages must be the "
                                    "request's; instead of `glossary`, not beside it")


class TranslateRequest(WithTerminology):
    # the options are strict (Integer, strict=True): a value of another type than the schema's (return_scores:
    # 0, beam_size: "4") is refused, not coerced; the limits a server is started with are in its OpenAPI
    # schema (docs.document_limits)
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"text": ["Ein Hund rennt über die Wiese.", "Zwei Kinder spielen."], "source": "de", "target": "en", "beam_size": 4}]},
    )
    text: str | list[str] = Field(description="one text or a list of texts: sentences, paragraphs or (format html) HTML")
    source: str = Field("de", description='source language code, or "auto" to detect it (per text)')
    target: str = Field("en", description="target language code")
    format: Literal["text", "html"] = Field("text", description="html: translate the text between tags, keep the markup")
    split_sentences: bool = Field(True, strict=True, description="cut each text into sentences and translate them apart (the models "
                                                    "were trained on sentences); false: each text is one unit")
    beam_size: Integer = Field(4, ge=1, description="1 = greedy")
    num_hypotheses: Integer = Field(1, ge=1, description="n-best size (a larger one than beam_size widens the beam to it)")
    max_length: PositiveInteger | None = Field(None, description="cap on generated tokens; default 1.5 x source + 10")
    length_penalty: float = Field(1.0, ge=0.0, le=5.0, allow_inf_nan=False, strict=True)
    return_scores: bool = Field(False, strict=True)


class Hypothesis(BaseModel):
    text: str
    score: float | None = None


class DetectedLanguage(BaseModel):
    language: str
    confidence: float = Field(description="0..1")


class SentenceFlag(BaseModel):
    sentence: int = Field(description="index of the sentence in its text")
    source: str
    text: str = Field(description="its translation")
    flags: list[str] = Field(description="repetition, length_ratio, copied_source, truncated, split, long, low_confidence, "
                                         "detached, constraint_unmet, constraint_strained "
                                         "(README: quality flags)")
    direction: str | None = Field(None, description="a text translated through the pivot language: the hop this sentence is "
                                                    "of (de-en, its source the text's; en-fr, its source the first hop's "
                                                    "English), each hop's sentences numbered from 0; absent otherwise")


class Translation(BaseModel):
    text: str
    score: float | None = Field(None, description="sum of token log-probabilities (return_scores)")
    normalized_score: float | None = Field(None, description="score / length ** length_penalty (return_scores)")
    hypotheses: list[Hypothesis] | None = Field(None, description="n-best list, best first (num_hypotheses > 1)")
    detected_language: DetectedLanguage | None = Field(None, description='the source language found (source "auto")')
    flags: list[SentenceFlag] | None = Field(None, description="sentences whose translation is doubtful, and why")
    error: str | None = Field(None, description="in a job's result only: why this text could not be translated (with "
                                                "source auto, no served language found in it; past a length limit), "
                                                "given back as it is while the job's other texts go on")

    @classmethod
    def of(cls, result: TextResult, num_hypotheses: int) -> Translation:
        """One text's translation as /v1/translate and a job's result show it."""
        return cls(
            text=result.text, score=result.score, normalized_score=result.normalized_score,
            hypotheses=[Hypothesis(text=t, score=sc) for t, sc in zip([result.text, *result.alternatives], result.hypothesis_scores)]
            if num_hypotheses > 1 else None,
            detected_language=DetectedLanguage(language=result.detected.language, confidence=round(result.detected.confidence, 4))
            if result.detected else None,
            flags=[SentenceFlag(sentence=f.sentence, source=f.source, text=f.text, flags=list(f.flags), direction=f.direction)
                   for f in result.flags] or None,
            error=result.error,
        )


class Usage(BaseModel):
    source_tokens: int
    generated_tokens: int
    sentences: int = Field(0, description="sentences translated (texts are cut into sentences)")


class TranslateResponse(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"model": "de-en", "translations": [{"text": "A dog runs across the meadow."}], "usage": {"source_tokens": 9, "generated_tokens": 8}}]}
    )
    model: str = Field(description="the model that translated: its pair (de-en), or its checkpoint's name where it is "
                                   "multilingual or another checkpoint has the same pair; "
                                   "comma-separated when texts of one request (source auto) went to several")
    translations: list[Translation]
    usage: Usage


AttentionKind = Literal["cross", "decoder_self", "encoder_self"]


class AttentionRequest(RequestBody):
    # strict as TranslateRequest
    model_config = ConfigDict(
        extra="forbid", strict=True,
        json_schema_extra={"examples": [{"text": "Ein Hund rennt über die Wiese.", "source": "de", "target": "en", "include": ["cross"], "layers": [2], "average_heads": True}]},
    )
    text: str = Field(min_length=1, description="source text")
    source: str = "de"
    target: str = "en"
    target_text: str | None = Field(None, description="a given translation to explain (forced decoding) instead of searching")
    beam_size: Integer = Field(4, ge=1, description="search used when target_text is not given")
    layers: list[Integer] | None = Field(None, min_length=1, description="layer indices to return (default all): "
                                                                         "0 to the model's decoder layers - 1 (/v1/models)")
    heads: list[Integer] | None = Field(None, min_length=1, description="head indices to return (default all): "
                                                                        "0 to the model's heads - 1")
    include: list[AttentionKind] = Field(default_factory=lambda: ["cross"])
    average_heads: bool = Field(False, description="one map per layer: the mean over the selected heads")


class AttentionResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "model": "de-en", "source_tokens": ["▁Ein", "▁Hund", "</s>"], "target_tokens": ["▁A", "▁dog", "</s>"],
        "translation": "A dog", "score": -1.2, "layers": [2], "heads": None, "num_layers": 3, "num_heads": 4,
        "cross": [[[[0.9, 0.08, 0.02], [0.1, 0.85, 0.05], [0.05, 0.1, 0.85]]]], "alignment": [0, 1, 2], "source_entropy": 0.31,
    }]})
    model: str
    source_tokens: list[str] = Field(description="source pieces, end-of-sentence included")
    target_tokens: list[str] = Field(description="target pieces, end-of-sentence included; row t produced target_tokens[t]")
    translation: str
    score: float = Field(description="sum of target token log-probabilities")
    layers: list[int]
    heads: list[int] | None = Field(None, description="head indices; absent when averaged (average_heads)")
    num_layers: int
    num_heads: int
    cross: list[list[list[list[float]]]] | None = Field(None, description="cross[layer][head][target][source]")
    decoder_self: list[list[list[list[float]]]] | None = Field(None, description="decoder_self[layer][head][target][target]")
    encoder_self: list[list[list[list[float]]]] | None = Field(None, description="encoder_self[layer][head][source][source]")
    alignment: list[int] = Field(description="for each target token, the most-attended source token (cross attention, selected layers and heads averaged)")
    source_entropy: float = Field(description="how spread the cross attention (all layers and heads averaged) is over the source's "
                                              "own pieces, 0 (each target token looks at one) to 1 (at all alike): what the "
                                              "`detached` quality flag reads (README: quality flags)")


class ModelInfo(BaseModel):
    id: str = Field(description="the direction, source-target: what `source` and `target` of a request pick")
    source: str
    target: str
    model: str = Field(description="the checkpoint serving it: its pair (de-en), or its name where it is multilingual "
                                   "(several directions from one set of weights) or another checkpoint has the same pair")
    multilingual: bool = False
    test_bleu: float | None = Field(None, description="the model's recorded sacreBLEU for this direction on "
                                                      "Multi30k test_2016_flickr, beam 4 (its model card), if measured")
    test_scores: dict[str, float] = Field(default_factory=dict, description="the model's recorded sacreBLEU for this direction "
                                          "on every test set its card measured ({test set: BLEU}, beam 4): what routing compares")
    quality_flags: dict[str, float] = Field(default_factory=dict, description="the thresholds of the flags that read the "
                                            "model's own signals (min_mean_logprob, max_source_entropy, attention_check_below), "
                                            "measured on its validation sentences; empty: the service's defaults (README: quality flags)")
    parameters: int
    decode_cost: int = Field(0, description="multiply-adds per generated token (its layers' weights and the output layer): "
                                            "on CPU a model over cpu_cost_limit times the cheapest one of a direction does not serve it")
    device: str
    dtype: str
    attention: str | None = Field(None, description="attention kernels in order of preference, e.g. sdpa:flash,efficient,math "
                                                    "on CUDA, sdpa:cpu-default on CPU")
    quantization: str = Field(description="none, or int8 (quantized Linear layers in search)")
    step_mode: str = Field(description="auto, eager or static (see the step_mode setting)")
    static_decoder: dict | None = Field(None, description="the static decoder's memory, when it is in use: buffers_bytes, "
                                                          "graphs (captured CUDA graphs) and graph_pool_bytes")
    memory: dict | None = Field(None, description="the memory plan it was loaded under (NMT_MEMORY_BUDGET_GB): weights_bytes "
                                                  "(an engine's part: its packed copies, and of the rest its share where "
                                                  "weights_shared_by engines map one copy), max_length, per start-up beam size "
                                                  "its rows and bytes, running_sentences, budget_bytes and budget_source, "
                                                  "planned_bytes_all_models, engines (the server's engine processes: each "
                                                  "holds all of this), and on a GPU device_reserved_bytes (what torch holds "
                                                  "there now)")
    shared_weights_bytes: int = Field(0, description="of its weights, the bytes every engine maps from one copy (the "
                                                     "shared_weights setting: two or more engines on the CPU); 0: none")
    load_seconds: float | None = Field(None, description="how long loading the checkpoint took")
    path: str


class UnloadedCheckpoint(BaseModel):
    model: str = Field(description="the checkpoint's model name (its pair, or its directory's name)")
    path: str
    directions: list[str] = Field(description="the directions it could serve (the first 64)")
    direction_count: int = Field(description="how many directions it could serve")
    served_by: list[str] = Field(description="the models that serve them instead")
    reason: str = Field(description="why they do: a preferred model (the prefer setting), better recorded test scores, "
                                    "or on CPU a work per token over cpu_cost_limit")


class PivotDirection(BaseModel):
    id: str = Field(description="a direction no model translates itself: what `source` and `target` of a request pick")
    source: str
    target: str
    through: str = Field(description="the language it is translated through (the pivot_language setting)")
    models: list[str] = Field(description="the models of the two translations, source->through then through->target")


class ModelList(BaseModel):
    models: list[ModelInfo]
    pivots: list[PivotDirection] = Field(default_factory=list, description="the directions translated through the pivot "
                                         "language: twice the work, and the first translation's errors carry into the second")
    unloaded: list[UnloadedCheckpoint] = Field(default_factory=list, description="the checkpoints of the models "
                                               "directory that serve no direction, left unloaded, and why")


class Health(BaseModel):
    status: str
    models: list[str] = []


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


JobState = Literal["queued", "running", "done", "failed", "cancelled"]


class JobRequest(WithTerminology):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"q": ["Ein Hund rennt über die Wiese.", "Zwei Kinder spielen."], "source": "de", "target": "en"}]},
    )
    q: list[str] = Field(min_length=1, description="the texts, translated in the background (up to max_job_texts, each up to "
                                                   "max_chars_per_text characters); the result keeps their order")
    source: str = Field("de", description='source language code, or "auto" to detect it (per text)')
    target: str = Field("en", description="target language code")
    format: Literal["text", "html"] = "text"
    split_sentences: bool = Field(True, strict=True)
    beam_size: Integer = Field(4, ge=1)
    num_hypotheses: Integer = Field(1, ge=1)
    max_length: PositiveInteger | None = None
    length_penalty: float = Field(1.0, ge=0.0, le=5.0, allow_inf_nan=False, strict=True)
    return_scores: bool = Field(False, strict=True)


class JobStatus(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": "5f0c9d3e8a7b41c2a1d4e6f8b9c0d1e2", "state": "running", "source": "de", "target": "en", "file_name": None,
        "done": 1280, "total": 20000, "sentences_done": 1302, "percent": 6.4, "eta_seconds": 212.5,
        "created_at": 1795500000.0, "started_at": 1795500000.1, "updated_at": 1795500014.3, "finished_at": None,
        "expires_at": None, "error": None, "not_translated": 0}]})
    id: str
    state: JobState = Field(description="queued, running, done, failed or cancelled")
    source: str = Field(description='the source language as asked ("auto": detected per text)')
    target: str
    file_name: str | None = Field(None, description="a file job's file (its result is the file translated); null for texts")
    done: int = Field(description="texts translated, their results kept (a text counts once its chunk is written)")
    total: int = Field(description="texts in the job")
    sentences_done: int = Field(description="sentences translated (texts are cut into sentences)")
    percent: float
    eta_seconds: float | None = Field(None, description="at the rate of this run so far (null until a chunk is done)")
    created_at: float = Field(description="Unix time")
    started_at: float | None = None
    updated_at: float = Field(description="last written; moves at least every second while the job runs")
    finished_at: float | None = None
    expires_at: float | None = Field(None, description="Unix time at which the finished job and its results are removed "
                                                       "(finished_at + job_ttl_s, or when DELETE removed it; from then on "
                                                       "404); null until it ends")
    error: str | None = Field(None, description="why it failed")
    not_translated: int = Field(0, description="texts given back as they are, each with its error in the result "
                                               "(Translation.error): the job goes on without them")

    @classmethod
    def of(cls, record: dict) -> JobStatus:
        """A job's record (jobs_store.py) as GET /v1/jobs/{id} shows it; the ETA at the rate of this run."""
        done, total = record["done"], record["total"]
        eta = None
        if record["state"] == "running" and record["resumed_at"]:
            rate = (done - record["done_at_resume"]) / max(record["updated_at"] - record["resumed_at"], 1e-9)
            eta = round((total - done) / rate, 1) if rate > 0 else None
        return cls(id=record["id"], state=record["state"], source=record["source"], target=record["target"],
                   file_name=record.get("file_name"), done=done, total=total, sentences_done=record["sentences"],
                   percent=round(100.0 * done / total, 2) if total else 100.0, eta_seconds=eta, created_at=record["created_at"],
                   started_at=record["started_at"], updated_at=record["updated_at"], finished_at=record["finished_at"],
                   expires_at=record.get("expires_at"), error=record["error"], not_translated=record.get("not_translated", 0))


class GlossaryCreate(RequestBody):
    """POST /v1/glossaries: a glossary to keep, its entries as a list or as tab-separated lines."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "Tiere", "source": "de", "target": "en", "entries": [{"source": "Hund", "target": "hound"}]},
        {"name": "Tiere", "source": "de", "target": "en", "entries_tsv": "Hund\thound\nKatze\tfeline\n"}]})
    name: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, description="source language code (not auto)")
    target: str = Field(min_length=1)
    entries: list[GlossaryTerm] | None = Field(None, description="the entries (at most max_glossary_entries)")
    entries_tsv: str | None = Field(None, description="or the entries as lines of `source<TAB>target` (DeepL's TSV)")


class GlossaryInfo(BaseModel):
    id: str
    name: str
    source: str
    target: str
    entry_count: int
    created_at: float = Field(description="Unix time")


class GlossaryList(BaseModel):
    glossaries: list[GlossaryInfo] = Field(description="the caller's glossaries, the newest first")


class GlossaryEntries(BaseModel):
    id: str
    entries: list[GlossaryTerm]


class JobList(BaseModel):
    """GET /v1/jobs: the caller's jobs, the newest first."""

    jobs: list[JobStatus]
    has_more: bool = Field(description="older jobs follow: ask again with before=<the last job's id>")


class JobResult(BaseModel):
    id: str
    model: str = Field(description="the models that translated, comma-separated")
    translations: list[Translation] = Field(description="one per text of q, in its order")
    usage: Usage
