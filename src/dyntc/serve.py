"""``dyntc serve``: an HTTP service over a saved classifier whose label set changes live.

Reads (``/predict``, ``/labels``, ``/versions``, ``/healthz``) and writes (label operations,
restore) go through one :class:`Service`:

- **Durability.** A write is one version of the model directory's store
  (:mod:`dyntc.classifier.store`), committed before the response; restarting the service loads the
  newest committed version. A process killed mid-write leaves the previous version.
- **Consistency.** A write applies its operation to a copy of the current classifier
  (:meth:`DynamicClassifier.copy`, copy-on-write of the label set), commits it, then swaps the
  reference; a read takes the reference once. So a prediction sees the old or the new label set,
  never a mix. Writes are serialised by a lock in the process and by the store's write lock across
  processes: if another process (a ``dyntc labels`` command) committed meanwhile, the newest version
  is loaded first; reads notice such a version too.
- **Responsiveness.** Endpoints that embed text are plain ``def`` functions, which FastAPI runs in
  its thread pool, so a slow batch never blocks the event loop (``/healthz`` stays fast).
- **Errors.** Bad input is a 4xx answer ``{"error": "..."}`` naming the problem: 400 bad values or
  malformed JSON, 401 a missing or wrong bearer token on a write, 404 an unknown label or version,
  409 a label name in use or a model without calibration, 413 a batch over ``max_batch``, 422 a
  field of the wrong type. Nothing is changed by a failed write.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from dyntc.classifier import DynamicClassifier, ModelStore, saving
from dyntc.errors import DyntcError, LabelExistsError, UnknownLabelError

DEFAULT_MAX_BATCH = 256


class Service:
    """The current classifier of one model directory, and the serialised way to change it."""

    def __init__(self, model_dir: str | Path, *, token: str | None = None, max_batch: int = DEFAULT_MAX_BATCH):
        self.path = Path(model_dir)
        self.store = ModelStore.open(self.path)
        self.token = token
        self.max_batch = max_batch
        self._current = DynamicClassifier.load(self.path)
        self._lock = threading.Lock()

    def _head(self) -> int:
        return self.store.versions(limit=1)[0]["version"]

    def current(self) -> DynamicClassifier:
        """The classifier to read from (reloaded if another process committed a newer version)."""
        clf = self._current
        if self._head() != clf.version_:
            with self._lock:
                if self._head() != self._current.version_:
                    self._current = DynamicClassifier.load(self.path)
                clf = self._current
        return clf

    def write(self, op: Callable[[DynamicClassifier], Any]) -> DynamicClassifier:
        """Apply `op` to a copy of the newest classifier and commit it as one version; returns it."""
        with self._lock:
            with self.store.transaction() as txn:
                base = self._current
                if txn.head != base.version_:  # another process wrote: start from its version
                    base = saving.from_snapshot(DynamicClassifier, txn.read())
                new = base.copy()
                op(new)
                version, store_id = saving.commit(new, txn, "http"), txn.store_id
            saving.mark_committed(new, store_id, version)  # committed: readers may see it now
            self._current = new
        return new

    def restore(self, version: int) -> DynamicClassifier:
        with self._lock:
            DynamicClassifier.restore(self.path, version)
            self._current = DynamicClassifier.load(self.path)
            return self._current


# ---------------------------------------------------------------------------------------- requests


class PredictRequest(BaseModel):
    texts: list[str] = Field(description="Texts to classify (at most the service's max batch)")
    top_k: int = Field(1, ge=1, description="Also return the k nearest labels with their distances")
    proba: bool = Field(False, description="Add the probability of the predicted label (softmax of -d²/T)")
    reject: bool = Field(False, description="Label out-of-scope texts null (needs a calibrated model)")


class NewLabel(BaseModel):
    name: str
    examples: list[str]


class Examples(BaseModel):
    examples: list[str]


class Split(BaseModel):
    parts: dict[str, list[str]] = Field(description="{new label: its examples}, at least two")
    reassign: bool = False


class Merge(BaseModel):
    names: list[str]
    into: str


class Rename(BaseModel):
    to: str


def _labels_body(clf: DynamicClassifier) -> dict:
    return {"version": clf.version_, "labels": clf.support_counts()}


# ---------------------------------------------------------------------------------------- the app


def create_app(model_dir: str | Path, *, token: str | None = None, max_batch: int = DEFAULT_MAX_BATCH) -> FastAPI:
    """The FastAPI application serving the classifier saved in `model_dir`."""
    if not (isinstance(max_batch, int) and max_batch >= 1):
        raise DyntcError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    if token is not None and not token.strip():
        raise DyntcError("the token is empty: put a secret in the token file, or serve without one")
    service = Service(model_dir, token=token, max_batch=max_batch)
    app = FastAPI(title="dyntc", description="A text classifier whose label set changes live.")
    app.state.service = service

    @app.exception_handler(DyntcError)
    def _dyntc_error(request: Request, exc: DyntcError) -> JSONResponse:
        status = 404 if isinstance(exc, UnknownLabelError) else 409 if isinstance(exc, LabelExistsError) else 400
        if "needs a calibrated classifier" in str(exc):
            status = 409
        return JSONResponse({"error": str(exc)}, status_code=status)

    @app.exception_handler(RequestValidationError)
    def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return JSONResponse({"error": "the request body is not valid JSON"}, status_code=400)
        where = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}" for e in errors)
        return JSONResponse({"error": f"invalid request: {where}"}, status_code=422)

    def writer(authorization: str | None = Header(None)) -> None:
        if service.token is None:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        # bytes: compare_digest refuses non-ASCII str, which would turn a stranger's header into a 500
        if not (authorization or "").startswith("Bearer ") or not hmac.compare_digest(
                given.encode("utf-8", "surrogateescape"), service.token.encode("utf-8")):
            raise _HTTPError(401, "this endpoint changes the model: send 'Authorization: Bearer <token>'")

    @app.exception_handler(_HTTPError)
    def _http_error(request: Request, exc: _HTTPError) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.get("/healthz")
    async def healthz() -> dict:
        clf = service._current  # no store access: health must answer even while the model is busy
        return {"status": "ok", "version": clf.version_, "n_labels": clf.n_classes_}

    @app.post("/predict")
    def predict(req: PredictRequest) -> dict:
        if not req.texts:
            raise DyntcError("texts is empty: send at least one text")
        if len(req.texts) > service.max_batch:
            raise _HTTPError(413, f"{len(req.texts)} texts in one request; this service takes at most "
                                  f"{service.max_batch} (split the batch or start it with a larger --max-batch)")
        clf = service.current()
        scores = clf.decision_function(req.texts)
        ranked = clf.nearest_labels(-scores, req.top_k)
        threshold = clf.require_calibration("reject=true").threshold if req.reject else None
        probs = clf.proba_from_scores(scores).max(1).tolist() if req.proba else None
        results = []
        for i, row in enumerate(ranked):
            record: dict[str, Any] = {"label": row[0][0]}
            if threshold is not None and row[0][1] > threshold:
                record["label"] = None
            if probs is not None:
                record["probability"] = probs[i]
            if req.top_k > 1:
                record["top_k"] = [{"label": label, "distance": d} for label, d in row]
            results.append(record)
        return {"version": clf.version_, "labels": clf.classes_, "results": results}

    @app.get("/labels")
    def labels() -> dict:
        return _labels_body(service.current())

    @app.post("/labels", status_code=201, dependencies=[Depends(writer)])
    def add_label(req: NewLabel) -> dict:
        return _labels_body(service.write(lambda clf: clf.add_label(req.name, req.examples)))

    @app.post("/labels/merge", dependencies=[Depends(writer)])
    def merge_labels(req: Merge) -> dict:
        return _labels_body(service.write(lambda clf: clf.merge_labels(req.names, req.into)))

    @app.post("/labels/{name}/examples", dependencies=[Depends(writer)])
    def add_examples(name: str, req: Examples) -> dict:
        return _labels_body(service.write(lambda clf: clf.add_examples(name, req.examples)))

    @app.delete("/labels/{name}", dependencies=[Depends(writer)])
    def remove_label(name: str) -> dict:
        return _labels_body(service.write(lambda clf: clf.remove_label(name)))

    @app.post("/labels/{name}/split", dependencies=[Depends(writer)])
    def split_label(name: str, req: Split) -> dict:
        return _labels_body(service.write(lambda clf: clf.split_label(name, req.parts, reassign=req.reassign)))

    @app.post("/labels/{name}/rename", dependencies=[Depends(writer)])
    def rename_label(name: str, req: Rename) -> dict:
        return _labels_body(service.write(lambda clf: clf.rename_label(name, req.to)))

    @app.get("/versions")
    def versions(limit: int = 20) -> dict:
        if limit < 1:
            raise DyntcError(f"limit must be >= 1, got {limit}")
        return {"versions": service.store.versions(limit)}

    @app.post("/versions/{version}/restore", dependencies=[Depends(writer)])
    def restore(version: int) -> dict:
        head = service._head()
        if not 1 <= version <= head:
            raise _HTTPError(404, f"no version {version}; the versions are 1..{head}")
        return _labels_body(service.restore(version))

    return app


class _HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def run(model_dir: Path, host: str, port: int, token_file: Path | None, max_batch: int) -> None:
    """Serve until interrupted (the ``dyntc serve`` command)."""
    import uvicorn

    token = None
    if token_file is not None:
        if not token_file.is_file():
            raise DyntcError(f"token file {str(token_file)!r} does not exist")
        token = token_file.read_text(encoding="utf-8").strip()
    app = create_app(model_dir, token=token, max_batch=max_batch)
    uvicorn.run(app, host=host, port=port, log_level="warning")
