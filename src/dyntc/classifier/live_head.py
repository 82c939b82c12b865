"""The cosine head of a :class:`~dyntc.classifier.DynamicClassifier` (``head="cosine"``, the default):
the scorer of :mod:`dyntc.classifier.head` run over the classifier's own label set, with label
operations that take effect at once and a refresh in a background thread.

The score of label c for a text x (``decision_function``; higher = better) is

    s(x, c) = scale · (cos(h(x), w_c) − o_c)   [+ proto_weight · proto_scale · (−d²(x, c)) if set]

with ``h(x)`` the encoder-space coordinates of the text's point (the point itself in Euclidean
space; on the hyperboloid its spatial part, whose direction is that of the log map at the origin:
the head is a cosine classifier, so it needs only directions, and on the tangent space at the origin
a cosine is sound where a hyperbolic distance is not), ``w_c`` the label's unit weight and ``o_c``
its offset (:mod:`dyntc.classifier.head`). A merged label has one weight per part and scores the
best of them, as its prototypes do.

**Trained and imprinted labels.** A refresh trains one weight per part of every label on every
stored support point (logit-adjusted L-BFGS with a pull toward the prototypes), always starting from
the prototypes: its result depends on the label set only, so a classifier loaded from a store, a
copy or a deep copy gets the same weights as the original's refresh of the same labels. Its
result, :class:`Trained`, is immutable and keyed by the label's :class:`~dyntc.classifier.labels.Support`
object, which a label operation replaces and never changes in place. So a label whose support
changed since the refresh (added, given examples, split, merged) has no trained weight and is
scored at once with its *imprinted* weight (its normalised prototype, minus its imprint offset: at least the
refresh's, more for a label among close neighbours, :func:`~dyntc.classifier.head.imprint_offsets`); a
renamed label keeps its support object and its weight; a removed one is simply not scored.

**Installing** a refresh is one assignment of a new :class:`Trained` to the label set's ``head``: a
reader takes that reference once and scores with it, so it never sees a half-built head. A label
added while a refresh trains is not in that refresh's snapshot, stays imprinted after the swap and
schedules the next refresh. :class:`Refresher` is the one background thread per classifier
(debounced, never two refreshes at once; it exits when idle).

**Distances.** :func:`sq_distances` turns scores into the squared distances ``top_k``,
``prediction_records`` and the out-of-scope threshold use: ``d² = 2 − 2 s / scale`` (the configured
scale), i.e. ``‖x̂ − ŵ_c‖² + 2 o_c`` (the squared chord between the text's direction and the
label's weight on the unit sphere, plus twice the imprint offset), so the nearest label is the
best-scored one and rejecting beyond a distance is rejecting below a top score.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dyntc.classifier.head import HeadConfig, Reference, imprint_offsets, normalize, reference, train_cosine_head
from dyntc.errors import DyntcError, is_number

log = logging.getLogger(__name__)

#: The values of the ``head`` parameter: a name, or None for the nearest-prototype scorer.
HEADS = ("cosine",)
#: Seconds after the last label operation before the background refresh starts (``refresh_delay``).
REFRESH_DELAY_S = 1.0
_OPTIONS = tuple(f.name for f in dataclasses.fields(HeadConfig) if f.name != "debias") + ("refresh_delay",)


def head_config(options: Mapping[str, Any] | None) -> tuple[HeadConfig, float]:
    """``(HeadConfig, refresh delay in seconds)`` from a classifier's ``head_options``."""
    opts = dict(options or {})
    if "debias" in opts:
        raise DyntcError("head_options: 'debias' is the classifier's own parameter (DynamicClassifier(debias=...))")
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise DyntcError(f"head_options {unknown} are not options of the cosine head; it takes {', '.join(_OPTIONS)}")
    delay = opts.pop("refresh_delay", REFRESH_DELAY_S)
    if not (is_number(delay) and math.isfinite(delay) and delay >= 0):
        raise DyntcError(f"head_options: refresh_delay must be a number of seconds >= 0, got {delay!r}")
    try:
        config = HeadConfig(**opts)
    except DyntcError as exc:
        raise DyntcError(f"head_options: {exc}") from None
    return config, float(delay)


