"""What one request may ask of ``dyntc serve``, and the guards that hold it to that.

- :class:`Limits`: the bounds (each a ``dyntc serve`` option of the same name), declared once.
- :func:`check_texts`, :func:`check_write`: a request's texts and label names against them, before
  anything tokenises or embeds them.
- :class:`EmbeddingWorkers`: at most ``workers`` threads embed at once, one kept for small requests.
- :class:`RequestGuard`: ASGI middleware run before routing: the ``Host`` check, the body-size limit,
  the request's deadline and the in-flight limit; the body is read here and handed on.
- :func:`guarded_h11`: uvicorn's h11 protocol with a whole-request deadline (headers and body) and
  the open-connection limit (:class:`Connections`).

**Slow clients.** A connection costs the service nothing until its request has arrived whole, and it
has ``request_timeout_s`` from the moment it opened (or finished its last response) to send its
headers and body: a client dripping a byte at a time is closed (408 once its headers arrived) however
often it sends. Only requests being worked on count against ``max_in_flight`` (``/healthz`` never
does: it is always answered); when ``max_connections`` are open, a new connection closes the oldest
one not being worked on (idle, or still sending its request), so slow or idle clients cannot lock
out one that sends its request at once. Only when every open connection is being worked on is a new
one answered 503.
"""

from __future__ import annotations

import asyncio
import json
import math
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
    request_timeout_s: float = 30.0  #: time a client has to send its request headers and its body, in all
    max_connections: int = 1024  #: open connections; over it the oldest not being worked on is closed
    max_in_flight: int = 128  #: requests being worked on at once; more are answered 503 (not /healthz)
    workers: int = 0  #: texts embedded by at most this many threads at once; 0 = the CPU count
    max_adapt_s: float = 900.0  #: seconds a discovery job may fine-tune the backbone (POST /discover's adapt_s)

    def __post_init__(self) -> None:
        for f in fields(self):
            value, low = getattr(self, f.name), 0 if f.name == "workers" else 1
            ok = (is_number(value) and 0 < value < math.inf if f.type == "float" else is_int(value) and value >= low)
            if not ok:
                raise DyntcError(f"{f.name} must be {'a finite number > 0' if f.type == 'float' else f'an integer >= {low}'}, "
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
        self._count = threading.Lock()
        self.busy = 0  #: requests embedding or waiting for a worker

    @contextmanager
    def take(self, chars: int) -> Iterator[None]:
        large = chars > SMALL_REQUEST_CHARS
        with self._count:
            self.busy += 1
        try:
            if large:
                self._large.acquire()
            try:
                with self._any, no_disk_cache():
                    yield
            finally:
                if large:
                    self._large.release()
        finally:
            with self._count:
                self.busy -= 1


# ---------------------------------------------------------------------------------------- ASGI guard


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def respond(send, status: int, message: str) -> None:
    body = error_body(message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


#: The key of ``scope["state"]`` under which the guarded protocol puts its connection (:func:`guarded_h11`).
CONNECTION = "dyntc.connection"


class RequestGuard:
    """ASGI middleware run before routing: the ``Host`` check (`host_refusal`), the body-size limit
    (from ``Content-Length`` before reading, and while reading for chunked bodies), the request's
    deadline (the connection's, when served by :func:`guarded_h11`: headers and body together) and
    the in-flight limit. The body is read here, at most ``max_body_bytes`` of it, and handed on."""

    def __init__(self, app, limits: Limits, host_refusal):
        self.app, self.limits, self.host_refusal = app, limits, host_refusal
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        connection = scope.get("state", {}).get(CONNECTION)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self.host_refusal(headers.get("host", ""))
        if refusal:
            return await respond(send, 403, refusal)
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await respond(send, 413, f"the request body is over this service's {limit:,} bytes "
                                            "(--max-body-bytes): send fewer or shorter texts")
        loop = asyncio.get_running_loop()
        deadline = connection.deadline if connection is not None else loop.time() + self.limits.request_timeout_s
        chunks, size, more = [], 0, True
        try:
            async with asyncio.timeout_at(deadline):
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body = message.get("body", b"")
                    size += len(body)
                    if size > limit:
                        return await respond(send, 413, f"the request body is over this service's {limit:,} bytes "
                                                        "(--max-body-bytes): send fewer or shorter texts")
                    chunks.append(body)
                    more = message.get("more_body", False)
        except TimeoutError:
            return await respond(send, 408, f"the request did not arrive within {self.limits.request_timeout_s:g} s "
                                            "(--request-timeout-s: headers and body in all)")
        if self.in_flight >= self.limits.max_in_flight and scope["path"] != "/healthz":
            return await respond(send, 503, f"this service is working on {self.in_flight} requests, its most "
                                            "(--max-in-flight): try again in a moment")
        sent = False

        async def replay_body():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        if connection is not None:
            connection.working = True
        self.in_flight += 1
        try:
            await self.app(scope, replay_body, send)
        finally:
            self.in_flight -= 1


class Connections:
    """The open connections of one server, oldest first (a dict keeps the order they came in)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open: dict = {}

    def admit(self, connection) -> bool:
        """Room for `connection`: the oldest open one not being worked on is closed if needed; False
        if every open connection is being worked on."""
        if len(self.open) >= self.limit:
            idle = next((c for c in self.open if not c.working), None)
            if idle is None:
                return False
            idle.close()
        self.open[connection] = None
        return True

    def leave(self, connection) -> None:
        self.open.pop(connection, None)


_BUSY = error_body("every connection this service takes (--max-connections) is working on a request: "
                   "try again in a moment")
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
                 b"connection: close\r\ncontent-length: " + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY)


def guarded_h11(limits: Limits):
    """uvicorn's h11 protocol with the request deadline and the connection limit (module docstring):
    a connection has ``request_timeout_s`` from when it opened (or finished its last response) until
    its request is being worked on; one that is not by then is closed (the body's 408 is
    :class:`RequestGuard`'s, on the same deadline). uvicorn's own ``limit_concurrency`` is not used:
    it counts idle and half-sent connections against real work."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    connections = Connections(limits.max_connections)
    timeout_s = limits.request_timeout_s

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.app_state = {**self.app_state, CONNECTION: self}  # copied into every request's scope
            self.working = False
            self.deadline = 0.0
            self._timer = None

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self.deadline = self.loop.time() + timeout_s
            self._timer = self.loop.call_at(self.deadline, self._expire)

        def _expire(self) -> None:
            if self.working or self.transport.is_closing():
                return
            if self.conn.their_state is h11.IDLE:  # its headers never came
                self.close()
            else:  # its body is late: RequestGuard answers 408 on the same deadline; close if it could not
                self._timer = self.loop.call_later(1.0, self._expire_body)

        def _expire_body(self) -> None:
            if not self.working and not self.transport.is_closing():
                self.close()

        def close(self) -> None:
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if not connections.admit(self):
                transport.write(BUSY_RESPONSE)
                transport.close()
                return
            self._arm()

        def on_response_complete(self) -> None:
            self.working = False
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._timer.cancel()
            connections.leave(self)
            super().connection_lost(exc)

    return GuardedH11Protocol
