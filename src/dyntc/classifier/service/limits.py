"""What one request may ask of ``dyntc serve``, and the guards that hold it to that.

- :class:`Limits`: the bounds (each a ``dyntc serve`` option of the same name), declared once.
- :func:`check_texts`, :func:`check_write`: a request's texts and label names against them, before
  anything tokenises or embeds them.
- :class:`EmbeddingWorkers`: at most ``workers`` threads embed at once, one kept for small requests.
- :class:`RequestGuard`: ASGI middleware run before routing: the ``Host`` check, the body-size limit
  and the body's deadline; the body is read here and handed on.
- :func:`timed_h11`: uvicorn's h11 protocol with a deadline for the request headers.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields

from dyntc.core.encoders.pretrained import no_disk_cache
from dyntc.errors import DyntcError, is_int, is_number

#: A request whose texts add up to at most this many characters may use the embedding worker that
#: larger requests leave free (:class:`EmbeddingWorkers`).
SMALL_REQUEST_CHARS = 2_000


class HTTPError(Exception):
    """A request refused with an HTTP status of the service's own (a limit, a token, an origin)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the service (each a ``dyntc serve`` option of the same name)."""

    max_body_bytes: int = 1 << 20  #: request body size; larger bodies are refused before they are read
    max_batch: int = 256  #: texts in one /predict request
    max_text_chars: int = 2_000  #: characters of one text (predicted or an example)
    max_examples: int = 1_000  #: examples in one write
    max_label_chars: int = 100  #: characters of a label name
    request_timeout_s: float = 30.0  #: time a client has to send its request headers and its body
    max_connections: int = 256  #: open connections; more are answered 503
    workers: int = 0  #: texts embedded by at most this many threads at once; 0 = the CPU count

    def __post_init__(self) -> None:
        for f in fields(self):
            value, low = getattr(self, f.name), 0 if f.name == "workers" else 1
            ok = is_number(value) and value > 0 if f.type == "float" else is_int(value) and value >= low
            if not ok:
                raise DyntcError(f"{f.name} must be {'a number > 0' if f.type == 'float' else f'an integer >= {low}'}, "
                                 f"got {value!r} (option --{f.name.replace('_', '-')})")

    @property
    def threads(self) -> int:
        return self.workers or os.cpu_count() or 1


def check_texts(texts: list[str], limits: Limits, what: str) -> int:
    """Refuse over-long texts before anything tokenises them; returns their total length."""
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            raise HTTPError(413, f"{what}[{i}] has {len(text):,} characters; this service takes at most "
                                 f"{limits.max_text_chars:,} per text (--max-text-chars)")
    return sum(len(t) for t in texts)


def check_batch(texts: list[str], limits: Limits) -> int:
    """The texts of one /predict request: at least one, at most ``max_batch``; returns their length."""
    if not texts:
        raise DyntcError("texts is empty: send at least one text")
    if len(texts) > limits.max_batch:
        raise HTTPError(413, f"{len(texts)} texts in one request; this service takes at most "
                             f"{limits.max_batch} (split the batch or start it with a larger --max-batch)")
    return check_texts(texts, limits, "texts")


def check_write(limits: Limits, names: list[str], examples: list[str]) -> int:
    """Limits of one write: label names and the number and length of its examples."""
    for name in names:
        if len(name) > limits.max_label_chars:
            raise HTTPError(413, f"label name of {len(name):,} characters; this service takes at most "
                                 f"{limits.max_label_chars} (--max-label-chars)")
        if "/" in name:  # it could never be addressed in a URL path afterwards
            raise DyntcError(f"label name {name[:40]!r} contains '/': choose a name without it")
    if len(examples) > limits.max_examples:
        raise HTTPError(413, f"{len(examples):,} examples in one write; this service takes at most "
                             f"{limits.max_examples:,} (--max-examples): send them in several writes")
    return check_texts(examples, limits, "examples")


class EmbeddingWorkers:
    """At most `n` threads embed at once; a request of more than ``SMALL_REQUEST_CHARS`` characters
    may only take `n` - 1 of them (when `n` > 1), so a short request always finds a worker free
    however many large ones are queued. Each worker embeds with one torch thread (``run`` sets it)."""

    def __init__(self, n: int):
        self._any = threading.BoundedSemaphore(n)
        self._large = threading.BoundedSemaphore(max(1, n - 1))

    @contextmanager
    def take(self, chars: int) -> Iterator[None]:
        large = chars > SMALL_REQUEST_CHARS
        if large:
            self._large.acquire()
        try:
            with self._any, no_disk_cache():
                yield
        finally:
            if large:
                self._large.release()


# ---------------------------------------------------------------------------------------- ASGI guard


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def respond(send, status: int, message: str) -> None:
    body = error_body(message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """ASGI middleware run before routing: the ``Host`` check (`host_ok`), the body-size limit (from
    ``Content-Length`` before reading, and while reading for chunked bodies) and the body timeout.
    The body is read here, at most ``max_body_bytes`` of it, and handed on to the application."""

    def __init__(self, app, limits: Limits, host_refusal):
        self.app, self.limits, self.host_refusal = app, limits, host_refusal

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.host_refusal(headers.get("host", ""))
        if refusal:
            return await respond(send, 403, refusal)
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await respond(send, 413, f"the request body is over this service's {limit:,} bytes "
                                            "(--max-body-bytes): send fewer or shorter texts")
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.limits.request_timeout_s)
            except TimeoutError:
                return await respond(send, 408, f"the request body did not arrive within "
                                                f"{self.limits.request_timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await respond(send, 413, f"the request body is over this service's {limit:,} bytes "
                                                "(--max-body-bytes): send fewer or shorter texts")
            chunks.append(body)
            more = message.get("more_body", False)
        sent = False

        async def replay_body():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay_body, send)


def timed_h11(timeout_s: float):
    """uvicorn's h11 protocol with a deadline for the request headers: a connection that has not
    sent a whole request line and headers `timeout_s` after it opened (or after its last response)
    is closed (uvicorn itself waits forever; the body's deadline is :class:`RequestGuard`'s)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):
        def _arm(self) -> None:
            self._headers_deadline = self.loop.call_later(timeout_s, self._expire)

        def _expire(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            self._headers_deadline.cancel()
            super().connection_lost(exc)

    return TimedH11Protocol