def features(space: Any, points: torch.Tensor) -> np.ndarray:
    """The head's input for points of `space` (a :class:`~dyntc.classifier.space.MetricSpace`): their
    encoder-space coordinates as float32 (module docstring)."""
    return space.model.space.euclidean_part(points).float().numpy()


def directions(space: Any, points: torch.Tensor) -> np.ndarray:
    """Unit rows of :func:`features`: the directions the cosine head, the out-of-scope pull and
    ``discover`` compare (a hyperboloid point by its spatial part, the direction of its log map at the
    origin)."""
    return normalize(features(space, points))


def _anchors(space: Any, support: Any) -> np.ndarray:
    """Unit prototypes of a support set's parts in the head's space, ``(n_parts, d)``."""
    x = features(space, support.points)
    if support.n_parts == 1:
        return normalize(x.mean(0, dtype=np.float64)[None, :].astype(np.float32))
    ids = support.part_ids().numpy()
    sums = np.zeros((support.n_parts, x.shape[1]), dtype=np.float64)
    np.add.at(sums, ids, x)
    return normalize((sums / np.bincount(ids)[:, None]).astype(np.float32))


# --------------------------------------------------------------------------- immutable state


class Trained:
    """A refresh's result: the unit weights of every part of the support sets it was trained on (found
    by the support object's identity), the scale, the (least) offset imprinted labels get, the stored
    examples as it scores them (:class:`~dyntc.classifier.head.Reference`, owners: label names; an
    imprinted label's own offset comes from them), and how the refresh went. Never modified once made
    (copies and pickles rebuild the identity index)."""

    __slots__ = ("entries", "scale", "imprint_offset", "info", "reference", "_index")

    def __init__(self, entries: tuple[tuple[Any, np.ndarray], ...], scale: float, imprint_offset: float,
                 info: Mapping[str, Any], reference: Reference | None = None):
        set_ = object.__setattr__
        set_(self, "entries", tuple(entries))  # (Support, (n_parts, d)) pairs
        set_(self, "scale", float(scale))
        set_(self, "imprint_offset", float(imprint_offset))
        set_(self, "info", dict(info))
        set_(self, "reference", reference)
        set_(self, "_index", {id(support): (support, w) for support, w in self.entries})

    def __setattr__(self, name, value):
        raise AttributeError("a Trained head is immutable")

    def __getstate__(self):
        return self.entries, self.scale, self.imprint_offset, self.info, self.reference

    def __setstate__(self, state):
        self.__init__(*state)

    def rows(self, support: Any) -> np.ndarray | None:
        """The trained weights of `support`'s parts, or None (not trained on this very support set)."""
        entry = self._index.get(id(support))
        return entry[1] if entry is not None and entry[0] is support else None


@dataclass(frozen=True)
class View:
    """What scoring needs, for one state of a label set and one :class:`Trained` (made lazily, kept in
    the label set's ``head_view`` and replaced in one assignment)."""

    token: Any  # the label set's prototype rows when this was built (replaced by every label operation)
    trained: Trained | None
    classes: tuple[str, ...]
    supports: tuple[Any, ...]
    anchors: Mapping[int, tuple[Any, np.ndarray]]  # id(Support) -> (Support, unit part prototypes)
    imprints: Mapping[int, tuple[Any, np.ndarray]]  # id(Support) -> (Support, part offsets): imprinted labels
    weights: np.ndarray  # (rows, d) unit: one row per part of every label
    offsets: np.ndarray  # (rows,)
    owner: np.ndarray  # (rows,) label index of every row
    scale: float
    imprinted: tuple[str, ...]


