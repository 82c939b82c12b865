"""Measured: how ``discover`` seeds its new centroids, against the seedings it replaced.

``clustering.seeded_kmeans`` seeds its ``n_new`` centroids by greedy k-means++ (Arthur and
Vassilvitskii 2007, as scikit-learn's ``KMeans`` does): ``2 + ln k`` candidates drawn with
probability proportional to the squared distance ``2 - 2 cos`` to the nearest centroid so far, the
one lowering the total distance most kept. This probe runs ``bench.discovery`` (its options, its
protocol) with one of the seedings it replaced in its place; its tables go to
``runs/discovery-seeding-<seeding>/``:

* ``plain-cos2``: one candidate drawn with probability proportional to ``(1 - cos)²`` (the square of
  the squared distance: far points weigh much more), ``discover``'s seeding until 2026-11-29;
* ``plain``: one candidate drawn with probability proportional to ``1 - cos`` (plain k-means++);
* ``greedy``: discover's own seeding, unchanged (with ``--no-swaps``, to rerun the runs measured
  before the swap search).

``--no-swaps`` turns off the swap search that follows the seeding in the default mode
(``clustering.swap_search``, added 2026-11-29) and the split search after it: with it, a run measured
before the swap search reruns as it was. ``--no-splits`` turns off the split search alone
(``clustering.split_search``, added 2026-11-29 after the swap search): a run measured between the two
reruns as it was.

    DYNTC_DATA=/path/to/datasets python research/discovery_seeding.py --seeding plain-cos2 --no-swaps --split dev --no-baselines
    DYNTC_DATA=/path/to/datasets python research/discovery_seeding.py --seeding greedy --no-swaps --datasets clinc150 --kcr 0.75
    DYNTC_DATA=/path/to/datasets python research/discovery_seeding.py --seeding greedy --no-splits --datasets mcid
    DYNTC_DATA=/path/to/datasets python research/discovery_seeding.py --seeding plain-cos2 \
        --script research/discovery_finetune.py --dataset stackoverflow --seed 0 --budget 360 --words-weight 0

The comparison on the dev splits is in docs/discovery.md ("How the new centroids are seeded"), and
so are the runs measured under the former seeding that this script reruns as they were.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: seeding name -> the power of ``1 - cos`` a candidate is drawn by
SEEDINGS = {"plain-cos2": 2, "plain": 1, "greedy": None}


def plain_plus_plus(points: np.ndarray, centroids: np.ndarray, n: int, rng: np.random.Generator,
                    power: int = 2) -> np.ndarray:
    """`n` more centroids among unit `points`, given `centroids` already chosen, each drawn with
    probability proportional to ``(1 - cos to the nearest centroid so far) ** power`` (one candidate,
    no greedy choice). ``clustering._plus_plus``'s signature (with `power` bound), so that it can
    stand in for it."""
    best = (points @ centroids.T).max(1) if len(centroids) else np.full(len(points), -1.0, np.float32)
    out = []
    for _ in range(n):
        weight = np.clip(1.0 - best, 0, None) ** power
        total = weight.sum()
        i = int(rng.integers(len(points))) if total <= 0 else int(rng.choice(len(points), p=weight / total))
        out.append(points[i])
        best = np.maximum(best, points @ points[i])
    return np.array(out, dtype=np.float32).reshape(n, points.shape[1])


def _take(argv: list[str], flag: str) -> str | None:
    """The value after `flag` in `argv`, both removed; None without the flag."""
    if flag not in argv:
        return None
    i = argv.index(flag)
    if i + 1 >= len(argv):
        raise SystemExit(f"{flag} needs a value")
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    seeding = _take(argv, "--seeding")
    if seeding is None:
        raise SystemExit(f"usage: research/discovery_seeding.py --seeding {{{','.join(SEEDINGS)}}} "
                         "[--no-swaps | --no-splits] "
                         "[--script SCRIPT.py] [the script's options; bench.discovery's by default]")
    if seeding not in SEEDINGS:
        raise SystemExit(f"--seeding {seeding!r}: choose one of {', '.join(SEEDINGS)}")
    script = _take(argv, "--script")
    if script is not None and not Path(script).is_file():
        raise SystemExit(f"--script {script}: no such file")
    no_swaps, no_splits = "--no-swaps" in argv, "--no-splits" in argv
    for flag in ("--no-swaps", "--no-splits"):
        if flag in argv:
            argv.remove(flag)
    sys.path.insert(0, str(ROOT))
    from dyntc.classifier import clustering, discovery

    power = SEEDINGS[seeding]
    if power is not None:
        clustering._plus_plus = lambda points, centroids, n, rng: plain_plus_plus(points, centroids, n, rng, power)
    if no_swaps:
        discovery.MODE_SETTINGS["default"]["swaps"] = False
    if no_swaps or no_splits:  # the split search came after the swap search
        discovery.MODE_SETTINGS["default"]["splits"] = False
    if script is not None:
        import runpy

        sys.argv = [script, *argv]
        runpy.run_path(script, run_name="__main__")
        return
    from bench import discovery as bench_discovery

    suffix = "-no-swaps" if no_swaps else "-no-splits" if no_splits else ""
    bench_discovery.OUT = ROOT / "runs" / f"discovery-seeding-{seeding}{suffix}"
    sys.argv = ["research/discovery_seeding.py", *argv]
    bench_discovery.main()


if __name__ == "__main__":
    main()
