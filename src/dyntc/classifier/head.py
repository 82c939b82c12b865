"""A discriminative cosine head over frozen embeddings, refreshed in the background, with imprinted
weights for the labels added since the last refresh.

The score of label c for a (unit-length) embedding x is

    s(x, c) = scale · (cos(x, w_c) − o_c)  +  proto_weight · proto_scale · (−(‖x − p_c‖² − σ²/n_c))

- ``w_c`` is the head's unit weight vector of label c. A *refresh* trains the head on every stored
  support example: full-batch L-BFGS on the cross-entropy of ``scale · cos(x, w_c)``, warm-started
  from the previous weights (a label the head has not seen starts from its normalised prototype).
  Training uses the logit-adjusted loss of Menon et al. (2021): ``τ · log π_c`` (π_c the label's
  share of the stored examples) is added to the logits during training only, so a 5-example label
  is not starved next to 100-example ones. A penalty ``pull · mean_c ‖w_c − p̂_c‖²`` keeps every
  weight near its label's normalised prototype p̂_c (few-shot labels must not drift from their few
  examples).
- A label added or changed after the last refresh gets the *imprinted* weight ``w_c = p̂_c`` (Qi et
  al. 2018) at once, and the offset ``o_c``: at least ``imprint_offset`` × the mean drop, over the
  stored examples at the last refresh, of the true label's cosine from its prototype to its trained
  weight (trained weights are less similar to their own examples than prototypes are; without the
  offset a freshly imprinted label takes texts from trained ones), raised where needed so that the
  label would take at most ``imprint_share`` of the last refresh's stored examples of other labels
  from the label the trained head gives them (:func:`imprint_offsets`: a label added among close
  neighbours, as in a fine-grained intent set, gets a larger offset than one added in an empty
  region). Trained labels have ``o_c = 0``.
- ``p_c``, ``n_c`` and σ² are the prototype, support size and pooled within-label spread of the
  product's support-size-corrected nearest-prototype score (:mod:`dyntc.classifier.labels`);
  ``proto_weight = 0`` (the default chosen on dev, docs/intents.md) leaves it out.

The defaults of :class:`HeadConfig` are what the dev-split study of docs/intents.md chose. Everything
here is numpy / torch on float32 embeddings; :class:`CosineHead` is the small stateful wrapper
(support points by label, weights, label operations, refresh in three steps, state to save).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dyntc.errors import DyntcError, is_int, is_number


@dataclass(frozen=True)
class HeadConfig:
    """Parameters of :class:`CosineHead` (see the module docstring)."""

    scale: float = 16.0  # cosine logit scale (initial value when learn_scale)
    learn_scale: bool = False
    tau: float = 0.875  # logit adjustment strength during training (0: plain cross-entropy)
    pull: float = 0.2  # weight of mean_c ||w_c - p_c||^2 (unit vectors)
    max_iter: int = 50  # L-BFGS iterations per refresh
    proto_weight: float = 0.0  # weight of the support-size-corrected prototype score
    imprint_offset: float = 0.5  # imprinted labels' cosines lowered by this share of the true-label cosine lost in training
    # ... and further, until an imprinted label takes at most this share of the other labels' stored
    # examples from their trained label (1: no further; docs/intents.md, "Right after a bulk add")
    imprint_share: float = 0.003
    proto_scale: float = 16.0
    debias: bool = True

    def __post_init__(self):
        for name in ("scale", "proto_scale"):
            value = getattr(self, name)
            if not (is_number(value) and math.isfinite(value) and value > 0):
                raise DyntcError(f"{name} must be a positive number, got {value!r}")
        for name in ("tau", "pull", "proto_weight", "imprint_offset"):
            value = getattr(self, name)
            if not (is_number(value) and math.isfinite(value) and value >= 0):
                raise DyntcError(f"{name} must be a number >= 0, got {value!r}")
        if not (is_number(self.imprint_share) and 0 <= self.imprint_share <= 1):
            raise DyntcError(f"imprint_share must be a number in [0, 1], got {self.imprint_share!r}")
        if not (is_int(self.max_iter) and self.max_iter >= 0):
            raise DyntcError(f"max_iter must be an integer >= 0, got {self.max_iter!r}")
        for name in ("learn_scale", "debias"):
            if not isinstance(getattr(self, name), bool):
                raise DyntcError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- pure functions


def _check_points(x, arg: str = "x") -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or not np.isfinite(x).all():
        raise DyntcError(f"{arg} must be a finite (n, dim) array, got shape {x.shape}")
    return x


def normalize(v: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(norm, 1e-12)


def prototypes(x: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``(means (C, d), counts (C,), sum of squared distances to their own mean)`` of labelled points."""
    x = _check_points(x)
    y = np.asarray(y)
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    if (counts == 0).any():
        raise DyntcError(f"every label needs at least one example; labels {np.flatnonzero(counts == 0).tolist()[:10]} have none")
    sums = np.zeros((n_classes, x.shape[1]), dtype=np.float64)
    np.add.at(sums, y, x)
    means = (sums / counts[:, None]).astype(np.float32)
    spread = float(((x - means[y]) ** 2).sum())
    return means, counts, spread


