"""``dyntc serve``: an HTTP service over a saved classifier whose label set changes live.

Reads (``/predict``, ``/labels``, ``/versions``, ``/healthz``) and writes (label operations,
restore) go through one :class:`Service`:

- **Durability.** A write is one version of the model directory's store
  (:mod:`dyntc.classifier.store`), committed before the response; restarting the service loads the
  newest committed version. A process killed mid-write leaves the previous version.
- **Consistency.** A write applies its operation to a copy of the current classifier
  (:meth:`DynamicClassifier.copy`, copy-on-write of the label set), commits it, then swaps the
  reference; a read takes the reference once. So a prediction sees the old or the new label set,
  never a mix.
- **Readers never wait on writers.** A write embeds its examples before it takes the store's write
  lock and holds that lock only to commit (:meth:`DynamicClassifier.edit`: if another
  process committed meanwhile, the operation is applied again to the newest version). A version
  committed by another process (a ``dyntc labels`` command, another replica) is loaded in the
  background, by a follower thread (:meth:`~dyntc.classifier.store.ModelStore.follow`: told at once
  by a PostgreSQL notification, or polling) or as soon as a read notices it, and swapped in once its
  cosine head is trained; reads go on with the current version meanwhile. No read loads, and no
  read takes a lock a writer holds.
- **Replicas.** Over a PostgreSQL store (``postgresql://`` URL) any number of services share one
  model: each commits through the store's lock and follows the others' commits, so a write through
  any of them is served by all within a fraction of a second (docs/deployment.md).
- **Bounded work.** Every request is bounded before it is parsed or embedded (:class:`Limits`: body
  bytes, texts per request, characters per text, examples per write, label name length), slow
  clients time out, and embedding runs in at most ``workers`` threads at once, one of which only
  small requests may use, so a maximal request cannot starve a one-line prediction. Texts from
  requests are cached in memory (bounded in bytes), never on disk.
- **Access.** See :class:`Access`: writes need the bearer token when one is set; without one the
  service only binds to loopback and accepts a write only from a client that a web page cannot
  imitate (a JSON ``Content-Type``, no foreign ``Origin``), with the ``Host`` header checked against
  DNS rebinding. An optional read token protects the reads too.
- **Errors.** Every failure is a JSON answer ``{"error": "..."}`` naming the problem: 400 bad values
  or malformed JSON, 401 a missing or wrong token, 403 a refused origin or host, 404 an unknown
  label, version or path, 405 a wrong method, 408 a body that did not arrive in time, 409 a label
  name in use or a model without calibration, 413 a request over a limit, 415 a write without a JSON
  body type, 422 a field of the wrong type, 503 a store that is gone or unreadable, 507 a full disk.
  Nothing is changed by a failed write.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import ipaddress
import json
import logging
import os
import stat
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from dyntc.classifier import DynamicClassifier, ModelStore
from dyntc.classifier.store import StoreFullError, StoreUnavailableError
from dyntc.core.encoders.pretrained import no_disk_cache
from dyntc.errors import DyntcError, LabelExistsError, UnknownLabelError, is_int, is_number

MIN_TOKEN_CHARS = 16
#: A request whose texts add up to at most this many characters may use the embedding worker that
#: larger requests leave free (:class:`EmbeddingWorkers`).
SMALL_REQUEST_CHARS = 2_000
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: Texts of one /predict request embedded per call (a maximal request is several calls).
EMBED_CHUNK = 32


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


@dataclass(frozen=True)
class Access:
    """Who may read and write.

    ``write_token``: the bearer token that writes need. ``read_token``: if set, reads need it (or the
    write token). ``loopback``: the service listens on a loopback address only; without a write
    token it must (``run`` refuses otherwise, unless ``insecure``), and then a write must carry a
    JSON ``Content-Type`` (a cross-site HTML form cannot send one, and a script needs a CORS
    preflight the service never grants) and no ``Origin`` or ``Sec-Fetch-Site`` of another site,
    and every request's ``Host`` must be a loopback name (DNS rebinding)."""

    write_token: str | None = None
    read_token: str | None = None
    loopback: bool = True


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


