"""The label console of ``dyntc serve``: pages for people who own a label set but do not write code.

Server-rendered HTML (Jinja2 templates in ``templates/``) and two small scripts (``static/console.js``;
the inbox's ``static/inbox.js``), shipped in the package: no CDN, no build step, works offline. ``/`` is the labels table; the other
pages are under ``/console/``. The JSON API is unchanged; the console adds the few reads and writes
it needs (a label's examples, removing examples, the difference between two versions) and serves the
OpenAPI page at ``/docs`` from local files (those of the ``fastapi-offline`` package; without it
``/docs`` is absent and ``/openapi.json`` remains).

Access is the service's own: pages are reads (with a read token configured, a page asks to sign in
and the script fetches it again with the token); every change is a call of the JSON API made by the
script with ``Authorization: Bearer <token>``, so the service's checks (token, limits, Origin/Host,
JSON content type) apply unchanged. The token lives in the tab's ``sessionStorage``: never in a URL
or a cookie, so another site cannot ride it. A service started without ``--token-file`` gets a
read-only console that says so. Pages forbid framing and inline scripts (Content-Security-Policy).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, StrictStr

from dyntc.classifier.service.inbox import DAY_S, CapturePolicy, Inbox, router as inbox_router
from dyntc.classifier.store import history
from dyntc.classifier.store.captures import CaptureLog
from dyntc.errors import DyntcError, UnknownLabelError

HERE = Path(__file__).parent
LABELS_PER_PAGE = 50
EXAMPLES_PER_PAGE = 100
VERSIONS_PER_PAGE = 50
CAPTURES_PER_PAGE = 100
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def open_inbox(service, policy: CapturePolicy) -> Inbox | None:
    """The service's capture of unplaced texts (None when ``--capture`` is 0)."""
    if not policy.capture:
        return None
    inbox = Inbox(CaptureLog(service.store, policy.capture, policy.capture_days * DAY_S), policy)
    close = service.close

    def close_both() -> None:
        inbox.close()
        close()

    service.close = close_both
    return inbox


@dataclass(frozen=True)
class Hooks:
    """What the console takes from the service's application (handed in, so that this module never
    imports it): its read and write guards (FastAPI dependencies), the body of a labels answer, the
    limits of a write, and whether a request carries a given bearer token."""

    reader: Callable[[Request], None]
    writer: Callable[[Request], None]
    labels_body: Callable
    check_write: Callable
    holds: Callable[[Request, str | None], bool]


class RemoveExamples(BaseModel):
    examples: list[StrictStr]


def _templates():
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["path"] = lambda name: quote(str(name), safe="")
    env.filters["when"] = lambda iso: (iso or "")[:19].replace("T", " ")
    return env


class _ChangeCache:
    """:func:`history.label_changes` of the newest version, read once per version."""

    def __init__(self, store):
        self.store, self._lock, self._value = store, threading.Lock(), (None, {})

    def get(self, version: int) -> dict:
        with self._lock:
            if self._value[0] != version:
                self._value = (version, history.label_changes(self.store))
            return self._value[1]


def describe_change(op: str, detail) -> str:
    """A version's change in words, from its operation and the detail the store recorded."""
    if isinstance(detail, dict) and "version" in detail:
        return f"restored version {detail['version']}"
    words = []
    for d in detail if isinstance(detail, list) else []:
        if not isinstance(d, dict):
            continue
        kind, label = d.get("op"), d.get("label")
        n = d.get("examples")
        examples = f"{n} example{'' if n == 1 else 's'}"
        said = {
            "add_label": f"added {label} ({examples})",
            "add_examples": f"added {examples} to {label}",
            "remove_examples": f"removed {examples} from {label}",
            "remove_label": f"removed {label}",
            "rename_label": f"renamed {label} → {d.get('to')}",
            "merge_labels": f"merged {', '.join(map(str, d.get('labels') or []))} into {d.get('into')}",
            "split_label": f"split {label} into {', '.join(map(str, d.get('into') or []))}",
            "calibrate": "calibrated",
            "add_out_of_scope": f"kept {d.get('texts')} out-of-scope example{'' if d.get('texts') == 1 else 's'}",
            "save": "saved",
        }.get(kind, str(kind))
        words.append(said)
    if not words:
        return op
    return "; ".join(words[:3]) + (f"; and {len(words) - 3} more" if len(words) > 3 else "")