def pooled_spread(spread_sum: float, counts: np.ndarray) -> float:
    """σ² = Σ_c Σ_i ‖x_ci − p_c‖² / Σ_c (n_c − 1) (0 without degrees of freedom), as in the label set."""
    dof = float(np.sum(counts) - len(counts))
    return spread_sum / dof if dof > 0 else 0.0


def prototype_scores(x: np.ndarray, means: np.ndarray, counts: np.ndarray, sigma2: float, debias: bool = True) -> np.ndarray:
    """``−(‖x − p_c‖² − σ²/n_c)`` (``(n, C)``): the product's nearest-prototype score, higher = nearer."""
    d2 = (x * x).sum(1)[:, None] + (means * means).sum(1)[None, :] - 2.0 * x @ means.T
    if debias:
        d2 = d2 - (sigma2 / counts)[None, :]
    return -d2


def cosine_logits(x: np.ndarray, weights: np.ndarray, scale: float, offsets: np.ndarray | None = None) -> np.ndarray:
    """``scale · (cos(x, w_c) − offset_c)`` (``(n, C)``)."""
    cos = normalize(np.asarray(x, np.float32)) @ normalize(weights).T
    if offsets is not None:
        cos = cos - offsets[None, :]
    return scale * cos


def combined_scores(x: np.ndarray, weights: np.ndarray, scale: float, means: np.ndarray, counts: np.ndarray,
                    sigma2: float, config: HeadConfig, offsets: np.ndarray | None = None) -> np.ndarray:
    """The head's cosine logits (minus per-label `offsets`) plus ``proto_weight · proto_scale`` × the
    prototype score (module docstring)."""
    x = _check_points(x)
    out = cosine_logits(x, weights, scale, offsets)
    if config.proto_weight:
        out = out + config.proto_weight * config.proto_scale * prototype_scores(x, means, counts, sigma2, config.debias)
    return out


_BEFORE_EVALUATION: ContextVar[Callable[[], None] | None] = ContextVar("dyntc_head_before_evaluation", default=None)


@contextmanager
def before_each_evaluation(hook: Callable[[], None]) -> Iterator[None]:
    """Call `hook` before each loss evaluation of the head's training run in this thread (a service's
    refresher waits there while requests run, so the training takes the CPU they leave)."""
    token = _BEFORE_EVALUATION.set(hook)
    try:
        yield
    finally:
        _BEFORE_EVALUATION.reset(token)


