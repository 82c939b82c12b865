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
  most ``max_accuracy_drop``.
- **Out-of-scope examples**, when given, are kept (``oos_examples``) and push the texts that resemble
  them away from every label: a text's squared distance to each label grows by ``2 · w · c̄``, where
  c̄ is its mean cosine to its ``OOS_NEIGHBOURS`` nearest examples (floored at 0) and w is
  ``oos_weight`` (``OOS_WEIGHT``; 0 keeps them only to measure what τ catches). The shift is the same
  for every label of a text, so the predicted label and the probabilities do not change; only the
  distance to the nearest label, hence the rejection, does. τ is chosen on the shifted distances, and
  the share of the examples it rejects (``oos_recall``) is measured with each example left out of its
  own neighbours. w = 0.5 and 3 neighbours were chosen among 0.25, 0.5, 1 and 1, 3, 10 on CLINC150's
  validation split, with its 100 out-of-scope training texts as the examples (docs/intents.md,
  "Out-of-scope examples").

The expected calibration error after calibration (``ece_after``) is measured out of sample: the
texts are cut into ``CV_FOLDS`` folds and each fold's probabilities use the temperature fitted on the
others (the in-sample figure, ``ece_after_in_sample``, flatters a temperature fitted on the very texts
it is measured on). A held-out set that the classifier gets entirely right cannot fit a temperature
(the likelihood keeps growing as T → 0, and every probability would become 1.0): the temperature is
then left at its prior value, with a :class:`~dyntc.errors.DyntcWarning`; a set of fewer than
``MIN_TEXTS`` texts, or a fit whose probabilities all collapse to ~1, is warned about as well.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass

import torch

from dyntc.errors import CalibrationRequiredError, DyntcError, DyntcWarning, is_number


ECE_BINS = 15
CV_FOLDS = 5  # folds of the out-of-sample ECE
OOS_WEIGHT = 0.5  # how far the out-of-scope examples push the texts near them (module docstring)
OOS_NEIGHBOURS = 3  # a text's pull towards the examples: the mean cosine of this many nearest
MIN_TEXTS = 30  # fewer held-out texts than this: the temperature and threshold are warned to be unreliable
COLLAPSED = 0.999  # mean top probability above this on the held-out texts: the probabilities are warned to have collapsed


@dataclass(frozen=True)
class Calibration:
    """What :meth:`DynamicClassifier.calibrate` fitted, and how well (on its held-out texts)."""

    temperature: float
    threshold: float  # distance (not squared) to the nearest prototype beyond which a text is out of scope
    max_accuracy_drop: float
    n_texts: int
    accuracy: float  # nearest prototype, no rejection
    accuracy_with_rejection: float  # rejected in-scope texts counted as errors
    ece_before: float  # expected calibration error of softmax(scores / prior T)
    ece_after: float  # ... of softmax(scores / T), T fitted on the other folds (out of sample)
    n_oos: int = 0
    oos_recall: float | None = None  # share of the out-of-scope texts rejected
    scorer: str = "prototype"  # the scores it was fitted on: "prototype" (head=None) or the head's name
    ece_after_in_sample: float | None = None  # ... with the T fitted on all of them (None: saved before it existed)
    temperature_fitted: bool = True  # False: every held-out text was right, T kept at its prior value
    oos_examples: tuple[str, ...] = ()  # kept out-of-scope examples: texts near them are pushed from every label
    oos_weight: float = 0.0  # w of the push (0: the examples are not kept)

    def __post_init__(self):
        object.__setattr__(self, "oos_examples", tuple(self.oos_examples))  # a list when read from JSON

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> dict:
        """:meth:`to_dict` with the out-of-scope examples counted rather than listed."""
        return {**self.to_dict(), "oos_examples": len(self.oos_examples)}

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
    n = len(labels)
    if n < 2:
        raise DyntcError(f"calibration needs at least 2 held-out texts (got {n}); {MIN_TEXTS} or more give a usable "
                         "temperature and threshold")
    if n < MIN_TEXTS:
        warnings.warn(f"calibrating on {n} held-out texts: the temperature and the out-of-scope threshold will be "
                      f"noisy; use at least {MIN_TEXTS} labelled texts that are not support examples", DyntcWarning,
                      stacklevel=4)
    fitted = bool((logits.argmax(1) != labels).any())
    temperature = _temperature(logits, labels, prior_temperature)
    if not fitted:
        warnings.warn(f"every one of the {n} held-out texts is classified correctly, so they cannot fit a temperature "
                      f"(it would shrink towards 0 and every probability become 1.0): kept the prior T = "
                      f"{prior_temperature:.4g}; calibrate on more or harder held-out texts (a dev split that "
                      "includes confusable ones)", DyntcWarning, stacklevel=4)
    elif float(torch.softmax(logits / temperature, 1).max(1).values.mean()) > COLLAPSED:
        warnings.warn(f"the fitted temperature T = {temperature:.4g} makes almost every probability 1.0 on the {n} "
                      "held-out texts: the probabilities will be overconfident; calibrate on more or harder held-out "
                      "texts", DyntcWarning, stacklevel=4)
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
        ece_after=expected_calibration_error(cross_fitted_proba(logits, labels, prior_temperature), labels),
        n_oos=0 if oos_sq_distances is None else len(oos_sq_distances), oos_recall=oos_recall, scorer=scorer,
        ece_after_in_sample=expected_calibration_error(torch.softmax(logits / temperature, 1), labels),
        temperature_fitted=fitted,
    )


