"""Suggestions for a label set: labels to merge (the classifier confuses them) and labels to split
(a label's support forms separate groups), each with its evidence.

Both work on the support points alone (nothing is embedded), as unit directions (cosine). Not in
discovery's adapted metric: that metric shrinks the directions in which a label's own examples
differ, which are exactly the directions along which a label that holds two intents splits.

* **merge** (a, b): leave-one-out nearest prototype over every support example (its own label's
  prototype computed without it). ``rate = (a→b + b→a) / (n_a + n_b)``, the share of the two labels'
  examples the other label takes; suggested when it reaches ``merge_rate`` (one intent under two names
  is confused about half the time; distinct intents rarely).
* **split** a: spherical 2-means on its support (best of a few seedings). ``ratio`` = the cosine
  distance between the two parts' centres over the median distance from a prototype to its nearest
  other prototype: two intents under one name are as far apart as two labels, the two halves of
  one intent much less. Suggested when ``ratio`` reaches ``split_ratio`` and the smaller part holds
  at least ``min_part`` examples and ``min_share`` of the label.

A suggestion's ``score`` is its statistic over its threshold (>= 1 when suggested), so merges and
splits rank on one scale. The defaults were read off HWU64's train split with one draw of planted
merges and splits (seed 0): planted halves of one intent are confused at rates 0.23-0.54, other
pairs at most 0.22; planted pairs of intents split at ratios 2.0-3.7, untouched labels mostly below
2.4 (docs/discovery.md, ``python -m bench.discovery --suggestions``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from dyntc.classifier import clustering as cl
from dyntc.classifier.discovery import _known, check_seed, unique_name
from dyntc.classifier.labels import LabelSet
from dyntc.errors import DyntcError, is_int, is_number

MERGE_RATE = 0.3
SPLIT_RATIO = 2.5
MIN_PART = 3
MIN_SHARE = 0.2
EXAMPLES = 3


@dataclass
class Suggestion:
    """``kind`` ``"merge"`` (``labels``: the two to merge) or ``"split"`` (``labels``: the one to split,
    ``parts``: proposed names -> texts); ``score`` (>= 1: the statistic over its threshold) and
    ``evidence`` (counts, distances, example texts)."""

    kind: str
    labels: list[str]
    score: float
    evidence: dict
    parts: dict[str, list[str]] = field(default_factory=dict)

    def to_dict(self, texts_per_part: int | None = None) -> dict:
        d = asdict(self)
        if texts_per_part is not None:
            d["parts"] = {k: v[:texts_per_part] for k, v in d["parts"].items()}
        return d

    def describe(self) -> str:
        e = self.evidence
        if self.kind == "merge":
            a, b = self.labels
            return (f"merge {a!r} + {b!r}: {e['a_to_b']} of {e['n_a']} {a!r} examples are nearer {b!r} and "
                    f"{e['b_to_a']} of {e['n_b']} {b!r} examples nearer {a!r} (rate {e['rate']:.2f}); "
                    f"prototype distance {e['prototype_distance']:.3f}")
        sizes = " + ".join(str(n) for n in e["part_sizes"])
        return (f"split {self.labels[0]!r} into {', '.join(map(repr, self.parts))} ({sizes} examples): its two "
                f"groups are {e['ratio']:.2f}x as far apart as a label from its nearest label")


def _check(value, name: str, hi: float | None = None) -> float:
    if not is_number(value) or not 0 < value <= (math.inf if hi is None else hi):  # also refuses NaN
        raise DyntcError(f"{name} must be a number {'> 0' if hi is None else f'in (0, {hi}]'}, got {value!r}")
    return float(value)


def suggest(labels: LabelSet, *, merge_rate: float = MERGE_RATE, split_ratio: float = SPLIT_RATIO,
            min_part: int = MIN_PART, min_share: float = MIN_SHARE, top: int | None = None,
            seed: int = 0) -> list[Suggestion]:
    """Merge and split suggestions for `labels`, highest score first (at most `top`)."""
    merge_rate = _check(merge_rate, "merge_rate", 1.0)
    split_ratio = _check(split_ratio, "split_ratio")
    min_share = _check(min_share, "min_share", 0.5)
    if not (is_int(min_part) and min_part >= 1):
        raise DyntcError(f"min_part must be an integer >= 1, got {min_part!r}")
    if top is not None and not (is_int(top) and top >= 1):
        raise DyntcError(f"top must be None or an integer >= 1, got {top!r}")
    seed = check_seed(seed)
    if len(labels) < 2:
        return []
    points, ids, owners = _known(labels)
    names = labels.classes
    label_of = np.array([names.index(o) for o in owners])[ids]  # label index of every support point
    x = cl.unit(points)
    texts = [t for _, s in labels.items() for t in s.texts]
    found = _merges(labels, x, label_of, texts, merge_rate) + _splits(labels, x, label_of, texts, split_ratio,
                                                                      min_part, min_share, seed)
    found.sort(key=lambda s: -s.score)
    return found[:top] if top is not None else found


def _merges(labels: LabelSet, x: np.ndarray, y: np.ndarray, texts: list[str], threshold: float) -> list[Suggestion]:
    names = labels.classes
    k = len(names)
    sums = cl.group_sums(y, x, k)
    counts = np.bincount(y, minlength=k)
    sims = x @ cl.unit(sums).T
    loo = cl.unit(sums[y] - x)  # leave-one-out prototype of the own label: (sum - x) / (n - 1), as a direction
    has_rest = counts[y] > 1
    sims[np.arange(len(x)), y] = np.where(has_rest, (x * loo).sum(1), -np.inf)
    pred = sims.argmax(1)
    confusion = np.zeros((k, k), np.int64)
    np.add.at(confusion, (y, pred), 1)
    protos = labels.prototypes()  # one row per label unless labels were merged (then no prototype distance)
    proto_d = labels.space.sq_distances(protos, protos).clamp_min(0).sqrt().numpy() if len(protos) == k else None
    out = []
    for a in range(k):
        for b in range(a + 1, k):
            ab, ba = int(confusion[a, b]), int(confusion[b, a])
            rate = float((ab + ba) / (counts[a] + counts[b]))
            if rate < threshold or rate == 0:
                continue
            wrong_a = [texts[i] for i in np.flatnonzero((y == a) & (pred == b))[:EXAMPLES]]
            wrong_b = [texts[i] for i in np.flatnonzero((y == b) & (pred == a))[:EXAMPLES]]
            out.append(Suggestion("merge", [names[a], names[b]], round(rate / threshold, 6), {
                "a_to_b": ab, "b_to_a": ba, "n_a": int(counts[a]), "n_b": int(counts[b]), "rate": round(rate, 6),
                "prototype_distance": None if proto_d is None else round(float(proto_d[a, b]), 6),
                "examples_a_nearer_b": wrong_a, "examples_b_nearer_a": wrong_b}))
    return out


def _nearest_gap(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Median over labels of the cosine distance from its prototype to the nearest other prototype."""
    protos = cl.unit(cl.group_sums(y, x, k))
    sims = protos @ protos.T
    np.fill_diagonal(sims, -np.inf)
    return float(np.median(1.0 - sims.max(1)))