class Service:
    """The current classifier of one model (a directory or a PostgreSQL URL), and the serialised way
    to change it."""

    def __init__(self, model_dir: str | Path, *, limits: Limits = Limits(), access: Access = Access(),
                 follow: bool = True):
        self.store = ModelStore.open(model_dir)
        self.path = self.store.location
        self.limits, self.access = limits, access
        self.workers = EmbeddingWorkers(limits.threads)
        self._current = self._load()
        self._write_lock = threading.Lock()  # this process's writers, one at a time
        self._reload_lock = threading.Lock()  # one reloader at a time; readers never wait for it
        self._swap_lock = threading.Lock()  # held for a comparison and an assignment only
        self._reload_pending = False  # a reader started a background load that has not finished
        self._stop = threading.Event()
        if follow:  # loads what other processes commit, in the background
            threading.Thread(target=self.store.follow, args=(self._stop, self._follow), daemon=True,
                             name="dyntc-follower").start()

    def close(self) -> None:
        self._stop.set()

    def _load(self) -> DynamicClassifier:
        """The newest version, ready to answer: its cosine head (if any) trained before anyone reads it."""
        clf = DynamicClassifier.load(self.store)
        if clf.head is not None:
            clf.refresh(wait=True)
        return clf

    def _follow(self) -> None:
        """Called by the follower thread when another process may have committed: load the newest
        version if it is newer. It may wait for a reader that is loading (the follower is nobody's
        reader), so no notified version is missed."""
        with self._reload_lock:
            if self.store.head_version() > self._current.version_:
                self._swap(self._load())

    def _swap(self, clf: DynamicClassifier) -> None:
        with self._swap_lock:
            if clf.version_ > self._current.version_:
                self._current = clf

    def current(self) -> DynamicClassifier:
        """The classifier to read from. A reader that sees a newer version committed by another process
        starts loading it in the background (besides the follower) and answers from the current one:
        no reader ever waits for a load."""
        clf = self._current
        if self.store.head_version() > clf.version_ and not self._reload_lock.locked():
            with self._swap_lock:
                if self._reload_pending:
                    return clf
                self._reload_pending = True
            threading.Thread(target=self._reload_now, daemon=True, name="dyntc-reload").start()
        return clf

    def _reload_now(self) -> None:
        try:
            self._follow()
        finally:
            self._reload_pending = False

    def write(self, op: Callable[[DynamicClassifier], Any], chars: int) -> DynamicClassifier:
        """Apply `op` to a copy of the newest classifier and commit it as one version; returns it."""
        with self._write_lock, no_disk_cache():
            with DynamicClassifier.edit(self.store, base=self.current(), op="http") as new:
                with self.workers.take(chars):
                    op(new)  # embeds the new examples, before the store's write lock
            # committed when the block ended (replayed on the newest version if another process
            # committed meanwhile); the lock wait held no embedding worker
            self._swap(new)
        return new

    def restore(self, version: int) -> DynamicClassifier:
        with self._write_lock:
            with self.store.transaction() as txn:
                txn.restore(version)
            self._swap(self._load())
            return self._current


# ---------------------------------------------------------------------------------------- requests
# Strict types: JSON true is not a count, "yes" is not a boolean.


class PredictRequest(BaseModel):
    texts: list[StrictStr] = Field(description="Texts to classify (at most the service's max batch)")
    top_k: StrictInt = Field(1, ge=1, le=1_000, description="Also return the k nearest labels with their distances")
    proba: StrictBool = Field(False, description="Add the probability of the predicted label (softmax of -d²/T)")
    reject: StrictBool = Field(False, description="Label out-of-scope texts null (needs a calibrated model)")


class NewLabel(BaseModel):
    name: StrictStr
    examples: list[StrictStr]


class Examples(BaseModel):
    examples: list[StrictStr]


class Split(BaseModel):
    parts: dict[StrictStr, list[StrictStr]] = Field(description="{new label: its examples}, at least two")
    reassign: StrictBool = False


class Merge(BaseModel):
    names: list[StrictStr]
    into: StrictStr


class Rename(BaseModel):
    to: StrictStr


