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
from dataclasses import asdict, dataclass

import torch

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
