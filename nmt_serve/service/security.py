"""Access control: optional API keys (constant-time comparison) and a per-key rate limit."""
from __future__ import annotations

import hashlib
import hmac
import math
import threading
import time

from fastapi import Request

from nmt_serve.service.errors import APIError


def unauthorized(message: str = "a valid API key is required: send 'Authorization: Bearer <key>'") -> APIError:
    return APIError(401, "unauthorized", message, None, {"WWW-Authenticate": "Bearer"})


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class KeyChecker:
    """Holds digests of the configured keys; every comparison runs over all of them in constant time."""

    def __init__(self, keys: list[str]):
        self.digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def valid(self, candidate: str | None) -> bool:
        if candidate is None:
            return False
        digest = hashlib.sha256(candidate.encode()).digest()
        found = False
        for known in self.digests:
            found |= hmac.compare_digest(digest, known)
        return found


class RateLimiter:
    """Token bucket per client: `per_minute` requests, refilled continuously."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, last refill time)
        self.lock = threading.Lock()

    def check(self, client: str) -> None:
        if not self.per_minute:
            return
        rate = self.per_minute / 60.0
        now = time.monotonic()
        with self.lock:
            tokens, last = self.buckets.get(client, (float(self.per_minute), now))
            tokens = min(float(self.per_minute), tokens + (now - last) * rate)
            if tokens < 1.0:
                self.buckets[client] = (tokens, now)
                retry = max(1, math.ceil((1.0 - tokens) / rate))
                raise APIError(429, "rate_limited", f"rate limit of {self.per_minute} requests per minute exceeded", None, {"Retry-After": str(retry)})
            self.buckets[client] = (tokens - 1.0, now)


def client_id(request: Request, key: str | None) -> str:
    # the key's digest, never the key itself: ids may end up in logs or metrics
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return "addr:" + (request.client.host if request.client else "unknown")
