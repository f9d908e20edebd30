"""What the routers share: settings, metrics, the loaded models and the batcher."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from .batcher import Batcher
from .errors import bad_request, not_ready, too_large
from .metrics import Metrics
from .models import LoadedModel
from .settings import Settings

if TYPE_CHECKING:
    from .security import KeyChecker, RateLimiter


@dataclass
class ServiceState:
    settings: Settings
    metrics: Metrics = field(default_factory=Metrics)
    models: dict[str, LoadedModel] = field(default_factory=dict)
    batcher: Batcher | None = None
    ready: bool = False
    load_error: str | None = None
    keys: "KeyChecker" = None  # type: ignore[assignment]
    rate_limiter: "RateLimiter" = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        from .security import KeyChecker, RateLimiter

        self.keys = KeyChecker(self.settings.keys())
        self.rate_limiter = RateLimiter(self.settings.rate_limit_per_minute)

    def require_ready(self) -> Batcher:
        if not self.ready or self.batcher is None:
            raise not_ready()
        return self.batcher

    def model_for(self, source: str, target: str) -> LoadedModel:
        model = self.models.get(f"{source}-{target}")
        if model is None:
            pairs = ", ".join(sorted(self.models)) or "none loaded yet"
            raise bad_request(f"no model for {source}->{target}; supported pairs: {pairs}", "source")
        return model

    def check_texts(self, model: LoadedModel, texts: list[str], param: str = "text") -> list[int]:
        """Apply the per-request limits; return each text's source token count."""
        s = self.settings
        if not texts:
            raise bad_request("the list of texts is empty", param)
        if len(texts) > s.max_texts_per_request:
            raise too_large(f"{len(texts)} texts in one request; the limit is {s.max_texts_per_request}", param)
        counts = []
        for i, text in enumerate(texts):
            if len(text) > s.max_chars_per_text:
                raise too_large(f"text {i} has {len(text)} characters; the limit is {s.max_chars_per_text}", param)
            n = model.translator.count_tokens(text)
            if n > s.max_tokens_per_text:
                raise too_large(f"text {i} has {n} tokens; the limit is {s.max_tokens_per_text}", param)
            counts.append(n)
        return counts


def get_state(request: Request) -> ServiceState:
    return request.app.state.service