def view(labels: Any, config: HeadConfig) -> View:
    """The scoring view of `labels` (a :class:`~dyntc.classifier.labels.LabelSet`) as it is now."""
    token = labels._prototype_rows()
    trained = labels.head
    current = labels.head_view
    if current is not None and current.token is token and current.trained is trained:
        return current
    known = current.anchors if current is not None else {}
    known_offsets = current.imprints if current is not None and current.trained is trained else {}
    anchors, imprints, weights, offsets, owner, imprinted = {}, {}, [], [], [], []
    items = labels.items()
    for i, (name, support) in enumerate(items):
        entry = known.get(id(support))
        a = entry[1] if entry is not None and entry[0] is support else _anchors(labels.space, support)
        anchors[id(support)] = (support, a)
        w = None if trained is None else trained.rows(support)
        if w is None or w.shape != a.shape:
            w = a
            entry = known_offsets.get(id(support))
            o = entry[1] if entry is not None and entry[0] is support else (
                np.zeros(len(a), np.float32) if trained is None else
                imprint_offsets(a, name, trained.reference, trained.imprint_offset, config.imprint_share))
            imprints[id(support)] = (support, o)
            offsets += list(o)
            imprinted.append(name)
        else:
            offsets += [0.0] * len(a)
        weights.append(w)
        owner += [i] * len(a)
    if not items:
        raise DyntcError("the label set is empty")
    made = View(token, trained, tuple(n for n, _ in items), tuple(s for _, s in items), anchors, imprints,
                np.concatenate(weights).astype(np.float32), np.asarray(offsets, dtype=np.float32),
                np.asarray(owner, dtype=np.int64), float(config.scale if trained is None else trained.scale),
                tuple(imprinted))
    labels.head_view = made
    return made


def scores(v: View, labels: Any, points: torch.Tensor, config: HeadConfig) -> torch.Tensor:
    """``(n, n_classes)`` float64 scores of `points` under view `v` of `labels` (module docstring)."""
    x = normalize(features(labels.space, points))
    logits = torch.from_numpy(v.scale * (x @ v.weights.T - v.offsets[None, :])).double()
    if len(v.owner) != len(v.classes):  # merged labels: the best part
        out = torch.full((len(x), len(v.classes)), float("-inf"), dtype=torch.float64)
        owner = torch.from_numpy(v.owner).expand(len(x), -1)
        logits = out.scatter_reduce(1, owner, logits, reduce="amax")
    if config.proto_weight:
        logits = logits - config.proto_weight * config.proto_scale * labels.sq_distances(points).double()
    return logits


def sq_distances(scores_: torch.Tensor | np.ndarray, config: HeadConfig) -> torch.Tensor:
    """The squared distances the scores stand for: ``2 − 2 s / scale`` (module docstring)."""
    return 2.0 - 2.0 * torch.as_tensor(scores_).double() / config.scale


def carry(trained: Trained | None, labels: Any) -> Trained | None:
    """`trained`'s weights for the support sets of `labels` it was trained on, or that hold the same
    examples (texts, parts and first point) as one it was trained on: another classifier's head
    carried over to a label set loaded anew (a store version read back builds new support objects).
    Labels without a match are scored by their prototype (imprinted) until the next refresh."""
    if trained is None:
        return None
    by_content = {(s.texts, s.parts): (s, w) for s, w in trained.entries}
    entries = []
    for _, support in labels.items():
        w = trained.rows(support)
        if w is None:
            old, w = by_content.get((support.texts, support.parts), (None, None))
            if old is None or w.shape[0] != support.n_parts or not torch.equal(old.points[:1], support.points[:1]):
                continue
        entries.append((support, w))
    return Trained(tuple(entries), trained.scale, trained.imprint_offset, trained.info, trained.reference)


