"""uvicorn's HTTP/1.1 protocol (httptools) with a request's head bounded in size and in time.

uvicorn takes a request line and headers of any size (httptools sets no limit: 8 MB of headers were read
and kept) and waits for them as long as they take: its idle timer is armed only after a response, so a
connection that sends nothing, or trickles its head a byte at a time ("slowloris"), is held for ever. Here
the head of each request must come within `header_timeout_s` from the connection's start (or, on a
kept-alive connection, from the request's first byte), else the connection is closed; and past
`max_header_bytes` (the URL and every header's name and value) it is answered 431 and closed, as nginx
(`large_client_header_buffers`, `client_header_timeout`) and Apache (`LimitRequestFieldSize`,
`RequestReadTimeout header=`) do. The body has its own bounds (middleware.BodySizeLimit).

At a graceful shutdown uvicorn closes every connection that is not in a request, and so also one it accepted
whose first request is on its way: that client's request is reset (a broken pipe), where the next worker, or
the process itself had it waited a moment, would have served it: a rolling replacement of the workers (SIGHUP)
would lose a request now and then. Such a connection gets its request answered (translated by a retired worker;
503 with Retry-After from a whole server draining, which refuses new work) and is then closed; one whose
head never comes is closed by the head timer.
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadTooLarge(Exception):
    """Raised in a parser callback: httptools stops, and uvicorn answers (send_400_response, made a 431 here)."""


class BoundedHeadProtocol(HttpToolsProtocol):
    max_header_bytes = 65536
    header_timeout_s = 20.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._last_request = False  # the server shuts down: one request more, then close
        super().connection_made(transport)
        self._arm()  # the first request's head, from the connection's start

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        if self._last_request and self.cycle is not None:
            self.cycle.keep_alive = False

    def shutdown(self) -> None:
        if self.cycle is None and not self.transport.is_closing():  # its first request is on its way
            self._last_request = True
            return
        super().shutdown()

    def send_400_response(self, msg: str) -> None:
        if self._head_bytes <= self.max_header_bytes:
            return super().send_400_response(msg)
        body = f"the request's line and headers are larger than the limit of {self.max_header_bytes} bytes".encode()
        self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        self.transport.close()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.max_header_bytes:
            raise HeadTooLarge

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(max_header_bytes: int, header_timeout_s: float) -> type[BoundedHeadProtocol]:
    """The protocol class with these bounds (uvicorn makes one instance per connection from a class)."""
    return type("BoundedHeadProtocol", (BoundedHeadProtocol,),
                {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s})
