"""``dyntc serve``: the HTTP routes over a :class:`~dyntc.classifier.service.service.Service`.

Reads (``/predict``, ``/labels``, ``/versions``, ``/healthz``) and writes (label operations,
restore) go through one Service (:mod:`~dyntc.classifier.service.service`: durability,
consistency, following other writers); every request is bounded before it is parsed or embedded
(:mod:`~dyntc.classifier.service.limits`); :mod:`~dyntc.classifier.service.access` says who may read
and write. Texts from requests are cached in memory (bounded in bytes), never on disk.

Routes are grouped in routers (:data:`ROUTERS`); a route reaches the service through the
:func:`service_of` dependency and is guarded by :func:`reader` or :func:`writer`, so a new group of
routes is one more router passed to :func:`create_app`.

**Errors.** Every failure is a JSON answer ``{"error": "..."}`` naming the problem, its status
chosen by the error's type (:data:`STATUS`): 400 bad values or malformed JSON, 401 a missing or
wrong token, 403 a refused origin or host, 404 an unknown label, version or path, 405 a wrong method,
408 a body that did not arrive in time, 409 a label name in use or a model without calibration, 413
a request over a limit, 415 a write without a JSON body type, 422 a field of the wrong type, 503 a
store that is gone or unreadable, 507 a full disk. Nothing is changed by a failed write.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException

from dyntc.classifier import DynamicClassifier
from dyntc.classifier.service import console
from dyntc.classifier.service.access import Access, _bearer, _same_token
from dyntc.classifier.service.inbox import CapturePolicy
from dyntc.classifier.service.limits import HTTPError, Limits, RequestGuard, check_batch, check_write
from dyntc.classifier.service.service import Service
from dyntc.classifier.store import StoreFullError, StoreUnavailableError
from dyntc.errors import (CalibrationRequiredError, DyntcError, LabelExistsError, UnknownLabelError,
                          VersionNotFoundError)

#: Texts of one /predict request embedded per call (a maximal request is several calls).
EMBED_CHUNK = 32
#: The HTTP status of each error type (the first that matches, most specific first); other DyntcErrors are 400.
STATUS: tuple[tuple[type[DyntcError], int], ...] = (
    (StoreFullError, 507), (StoreUnavailableError, 503), (UnknownLabelError, 404), (VersionNotFoundError, 404),
    (LabelExistsError, 409), (CalibrationRequiredError, 409),
)


def status_of(exc: DyntcError) -> int:
    return next((status for kind, status in STATUS if isinstance(exc, kind)), 400)


# ---------------------------------------------------------------------------------------- requests
# Strict types: JSON true is not a count, "yes" is not a boolean.


class PredictRequest(BaseModel):
    texts: list[StrictStr] = Field(description="Texts to classify (at most the service's max batch)")
    top_k: StrictInt = Field(1, ge=1, le=1_000, description="Also return the k nearest labels with their distances")
    proba: StrictBool = Field(False, description="Add the probability of the predicted label (softmax of the "
                                                 "model's scores / T: the cosine head's by default; T from calibrate)")
    ranking: StrictInt = Field(0, ge=0, le=1_000, description="Also return the k most probable labels with their "
                                                              "confidences (like Rasa's intent_ranking); 0 = none")
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


# ---------------------------------------------------------------------------------------- dependencies


def service_of(request: Request) -> Service:
    return request.app.state.service


def reader(request: Request) -> None:
    service_of(request).access.check_read(request)


def writer(request: Request) -> None:
    service_of(request).access.check_write(request)


def labels_body(clf: DynamicClassifier) -> dict:
    return {"version": clf.version_, "labels": clf.support_counts()}


# ---------------------------------------------------------------------------------------- routes

health = APIRouter(tags=["health"])
reads = APIRouter(tags=["reads"], dependencies=[Depends(reader)])
writes = APIRouter(tags=["writes"], dependencies=[Depends(writer)])


@health.get("/healthz")
async def healthz(service: Service = Depends(service_of)) -> dict:
    """The version served and whether the store answers ("ok") or not ("degraded": reads go on from
    memory, writes are refused with 503); answered from memory, never waiting on the store."""
    return service.health()


@reads.post("/predict")
def predict(req: PredictRequest, service: Service = Depends(service_of)) -> dict:
    chars = check_batch(req.texts, service.limits)
    clf = service.current()
    if req.reject:
        clf.require_calibration("reject=true")
    with service.workers.take(chars):
        # in chunks: between two, the interpreter lock is free for a short request's Python work
        scores = np.concatenate([clf.label_scores(req.texts[i: i + EMBED_CHUNK])
                                 for i in range(0, len(req.texts), EMBED_CHUNK)])
    if service.inbox is not None:  # dyntc serve --capture: the texts it could not place, for the console
        service.inbox.observe(clf, req.texts, scores)
    return {"version": clf.version_, "labels": clf.classes_.tolist(),
            "results": clf.prediction_records(scores, top_k=req.top_k, proba=req.proba, reject=req.reject,
                                              ranking=req.ranking)}


@reads.get("/labels")
def labels(service: Service = Depends(service_of)) -> dict:
    return labels_body(service.current())


@reads.get("/versions")
def versions(limit: int = 20, service: Service = Depends(service_of)) -> dict:
    if not 1 <= limit <= 10_000:
        raise DyntcError(f"limit must be in 1..10000, got {limit}")
    return {"versions": service.store.versions(limit)}


@writes.post("/labels", status_code=201)
def add_label(req: NewLabel, service: Service = Depends(service_of)) -> dict:
    chars = check_write(service.limits, [req.name], req.examples)
    return labels_body(service.write(lambda clf: clf.add_label(req.name, req.examples), chars))


@writes.post("/labels/merge")
def merge_labels(req: Merge, service: Service = Depends(service_of)) -> dict:
    check_write(service.limits, [req.into], [])
    return labels_body(service.write(lambda clf: clf.merge_labels(req.names, req.into), 0))


@writes.post("/labels/{name}/examples")
def add_examples(name: str, req: Examples, service: Service = Depends(service_of)) -> dict:
    chars = check_write(service.limits, [], req.examples)
    return labels_body(service.write(lambda clf: clf.add_examples(name, req.examples), chars))


@writes.delete("/labels/{name}")
def remove_label(name: str, service: Service = Depends(service_of)) -> dict:
    return labels_body(service.write(lambda clf: clf.remove_label(name), 0))


@writes.post("/labels/{name}/split")
def split_label(name: str, req: Split, service: Service = Depends(service_of)) -> dict:
    chars = check_write(service.limits, list(req.parts), [t for texts in req.parts.values() for t in texts])
    return labels_body(service.write(lambda clf: clf.split_label(name, req.parts, reassign=req.reassign), chars))


@writes.post("/labels/{name}/rename")
def rename_label(name: str, req: Rename, service: Service = Depends(service_of)) -> dict:
    check_write(service.limits, [req.to], [])
    return labels_body(service.write(lambda clf: clf.rename_label(name, req.to), 0))


@writes.post("/versions/{version}/restore")
def restore(version: int, service: Service = Depends(service_of)) -> dict:
    return labels_body(service.restore(version))


#: The route groups every service has; :func:`create_app` includes them, then any it is given.
ROUTERS = (health, reads, writes)


# ---------------------------------------------------------------------------------------- the app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(DyntcError)
    def _dyntc_error(request: Request, exc: DyntcError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=status_of(exc))

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


def create_app(model_dir: str | Path, *, limits: Limits = Limits(), access: Access = Access(),
               routers: Iterable[APIRouter] = (), capture: CapturePolicy = CapturePolicy()) -> RequestGuard:
    """The application serving the classifier saved at `model_dir` (a directory or a
    ``postgresql://`` URL): FastAPI with the :data:`ROUTERS` and any further `routers`, and the
    console (:mod:`~dyntc.classifier.service.console`) with its inbox (`capture`), wrapped in
    its :class:`~dyntc.classifier.service.limits.RequestGuard`. ``.app.state.service`` is the
    :class:`~dyntc.classifier.service.service.Service`."""
    service = Service(model_dir, limits=limits, access=access)
    service.inbox = console.open_inbox(service, capture)
    # /docs is served by the console from local files, not from a CDN
    app = FastAPI(title="dyntc", description="A text classifier whose label set changes live.",
                  docs_url=None, redoc_url=None)
    app.state.service = service
    _install_error_handlers(app)
    for router in (*ROUTERS, *routers):
        app.include_router(router)
    console.install(app, service, service.inbox, console.Hooks(
        reader, writer, labels_body, check_write,
        lambda request, token: token is not None and _same_token(_bearer(request), token)))
    return RequestGuard(app, limits, access.host_refusal)