def _temperature(logits: torch.Tensor, labels: torch.Tensor, prior_temperature: float) -> float:
    """The fitted temperature, or `prior_temperature` when every text is right (no finite minimum)."""
    if not bool((logits.argmax(1) != labels).any()):
        return prior_temperature
    return fit_temperature(-logits, labels)


def cross_fitted_proba(logits: torch.Tensor, labels: torch.Tensor, prior_temperature: float,
                       folds: int = CV_FOLDS) -> torch.Tensor:
    """``softmax(logits / T)`` where each text's T is fitted on the other folds (texts dealt round-robin
    into ``min(folds, n)`` folds after a fixed shuffle): out-of-sample probabilities for the ECE."""
    n = len(labels)
    k = min(folds, n)
    fold = torch.randperm(n, generator=torch.Generator().manual_seed(0)) % k
    proba = torch.empty_like(logits, dtype=torch.float64)
    for f in range(k):
        test = fold == f
        t = _temperature(logits[~test], labels[~test], prior_temperature)
        proba[test] = torch.softmax(logits[test] / t, 1)
    return proba


def oos_pull(directions: torch.Tensor, examples: torch.Tensor, own: torch.Tensor | None = None) -> torch.Tensor:
    """c̄ per row of `directions` (unit rows): the mean cosine to its ``OOS_NEIGHBOURS`` nearest rows of
    `examples` (unit), floored at 0. `own[i]` >= 0 leaves example ``own[i]`` out of row i's neighbours
    (the row is that example: an example must not vouch for itself)."""
    sims = directions.double() @ examples.double().T
    if own is not None:
        rows = torch.nonzero(own >= 0).flatten()
        sims[rows, own[rows]] = float("-inf")
    k = min(OOS_NEIGHBOURS, len(examples) - int(own is not None and bool((own >= 0).any())))
    if k < 1:
        return torch.zeros(len(directions), dtype=torch.float64)
    return sims.topk(k, dim=1).values.mean(1).clamp_min(0)


def require_calibration(cal: Calibration | None, scorer: str, head: str | None, what: str) -> Calibration:
    """`cal` if it was fitted on the `scorer` in use, or a clear error naming `what` needed it."""
    if cal is not None and cal.scorer != scorer:
        raise CalibrationRequiredError(f"{what}: the calibration was fitted on the {cal.scorer!r} scorer's scores and this "
                         f"classifier scores with {scorer!r} (head={head!r}): call calibrate(texts, labels) again, "
                         "or set the head it was fitted with")
    if cal is None:
        raise CalibrationRequiredError(f"{what} needs a calibrated classifier: call calibrate(texts, labels) with held-out "
                         "labelled texts first (fine_tune resets the calibration)")
    return cal


def check_max_drop(value: object) -> float:
    if not (is_number(value) and 0 <= value < 1):
        raise DyntcError(f"max_accuracy_drop must be a number in [0, 1) (0.02 = two points), got {value!r}")
    return float(value)


def check_oos_weight(value: object) -> float:
    if not (is_number(value) and math.isfinite(value) and 0 <= value <= 10):
        raise DyntcError(f"oos_weight must be a number between 0 and 10 (0: the out-of-scope examples only measure the "
                         f"rejection; default {OOS_WEIGHT}), got {value!r}")
    return float(value)


def check_threshold(value: object) -> float:
    if not (is_number(value) and math.isfinite(value) and value > 0):
        raise DyntcError(f"threshold must be a finite distance > 0 (or None to choose it from the data), got {value!r}")
    return float(value)