def adopt(live: "LiveHead", labels: Any, other: Any) -> list[str]:
    """Score `labels` with the head last trained for `other` (another label set of the same model),
    carried over by :func:`carry`; returns the labels scored by their prototype."""
    trained = carry(other.head, labels)
    if trained is not None:
        labels.head = trained
    return list(view(labels, live.config).imprinted)


# --------------------------------------------------------------------------- refresh


def train(labels: Any, config: HeadConfig) -> tuple[Trained, View]:
    """Train the head on every support point of `labels` as it is now (the slow part: it reads the
    label set's immutable support sets and writes nothing shared), starting from the prototypes.
    Returns the result and the view it started from (its snapshot)."""
    v = view(labels, config)
    t0 = time.perf_counter()
    n_rows = len(v.weights)
    examples = sum(len(s.texts) for s in v.supports)
    if n_rows < 2:  # nothing to discriminate: every label stays imprinted (offset 0, no reference)
        return Trained((), float(config.scale), 0.0, {"seconds": 0.0, "examples": examples, "rows": n_rows}), v
    x = np.concatenate([features(labels.space, s.points) for s in v.supports])
    first = np.cumsum([0] + [s.n_parts for s in v.supports])[:-1]
    y = np.concatenate([first[i] + s.part_ids().numpy() for i, s in enumerate(v.supports)])
    anchors = np.concatenate([v.anchors[id(s)][1] for s in v.supports])
    # from the prototypes, not the last weights: the result is a function of the label set alone, so
    # a loaded, copied or replayed classifier gets the weights its original had (docs/intents.md)
    weights, scale, info = train_cosine_head(x, y, anchors, anchors, config, config.scale)
    offset = 0.0
    if config.imprint_offset:
        xn = normalize(x)
        lost = (xn * anchors[y]).sum(1) - (xn * weights[y]).sum(1)
        offset = config.imprint_offset * float(lost.mean())
    entries = tuple((s, weights[first[i]:first[i] + s.n_parts]) for i, s in enumerate(v.supports))
    row_label = np.repeat(np.asarray(v.classes, dtype=object), [s.n_parts for s in v.supports])
    ref = reference(x, row_label[y], weights)
    info = {**info, "rows": n_rows, "seconds": time.perf_counter() - t0}
    return Trained(entries, scale, offset, info, ref), v


class Refresher:
    """The background refresh of one classifier: :meth:`schedule` (after every label operation) starts
    `run(labels)` `delay` seconds after the last call, in one daemon thread that exits when nothing
    is pending; a call during a refresh schedules the next one. ``run`` must not raise (errors are
    logged and kept in ``last_error``)."""

    def __init__(self, run: Callable[[Any], None], delay: float):
        _REFRESHERS.add(self)
        self._run = run
        self.delay = delay
        self._cond = threading.Condition()
        self._pending: Any = None
        self._due = 0.0
        self._thread: threading.Thread | None = None
        self.running = False
        self.last_error: BaseException | None = None

    def schedule(self, labels: Any, delay: float | None = None) -> None:
        with self._cond:
            if _CLOSING.is_set():
                return
            self._pending = labels
            self._due = time.monotonic() + (self.delay if delay is None else delay)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="dyntc-head-refresh", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a refresh is pending or running."""
        with self._cond:
            return self._thread is not None

    def close(self, timeout: float | None = None) -> bool:
        """Drop the pending refresh and wait for a running one (at exit: a thread must not be inside
        torch while the interpreter finalises)."""
        with self._cond:
            self._pending = None
            self._cond.notify_all()
            return self._cond.wait_for(lambda: self._thread is None, timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no refresh is pending or running (or `timeout` seconds); True if idle."""
        with self._cond:
            return self._cond.wait_for(lambda: self._thread is None, timeout)

    def _loop(self) -> None:
        try:
            self._serve()
        finally:  # however it ends, a later schedule() starts a new thread
            with self._cond:
                if self._thread is threading.current_thread():
                    self._thread = None
                    self.running = False
                self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._pending is None:
                        self._thread = None
                        self._cond.notify_all()
                        return
                    left = self._due - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                labels, self._pending = self._pending, None
                self.running = True
            try:
                self._run(labels)
            except Exception as exc:  # keep serving imprinted weights; the next label operation retries
                self.last_error = exc
                log.exception("background refresh of the cosine head failed")
            finally:
                with self._cond:
                    self.running = False


