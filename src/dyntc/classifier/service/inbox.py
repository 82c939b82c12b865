"""The inbox of ``dyntc serve``: texts the service could not place, captured (opt-in) into the model's
store, and what turns them into labels.

- **Capture** (``dyntc serve --capture N``): a /predict text is captured when the calibrated
  threshold rejects it (``rejected``) or when the probabilities of its two best labels differ by
  less than ``--capture-margin`` (``low-margin``). Sightings are queued in memory and written by one
  background thread about once a second (a prediction never waits for the store), into the store's
  ``captures`` table (:mod:`dyntc.classifier.store.captures`), bounded by a count and an age, so
  every replica of a model shares one inbox.
- **Reading** captured texts (``GET /captures``), forgetting them (``POST /captures/dismiss``,
  ``DELETE /captures``) and clustering them (``POST /discover`` without texts) need the write token:
  without one configured they are refused, so no captured text leaves through an anonymous read,
  and ``--capture`` itself needs ``--token-file``.
- **Discovery** (``POST /discover``: clusters of the captured or the posted texts, from
  :meth:`DynamicClassifier.discover`) and **suggestions** (``GET /suggestions``: merges and splits,
  from :meth:`DynamicClassifier.suggest`) are offered when the library has them. A discovery that
  adapts the backbone first (``adapt_s``, minutes) is a background job
  (:mod:`~dyntc.classifier.service.jobs`): answered 202 with its ``url``, read by
  ``GET /discover/jobs/{id}`` until its ``status`` is ``done`` (or ``failed``).
- **Accepting** a cluster (``POST /discover/accept``) is one write: its texts become a new label, or
  examples of an existing one, and leave the inbox. The client sends the texts it accepts, so a
  discovery that went stale (the label set changed since) is applied to the current label set as it
  is: a name taken meanwhile is refused (409), a label removed meanwhile is unknown (404).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, fields

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictFloat, StrictInt, StrictStr

from dyntc.classifier import DynamicClassifier
from dyntc.classifier.service.jobs import JobConflict, Jobs
from dyntc.classifier.service.limits import HTTPError
from dyntc.classifier.store.captures import CaptureLog, Captured
from dyntc.errors import DyntcError, is_int, is_number

#: Sightings waiting for the writer thread; more are dropped (the inbox is a sample, not a log).
QUEUE_LIMIT = 10_000
FLUSH_S = 1.0
DAY_S = 86_400.0


@dataclass(frozen=True)
class CapturePolicy:
    """What ``dyntc serve`` captures (each a ``dyntc serve`` option of the same name)."""

    capture: int = 0  #: texts kept at most; 0 = capture nothing
    capture_days: float = 7.0  #: a text not seen again for this long is forgotten
    capture_margin: float = 0.1  #: capture a text whose two best labels' probabilities differ by less

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            ok = (is_int(value) and value >= 0) if f.type == "int" else (is_number(value) and value > 0)
            if f.name == "capture_margin":
                ok = is_number(value) and 0 <= value <= 1
            if not ok:
                raise DyntcError(f"--{f.name.replace('_', '-')} got {value!r}: it must be "
                                 + {"capture": "an integer >= 0", "capture_days": "a number > 0",
                                    "capture_margin": "a number in 0..1"}[f.name])


def unplaced(clf: DynamicClassifier, texts: list[str], scores: np.ndarray, margin: float) -> list[Captured]:
    """The texts among `texts` (scored by `clf`) that the service could not place."""
    try:
        threshold = clf.require_calibration("capture").threshold
    except DyntcError:
        threshold = None
    nearest = clf.nearest_labels(clf.squared_distances(scores), 1)
    proba = clf.proba_from_scores(scores)
    top2 = -np.sort(-proba, axis=1)[:, :2] if proba.shape[1] > 1 else np.concatenate([proba, np.zeros_like(proba)], 1)
    gaps = top2[:, 0] - top2[:, 1]
    out = []
    for text, ((label, distance),), gap in zip(texts, nearest, gaps.tolist()):
        if threshold is not None and distance > threshold:
            out.append(Captured(text, "rejected", None, round(gap, 6)))
        elif gap < margin:
            out.append(Captured(text, "low-margin", label, round(gap, 6)))
    return out


class Inbox:
    """Captures of one service: a bounded queue of sightings, written to the store by one thread."""

    def __init__(self, log: CaptureLog, policy: CapturePolicy):
        self.log, self.policy = log, policy
        self._queue: queue.Queue[Captured] = queue.Queue(QUEUE_LIMIT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="dyntc-capture")
        self._thread.start()

    def observe(self, clf: DynamicClassifier, texts: list[str], scores: np.ndarray) -> None:
        for sighting in unplaced(clf, texts, scores, self.policy.capture_margin):
            try:
                self._queue.put_nowait(sighting)
            except queue.Full:
                return

    def flush(self) -> None:
        batch = []
        while True:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if batch:
            self.log.add(batch)

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            try:
                self.flush()
            except DyntcError:  # the store is busy or gone: these sightings are lost, capture goes on
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.flush()
        except DyntcError:
            pass


# ---------------------------------------------------------------------------------------- requests


class Dismiss(BaseModel):
    texts: list[StrictStr] = Field(description="Captured texts to forget")


class OutOfScope(BaseModel):
    texts: list[StrictStr] = Field(description="Texts no label should take: kept as out-of-scope examples "
                                               "(the model must be calibrated), and forgotten by the inbox")


class Discover(BaseModel):
    texts: list[StrictStr] | None = Field(None, description="Texts to cluster; none: the captured texts")
    n_new: StrictInt | None = Field(None, description="Number of new intents; none: estimated")
    adapt_s: StrictFloat | None = Field(None, description="Seconds of fine-tuning a copy of the backbone on the texts "
                                                          "first (minutes: answered 202 with a job to read)")


class Accept(BaseModel):
    texts: list[StrictStr] = Field(description="The cluster's texts (those the user keeps)")
    name: StrictStr | None = Field(None, description="A new label made of the texts")
    into: StrictStr | None = Field(None, description="An existing label the texts join")


def router(service, inbox: Inbox | None, hooks) -> APIRouter:
    """The inbox's endpoints over `service` (:class:`~dyntc.classifier.service.app.Service`), guarded
    by `hooks` (:class:`~dyntc.classifier.service.console.Hooks`)."""
    access, limits = service.access, service.limits
    reader, writer, labels_body, check_write = hooks.reader, hooks.writer, hooks.labels_body, hooks.check_write
    log = inbox.log if inbox is not None else CaptureLog(service.store, 1_000_000, 3650 * DAY_S)
    api = APIRouter()

    def token_only(request: Request) -> None:
        if access.write_token is None:
            raise HTTPException(403, "captured texts are readable only with a token: start the service with --token-file")
        if not hooks.holds(request, access.write_token):
            raise HTTPException(401, "captured texts need the token: send 'Authorization: Bearer <token>'")

    @api.get("/captures", dependencies=[Depends(token_only)])
    def captures(offset: int = 0, limit: int = 100) -> dict:
        if offset < 0 or not 1 <= limit <= 1_000:
            raise DyntcError(f"offset must be >= 0 and limit in 1..1000, got offset={offset}, limit={limit}")
        rows, total = log.read(offset, limit)
        return {"capturing": inbox is not None, "total": total, "captures": rows}

    @api.delete("/captures", dependencies=[Depends(token_only)])
    def clear_captures() -> dict:
        log.remove()
        return {"total": 0}

    @api.post("/captures/dismiss", dependencies=[Depends(token_only)])
    def dismiss(req: Dismiss) -> dict:
        log.remove(req.texts)
        return {"total": log.read(0, 1)[1]}

    @api.post("/captures/out-of-scope", dependencies=[Depends(writer)])
    def out_of_scope(req: OutOfScope) -> dict:
        chars = check_write(limits, [], req.texts)
        service.current().require_calibration("marking texts out of scope")
        clf = service.write(lambda c: c.add_out_of_scope(req.texts), chars)
        if access.write_token is not None:
            log.remove(req.texts)
        return {**labels_body(clf), "oos_examples": len(clf.calibration_.oos_examples)}

    @api.post("/discover/accept", dependencies=[Depends(writer)])
    def accept(req: Accept) -> dict:
        if (req.name is None) == (req.into is None):
            raise DyntcError("give either name (a new label) or into (an existing label), not both or neither")
        chars = check_write(limits, [req.name or req.into], req.texts)
        if req.name is not None:
            clf = service.write(lambda c: c.add_label(req.name, req.texts), chars)
        else:
            clf = service.write(lambda c: c.add_examples(req.into, req.texts), chars)
        if access.write_token is not None:  # without a token nobody reads the inbox, and nothing is captured
            log.remove(req.texts)
        return labels_body(clf)

    if hasattr(DynamicClassifier, "discover"):
        from dyntc.classifier.discovery import check_discover
        from dyntc.core.encoders.pretrained import no_disk_cache

        jobs = Jobs()

        @api.post("/discover", dependencies=[Depends(writer)])
        def discover(req: Discover, request: Request):
            texts = req.texts
            source = "captures" if texts is None else "texts"
            if texts is None:  # as many as --capture keeps (another replica may capture), else --max-examples
                token_only(request)
                texts = log.texts()
                bound = max(limits.max_examples, inbox.policy.capture if inbox is not None else 0)
                if len(texts) > bound:
                    raise HTTPException(413, f"{len(texts):,} captured texts; this service clusters at most {bound:,} "
                                             "(--capture, --max-examples): dismiss some, or post the texts to cluster")
                chars = sum(map(len, texts))
            elif len(texts) > limits.max_examples:
                raise HTTPException(413, f"{len(texts):,} texts to cluster; this service takes at most "
                                     f"{limits.max_examples:,} in a request (--max-examples)")
            else:
                chars = check_write(limits, [], texts) if texts else 0
            clf = service.current()
            if req.adapt_s is None:
                with service.workers.take(chars):
                    found = clf.discover(texts, n_new=req.n_new)
                return {"version": clf.version_, "source": source, **found.to_dict()}
            if req.adapt_s > limits.max_adapt_s:
                raise HTTPException(413, f"adapt_s={req.adapt_s:g}; this service adapts for at most "
                                         f"{limits.max_adapt_s:g} s (--max-adapt-s)")
            check_discover(clf, texts, req.n_new, adapt_s=req.adapt_s)  # a bad request fails now, not in the job

            def work() -> dict:
                with no_disk_cache():  # posted or captured texts never reach the disk cache
                    found = clf.discover(texts, n_new=req.n_new, adapt_s=req.adapt_s)
                return {"version": clf.version_, "source": source, **found.to_dict()}

            try:
                job = jobs.start("discover", source, work)
            except JobConflict as exc:
                raise HTTPException(409, str(exc)) from None
            return JSONResponse(job.to_dict(), status_code=202, headers={"Location": job.url})

        def job_reader(request: Request) -> None:
            """What started a job reads it: the write token where there is one (a GET: no body type)."""
            if access.write_token is None:
                reader(request)
            elif not hooks.holds(request, access.write_token):
                raise HTTPError(401, "a discovery job is read with the token that started it: "
                                     "send 'Authorization: Bearer <token>'")

        @api.get("/discover/jobs/{job_id}", dependencies=[Depends(job_reader)])
        def discover_job(job_id: str, request: Request) -> dict:
            job = jobs.get(job_id)
            if job is None:
                raise HTTPError(404, f"no discovery job {job_id[:64]!r} here: a job lives in the service process "
                                         f"that started it, for {jobs.keep_s / 60:g} minutes after it ends")
            if job.source == "captures":
                token_only(request)
            return job.to_dict()

    if hasattr(DynamicClassifier, "suggest"):

        @api.get("/suggestions", dependencies=[Depends(reader)])
        def suggestions() -> dict:
            clf = service.current()
            return {"version": clf.version_,
                    "suggestions": [{**s.to_dict(), "description": s.describe()} for s in clf.suggest()]}

    return api
