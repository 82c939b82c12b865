"""What a :class:`~dyntc.classifier.DynamicClassifier` answers for a batch of texts, from the scores
it computed once (``label_scores``): the nearest labels with their distances (``top_k``), the
labels ranked by probability (``rank``, Rasa's ``intent_ranking``), and the JSON-able records that
``dyntc predict`` and the HTTP service send. Pure functions of matrices and label lists."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from dyntc.errors import DyntcError, is_int

#: Labels a ranking lists when the caller does not say (Rasa's ``ranking_length`` default).
RANKING_LENGTH = 10


def check_k(k: Any, arg: str = "k", low: int = 1) -> int:
    if not (is_int(k) and k >= low):
        raise DyntcError(f"{arg} must be an integer >= {low}, got {k!r}")
    return k


def check_scores(scores: Any, n_classes: int, arg: str = "scores", one_d: bool = False) -> Any:
    """`scores` (or squared distances), checked to have one column per label: a matrix from another
    classifier, or a label set changed since, would otherwise be read against the wrong labels.
    `one_d`: a two-label classifier's ``(n,)`` decision_function is accepted too."""
    shape = np.shape(scores)
    if one_d and n_classes == 2 and len(shape) == 1:
        return scores
    if len(shape) != 2 or shape[1] != n_classes:
        source = "squared_distances(label_scores(texts))" if arg == "sq_distances" else "label_scores(texts)"
        raise DyntcError(f"{arg} must be (n, {n_classes}), one column per label of classes_, got shape {shape}"
                         + (" (a two-label decision_function is 1-D)" if len(shape) == 1 else "") + f": pass {source}")
    return scores


def check_record_args(scores: Any, n_classes: int, top_k: Any, ranking: Any) -> None:
    """What :meth:`~dyntc.classifier.DynamicClassifier.prediction_records` is given, checked."""
    check_scores(scores, n_classes)
    check_k(top_k, "top_k")
    check_k(ranking, "ranking", low=0)


def as_matrix(scores: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Scores as an ``(n, n_classes)`` float64 matrix; a two-label ``decision_function`` ``(n,)``, the
    second label's score minus the first's, as ``[0, d]`` (softmax does not see the shift)."""
    scores = torch.as_tensor(scores).double()
    return torch.stack([torch.zeros_like(scores), scores], 1) if scores.ndim == 1 else scores


def best(classes: np.ndarray, sq_distances: torch.Tensor, threshold: float | None) -> np.ndarray:
    """The nearest label of every row of ``(n, n_classes)`` squared distances, taken from the array
    `classes`; with a `threshold`, None (in an object array) where it is farther than that."""
    index = sq_distances.argmin(1).numpy() if len(sq_distances) else np.zeros(0, dtype=int)
    if threshold is None:
        return classes[index]
    out = np.empty(len(index), dtype=object)
    out[:] = list(classes[index])
    out[sq_distances.min(1).values.clamp_min(0).sqrt().numpy() > threshold] = None
    return out


def nearest(classes: Sequence[Any], sq_distances: torch.Tensor | np.ndarray, k: int) -> list[list[tuple[Any, float]]]:
    """The `k` nearest labels of every row of ``(n, n_classes)`` squared distances, as ``(label,
    distance)``, nearest first."""
    d2 = torch.as_tensor(sq_distances)
    values, index = d2.topk(min(k, d2.shape[1]), dim=1, largest=False)
    return [[(classes[j], v) for j, v in zip(row_i, row_v)]
            for row_i, row_v in zip(index.tolist(), values.clamp_min(0).sqrt().tolist())]


def ranking(classes: Sequence[Any], proba: np.ndarray, k: int) -> list[list[tuple[Any, float]]]:
    """The `k` most probable labels of every row of ``(n, n_classes)`` probabilities, as ``(label,
    probability)``, most probable first (ties in column order)."""
    proba = np.asarray(proba)
    order = np.argsort(-proba, axis=1, kind="stable")[:, :k]
    return [[(classes[j], float(row[j])) for j in idx] for idx, row in zip(order.tolist(), proba)]


def records(classes: Sequence[Any], sq_distances: torch.Tensor, proba: np.ndarray | None, *, top_k: int,
            threshold: float | None, probability: bool, ranking_length: int = 0) -> list[dict]:
    """One JSON-able record per row: ``label`` (None when the nearest label is farther than
    `threshold`), with `probability` the top label's ``probability`` (from `proba`), with `top_k` > 1 the ``top_k``
    nearest labels and their distances, with `ranking_length` > 0 the ``ranking`` of that many labels
    by probability (``{"label", "confidence"}``). Numbers rounded to 6 digits."""
    ranked = nearest(classes, sq_distances, top_k)
    ranks = ranking(classes, proba, ranking_length) if ranking_length and proba is not None else None
    out = []
    for i, row in enumerate(ranked):
        record: dict = {"label": None if threshold is not None and row[0][1] > threshold else row[0][0]}
        if probability:
            record["probability"] = round(float(proba[i].max()), 6)
        if top_k > 1:
            record["top_k"] = [{"label": label, "distance": round(d, 6)} for label, d in row]
        if ranks is not None:
            record["ranking"] = [{"label": label, "confidence": round(p, 6)} for label, p in ranks[i]]
        out.append(record)
    return out
