"""Measured: does greedy k-means++ seeding of discover's new centroids cluster better?

``clustering.seeded_kmeans`` seeds its ``n_new`` centroids by plain k-means++: each one drawn with
probability proportional to the squared cosine distance to the nearest centroid chosen so far. Greedy
k-means++ (Arthur and Vassilvitskii 2007, the default of scikit-learn's ``KMeans``) draws ``2 + ln n``
candidates that way and keeps the one that lowers the total potential most. This probe runs
``bench.discovery`` (its options, its protocol) with the greedy seeding in place of the plain one;
its tables go to ``runs/discovery-greedy-seeding/``.

    DYNTC_DATA=/path/to/datasets python research/discovery_seeding.py --split dev --no-baselines

Measured 2026-11-29 01:25-01:29 UTC on the 2-core AMD EPYC with nothing else running, ``--split dev
--no-baselines`` (all four datasets, KCR 25 / 50 / 75 %, seeds 0, 1, 2), the ``ours`` rows (``n_new``
given) averaged over the KCRs and seeds, NMI / ARI / ACC, against ``python -m bench.discovery --split
dev --no-baselines --words-weight 0.3`` (plain seeding, the product's; 00:32-00:36 UTC):

| seeding | CLINC150 | HWU64 | StackOverflow | M-CID |
|---|---|---|---|---|
| plain k-means++ (the product's) | 91.3 / 69.3 / 74.3 | 84.3 / 60.4 / 68.8 | 79.3 / 69.6 / 80.8 | 80.6 / 62.9 / 75.9 |
| greedy k-means++ | 92.1 / 72.6 / 78.8 | 84.6 / 61.5 / 69.8 | 78.7 / 69.2 / 80.8 | 79.8 / 61.4 / 75.4 |

Greedy seeding lifts CLINC150 (150 intents: many new centroids to place) by 0.8 / 3.3 / 4.5 and HWU64
by about a point, and costs StackOverflow and M-CID (5-15 new intents) up to 1.5. Not adopted yet:
it would change every measured row of docs/discovery.md, the adapted backbone's included.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def greedy_plus_plus(points: np.ndarray, centroids: np.ndarray, n: int, rng: np.random.Generator,
                     trials: int | None = None) -> np.ndarray:
    """`n` more centroids among unit `points` by greedy k-means++ (cosine distance), given `centroids`
    already chosen: per centroid, `trials` (default ``2 + ln n``) candidates drawn by k-means++, the one
    leaving the smallest potential (sum of squared distances to the nearest centroid) kept.
    ``clustering._plus_plus``'s signature, so that it can stand in for it."""
    trials = trials or 2 + int(np.log(max(n, 2)))
    best = (points @ centroids.T).max(1) if len(centroids) else np.full(len(points), -1.0, np.float32)
    out = []
    for _ in range(n):
        weight = np.clip(1.0 - best, 0, None) ** 2
        total = weight.sum()
        candidates = (rng.choice(len(points), size=trials, p=weight / total) if total > 0
                      else rng.integers(len(points), size=trials))
        sims = points @ points[candidates].T
        potentials = (np.clip(1.0 - np.maximum(best[:, None], sims), 0, None) ** 2).sum(0)
        j = int(np.argmin(potentials))
        out.append(points[candidates[j]])
        best = np.maximum(best, sims[:, j])
    return np.array(out, dtype=np.float32).reshape(n, points.shape[1])


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(ROOT))
    from bench import discovery
    from dyntc.classifier import clustering

    clustering._plus_plus = greedy_plus_plus
    discovery.OUT = ROOT / "runs" / "discovery-greedy-seeding"
    sys.argv = ["research/discovery_seeding.py", *(sys.argv[1:] if argv is None else argv)]
    discovery.main()


if __name__ == "__main__":
    main()