class LiveHead:
    """The cosine head of one classifier while it runs: its options, a lock so that two refreshes never
    run at once, and its background :class:`Refresher`. A classifier makes its own (copies and
    unpickled classifiers make theirs) and a new one when its head options change; the old one is
    :meth:`retire`-d, and a refresh it was running is then dropped instead of installed.
    `current_labels` gives the classifier's label set of the moment: labels changed during a refresh
    are refreshed again only if they are still the classifier's."""

    def __init__(self, options: Mapping[str, Any] | None, current_labels: Callable[[], Any], *,
                 auto: Callable[[], bool] = lambda: True):
        self.config, delay = head_config(options)
        self._auto = auto  # refresh by itself (after label operations, at the first prediction)? else only when asked
        self._current_labels = current_labels
        self._lock = threading.Lock()
        self._retired = False
        self.refresher = Refresher(self._refresh_in_background, delay)

    def retire(self) -> None:
        self._retired = True

    def view(self, labels: Any) -> View:
        """The scoring view of `labels`; a label set whose head was never trained (just loaded, refitted,
        options changed) is trained now, unless the head refreshes only when asked (``auto`` False): then
        every label is scored by its prototype until then."""
        if labels.head is None and self._auto():
            self.refresh(labels)
        return view(labels, self.config)

    def scores(self, labels: Any, points: torch.Tensor) -> torch.Tensor:
        return scores(self.view(labels), labels, points, self.config)

    def sq_distances(self, scores_: torch.Tensor | np.ndarray) -> torch.Tensor:
        return sq_distances(scores_, self.config)

    def refresh(self, labels: Any, *, force: bool = False) -> dict | None:
        """Train on `labels` as they are and install the result (one assignment). Returns the refresh's
        info (``imprinted``: labels changed meanwhile, which schedule the next refresh), or None if
        another thread just trained them (without `force`) or this head was retired meanwhile."""
        with self._lock:
            if labels.head is not None and not force:
                return None
            trained, snapshot = train(labels, self.config)
            if self._retired:  # the classifier's head options changed while it trained: stale
                return None
            labels.head = trained
            now = view(labels, self.config)
        changed = set(map(id, now.supports)) - set(map(id, snapshot.supports))
        if changed and self._auto() and labels is self._current_labels():
            self.refresher.schedule(labels)
        return {**trained.info, "imprinted": list(now.imprinted)}

    def _refresh_in_background(self, labels: Any) -> None:
        if not self._retired:
            self.refresh(labels, force=True)

    def labels_changed(self, labels: Any) -> None:
        """After a label operation: the touched labels are imprinted at once; a refresh follows in the
        background (once the head was trained: until then, the first prediction trains it)."""
        if labels.head is not None and self._auto():
            self.refresher.schedule(labels)

    def status(self, labels: Any) -> dict | None:
        """JSON-able: ``imprinted``, ``refreshing``, the last refresh's ``seconds`` and ``examples``;
        None before the head was first trained."""
        if labels.head is None:
            return None
        return {"imprinted": list(view(labels, self.config).imprinted), "refreshing": self.refresher.busy,
                "seconds": round(float(labels.head.info.get("seconds", 0.0)), 4),
                "examples": int(labels.head.info.get("examples", 0))}


_REFRESHERS: "weakref.WeakSet[Refresher]" = weakref.WeakSet()
_CLOSING = threading.Event()


@atexit.register
def _close_all() -> None:
    _CLOSING.set()
    for refresher in list(_REFRESHERS):
        refresher.close(timeout=60)