def _labels_body(clf: DynamicClassifier) -> dict:
    return {"version": clf.version_, "labels": clf.support_counts()}


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _check_texts(texts: list[str], limits: Limits, what: str) -> int:
    """Refuse over-long texts before anything tokenises them; returns their total length."""
    for i, text in enumerate(texts):
        if len(text) > limits.max_text_chars:
            raise HTTPError(413, f"{what}[{i}] has {len(text):,} characters; this service takes at most "
                                 f"{limits.max_text_chars:,} per text (--max-text-chars)")
    return sum(len(t) for t in texts)


def _check_write(limits: Limits, names: list[str], examples: list[str]) -> int:
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
    return _check_texts(examples, limits, "examples")


# ---------------------------------------------------------------------------------------- guards


def is_loopback(host: str) -> bool:
    if host.strip("[]") in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(value: str) -> str:
    """The host part of a ``Host`` header (``127.0.0.1:8080``, ``[::1]:80``, ``localhost``)."""
    return (urlsplit(f"//{value}").hostname or "") if value else ""


def _error(status: int, message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class RequestGuard:
    """ASGI middleware run before routing: the ``Host`` check, the body-size limit (from
    ``Content-Length`` before reading, and while reading for chunked bodies) and the body timeout.
    The body is read here, at most ``max_body_bytes`` of it, and handed on to the application."""

    def __init__(self, app, limits: Limits, access: Access):
        self.app, self.limits, self.access = app, limits, access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.access.loopback and not is_loopback(_host_name(headers.get("host", ""))):
            return await _respond(send, 403, f"Host {headers.get('host', '')[:80]!r} is not a loopback name; this "
                                             "service listens on loopback only (a DNS rebinding guard)")
        limit = self.limits.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return await _respond(send, 413, f"the request body is over this service's {limit:,} bytes "
                                             "(--max-body-bytes): send fewer or shorter texts")
        chunks, size, more = [], 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.limits.request_timeout_s)
            except TimeoutError:
                return await _respond(send, 408, f"the request body did not arrive within "
                                                 f"{self.limits.request_timeout_s:g} s")
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                return await _respond(send, 413, f"the request body is over this service's {limit:,} bytes "
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


async def _respond(send, status: int, message: str) -> None:
    body = _error(status, message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _bearer(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if value is None or not value.startswith("Bearer "):
        return None
    return value.removeprefix("Bearer ").strip()


def _same_token(given: str | None, token: str) -> bool:
    # bytes: compare_digest refuses non-ASCII str, which would turn a stranger's header into a 500
    return given is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("utf-8"))


# ---------------------------------------------------------------------------------------- the app


def create_app(model_dir: str | Path, *, limits: Limits = Limits(), access: Access = Access()) -> FastAPI:
    """The FastAPI application serving the classifier saved in `model_dir`, wrapped in its
    :class:`RequestGuard`."""
    for name, token in (("write token", access.write_token), ("read token", access.read_token)):
        if token is not None:
            check_token(token, name)
    service = Service(model_dir, limits=limits, access=access)
    app = FastAPI(title="dyntc", description="A text classifier whose label set changes live.")
    app.state.service = service

    @app.exception_handler(DyntcError)
    def _dyntc_error(request: Request, exc: DyntcError) -> JSONResponse:
        if isinstance(exc, StoreFullError):
            status = 507
        elif isinstance(exc, StoreUnavailableError):
            status = 503
        elif isinstance(exc, UnknownLabelError):
            status = 404
        elif isinstance(exc, LabelExistsError) or "needs a calibrated classifier" in str(exc):
            status = 409
        else:
            status = 400
        return JSONResponse({"error": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") in ("json_invalid", "json_type") for e in errors):
            return JSONResponse({"error": "the request body is not valid JSON"}, status_code=400)
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errors)
        return JSONResponse({"error": f"invalid request: {where}"}, status_code=422)

    @app.exception_handler(HTTPError)
    def _http_error(request: Request, exc: HTTPError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = {404: f"no such endpoint: {request.url.path[:100]}",
                   405: f"{request.method} is not allowed on {request.url.path[:100]}"}.get(exc.status_code, str(exc.detail))
        return JSONResponse({"error": message}, status_code=exc.status_code)

    def reader(request: Request) -> None:
        if access.read_token is None:
            return
        given = _bearer(request)
        if not (_same_token(given, access.read_token) or
                (access.write_token is not None and _same_token(given, access.write_token))):
            raise HTTPError(401, "this service's reads need a token: send 'Authorization: Bearer <token>'")

    def writer(request: Request) -> None:
        if access.write_token is not None:
            if not _same_token(_bearer(request), access.write_token):
                raise HTTPError(401, "this endpoint changes the model: send 'Authorization: Bearer <token>'")
            return
        # No token (loopback only): refuse what a web page in a browser on this host could send.
        origin = request.headers.get("origin")
        if origin is not None and not is_loopback(urlsplit(origin).hostname or ""):  # "null" too (sandboxed pages)
            raise HTTPError(403, f"a write from origin {origin[:80]!r} is refused: this service takes writes from "
                                 "local clients only (start it with --token-file to take writes from elsewhere)")
        if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
            raise HTTPError(403, "a cross-site write is refused")
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            raise HTTPError(415, "a write needs 'Content-Type: application/json' (a body of {} will do where none "
                                 "is needed)")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        clf = service._current  # the store is probed, the model is not: health answers while it is busy
        try:  # in a thread: a database server that does not answer must not stall the other requests
            await asyncio.to_thread(service.store.check)
        except DyntcError as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc), "version": clf.version_,
                                 "backend": service.store.backend}, status_code=503)
        return JSONResponse({"status": "ok", "version": clf.version_, "n_labels": clf.n_classes_,
                             "backend": service.store.backend})

    @app.post("/predict", dependencies=[Depends(reader)])
    def predict(req: PredictRequest) -> dict:
        if not req.texts:
            raise DyntcError("texts is empty: send at least one text")
        if len(req.texts) > limits.max_batch:
            raise HTTPError(413, f"{len(req.texts)} texts in one request; this service takes at most "
                                 f"{limits.max_batch} (split the batch or start it with a larger --max-batch)")
        chars = _check_texts(req.texts, limits, "texts")
        clf = service.current()
        if req.reject:
            clf.require_calibration("reject=true")
        with service.workers.take(chars):
            # in chunks: between two, the interpreter lock is free for a short request's Python work
            scores = np.concatenate([clf.decision_function(req.texts[i: i + EMBED_CHUNK])
                                     for i in range(0, len(req.texts), EMBED_CHUNK)])
        return {"version": clf.version_, "labels": clf.classes_,
                "results": clf.prediction_records(scores, top_k=req.top_k, proba=req.proba, reject=req.reject)}

    @app.get("/labels", dependencies=[Depends(reader)])
    def labels() -> dict:
        return _labels_body(service.current())

    @app.post("/labels", status_code=201, dependencies=[Depends(writer)])
    def add_label(req: NewLabel) -> dict:
        chars = _check_write(limits, [req.name], req.examples)
        return _labels_body(service.write(lambda clf: clf.add_label(req.name, req.examples), chars))

    @app.post("/labels/merge", dependencies=[Depends(writer)])
    def merge_labels(req: Merge) -> dict:
        _check_write(limits, [req.into], [])
        return _labels_body(service.write(lambda clf: clf.merge_labels(req.names, req.into), 0))

    @app.post("/labels/{name}/examples", dependencies=[Depends(writer)])
    def add_examples(name: str, req: Examples) -> dict:
        chars = _check_write(limits, [], req.examples)
        return _labels_body(service.write(lambda clf: clf.add_examples(name, req.examples), chars))

    @app.delete("/labels/{name}", dependencies=[Depends(writer)])
    def remove_label(name: str) -> dict:
        return _labels_body(service.write(lambda clf: clf.remove_label(name), 0))

    @app.post("/labels/{name}/split", dependencies=[Depends(writer)])
    def split_label(name: str, req: Split) -> dict:
        chars = _check_write(limits, list(req.parts), [t for texts in req.parts.values() for t in texts])
        return _labels_body(service.write(lambda clf: clf.split_label(name, req.parts, reassign=req.reassign), chars))

    @app.post("/labels/{name}/rename", dependencies=[Depends(writer)])
    def rename_label(name: str, req: Rename) -> dict:
        _check_write(limits, [req.to], [])
        return _labels_body(service.write(lambda clf: clf.rename_label(name, req.to), 0))

    @app.get("/versions", dependencies=[Depends(reader)])
    def versions(limit: int = 20) -> dict:
        if not 1 <= limit <= 10_000:
            raise DyntcError(f"limit must be in 1..10000, got {limit}")
        return {"versions": service.store.versions(limit)}

    @app.post("/versions/{version}/restore", dependencies=[Depends(writer)])
    def restore(version: int) -> dict:
        head = service.store.head_version()
        if not 1 <= version <= head:
            raise HTTPError(404, f"no version {version}; the versions are 1..{head}")
        return _labels_body(service.restore(version))

    return RequestGuard(app, limits, access)


# ---------------------------------------------------------------------------------------- running


def check_token(token: str, what: str = "token") -> str:
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
        raise DyntcError(f"the {what} must be at least {MIN_TOKEN_CHARS} characters without spaces, got "
                         f"{len(token)} characters: make one with `openssl rand -hex 32 > token && chmod 600 token`")
    return token


def read_token(path: Path, what: str = "token file") -> str:
    """The secret in `path`, which must be a private UTF-8 text file (not readable by group or others)."""
    if not path.is_file():
        raise DyntcError(f"{what} {str(path)!r} does not exist")
    if os.name == "posix" and stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise DyntcError(f"{what} {str(path)!r} can be read by other users (mode "
                         f"{stat.S_IMODE(path.stat().st_mode):o}): run `chmod 600 {path}`")
    try:
        token = path.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError:
        raise DyntcError(f"{what} {str(path)!r} is not UTF-8 text: put the secret in it as text") from None
    return check_token(token, what.removesuffix(" file"))


def run(model_dir: str | Path, host: str, port: int, *, token_file: Path | None = None, read_token_file: Path | None = None,
        insecure: bool = False, limits: Limits = Limits(), access_log: bool = False) -> None:
    """Serve until interrupted (the ``dyntc serve`` command): prints ``listening on http://HOST:PORT``
    on stderr once the socket is bound; with `access_log`, one line per request."""
    import torch
    import uvicorn

    write_token = None if token_file is None else read_token(token_file)
    reads = None if read_token_file is None else read_token(read_token_file, "read token file")
    loopback = is_loopback(host)
    if not loopback and write_token is None:
        if not insecure:
            raise DyntcError(f"--host {host} is reachable from other machines, and without --token-file anyone there "
                             "could change the model: give --token-file (or --insecure to accept that)")
        warnings.warn(f"dyntc serve: listening on {host} with no token (--insecure): anyone who can reach it can "
                      "change or roll back the model", stacklevel=2)
    torch.set_num_threads(1)  # one thread per embedding worker (EmbeddingWorkers): no oversubscription
    app = create_app(model_dir, limits=limits, access=Access(write_token, reads, loopback))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", http=_timed_h11(limits.request_timeout_s),
                            limit_concurrency=limits.max_connections, timeout_keep_alive=5, access_log=access_log,
                            log_config=_log_config())
    if access_log:  # log_level set every uvicorn logger to warnings: the access lines are at info
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    _announcing_server(config).run()


def _log_config() -> dict:
    """uvicorn's logging, its access lines on stderr as well (stdout is left to the application)."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["handlers"]["access"]["stream"] = "ext://sys.stderr"
    return config


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _announcing_server(config):
    """uvicorn's server, saying where it listens once its socket is bound (uvicorn's own line is at
    info level, which would also bring its per-connection chatter)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = [s.getsockname() for server in self.servers for s in server.sockets]
                port = bound[0][1] if bound else config.port
                print(f"listening on {_url(config.host, port)} (Ctrl+C to stop)", file=sys.stderr, flush=True)

    return Server(config)


def _timed_h11(timeout_s: float):
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