def _pages(n: int, per: int, page: int) -> dict:
    last = max(1, math.ceil(n / per))
    if page < 1 or page > last:
        raise DyntcError(f"page {page} does not exist: the pages are 1..{last}")
    return {"page": page, "last": last, "start": (page - 1) * per}


def install(app: FastAPI, service, inbox: Inbox | None, hooks: Hooks) -> None:
    """Add the console's pages, its extra API endpoints and the inbox's endpoints to `app`."""
    access, limits = service.access, service.limits
    reader, writer, labels_body, check_write = hooks.reader, hooks.writer, hooks.labels_body, hooks.check_write
    env = _templates()
    changes = _ChangeCache(service.store)
    app.include_router(inbox_router(service, inbox, hooks))
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")

    # ------------------------------------------------------------------ the API the console adds

    @app.get("/labels/{name}/examples", dependencies=[Depends(reader)])
    def label_examples(name: str) -> dict:
        clf = service.current()
        return {"version": clf.version_, "label": name, "examples": clf.support(name)}

    @app.post("/labels/{name}/examples/remove", dependencies=[Depends(writer)])
    def remove_examples(name: str, req: RemoveExamples) -> dict:
        check_write(limits, [], req.examples)
        return labels_body(service.write(lambda clf: clf.remove_examples(name, req.examples), 0))

    @app.get("/versions/diff", dependencies=[Depends(reader)])
    def versions_diff(a: int, b: int) -> dict:
        return history.diff(service.store, a, b)

    @app.get("/console/whoami")
    def whoami(request: Request) -> dict:
        """What the bearer token of this request may do (the sign-in form checks a token with it)."""
        write = hooks.holds(request, access.write_token)
        read = write or access.read_token is None or hooks.holds(request, access.read_token)
        return {"write": write, "read": read, "write_token_set": access.write_token is not None}

    # ------------------------------------------------------------------ pages

    def can_read(request: Request) -> bool:
        if access.read_token is None:
            return True
        return hooks.holds(request, access.read_token) or hooks.holds(request, access.write_token)

    def has_write_token(request: Request) -> bool:
        return hooks.holds(request, access.write_token)

    def render(request: Request, template: str, title: str, status: int = 200, *, locked: bool = False,
               **context) -> HTMLResponse:
        html = env.get_template(template).render(
            title=title, locked=locked, writable=access.write_token is not None,
            read_token=access.read_token is not None, path=request.url.path, **context)
        return HTMLResponse(html, status_code=status, headers=HEADERS)

    def page(template: str, title: str, *, needs_token: bool = False):
        """A page route: `build(request, **params)` makes its context; errors become an error page;
        without the read (or, with `needs_token`, the write) token the page asks to sign in."""

        def wrap(build):
            def handler(request: Request):
                locked = not can_read(request) or (needs_token and not has_write_token(request))
                if locked:
                    return render(request, template, title, locked=True)
                try:
                    context = build(request)
                except DyntcError as exc:
                    status = 404 if isinstance(exc, UnknownLabelError) else 400
                    return render(request, "error.html", "Not found" if status == 404 else "Error", status,
                                  message=str(exc))
                except Exception as exc:  # a page in words, never a blank one
                    return render(request, "error.html", "The console failed", 500,
                                  message=f"{type(exc).__name__}: {exc}")
                if isinstance(context, RedirectResponse):
                    return context
                return render(request, template, context.pop("title", title), **context)

            handler.__name__ = build.__name__
            return handler

        return wrap

    def qint(request: Request, name: str, default: int) -> int:
        value = request.query_params.get(name, "")
        if not value:
            return default
        if not value.lstrip("-").isdigit():
            raise DyntcError(f"{name} must be a whole number, got {value[:20]!r}")
        return int(value)

    @page("labels.html", "Labels")
    def labels_page(request: Request) -> dict:
        clf = service.current()
        counts = clf.support_counts()
        query = request.query_params.get("q", "").strip()
        names = sorted((n for n in counts if query.casefold() in n.casefold()), key=str.casefold)
        pages = _pages(len(names), LABELS_PER_PAGE, qint(request, "page", 1))
        last = changes.get(clf.version_)
        rows = [{"name": n, "examples": counts[n], "changed": last.get(n, {})}
                for n in names[pages["start"]: pages["start"] + LABELS_PER_PAGE]]
        return {"rows": rows, "q": query, "matches": len(names), "n_labels": len(counts),
                "n_examples": sum(counts.values()), "version": clf.version_, **pages}

    @page("label.html", "Label")
    def label_page(request: Request) -> dict:
        name = request.path_params["name"]
        clf = service.current()
        examples = clf.support(name)
        pages = _pages(len(examples), EXAMPLES_PER_PAGE, qint(request, "page", 1))
        shown = examples[pages["start"]: pages["start"] + EXAMPLES_PER_PAGE]
        return {"title": name, "name": name, "examples": shown, "n_examples": len(examples),
                "changed": changes.get(clf.version_).get(name, {}), "version": clf.version_, **pages}

    @page("split.html", "Split")
    def split_page(request: Request) -> dict:
        name = request.path_params["name"]
        return {"title": f"Split {name}", "name": name, "examples": service.current().support(name)}

    @page("try.html", "Try it")
    def try_page(request: Request) -> dict:
        clf = service.current()
        return {"calibrated": _calibrated(clf), "n_labels": clf.n_classes_, "version": clf.version_}

    @page("versions.html", "Versions")
    def versions_page(request: Request) -> dict:
        head = service.store.head_version()
        page_no = qint(request, "page", 1)
        rows, total = history.version_page(service.store, (max(page_no, 1) - 1) * VERSIONS_PER_PAGE, VERSIONS_PER_PAGE)
        pages = _pages(total, VERSIONS_PER_PAGE, page_no)
        for row in rows:
            row["change"] = describe_change(row["op"], row["detail"])
        return {"rows": rows, "head": head, "total": total, **pages}

    @page("diff.html", "Difference")
    def diff_page(request: Request) -> dict:
        head = service.store.head_version()
        a, b = qint(request, "a", max(head - 1, 1)), qint(request, "b", head)
        return {"title": f"Version {a} → {b}", "diff": history.diff(service.store, a, b), "head": head}

    @page("inbox.html", "Inbox", needs_token=True)
    def inbox_page(request: Request) -> dict:
        log = inbox.log if inbox is not None else CaptureLog(service.store, 1_000_000, 3650 * DAY_S)
        page_no = qint(request, "page", 1)
        rows, total = log.read((max(page_no, 1) - 1) * CAPTURES_PER_PAGE, CAPTURES_PER_PAGE)
        pages = _pages(total, CAPTURES_PER_PAGE, page_no)
        from dyntc.classifier import DynamicClassifier

        clf = service.current()
        return {"rows": rows, "total": total, "capturing": inbox is not None,
                "policy": inbox.policy if inbox is not None else None, "labels": clf.classes_.tolist(),
                "can_discover": hasattr(DynamicClassifier, "discover"), "can_adapt": _can_adapt(clf),
                "max_adapt_min": math.floor(service.limits.max_adapt_s / 60 * 100) / 100,  # never above the limit
                "can_suggest": hasattr(DynamicClassifier, "suggest"), "calibrated": _calibrated(clf), **pages}

    app.add_api_route("/", labels_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/labels/{name}", label_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/labels/{name}/split", split_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/try", try_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/versions", versions_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/versions/diff", diff_page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console/inbox", inbox_page, methods=["GET"], include_in_schema=False)
    _offline_docs(app)


def _calibrated(clf) -> bool:
    """Whether `clf` can reject (and so keep out-of-scope examples)."""
    try:
        clf.require_calibration("reject")
        return True
    except DyntcError:
        return False


def _can_adapt(clf) -> bool:
    """Whether a discovery may adapt `clf`'s backbone first (a pretrained one; not hashing or GloVe)."""
    from dyntc.classifier.discovery_tuning import check_adaptable

    try:
        check_adaptable(clf)
    except DyntcError:
        return False
    return True


def _offline_docs(app: FastAPI) -> None:
    """``/docs``: the Swagger page with its script and style served from this process (the files of
    the ``fastapi-offline`` package), never from a CDN. Without that package there is no /docs."""
    try:
        import fastapi_offline
    except ImportError:
        return
    from fastapi.openapi.docs import get_swagger_ui_html

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs/static", StaticFiles(directory=assets), name="docs-static")

    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="dyntc API",
                                   swagger_js_url="/docs/static/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/static/swagger-ui.css",
                                   swagger_favicon_url="/docs/static/favicon.png")

    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
