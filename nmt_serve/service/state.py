"""What the routers share: settings, metrics, the engine (through its client) and the models it serves."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from nmt_serve.service.directions import Pivot, ServedDirection, named
from nmt_serve.service.errors import bad_request, not_ready
from nmt_serve.service.glossary_store import GlossaryStore
from nmt_serve.service.jobs_store import default_directory
from nmt_serve.service.limits import RequestLimits
from nmt_serve.service.metrics import Metrics
from nmt_serve.service.security import KeyChecker, RateLimiter
from nmt_serve.service.settings import Settings
from nmt_serve.service.translation_cache import TranslationCache

if TYPE_CHECKING:
    from nmt_serve.engine.supervisor import EngineSupervisor
    from nmt_serve.service.engine_client import EngineClient
    from nmt_serve.text.language_detection import LanguageDetector


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedDirection] = field(default_factory=dict)
    pivots: dict[str, Pivot] = field(default_factory=dict)  # directions no model serves, through Settings.pivot_language
    unloaded: list[dict] = field(default_factory=list)  # the engine's checkpoints left unloaded, and why
    engine: "EngineClient | None" = None
    supervisors: "list[EngineSupervisor]" = field(default_factory=list)  # when this process started the engines
    draining: bool = False  # SIGTERM: readiness 503, in-flight requests finish
    load_error: str | None = None
    keys: KeyChecker = None  # type: ignore[assignment]
    rate_limiter: RateLimiter = None  # type: ignore[assignment]
    limits: RequestLimits = None  # type: ignore[assignment]
    names: dict[str, str] = field(default_factory=dict)  # a model's own language code -> the service's name for it
    translation_cache: TranslationCache = None  # type: ignore[assignment]
    glossaries: GlossaryStore = None  # type: ignore[assignment]
    listing: object = None  # model_listing.Listing: GET /v1/models' whole body, kept while these models are served
    # (sorted directions, source languages, target languages) of `models`, and the dict they were read from
    _served: tuple = field(default=((), frozenset(), frozenset()), init=False, repr=False)
    _served_of: dict | None = field(default=None, init=False, repr=False)
    _health: dict = field(default_factory=dict, init=False, repr=False)  # status -> /health's body for `_served_of`

    def __post_init__(self) -> None:
        self.translation_cache = TranslationCache(self.settings.api_cache_entries)
        # beside the jobs, on the volume they are kept on: every worker and replica sees the same glossaries
        self.glossaries = GlossaryStore(Path(self.settings.jobs_dir or default_directory()) / "glossaries")
        self.keys = KeyChecker(self.settings.keys())
        self.rate_limiter = RateLimiter(self.settings.rate_limit_per_minute)
        self.limits = RequestLimits(self.settings)

    @property
    def supervisor(self) -> "EngineSupervisor | None":
        """The first engine's supervisor, when this process started the engines."""
        return self.supervisors[0] if self.supervisors else None

    @property
    def ready(self) -> bool:
        return not self.draining and self.engine is not None and self.engine.ready and bool(self.models)

    def require_ready(self) -> "EngineClient":
        if not self.ready:
            raise not_ready(self.unready_reason())
        return self.engine

    def unready_reason(self) -> str:
        """Why the service does not translate now, for a 503 (the cause of a load failure, with file names,
        is in the server log, not in a public response)."""
        if self.load_error:
            return "model loading failed; see the server log"
        if self.draining:
            return "the server is shutting down"
        engines = self.engine.engines if self.engine is not None else None
        restarting = engines is not None and engines.losses
        reason = "the engine is restarting" if restarting else "models are still loading"
        # how far a starting engine is: which model it reads, and for how long (a large one takes minutes)
        status = engines.status if engines is not None else None
        if status is not None and not status.ready and status.loading is not None:
            reason += f" ({status.loading.describe()})"
        return reason

    def _facts(self) -> tuple:
        """What requests read of the served models, made once per set of them: NLLB-200 serves 40,602
        directions, and a set of their languages took 3 ms, several times a request."""
        if self._served_of is not self.models:
            models = self.models
            self._served = (sorted(models), frozenset(m.source for m in models.values()), frozenset(m.target for m in models.values()))
            self._served_of = models
            self._health = {}
        return self._served

    def health_body(self, status: str) -> bytes:
        """/health's JSON ({"status", "models": the served directions}), made once per set of models and status:
        for NLLB-200's 40,602 directions it is 655 kB, validated and written at every probe before (a call took
        3.0-4.1 ms, 0.7-1.1 ms since)."""
        directions = self.directions
        body = self._health.get(status)
        if body is None:
            body = self._health[status] = json.dumps({"status": status, "models": directions}, ensure_ascii=False,
                                                     separators=(",", ":")).encode()
        return body

    @property
    def directions(self) -> list[str]:
        """The served directions, sorted."""
        return self._facts()[0]

    @property
    def sources(self) -> frozenset[str]:
        """The languages some served model translates from."""
        return self._facts()[1]

    @property
    def targets(self) -> frozenset[str]:
        """The languages some served model translates into."""
        return self._facts()[2]

    def language(self, name: str) -> str:
        """The service's name of a language named as a user may name it (`deu_Latn`, `de_DE`, `DE` -> `de`);
        a name no model knows as given (for the error that names it)."""
        return named(self.names, name)

    def to_itself(self, source: str, target: str) -> bool:
        """A served language named as both source and target: the text is given back as it is (as
        LibreTranslate does), with no model."""
        source, target = self.language(source), self.language(target)
        return source == target and (source in self.sources or source in self.targets)

    def model_for(self, source: str, target: str) -> ServedDirection:
        """The model that translates source into target itself; 400 where none does (a direction served through
        the pivot language names it: what needs one model, as a glossary or attention maps, cannot take it)."""
        source, target = self.language(source), self.language(target)
        model = self.models.get(f"{source}-{target}")
        if model is None:
            pivot = self.pivots.get(f"{source}-{target}")
            if pivot is not None:
                raise bad_request(f"no model translates {source}->{target} itself (it is translated through {pivot.through}, "
                                  f"by {pivot.first.id} and {pivot.second.id}): this needs one model; "
                                  f"direct pairs: {capped(self.directions)}", "target")
            # those from the asked source first: with many directions, the list is cut after a few
            pairs = capped(sorted(self.directions, key=lambda d: not d.startswith(f"{source}-"))) or "none loaded yet"
            if self.pivots:
                pairs += f"; through {next(iter(self.pivots.values())).through}: {capped(sorted(self.pivots))}"
            # the parameter to change: the target when some model reads this source
            param = "target" if source in self.sources else "source"
            raise bad_request(f"no model for {source}->{target}; supported pairs: {pairs}", param)
        return model

    def route(self, source: str, target: str) -> ServedDirection | Pivot:
        """What translates source into target: its model, else the two through the pivot language; 400 where
        neither is served."""
        pivot = self.pivots.get(f"{self.language(source)}-{self.language(target)}")
        return pivot if pivot is not None else self.model_for(source, target)

    def detector(self) -> "LanguageDetector":
        """The language detector over the served source languages (built once per set of languages); 400
        when the server runs without detection (Settings.language_detection)."""
        if not self.settings.language_detection:
            raise bad_request('language detection is off on this server: name the source language instead of "auto"', "source")
        from nmt_serve.text.language_detection import detector_for

        return detector_for(self.sources, self.settings.language_detection_accuracy)


def capped(names: list[str], shown: int = 24) -> str:
    """Names for a message or a log line, at most `shown` of them and then their count: NLLB-200's 40,602
    directions would make one 600 kB."""
    return ", ".join(names[:shown]) + (f", ... ({len(names)} in all)" if len(names) > shown else "")
