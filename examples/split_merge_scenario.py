"""Splitting and merging labels: ``DynamicClassifier`` label operations against
retraining a static classifier on the same frozen backbone.

* **split**: ``--pairs`` pairs of intents from the same domain start as one label each (all their
  training examples under the name ``a|b``); then the label is split into ``a`` and ``b`` with
  ``--shots`` examples each (``split_label``, nothing retrained). The static alternative retrains a
  logistic regression on the other labels' training data plus those ``--shots`` examples of a and b.
* **merge**: every intent a label (all training data), then each pair merged into ``a|b``
  (``merge_labels``); the static alternative retrains on the merged labels.

Accuracy on the official test split, on the texts of the labels that changed and on the others::

    .venv/bin/python examples/split_merge_scenario.py --dataset clinc150
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dyntc import DynamicClassifier
from dyntc.protocol.data.datasets import load
from dyntc.core.encoders import create_encoder
from dyntc.core.machine import machine_description


def accuracy(pred, gold, changed):
    pred, gold = np.asarray(pred, dtype=object), np.asarray(gold, dtype=object)
    mask = np.isin(gold, list(changed))
    ok = pred == gold
    return 100 * ok[mask].mean(), 100 * ok[~mask].mean(), 100 * ok.mean()


def logreg(train_texts, train_labels, test_texts):
    from sklearn.linear_model import LogisticRegression

    encoder = create_encoder("minilm", [], num_layers=0, max_len=64)
    x_fit = torch.stack(encoder.featurize(train_texts)).numpy()
    x_test = torch.stack(encoder.featurize(test_texts)).numpy()
    return LogisticRegression(class_weight="balanced", max_iter=2000).fit(x_fit, train_labels).predict(x_test).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="clinc150", choices=["clinc150", "hwu64"])
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--shots", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    data = load(args.dataset)
    tree = data.hierarchy
    domains = [d for d in sorted(tree.children["ROOT"]) if len(tree.children[d]) >= 2]
    pairs = [tuple(sorted(rng.choice(sorted(tree.children[d]), 2, replace=False).tolist()))
             for d in sorted(rng.choice(domains, args.pairs, replace=False).tolist())]
    merged_name = {a: f"{a}|{b}" for a, b in pairs} | {b: f"{a}|{b}" for a, b in pairs}
    train_texts, train_labels = list(data.train.texts), list(data.train.labels)
    test_texts, test_labels = list(data.test.texts), list(data.test.labels)
    print(f"{args.dataset}: {len(pairs)} pairs {pairs}; {machine_description()}")

    # ---- split: a|b known with all its data, then split into a and b with --shots examples each
    coarse = [merged_name.get(y, y) for y in train_labels]
    shots = {}
    for a, b in pairs:
        for name in (a, b):
            pool = [t for t, y in zip(train_texts, train_labels) if y == name]
            shots[name] = [pool[i] for i in sorted(rng.choice(len(pool), args.shots, replace=False))]
    changed = {n for pair in pairs for n in pair}
    rows = {}
    for debias in (True, False):
        clf = DynamicClassifier(debias=debias, head=None).fit(train_texts, coarse)  # debias: the prototype scorer's
        t0 = time.perf_counter()
        for a, b in pairs:
            clf.split_label(f"{a}|{b}", {a: shots[a], b: shots[b]})
        ms = 1000 * (time.perf_counter() - t0) / len(pairs)
        rows[f"DynamicClassifier(debias={debias}) + split_label"] = (*accuracy(clf.predict(test_texts), test_labels, changed), ms)
    keep = [(t, y) for t, y in zip(train_texts, train_labels) if y not in changed]
    fit_texts = [t for t, _ in keep] + [t for n in sorted(shots) for t in shots[n]]
    fit_labels = [y for _, y in keep] + [n for n in sorted(shots) for _ in shots[n]]
    rows["LogisticRegression retrained (others + the split parts' examples)"] = (
        *accuracy(logreg(fit_texts, fit_labels, test_texts), test_labels, changed), float("nan"))
    print(f"\nsplit: {len(pairs)} labels each split into two, {args.shots} examples per part")
    print("| approach | split parts | other labels | all | ms per split |\n|---|---:|---:|---:|---:|")
    for name, (a, o, al, ms) in rows.items():
        print(f"| {name} | {a:.1f} | {o:.1f} | {al:.1f} | {'' if ms != ms else f'{ms:.0f}'} |")

    # ---- merge: all intents, then each pair merged
    gold = [merged_name.get(y, y) for y in test_labels]
    merged = {f"{a}|{b}" for a, b in pairs}
    rows = {}
    clf = DynamicClassifier().fit(train_texts, train_labels)
    t0 = time.perf_counter()
    for a, b in pairs:
        clf.merge_labels([a, b], f"{a}|{b}")
    ms = 1000 * (time.perf_counter() - t0) / len(pairs)
    rows["DynamicClassifier() + merge_labels"] = (*accuracy(clf.predict(test_texts), gold, merged), ms)
    rows["LogisticRegression retrained on the merged labels"] = (
        *accuracy(logreg(train_texts, [merged_name.get(y, y) for y in train_labels], test_texts), gold, merged), float("nan"))
    print(f"\nmerge: {len(pairs)} pairs merged")
    print("| approach | merged labels | other labels | all | ms per merge |\n|---|---:|---:|---:|---:|")
    for name, (a, o, al, ms) in rows.items():
        print(f"| {name} | {a:.1f} | {o:.1f} | {al:.1f} | {'' if ms != ms else f'{ms:.0f}'} |")


if __name__ == "__main__":
    main()
