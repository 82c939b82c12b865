"""Per-label recall by support size within one label set, with and without the
support-size correction (``DynamicClassifier(debias=...)``).

Every intent of the dataset is a label; a random half gets 5 training examples, the other half 100
(all of them on HWU64 when fewer), and the classifier is fitted on that; recall of the 5-shot and
of the many-shot labels, and the 5-shot labels' share of the predictions against their true share,
on the validation and the test split, averaged over ``--seeds`` random halves::

    .venv/bin/python examples/support_size.py --dataset clinc150
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from dyntc import DynamicClassifier
from dyntc.protocol.data.datasets import load
from dyntc.core.machine import machine_description


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="clinc150", choices=["clinc150", "hwu64"])
    ap.add_argument("--few", type=int, default=5)
    ap.add_argument("--many", type=int, default=100)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--metric", default="euclidean", choices=["euclidean", "hyperbolic"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = load(args.dataset)
    by_label: dict[str, list[str]] = {}
    for text, label in zip(data.train.texts, data.train.labels):
        by_label.setdefault(label, []).append(text)
    labels = sorted(by_label)
    print(f"{args.dataset}: {len(labels)} labels, half with {args.few} examples, half with up to {args.many}; "
          f"metric {args.metric}; {args.seeds} random halves; {machine_description()}")
    results: dict[tuple[str, bool], list[tuple[float, float, float, float]]] = {}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        few = set(rng.permutation(labels)[: len(labels) // 2].tolist())
        texts, ys = [], []
        for label in labels:
            pool = by_label[label]
            idx = rng.permutation(len(pool))[: args.few if label in few else args.many]
            texts += [pool[i] for i in idx]
            ys += [label] * len(idx)
        clf = DynamicClassifier(metric=args.metric, seed=seed, head=None).fit(texts, ys)  # debias: the prototype scorer's
        for split_name, split in (("dev", data.dev), ("test", data.test)):
            truth = np.asarray(split.labels, dtype=object)
            is_few = np.isin(truth, list(few))
            for debias in (False, True):
                pred = np.asarray(clf.set_params(debias=debias).predict(split.texts), dtype=object)
                ok = pred == truth
                results.setdefault((split_name, debias), []).append(
                    (100 * ok[is_few].mean(), 100 * ok[~is_few].mean(), 100 * np.isin(pred, list(few)).mean(),
                     100 * is_few.mean()))
    print(f"\n| split | debias | recall, {args.few}-shot labels | recall, many-shot labels | all | "
          f"{args.few}-shot labels predicted / true share |")
    print("|---|---|---:|---:|---:|---:|")
    for (split_name, debias), rows in results.items():
        few_r, many_r, share, true_share = np.mean(rows, axis=0)
        overall = (few_r * true_share + many_r * (100 - true_share)) / 100
        print(f"| {split_name} | {debias} | {few_r:.1f} | {many_r:.1f} | {overall:.1f} | {share:.1f} / {true_share:.1f} |")


if __name__ == "__main__":
    main()
