"""A discriminative cosine head over frozen embeddings, refreshed in the background, with imprinted
weights for the labels added since the last refresh.

The score of label c for a (unit-length) embedding x is

    s(x, c) = scale · cos(x, w_c)  +  proto_weight · proto_scale · (−(‖x − p_c‖² − σ²/n_c))

- ``w_c`` is the head's weight vector of label c. At a refresh the head is trained on every stored
  support example (full-batch L-BFGS on the cross-entropy, warm-started from the previous weights or,
  for a label the head has not seen, from its normalised prototype). Training uses the
  logit-adjusted loss of Menon et al. (2021): ``τ · log π_c`` (π_c the label's share of the stored
  examples) is added to the logits during training only, so a 5-example label is not starved next to
  100-example ones. A penalty ``pull · mean_c ‖ŵ_c − p̂_c‖²`` keeps every unit weight near its label's
  normalised prototype (few-shot labels must not drift from their few examples).
- A label added or changed after the last refresh gets the *imprinted* weight ``w_c = p̂_c`` (its
  normalised prototype; Qi et al. 2018), at once: as a cosine classifier the head needs no rescaling
  for it.
- ``p_c``, ``n_c`` and σ² are the prototype, support size and pooled within-label spread of the
  product's support-size-corrected nearest-prototype score (:mod:`dyntc.classifier.labels`);
  ``proto_weight = 0`` turns it off, ``proto_scale`` is the product's logit scale (16).

Everything here is plain numpy / torch on float32 embeddings; :class:`CosineHead` is the small
stateful wrapper (support sets by label, weights, refresh, label operations).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from dyntc.errors import DyntcError, is_int, is_number


@dataclass(frozen=True)
class HeadConfig:
    """Parameters of :class:`CosineHead` (see the module docstring)."""

    scale: float = 16.0  # cosine logit scale (initial value when learn_scale)
    learn_scale: bool = False
    tau: float = 1.0  # logit adjustment strength during training (0: plain cross-entropy)
    pull: float = 1.0  # weight of mean_c ||w_c - p_c||^2 (unit vectors)
    max_iter: int = 50  # L-BFGS iterations per refresh
    proto_weight: float = 0.0  # weight of the support-size-corrected prototype score
    proto_scale: float = 16.0
    debias: bool = True

    def __post_init__(self):
        for name in ("scale", "proto_scale"):
            value = getattr(self, name)
            if not (is_number(value) and math.isfinite(value) and value > 0):
                raise DyntcError(f"{name} must be a positive number, got {value!r}")
        for name in ("tau", "pull", "proto_weight"):
            value = getattr(self, name)
            if not (is_number(value) and math.isfinite(value) and value >= 0):
                raise DyntcError(f"{name} must be a number >= 0, got {value!r}")
        if not (is_int(self.max_iter) and self.max_iter >= 0):
            raise DyntcError(f"max_iter must be an integer >= 0, got {self.max_iter!r}")
        if not isinstance(self.learn_scale, bool) or not isinstance(self.debias, bool):
            raise DyntcError("learn_scale and debias must be True or False")

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


def cosine_logits(x: np.ndarray, weights: np.ndarray, scale: float) -> np.ndarray:
    """``scale · cos(x, w_c)`` (``(n, C)``)."""
    return scale * (normalize(np.asarray(x, np.float32)) @ normalize(weights).T)


def combined_scores(x: np.ndarray, weights: np.ndarray, scale: float, means: np.ndarray, counts: np.ndarray,
                    sigma2: float, config: HeadConfig) -> np.ndarray:
    """The head's cosine logits plus ``proto_weight · proto_scale`` × the prototype score (module docstring)."""
    x = _check_points(x)
    out = cosine_logits(x, weights, scale)
    if config.proto_weight:
        out = out + config.proto_weight * config.proto_scale * prototype_scores(x, means, counts, sigma2, config.debias)
    return out


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

        def closure():
            nonlocal evals
            evals += 1
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


# --------------------------------------------------------------------------- the stateful head