def train_cosine_head(x: np.ndarray, y: np.ndarray, init: np.ndarray, anchors: np.ndarray, config: HeadConfig,
                      scale: float | None = None) -> tuple[np.ndarray, float, dict]:
    """Unit weights (C, d) and the scale after full-batch L-BFGS on the logit-adjusted cross-entropy
    of ``scale · cos(x, w_c)`` plus ``pull · mean_c ‖ŵ_c − anchors_c‖²``; starts from `init`.
    Returns ``(weights, scale, info)``."""
    x = _check_points(x)
    n_classes = len(init)
    y_t = torch.as_tensor(np.asarray(y), dtype=torch.long)
    counts = torch.bincount(y_t, minlength=n_classes).double()
    prior = (counts / counts.sum()).clamp_min(1e-12)
    adjust = (config.tau * prior.log()).float()
    xt = torch.nn.functional.normalize(torch.as_tensor(x), dim=1)
    anchor_t = torch.nn.functional.normalize(torch.as_tensor(np.asarray(anchors, np.float32)), dim=1)
    w = torch.nn.functional.normalize(torch.as_tensor(np.asarray(init, np.float32)).clone(), dim=1).requires_grad_(True)
    log_s = torch.tensor(math.log(scale if scale is not None else config.scale), requires_grad=config.learn_scale)
    params = [w] + ([log_s] if config.learn_scale else [])
    t0 = time.perf_counter()
    evals = 0
    if config.max_iter > 0:
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=config.max_iter, history_size=10, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-6, tolerance_change=1e-9)

        hook = _BEFORE_EVALUATION.get()

        def closure():
            nonlocal evals
            evals += 1
            if hook is not None:
                hook()
            opt.zero_grad()
            wn = torch.nn.functional.normalize(w, dim=1)
            logits = log_s.exp() * (xt @ wn.T) + adjust
            loss = torch.nn.functional.cross_entropy(logits, y_t)
            if config.pull:
                loss = loss + config.pull * ((wn - anchor_t) ** 2).sum(1).mean()
            loss.backward()
            return loss

        opt.step(closure)
    weights = torch.nn.functional.normalize(w.detach(), dim=1).numpy()
    s = float(log_s.detach().exp())
    if not (np.isfinite(weights).all() and math.isfinite(s)):
        raise DyntcError("the head's training diverged (non-finite weights); lower max_iter or raise pull")
    return weights, s, {"seconds": time.perf_counter() - t0, "evaluations": evals, "examples": len(x)}


#: At most this many stored examples (a fixed random subset of them) form a refresh's :class:`Reference`:
#: an imprinted label's offset then costs one (rows × dim) product, ~1 ms, however large the store.
REFERENCE_ROWS = 8192


@dataclass(frozen=True)
class Reference:
    """Stored examples as the last refresh scores them: unit rows ``(R, d)``, each one's best cosine
    with a trained weight ``(R,)``, and its label ``(R,)`` (a name or an index)."""

    x: np.ndarray
    top: np.ndarray
    owner: np.ndarray


def reference(x: np.ndarray, owner: np.ndarray, weights: np.ndarray, seed: int = 0) -> Reference:
    """The :class:`Reference` of stored examples `x` (labels `owner`) under trained unit `weights`:
    all of them, or a fixed random subset of :data:`REFERENCE_ROWS` (a function of the data alone)."""
    if len(x) > REFERENCE_ROWS:
        keep = np.sort(np.random.default_rng(seed).choice(len(x), REFERENCE_ROWS, replace=False))
        x, owner = x[keep], np.asarray(owner)[keep]
    xn = normalize(np.asarray(x, np.float32))
    top = (xn @ np.asarray(weights, np.float32).T).max(1) if len(weights) else np.full(len(xn), -np.inf, np.float32)
    return Reference(xn, top.astype(np.float32), np.asarray(owner))


def imprint_offsets(anchors: np.ndarray, owner, ref: Reference | None, base: float, share: float) -> np.ndarray:
    """Offsets ``(k,)`` of an imprinted label's unit prototypes `anchors` ``(k, d)``: the smallest
    ``o >= base`` such that ``cos(x, anchor) − o`` beats the best trained cosine of at most ``share``
    of the reference's examples of other labels than `owner` (the ones it would take from them)."""
    out = np.full(len(anchors), float(base), dtype=np.float32)
    if ref is None or share >= 1 or not len(ref.top):
        return out
    excess = ref.x @ np.asarray(anchors, np.float32).T - ref.top[:, None]  # (R, k): o must exceed it to leave x
    own = ref.owner == owner
    excess[own] = -np.inf  # its own examples (no copy of the reference: this runs in add_label)
    others = len(excess) - int(own.sum())
    allowed = int(share * others)  # examples the label may take
    if allowed >= others:
        return out
    needed = -np.partition(-excess, allowed, axis=0)[allowed]  # the (allowed + 1)-th largest, per anchor
    return np.maximum(out, needed.astype(np.float32))


# --------------------------------------------------------------------------- the stateful head


@dataclass(frozen=True)
class Snapshot:
    """What a refresh trains on, taken under the writer's lock in O(labels): the labels, their
    versions (to tell afterwards which labels changed meanwhile), support points (shared, never
    modified in place), the warm start and the current scale."""

    classes: tuple[str, ...]
    versions: tuple[int, ...]
    support: tuple[np.ndarray, ...]
    init: np.ndarray
    anchors: np.ndarray
    scale: float


