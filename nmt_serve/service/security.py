"""Access control: optional API keys (constant-time comparison) and a per-client rate limit."""
from __future__ import annotations

import fcntl
import hashlib
import hmac
import ipaddress
import logging
import math
import mmap
import os
import struct
import threading
import time
from urllib.parse import unquote_plus

from fastapi import Request

from nmt_serve.service.errors import APIError

# the LibreTranslate parameter that carries a key; a query string holding it is redacted before the access log sees it
KEY_PARAMETER = "api_key"

log = logging.getLogger("nmt_serve.service.security")


def unauthorized(message: str = "a valid API key is required: send 'Authorization: Bearer <key>'") -> APIError:
    return APIError(401, "unauthorized", message, None, {"WWW-Authenticate": "Bearer"})


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def same_secret(candidate: str | None, secret: str) -> bool:
    """Whether a presented secret is the configured one, in a time that depends on neither (their
    digests are compared: hmac.compare_digest on the strings themselves returns at once on a length
    mismatch, which tells the secret's length)."""
    if candidate is None:
        return False
    return hmac.compare_digest(hashlib.sha256(candidate.encode("utf-8", "surrogatepass")).digest(),
                               hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest())


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
        digest = hashlib.sha256(candidate.encode("utf-8", "surrogatepass")).digest()
        found = False
        for known in self.digests:
            found |= hmac.compare_digest(digest, known)
        return found


class RateLimiter:
    """Token bucket per client: `per_minute` requests, refilled continuously.

    The buckets live in a table of fixed size (SLOTS), so a flood of distinct clients (addresses, made-up
    keys) cannot grow the process's memory: a client is hashed to a slot and probes up to PROBES slots from
    there; a bucket idle for a minute is full again, the same as none, so its slot is taken over; only a
    table full of clients seen within the last minute makes the least recently seen of a probe window start
    afresh. With `path` the table is a file that every API worker maps and locks (flock), so N workers
    (`--workers N`) share one limit instead of granting N times it: time.monotonic() is the system's
    clock, the same in every process."""

    SLOTS = 1 << 16
    PROBES = 32
    SLOT = struct.Struct("<Qdd")  # client hash (0: never used), tokens, time of the last refill

    def __init__(self, per_minute: int, path: str | None = None, slots: int = SLOTS):
        self.per_minute = per_minute
        self.path = path
        self.slots = slots
        self.lock = threading.Lock()
        self._table: mmap.mmap | None = None
        self._fd: int | None = None

    def _open(self) -> mmap.mmap:
        size = self.slots * self.SLOT.size
        if self.path:
            fd = None
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    if os.fstat(fd).st_size < size:
                        os.ftruncate(fd, size)  # zero-filled: every slot unused
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                self._fd, self._table = fd, mmap.mmap(fd, size)
                return self._table
            except OSError as exc:  # a limit of this process alone rather than none, or a 500 for every request
                if fd is not None:
                    os.close(fd)
                self._fd = None
                log.error("the rate limit's shared table %s cannot be used (%s): this API process counts on its own",
                          self.path, exc)
        self._table = mmap.mmap(-1, size)
        return self._table

    def close(self) -> None:
        if self._table is not None:
            self._table.close()
            self._table = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _slot(self, table: mmap.mmap, key: int, now: float) -> tuple[int, float, float]:
        """The slot of `key`, its tokens and last refill; a free one (a full bucket) if it has none."""
        full_after = 60.0  # seconds for an empty bucket to fill up again: per_minute / (per_minute / 60)
        size, start = self.SLOT.size, key % self.slots
        free = oldest = None
        oldest_seen = math.inf
        for i in range(self.PROBES):
            index = (start + i) % self.slots
            held, tokens, last = self.SLOT.unpack_from(table, index * size)
            if held == key:
                return index, tokens, last
            if held == 0:  # slots are never emptied: the key is not further on
                free = index if free is None else free
                break
            if now - last >= full_after:
                free = index if free is None else free
            elif last < oldest_seen:
                oldest, oldest_seen = index, last
        return (free if free is not None else oldest), float(self.per_minute), now

    def check(self, client: str) -> None:
        if not self.per_minute:
            return
        rate = self.per_minute / 60.0
        key = int.from_bytes(hashlib.blake2b(client.encode(), digest_size=8).digest(), "little") or 1
        with self.lock:
            table = self._table if self._table is not None else self._open()
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                now = time.monotonic()
                index, tokens, last = self._slot(table, key, now)
                tokens = min(float(self.per_minute), tokens + max(0.0, now - last) * rate)
                allowed = tokens >= 1.0
                self.SLOT.pack_into(table, index * self.SLOT.size, key, tokens - 1.0 if allowed else tokens, now)
            finally:
                if self._fd is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
        if not allowed:
            retry = max(1, math.ceil((1.0 - tokens) / rate))
            raise APIError(429, "rate_limited", f"rate limit of {self.per_minute} requests per minute exceeded", None, {"Retry-After": str(retry)})


def client_address(request: Request) -> str:
    """The client's address as the rate limit counts it: an IPv6 client by its /64, the smallest network
    a subscriber or a host is given (counted by its full address, one host could use 2^64 of them)."""
    host = request.client.host if request.client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        if address.ipv4_mapped is not None:  # ::ffff:a.b.c.d, an IPv4 client of a dual-stack socket
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def client_id(request: Request, key: str | None) -> str:
    # the key's digest, never the key itself: ids may end up in logs or metrics
    if key:
        return "key:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return "addr:" + client_address(request)


def redacted_query(query: bytes) -> bytes:
    """The query string with the value of every api_key parameter replaced: uvicorn's access log writes
    each request's path and query string, and LibreTranslate's clients may send their key there."""
    if b"=" not in query:
        return query
    parts = query.split(b"&")
    changed = False
    for i, part in enumerate(parts):
        name, equals, _ = part.partition(b"=")
        if equals and unquote_plus(name.decode("latin-1")) == KEY_PARAMETER:
            parts[i], changed = name + b"=REDACTED", True
    return b"&".join(parts) if changed else query