def _splits(labels: LabelSet, x: np.ndarray, y: np.ndarray, texts: list[str], threshold: float, min_part: int,
            min_share: float, seed: int) -> list[Suggestion]:
    names = labels.classes
    gap = _nearest_gap(x, y, len(names))
    if gap <= 0:
        return []
    out = []
    for c, name in enumerate(names):
        idx = np.flatnonzero(y == c)
        if len(idx) < 2 * min_part:
            continue
        empty = np.zeros((0, x.shape[1]), np.float32)
        assign, centres, _ = cl.seeded_kmeans(x[idx], empty, np.zeros(0, np.int64), 0, 2, seed=seed, n_init=5)
        sizes = np.bincount(assign, minlength=2)
        if sizes.min() < max(min_part, min_share * len(idx)):
            continue
        ratio = (1.0 - float(centres[0] @ centres[1])) / gap
        if ratio < threshold:
            continue
        groups = [[texts[idx[i]] for i in np.flatnonzero(assign == p)] for p in range(2)]
        words = cl.keywords(groups, top=2)
        taken = set(names) - {name}
        parts = {}
        for p in range(2):
            part = unique_name(f"{name}_{'_'.join(words[p]) or p + 1}", taken)
            taken.add(part)
            parts[part] = groups[p]
        out.append(Suggestion("split", [name], round(ratio / threshold, 6), {
            "part_sizes": [int(s) for s in sizes], "ratio": round(ratio, 6),
            "part_distance": round(1.0 - float(centres[0] @ centres[1]), 6), "nearest_label_gap": round(gap, 6),
            "examples": {p: g[:EXAMPLES] for p, g in parts.items()}}, parts))
    return out


def suggest_for(clf, **options) -> list[Suggestion]:
    """``DynamicClassifier.suggest(**options)``: merge and split suggestions for the classifier's
    current label set, strongest first, each with its evidence; `options` are :func:`suggest`'s."""
    return suggest(clf.labels_, **options)