@dataclass(frozen=True)
class Trained:
    """A refresh's result, to :meth:`CosineHead.install`."""

    snapshot: Snapshot
    weights: np.ndarray
    scale: float
    imprint_offset: float
    info: dict
    reference: Reference | None = None


def train(snapshot: Snapshot, config: HeadConfig) -> Trained:
    """The slow half of a refresh (no shared state touched: run it in a background thread)."""
    if len(snapshot.classes) < 2:
        raise DyntcError("the head needs at least two labels to train")
    x = np.concatenate(snapshot.support)
    y = np.repeat(np.arange(len(snapshot.classes)), [len(p) for p in snapshot.support])
    weights, scale, info = train_cosine_head(x, y, snapshot.init, snapshot.anchors, config, snapshot.scale)
    offset = 0.0
    if config.imprint_offset:
        xn = normalize(x)
        lost = (xn * snapshot.anchors[y]).sum(1) - (xn * weights[y]).sum(1)
        offset = config.imprint_offset * float(lost.mean())
    return Trained(snapshot, weights, scale, offset, info, reference(x, y, weights))


class CosineHead:
    """Support points by label, trained weights, and imprinted weights for the labels added or changed
    since the last refresh. Labels are kept in sorted order (the columns of :meth:`scores`).

    Label operations cost O(labels · dim) and take effect at once. A refresh is
    :meth:`snapshot` (quick) → :func:`train` (seconds; may run in the background while label
    operations go on) → :meth:`install` (quick): only labels unchanged since the snapshot take the
    trained weights; the others stay imprinted until the next refresh. :meth:`refresh` does all three.
    """

    def __init__(self, config: HeadConfig | None = None):
        config = HeadConfig() if config is None else config
        if not isinstance(config, HeadConfig):
            raise DyntcError(f"config must be a HeadConfig, got {type(config).__name__}")
        self.config = config
        self._support: dict[str, np.ndarray] = {}
        self._stats: dict[str, tuple[np.ndarray, int, float]] = {}  # label -> (mean, count, spread sum)
        self._version: dict[str, int] = {}
        self._clock = 0
        self._trained: dict[str, np.ndarray] = {}  # label -> unit weight from the last refresh (never stale)
        self.scale = float(config.scale)
        self.imprint_offset = 0.0  # subtracted from imprinted labels' cosines (at least)
        self._reference: Reference | None = None  # the last refresh's stored examples (owners: label names)
        self._offsets: dict[str, tuple[int, float]] = {}  # imprinted label -> (version, its offset)
        self.last_refresh: dict = {}
        self._cache: tuple | None = None

    # -- reading
    @property
    def classes(self) -> list[str]:
        return sorted(self._support)

    @property
    def stale(self) -> set[str]:
        """Labels scored with imprinted weights (added or changed since the last installed refresh)."""
        return set(self._support) - set(self._trained)

    def counts(self) -> dict[str, int]:
        return {c: len(self._support[c]) for c in self.classes}

    # -- label operations (no training: effective at once)
    def add_label(self, name: str, points) -> None:
        if not isinstance(name, str) or not name.strip():
            raise DyntcError(f"name must be a non-empty label name, got {name!r}")
        if name in self._support:
            raise DyntcError(f"label {name!r} exists already")
        self._set(name, _check_points(points, "points"))

    def add_examples(self, name: str, points) -> None:
        self._require(name)
        self._set(name, np.concatenate([self._support[name], _check_points(points, "points")]))

    def remove_label(self, name: str) -> None:
        self._require(name)
        for table in (self._support, self._stats, self._version, self._trained):
            table.pop(name, None)
        self._cache = None

    def _set(self, name: str, points: np.ndarray) -> None:
        if len(points) == 0:
            raise DyntcError("a label needs at least one example")
        mean = points.mean(0, dtype=np.float64).astype(np.float32)
        self._support[name] = points
        self._stats[name] = (mean, len(points), float(((points - mean) ** 2).sum(dtype=np.float64)))
        self._clock += 1
        self._version[name] = self._clock
        self._trained.pop(name, None)
        self._cache = None

    def _require(self, name: str) -> None:
        if name not in self._support:
            raise DyntcError(f"label {name!r} does not exist")

    # -- scoring state (rebuilt lazily after a change: O(labels · dim))
    def _state(self):
        if self._cache is None:
            classes = self.classes
            if not classes:
                raise DyntcError("the head has no labels")
            means = np.stack([self._stats[c][0] for c in classes])
            counts = np.array([self._stats[c][1] for c in classes], dtype=np.float64)
            spread = sum(self._stats[c][2] for c in classes)
            anchors = normalize(means)
            weights = np.stack([self._trained.get(c, anchors[i]) for i, c in enumerate(classes)])
            offsets = np.array([0.0 if c in self._trained else self._imprint_offset(c, anchors[i])
                                for i, c in enumerate(classes)], dtype=np.float32)
            self._cache = (classes, means, counts, pooled_spread(spread, counts), anchors, weights, offsets)
        return self._cache

    def _imprint_offset(self, name: str, anchor: np.ndarray) -> float:
        version = self._version[name]
        if self._offsets.get(name, (None,))[0] != version:
            offset = imprint_offsets(anchor[None, :], name, self._reference, self.imprint_offset,
                                     self.config.imprint_share)[0]
            self._offsets[name] = (version, float(offset))
        return self._offsets[name][1]

    def scores(self, x) -> np.ndarray:
        """``(n, n_classes)`` combined scores, columns in :attr:`classes` order."""
        classes, means, counts, sigma2, _, weights, offsets = self._state()
        return combined_scores(x, weights, self.scale, means, counts, sigma2, self.config, offsets)

    def predict(self, x) -> list[str]:
        classes = self.classes
        return [classes[i] for i in self.scores(x).argmax(1)]

    # -- refresh
    def snapshot(self) -> Snapshot:
        classes, _, _, _, anchors, weights, _ = self._state()
        return Snapshot(tuple(classes), tuple(self._version[c] for c in classes), tuple(self._support[c] for c in classes),
                        weights.copy(), anchors.copy(), self.scale)

    def install(self, trained: Trained) -> list[str]:
        """Take a refresh's weights for the labels unchanged since its snapshot; returns those left stale."""
        snap = trained.snapshot
        self.scale = trained.scale
        self.imprint_offset = trained.imprint_offset
        ref = trained.reference
        self._reference = None if ref is None else Reference(ref.x, ref.top, np.asarray(snap.classes)[ref.owner])
        self._offsets = {}
        for name, version, weight in zip(snap.classes, snap.versions, trained.weights):
            if self._version.get(name) == version:
                self._trained[name] = weight
        self.last_refresh = trained.info
        self._cache = None
        return sorted(self.stale)

    def refresh(self) -> dict:
        """Train on every stored example now (warm start) and install; returns timing information."""
        self.install(train(self.snapshot(), self.config))
        return self.last_refresh

    # -- persistence
    def state_dict(self) -> dict:
        """What a store keeps besides the support sets: config, scale, imprint offset, the trained
        weight of every non-stale label (a label without one is imprinted on load) and the offset of
        every imprinted one (:func:`imprint_offsets`; the reference it came from is not kept)."""
        self._state()  # the imprinted labels' offsets, computed
        return {"config": self.config.to_dict(), "scale": self.scale, "imprint_offset": self.imprint_offset,
                "weights": {c: self._trained[c].tolist() for c in sorted(self._trained)},
                "imprinted_offsets": {c: self._offsets[c][1] for c in sorted(self.stale)}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` on a head holding the same support sets."""
        try:
            config = HeadConfig(**state["config"])
            weights = {c: np.asarray(w, dtype=np.float32) for c, w in state["weights"].items()}
            scale, offset = float(state["scale"]), float(state["imprint_offset"])
            imprinted = {c: float(o) for c, o in state.get("imprinted_offsets", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise DyntcError(f"the stored head is damaged ({type(exc).__name__}: {exc}); refresh it again") from exc
        unknown = sorted(set(weights) - set(self._support))
        if unknown:
            raise DyntcError(f"the stored head has weights for labels that do not exist: {unknown[:5]}")
        self.config, self.scale, self.imprint_offset, self._trained = config, scale, offset, weights
        # the reference is not stored: a label imprinted when saved keeps its offset, one imprinted
        # later gets the base offset until the next refresh
        self._reference = None
        self._offsets = {c: (self._version[c], o) for c, o in imprinted.items() if c in self._support}
        self._cache = None