@dataclass
class CosineHead:
    """Support points by label, trained weights, and imprinted weights for labels added since the last
    :meth:`refresh`. Labels are kept in sorted order (the columns of :meth:`scores`)."""

    config: HeadConfig = field(default_factory=HeadConfig)

    def __post_init__(self):
        if not isinstance(self.config, HeadConfig):
            raise DyntcError(f"config must be a HeadConfig, got {type(self.config).__name__}")
        self._support: dict[str, np.ndarray] = {}
        self._stats: dict[str, tuple[np.ndarray, int, float]] = {}  # label -> (mean, count, spread sum)
        self._trained: dict[str, np.ndarray] = {}  # label -> unit weight from the last refresh
        self.scale = float(self.config.scale)
        self.stale: set[str] = set()  # labels added or changed since the last refresh
        self.last_refresh: dict = {}
        self._cache: tuple | None = None

    # -- reading
    @property
    def classes(self) -> list[str]:
        return sorted(self._support)

    def counts(self) -> dict[str, int]:
        return {c: len(self._support[c]) for c in self.classes}

    # -- label operations (no training: effective at once)
    def add_label(self, name: str, points) -> None:
        if not isinstance(name, str) or not name.strip():
            raise DyntcError(f"name must be a non-empty label name, got {name!r}")
        if name in self._support:
            raise DyntcError(f"label {name!r} exists already")
        points = _check_points(points, "points")
        if len(points) == 0:
            raise DyntcError("a label needs at least one example")
        self._set(name, points)

    def _set(self, name: str, points: np.ndarray) -> None:
        mean = points.mean(0, dtype=np.float64).astype(np.float32)
        self._support[name] = points
        self._stats[name] = (mean, len(points), float(((points - mean) ** 2).sum()))
        self.stale.add(name)
        self._cache = None

    def add_examples(self, name: str, points) -> None:
        self._require(name)
        self._set(name, np.concatenate([self._support[name], _check_points(points, "points")]))

    def remove_label(self, name: str) -> None:
        self._require(name)
        del self._support[name], self._stats[name]
        self._trained.pop(name, None)
        self.stale.discard(name)
        self._cache = None

    def _require(self, name: str) -> None:
        if name not in self._support:
            raise DyntcError(f"label {name!r} does not exist")

    # -- state
    def _state(self):
        if self._cache is None:
            classes = self.classes
            means = np.stack([self._stats[c][0] for c in classes])
            counts = np.array([self._stats[c][1] for c in classes], dtype=np.float64)
            spread = sum(self._stats[c][2] for c in classes)
            anchors = normalize(means)
            weights = np.stack([self._trained[c] if c in self._trained and c not in self.stale else anchors[i]
                                for i, c in enumerate(classes)])
            self._cache = (classes, means, counts, pooled_spread(spread, counts), anchors, weights)
        return self._cache

    def refresh(self) -> dict:
        """Train the head on every stored example (warm start); what is returned says how long it took."""
        classes, means, counts, sigma2, anchors, weights = self._state()
        x = np.concatenate([self._support[c] for c in classes])
        y = np.repeat(np.arange(len(classes)), [len(self._support[c]) for c in classes])
        if len(classes) < 2:
            raise DyntcError("the head needs at least two labels")
        trained, self.scale, info = train_cosine_head(x, y, weights, anchors, self.config, self.scale)
        self._trained = dict(zip(classes, trained))
        self.stale = set()
        self._cache = None
        self.last_refresh = info
        return info

    def scores(self, x) -> np.ndarray:
        """``(n, n_classes)`` combined scores, columns in :attr:`classes` order."""
        classes, means, counts, sigma2, _, weights = self._state()
        return combined_scores(x, weights, self.scale, means, counts, sigma2, self.config)

    def predict(self, x) -> list[str]:
        classes = self.classes
        return [classes[i] for i in self.scores(x).argmax(1)]

    def state_dict(self) -> dict:
        """What a store would keep besides the support sets: config, scale, trained weights by label,
        and the labels that are stale (their weights are imprinted on load)."""
        return {"config": self.config.to_dict(), "scale": self.scale,
                "weights": {c: w.tolist() for c, w in self._trained.items()}, "stale": sorted(self.stale)}
