"""What the API processes and the engine process say to each other over ZeroMQ.

Calls go API -> engine on a DEALER/ROUTER pair, each with an id; the engine answers each call once
with a Reply carrying that id. A message holds one or more of them, a pickled call or reply per frame:
the calls an API process made in one turn of its event loop, the replies to one caller of one round of
the engine's loop (fewer messages: each costs both ends' ZeroMQ and the engine's I/O thread far more
than a frame). The engine also publishes an EngineStatus a few times a second on a
PUB socket: readiness (while it starts, how far it is), the loaded models, its incarnation (a new one
after every restart, so a client knows that calls sent to the previous one are lost) and the statistics
for /metrics. Messages are pickled dataclasses: both ends are processes of this service, on sockets in a
private directory.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from typing import Any

# Reply.error kinds; the API maps them to HTTP statuses
REFUSED = "refused"  # admission: the work ahead would not finish before the deadline (503 + Retry-After)
EXPIRED = "expired"  # the deadline passed before the result (504)
OUT_OF_MEMORY = "out_of_memory"  # the device ran out of memory (503)
INVALID = "invalid"  # the input cannot be translated as asked (400)
FAILED = "failed"  # anything else (500)
SHUTTING_DOWN = "shutting_down"  # the engine stops (503)

# Translate.priority: a background call (a job's chunk) waits while interactive sentences wait, takes at
# most a bounded share of the running rows (EngineConfig.background_share), and its admitted work is not
# counted ahead of interactive calls (admission.py)
INTERACTIVE = 0
BACKGROUND = 1


@dataclass(frozen=True)
class DecodeOptions:
    """Options of one translate call (sentences with the same beam size and min length share rows)."""

    beam_size: int = 4
    num_hypotheses: int = 1
    max_length: int | None = None
    length_penalty: float = 1.0
    return_scores: bool = False
    # the search keeps the cross-attention's source entropy of each translation (the `detached` check's
    # number, as an Attention call's source_entropy), eager search and device search alike
    return_source_entropy: bool = False
    # and each translation's alignment (what an Attention call's alignment, source_tokens and target_tokens give), the same way
    return_alignment: bool = False


@dataclass
class EngineHypothesis:
    """One translation of one text (plain data: the API process needs no torch to read it)."""

    text: str
    score: float | None = None  # sum of token log-probs, eos included (return_scores)
    normalized_score: float | None = None  # score / length ** length_penalty (return_scores)
    tokens: int = 0  # generated tokens, eos excluded
    truncated: bool = False  # stopped by max_length, not by the model's eos
    constraint_unmet: bool = False  # its terms did not all fit within max_length: this is the free translation
    source_entropy: float | None = None  # DecodeOptions.return_source_entropy, where the search kept it
    # DecodeOptions.return_alignment, where the search kept it: per target piece (the target prefix's and eos
    # included) the source piece it attends most, and the pieces themselves (the source's as the model read it)
    alignment: list[int] | None = None
    source_pieces: list[str] | None = None
    target_pieces: list[str] | None = None
    # where glossary terms were placed (the model's free translation lacked them): that free translation's
    # log-prob per token (eos included), the model's own certainty about the source, which the forced terms
    # do not lower; and the log-prob given up per term against it (text/quality_flags.py: constraint_strained)
    free_mean_logprob: float | None = None
    constraint_cost: float | None = None


@dataclass
class Translate:
    id: str  # unique per API process: "<pid>-<client>-<n>"
    model: str  # the engine's model id: "de-en", or a multilingual checkpoint's name
    sources: list[list[int]]  # per text its source ids, eos excluded, a multilingual model's target tag first (the API
    # tokenized it to check its limits)
    options: DecodeOptions
    deadline: float  # time.monotonic() (system-wide on Linux): after it nobody waits for the result
    target_prefix: list[int] = field(default_factory=list)  # ids every translation starts with (a fairseq-family
    # model's target language code: input_processor.py), not part of the text returned
    priority: int = INTERACTIVE  # or BACKGROUND
    # terminology: per source, the target terms its translation must contain (a glossary's entries whose source term
    # it holds), and for every source the terms none may contain; the engine tokenizes them with the target side's
    # tokenizer. A source with terms is translated by constrained beam search (lexical_constraints.py).
    terms: list[list[str]] | None = None
    avoid: list[str] = field(default_factory=list)


@dataclass
class Attention:
    """Attention maps of a translation (or of a given target_text, by forced decoding)."""

    id: str
    model: str
    source: list[int]  # the source's ids as for Translate (the API tokenized it: input_processor.py)
    target_text: str | None
    beam_size: int
    include: tuple[str, ...]
    layers: list[int]
    heads: list[int]
    encoder_layers: list[int]
    average_heads: bool
    deadline: float
    target_prefix: list[int] = field(default_factory=list)  # as Translate's
    score: bool = True  # False: the forced decoding's score is not wanted (the engine skips the output layer)


@dataclass
class Cancel:
    id: str  # the caller gave up (timeout, client disconnected): drop its sentences


@dataclass
class Reply:
    id: str
    value: Any = None  # translate: per text its n-best list[EngineHypothesis], best first; attention: a dict
    error: str | None = None  # one of the kinds above
    message: str = ""
    retry_after: float | None = None
    param: str | None = None  # invalid: the request parameter at fault where it is not the text


@dataclass
class StartupProgress:
    """Where a starting engine is, repeated in its statuses until it serves."""
    phase: str  # one of STARTUP_PHASES
    seconds: float  # since the engine process began its start-up (process.run)
    model: str | None = None  # loading: the model being loaded
    models_loaded: int = 0
    models_total: int = 0  # 0 until the models are chosen

    def describe(self) -> str:
        """For people: "loading de-en, model 2 of 12; started 14.2 s ago"."""
        what = self.phase
        if self.phase == "loading" and self.model is not None:
            what = f"loading {self.model}, model {self.models_loaded + 1} of {self.models_total}"
        return f"{what}; started {self.seconds:.1f} s ago"


# in order: the interpreter and torch; choosing the models and planning their memory; reading their weights;
# capturing the device searches (CUDA); their first translations (and the admission rate's calibration)
STARTUP_PHASES = ("starting", "planning", "loading", "capturing", "first runs")


@dataclass
class EngineStatus:
    incarnation: str
    ready: bool
    models: list[dict] = field(default_factory=list)  # id, source, target, parameters, device, dtype, ...
    load_error: str | None = None
    stats: dict[str, float] = field(default_factory=dict)
    model_stats: dict[str, dict[str, float]] = field(default_factory=dict)  # per model id: tokens, sentences
    unloaded: list[dict] = field(default_factory=list)  # checkpoints left unloaded and why (loader.LoadPlan)
    # the process that made it (statuses are made only in the engine process): the API watches it, so
    # that an engine that exits is noticed at once and a slow one is not taken for a dead one
    pid: int = field(default_factory=os.getpid)
    loading: StartupProgress | None = None  # not ready and not failed: how far its start-up is


def dumps(message: Any) -> bytes:
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Any:
    return pickle.loads(data)
