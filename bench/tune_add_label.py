"""``add_label`` on a tuned model: its new labels are embedded by the tuned backbone (no embedding
cache), so this times it after ``DynamicClassifier.tune_saved``.

    python -m bench.tune_add_label [--intents 50] [--budget 30] [--new 10]

CLINC150 (``DYNTC_DATA``): the default classifier fitted on the first `--intents` intents' training
texts, tuned for `--budget` seconds as one new version, loaded, then `--new` more intents added with 5
examples each; prints the median and the slowest ``add_label``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from bench._machine import cpu_model, load_average
from dyntc import DynamicClassifier
from dyntc.protocol.data.datasets import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--intents", type=int, default=50)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("--new", type=int, default=10)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    train = load("clinc150").train
    names = sorted(set(train.labels))[: args.intents + args.new]
    fitted = set(names[: args.intents])
    texts = [t for t, y in zip(train.texts, train.labels) if y in fitted]
    labels = [y for y in train.labels if y in fitted]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        DynamicClassifier().fit(texts, labels).save(path)
        DynamicClassifier.tune_saved(path, budget_s=args.budget)
        clf = DynamicClassifier.load(path)
        times = []
        for name in names[args.intents:]:
            examples = [t for t, y in zip(train.texts, train.labels) if y == name][:5]
            t0 = time.perf_counter()
            clf.add_label(name, examples)
            times.append((time.perf_counter() - t0) * 1000)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}; load {load_average()}; "
          f"{len(texts)} examples in {args.intents} intents, tuned {args.budget:g} s (version {clf.version_}); "
          f"add_label with 5 examples x{len(times)}: median {statistics.median(times):.1f} ms, "
          f"max {max(times):.1f} ms")


if __name__ == "__main__":
    main()
