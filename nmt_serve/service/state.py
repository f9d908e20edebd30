"""What the routers share: settings, metrics, the engine (through its client) and the models it serves."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nmt_serve.service.directions import ServedDirection
from nmt_serve.service.errors import bad_request, not_ready, too_large
from nmt_serve.service.metrics import Metrics
from nmt_serve.service.security import KeyChecker, RateLimiter
from nmt_serve.service.settings import Settings

if TYPE_CHECKING:
    from nmt_serve.engine.supervisor import EngineSupervisor
    from nmt_serve.service.engine_client import EngineClient
    from nmt_serve.text.language_detection import LanguageDetector


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, ServedDirection] = field(default_factory=dict)
    engine: "EngineClient | None" = None
    supervisor: "EngineSupervisor | None" = None  # when this process started the engine
    draining: bool = False  # SIGTERM: readiness 503, in-flight requests finish
    load_error: str | None = None
    keys: KeyChecker = None  # type: ignore[assignment]
    rate_limiter: RateLimiter = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        self.keys = KeyChecker(self.settings.keys())
        self.rate_limiter = RateLimiter(self.settings.rate_limit_per_minute)

    @property
    def ready(self) -> bool:
        return not self.draining and self.engine is not None and self.engine.ready and bool(self.models)

    def require_ready(self) -> "EngineClient":
        if not self.ready:
            if self.engine is not None and self.engine.connection.losses and not self.engine.connection.ready:
                raise not_ready("the engine is restarting")
            raise not_ready()
        return self.engine

    def model_for(self, source: str, target: str) -> ServedDirection:
        model = self.models.get(f"{source}-{target}")
        if model is None:
            pairs = ", ".join(sorted(self.models)) or "none loaded yet"
            raise bad_request(f"no model for {source}->{target}; supported pairs: {pairs}", "source")
        return model

    def detector(self) -> "LanguageDetector":
        """The language detector over the served source languages (built once per set of languages)."""
        from nmt_serve.text.language_detection import detector_for

        return detector_for(frozenset(m.source for m in self.models.values()))

    def check_sizes(self, texts: list[str], param: str = "text") -> None:
        """The limits known before tokenizing: how many texts, how many characters each."""
        s = self.settings
        if not texts:
            raise bad_request("the list of texts is empty", param)
        if len(texts) > s.max_texts_per_request:
            raise too_large(f"{len(texts)} texts in one request; the limit is {s.max_texts_per_request}", param)
        for i, text in enumerate(texts):
            if len(text) > s.max_chars_per_text:
                raise too_large(f"text {i} has {len(text)} characters; the limit is {s.max_chars_per_text}", param)

    def check_texts(self, model: ServedDirection, texts: list[str], param: str = "text") -> list[list[int]]:
        """Apply the per-request limits; return each text's source ids (eos excluded)."""
        s = self.settings
        self.check_sizes(texts, param)
        sources = []
        for i, text in enumerate(texts):
            ids = model.encode(text)
            if len(ids) > s.max_tokens_per_text:
                raise too_large(f"text {i} has {len(ids)} tokens; the limit is {s.max_tokens_per_text}", param)
            sources.append(ids)
        return sources
