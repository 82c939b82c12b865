"""Out-of-scope rejection on a :class:`~dyntc.classifier.estimator.DynamicClassifier`: what
``calibrate`` fits, and the push of the out-of-scope examples it keeps.

The numerics (temperature, threshold, the pull of the examples) are in
:mod:`~dyntc.classifier.calibration`; this module applies them to a classifier's scores. A text's
pull c̄ (its mean cosine to its nearest kept examples) lowers every label's score by the same amount,
the one that adds ``2 · w · c̄`` to its squared distance to every label: ``2 w c̄`` for ``-d²`` scores,
``scale · w · c̄`` for the cosine head's (``d² = 2 − 2 s / scale``). Predictions and probabilities
(shift-invariant) stay; the distance to the nearest label, hence the rejection, moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from dyntc.classifier import trainer
from dyntc.classifier.calibration import OOS_WEIGHT, Calibration, fit_calibration, oos_pull
from dyntc.classifier.labels import check_examples
from dyntc.classifier.live_head import directions
from dyntc.classifier.targets import as_texts
from dyntc.errors import DyntcError


def pushed(clf: Any, scores: torch.Tensor, points: torch.Tensor, texts: list[str], leave_one_out: bool) -> torch.Tensor:
    """`scores` of `texts` (at `points`) lowered by the pull of `clf`'s kept examples; with
    `leave_one_out` a text that is one of them is not pulled by itself (to measure the rejection on them)."""
    cal = clf._calibration()
    if cal is None or not cal.oos_weight or not texts:
        return scores
    own = None
    if leave_one_out:
        at = {text: i for i, text in enumerate(cal.oos_examples)}
        own = torch.tensor([at.get(text, -1) for text in texts])
    pull = oos_pull(torch.from_numpy(directions(clf.space_, points)), example_directions(clf, cal), own)
    return scores - shift(clf, pull, cal.oos_weight)


def calibrate(clf: Any, texts: Sequence[str], labels: Sequence[str], oos_texts: Sequence[str] | None, *,
              max_accuracy_drop: float, threshold: float | None, oos_weight: float) -> Calibration:
    """:meth:`DynamicClassifier.calibrate`'s fit on checked settings: the temperature and the threshold
    on the held-out texts pushed by the new examples (kept when `oos_weight` > 0), the examples' own
    rejection with each left out of its own push."""
    texts, labels = trainer.check_pairs(*clf._targets.encoded(texts, labels))
    index = {clf._targets.name(c): i for i, c in enumerate(clf.classes_)}
    unknown = sorted(set(labels) - index.keys())
    if unknown:
        raise DyntcError(f"calibration labels {unknown[:5]} are not in the label set: add them with add_label "
                         "or leave those texts out (out-of-scope texts go in oos_texts)")
    oos = [] if oos_texts is None else check_examples(as_texts(oos_texts), "oos_texts", allow_empty=True)
    scores, points = clf._unshifted_scores(texts)
    oos_scores, oos_points = clf._unshifted_scores(oos)
    examples = tuple(dict.fromkeys(oos)) if oos_weight else ()
    if examples:
        first = {text: i for i, text in reversed(list(enumerate(oos)))}  # each example's first row
        oos_directions = torch.from_numpy(directions(clf.space_, oos_points))
        kept = oos_directions[[first[text] for text in examples]]
        at = {text: i for i, text in enumerate(examples)}
        scores = scores - shift(clf, oos_pull(torch.from_numpy(directions(clf.space_, points)), kept), oos_weight)
        oos_scores = oos_scores - shift(clf, oos_pull(oos_directions, kept, torch.tensor([at[t] for t in oos])),
                                        oos_weight)
        clf.__dict__["_oos_cache"] = (clf.space_, examples, kept)
    cal = fit_calibration(clf.squared_distances(scores), torch.tensor([index[label] for label in labels]),
                          clf.squared_distances(oos_scores) if oos else None, max_accuracy_drop=max_accuracy_drop,
                          threshold=threshold, prior_temperature=clf.prior_temperature_, scores=scores,
                          scorer=clf._scorer())
    clf._labels.log.append({"op": "calibrate", "texts": len(texts), "oos_texts": len(oos)})
    return dataclasses.replace(cal, oos_examples=examples, oos_weight=oos_weight if examples else 0.0)


def with_examples(clf: Any, texts: Sequence[str]) -> Calibration:
    """`clf`'s calibration keeping `texts` as more out-of-scope examples, nothing refitted."""
    cal = clf.require_calibration("add_out_of_scope")
    texts = check_examples(as_texts(texts), "texts")
    examples = tuple(dict.fromkeys(cal.oos_examples + tuple(texts)))
    clf._labels.log.append({"op": "add_out_of_scope", "texts": len(examples) - len(cal.oos_examples)})
    return dataclasses.replace(cal, oos_examples=examples, oos_weight=cal.oos_weight or OOS_WEIGHT)


def warm(clf: Any) -> None:
    """Embed the kept examples now (a service does this before it serves a version it has just read)."""
    cal = clf._calibration()
    if cal is not None and cal.oos_weight:
        example_directions(clf, cal)


def example_directions(clf: Any, cal: Calibration) -> torch.Tensor:
    """The directions of `cal`'s examples under `clf`'s backbone: embedded once, the result carried by
    ``copy()`` and ``load(base=...)`` while the backbone stays."""
    cached = clf.__dict__.get("_oos_cache")
    if cached is None or cached[0] is not clf.space_ or cached[1] != cal.oos_examples:
        points = clf.space_.embed(list(cal.oos_examples))
        cached = (clf.space_, cal.oos_examples, torch.from_numpy(directions(clf.space_, points)))
        clf.__dict__["_oos_cache"] = cached
    return cached[2]


def shift(clf: Any, pull: torch.Tensor, weight: float) -> torch.Tensor:
    """``(n, 1)``: what every label's score loses for `pull`, so that its squared distance grows by
    ``2 · weight · pull`` (module docstring)."""
    live = clf._live_head()
    return (2 * weight * pull * (1.0 if live is None else live.config.scale / 2))[:, None]
