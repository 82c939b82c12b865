"""Calibrated probabilities and out-of-scope rejection for a nearest-prototype classifier.

Both are fitted on held-out labelled texts (never the support examples: their distances to their
own prototypes are too small), over the classifier's scores s (``decision_function``: ``-d²`` with
``head=None``, the cosine head's scores otherwise) and the distances they stand for (with the head,
``d² = 2 - 2 s / scale``: :mod:`dyntc.classifier.live_head`):

- **Temperature** T for ``p(y | x) = softmax(s(x, y) / T)``: the T minimising the negative
  log-likelihood of the held-out labels (one scalar, so accuracy is unchanged; Guo et al. 2017).
- **Rejection threshold** τ on the distance to the nearest label (with the head: a threshold on the
  top score): a text whose nearest label is farther than τ is out of scope. τ is the smallest distance (the most texts rejected)
  at which accuracy on the held-out in-scope texts, counting a rejected one as an error, drops by at
  most ``max_accuracy_drop``. Out-of-scope examples, when given, only measure what that τ catches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Self

import numpy as np
import torch

from dyntc.classifier.fit import check_pairs
from dyntc.classifier.labels import check_examples
from dyntc.classifier.replay import recorded
from dyntc.errors import DyntcError, is_number


ECE_BINS = 15


@dataclass(frozen=True)
class Calibration:
    """What :meth:`DynamicClassifier.calibrate` fitted, and how well (on its held-out texts)."""

    temperature: float
    threshold: float  # distance (not squared) to the nearest prototype beyond which a text is out of scope
    max_accuracy_drop: float
    n_texts: int
    accuracy: float  # nearest prototype, no rejection
    accuracy_with_rejection: float  # rejected in-scope texts counted as errors
    ece_before: float  # expected calibration error of softmax(-d²)
    ece_after: float  # ... of softmax(-d² / T)
    n_oos: int = 0
    oos_recall: float | None = None  # share of the out-of-scope texts rejected
    scorer: str = "prototype"  # the scores it was fitted on: "prototype" (head=None) or the head's name

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Calibration":
        try:
            return cls(**data)
        except TypeError as exc:
            raise DyntcError(f"the stored calibration is damaged ({exc}): calibrate again") from exc


def fit_temperature(sq_distances: torch.Tensor, labels: torch.Tensor) -> float:
    """``argmin_T  -Σ_i log softmax(-d²_i / T)[y_i]`` over T > 0 (Newton steps in log T, float64);
    pass ``-scores`` to fit ``softmax(scores / T)``."""
    d2 = sq_distances.double()
    y = labels.long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    # The NLL is smooth and unimodal in log T; LBFGS with a line search converges in a few steps.
    opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=100, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(-d2 / log_t.exp(), y)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    if not math.isfinite(t) or t <= 0:
        raise DyntcError("calibration failed: the fitted temperature is not a positive number")
    return t


def expected_calibration_error(proba: torch.Tensor, labels: torch.Tensor, bins: int = ECE_BINS) -> float:
    """``Σ_b |B_b|/n · |acc(B_b) - conf(B_b)|`` over equal-width bins of the top-label confidence."""
    conf, pred = proba.double().max(1)
    correct = (pred == labels.long()).double()
    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (conf > lo) & (conf <= hi)
        if in_bin.any():
            ece += float(in_bin.double().mean() * (correct[in_bin].mean() - conf[in_bin].mean()).abs())
    return ece


def choose_threshold(nearest: torch.Tensor, correct: torch.Tensor, max_accuracy_drop: float) -> float:
    """The smallest distance τ such that rejecting every text with ``nearest > τ`` costs at most
    `max_accuracy_drop` accuracy (a rejected text counts as an error) on these in-scope texts.

    Rejecting the texts farther than τ costs ``#{correct, nearest > τ} / n``; scanning the texts
    from the farthest inwards, τ stops just before the correct ones rejected exceed the budget."""
    n = len(nearest)
    order = torch.argsort(nearest.double(), descending=True)
    dist, ok = nearest.double()[order], correct.bool()[order]
    budget = math.floor(max_accuracy_drop * n + 1e-9)  # correct texts we may reject
    lost = torch.cumsum(ok.long(), 0)  # correct texts rejected if we reject the first i+1
    allowed = int((lost <= budget).sum())  # reject the farthest `allowed` texts at most
    # Ties: a threshold between distinct distances only; rejecting part of a tie is impossible.
    while 0 < allowed < n and dist[allowed] == dist[allowed - 1]:
        allowed -= 1
    if allowed == 0:
        return float(dist[0]) * (1 + 1e-6) + 1e-12  # reject nothing seen here
    if allowed == n:
        return 0.0
    return float((dist[allowed - 1] + dist[allowed]) / 2)


def fit_calibration(sq_distances: torch.Tensor, labels: torch.Tensor, oos_sq_distances: torch.Tensor | None, *,
                    max_accuracy_drop: float, threshold: float | None = None,
                    prior_temperature: float = 1.0, scores: torch.Tensor | None = None,
                    scorer: str = "prototype") -> Calibration:
    """Temperature and threshold from the squared distances of held-out in-scope texts to every
    label (``(n, k)``, true columns `labels`) and, optionally, of out-of-scope texts. The temperature
    is fitted on `scores` (default ``-sq_distances``). `prior_temperature`: the one in use before (for
    ``ece_before``)."""
    logits = (-sq_distances if scores is None else scores).double()
    temperature = fit_temperature(-logits, labels)
    nearest = sq_distances.min(1).values.clamp_min(0).sqrt()
    correct = sq_distances.argmin(1) == labels
    tau = threshold if threshold is not None else choose_threshold(nearest, correct, max_accuracy_drop)
    oos_recall = None
    if oos_sq_distances is not None and len(oos_sq_distances):
        oos_recall = float((oos_sq_distances.min(1).values.clamp_min(0).sqrt() > tau).double().mean())
    return Calibration(
        temperature=temperature, threshold=tau, max_accuracy_drop=max_accuracy_drop, n_texts=len(labels),
        accuracy=float(correct.double().mean()),
        accuracy_with_rejection=float((correct & (nearest <= tau)).double().mean()),
        ece_before=expected_calibration_error(torch.softmax(logits / prior_temperature, 1), labels),
        ece_after=expected_calibration_error(torch.softmax(logits / temperature, 1), labels),
        n_oos=0 if oos_sq_distances is None else len(oos_sq_distances), oos_recall=oos_recall, scorer=scorer,
    )


def check_max_drop(value: object) -> float:
    if not (is_number(value) and 0 <= value < 1):
        raise DyntcError(f"max_accuracy_drop must be a number in [0, 1) (0.02 = two points), got {value!r}")
    return float(value)


def check_threshold(value: object) -> float:
    if not (is_number(value) and math.isfinite(value) and value > 0):
        raise DyntcError(f"threshold must be a finite distance > 0 (or None to choose it from the data), got {value!r}")
    return float(value)


class CalibrationMixin:
    """:class:`~dyntc.classifier.DynamicClassifier`'s temperature and out-of-scope threshold: the
    probabilities of ``predict_proba`` and the rejection of ``predict(reject=True)``."""

    def _calibration(self) -> Calibration | None:
        """``calibration_`` if it was fitted on this classifier's scorer (a stored one may predate the head)."""
        cal = self.calibration_
        return cal if cal is not None and cal.scorer == self._scorer() else None

    @property
    def temperature_(self) -> float:
        """The temperature T of :meth:`predict_proba`: calibrated, or before :meth:`calibrate` the model's own
        (``prior_temperature_``)."""
        self._check_fitted()
        cal = self._calibration()
        return cal.temperature if cal is not None else self.prior_temperature_

    @property
    def prior_temperature_(self) -> float:
        """The temperature before calibration: with ``head=None`` ``1/s`` for the model's logit scale s (its
        logits are ``-s d²``); with the head 1 (its scores are logits already)."""
        self._check_fitted()
        if self._scorer() != "prototype":
            return 1.0
        return 1.0 / float(self.space_.model.scale())

    def proba_from_scores(self, scores: torch.Tensor | np.ndarray) -> np.ndarray:
        """:meth:`predict_proba` from scores already computed (:meth:`decision_function`)."""
        return torch.softmax(torch.as_tensor(scores).double() / self.temperature_, dim=1).numpy()

    def require_calibration(self, what: str) -> Calibration:
        """The calibration, or a clear error naming `what` needed it."""
        self._check_fitted()
        cal = self._calibration()
        if cal is None and self.calibration_ is not None:
            raise DyntcError(f"{what}: the calibration was fitted on the {self.calibration_.scorer!r} scorer's "
                             f"scores and this classifier scores with {self._scorer()!r} (head={self.head!r}): "
                             "call calibrate(texts, labels) again, or set the head it was fitted with")
        if cal is None:
            raise DyntcError(f"{what} needs a calibrated classifier: call calibrate(texts, labels) with held-out "
                             "labelled texts first (fine_tune resets the calibration)")
        return cal

    @recorded
    def calibrate(self, texts: Sequence[str], labels: Sequence[str], oos_texts: Sequence[str] | None = None, *,
                  max_accuracy_drop: float = 0.02, threshold: float | None = None) -> Self:
        """Fit :meth:`predict_proba`'s temperature and the out-of-scope threshold on held-out texts.

        `texts`, `labels`: labelled in-scope texts that are not support examples (a dev split).
        The threshold is the smallest distance to the nearest label (:meth:`squared_distances`) that costs at most
        `max_accuracy_drop` accuracy on them when farther texts are rejected; `threshold` sets it
        instead. `oos_texts` (optional out-of-scope examples) measure the share it rejects. What was
        fitted and measured (expected calibration error before/after, accuracies, OOS recall) is in
        ``calibration_``; it is saved with the classifier."""
        self._check_fitted()
        max_drop = check_max_drop(max_accuracy_drop)
        fixed = None if threshold is None else check_threshold(threshold)
        texts, labels = check_pairs(texts, labels)
        index = {c: i for i, c in enumerate(self.classes_)}
        unknown = sorted(set(labels) - index.keys())
        if unknown:
            raise DyntcError(f"calibration labels {unknown[:5]} are not in the label set: add them with add_label "
                             "or leave those texts out (out-of-scope texts go in oos_texts)")
        oos = [] if oos_texts is None else check_examples(oos_texts, "oos_texts", allow_empty=True)
        scores = self._scores(texts)
        oos_d2 = self.squared_distances(self._scores(oos)) if oos else None
        self.calibration_ = fit_calibration(self.squared_distances(scores), torch.tensor([index[label] for label in labels]),
                                            oos_d2, max_accuracy_drop=max_drop, threshold=fixed,
                                            prior_temperature=self.prior_temperature_, scores=scores,
                                            scorer=self._scorer())
        self._labels.log.append({"op": "calibrate", "texts": len(texts), "oos_texts": len(oos)})
        return self
