"""Which score tells CLINC150's out-of-scope texts apart best: the product's head, or another one.

The classifier (``DynamicClassifier()``: frozen all-MiniLM-L6-v2, the cosine head) is built as

* ``--scenario full`` (default): fitted on all of CLINC150's training texts;
* ``--scenario generalized``: ``bench.intents``' generalized scenario for ``--seed`` (a random third
  of the intents added with 5 examples each after fitting the others, then the head refreshed); with
  ``--tune SECONDS`` it is then served from a store and tuned by ``DynamicClassifier.tune_saved``,
  as the ``product:tune`` row of ``bench.intents`` does, and the tuned version is scored;

and the in-scope test texts and the out-of-scope test texts are scored by

* the head: the best label's score (what ``predict(reject=True)`` thresholds), its softmax
  probability, the log-sum-exp of the label scores (the "energy" score), and the best score after
  the support-size correction ``+ scale · σ²/(2 n_c)`` (a label of n_c examples sits that much
  farther from its texts, on average, than its true mean does);
* the stored examples (in the classifier's space): mean cosine of the k nearest (k = 1, 5, 10, 25),
  the cosine of the nearest label prototype (the mean of its examples), and the Mahalanobis distance
  to the nearest label mean under one covariance shared by all labels (Lee et al. 2018; Podolskiy et
  al. 2021 for intents), as estimated and shrunk halfway to a multiple of the identity;

and each score's AUROC (in-scope against out-of-scope) is printed, over all in-scope texts and, in
the generalized scenario, over the texts of the established intents and of the new ones apart.

    DYNTC_DATA=/path/to/datasets python -m bench.oos_scores [--scenario generalized --seed 0 --tune 600]
"""

from __future__ import annotations

import argparse
import tempfile
from types import SimpleNamespace

import numpy as np


def build(data, args):
    """The classifier to score and the test texts' intents that were added with few examples."""
    from bench.intents import NEW_FRACTION, NEW_SHOTS, partition
    from dyntc import DynamicClassifier

    name = lambda c: f"{int(c):04d}"  # noqa: E731
    tr = data.train
    if args.scenario == "full":
        clf = DynamicClassifier(seed=0).fit(tr.texts, [name(c) for c in tr.y])
        clf.refresh(wait=True)
        return clf, np.zeros(0, int)
    new, old, support = partition(data, args.seed, NEW_SHOTS, NEW_FRACTION)
    kept = np.flatnonzero(np.isin(tr.y, old))
    clf = DynamicClassifier(seed=0).fit([tr.texts[i] for i in kept], [name(tr.y[i]) for i in kept])
    for c in new:
        clf.add_label(name(c), [tr.texts[i] for i in support[c]])
    clf.refresh(wait=True)
    if args.tune:
        with tempfile.TemporaryDirectory(prefix="dyntc-oos-tune-") as path:
            clf.save(path)
            report = DynamicClassifier.tune_saved(path, args.tune)
            print(f"tuned: {report.episodes} episodes in {report.train_seconds:.0f} s, {report.few_shot} labels "
                  "left out of the episodes")
            clf = DynamicClassifier.load(path)  # the tuned version, as a replica would load it
            clf.refresh(wait=True)
    return clf, new


def scorers(clf):
    """``{row name: texts -> in-scope score (higher = more in scope)}``."""
    import torch

    from dyntc.classifier.head import normalize as unit, pooled_spread

    names = [str(c) for c in clf.classes_]
    points = [clf.labels_.support(c).points.double().numpy() for c in names]
    counts = np.array([len(p) for p in points], float)
    stored, owner = np.concatenate(points), np.repeat(np.arange(len(points)), counts.astype(int))
    means = np.stack([p.mean(0) for p in points])
    centred = stored - means[owner]
    sigma2 = pooled_spread(float((centred ** 2).sum()), counts)  # the label set's own σ²
    cov = centred.T @ centred / (len(stored) - len(points))
    shrunk = 0.5 * cov + 0.5 * np.trace(cov) / len(cov) * np.eye(len(cov))
    protos, unit_stored = unit(means), unit(stored)
    head_scale = clf.labels_.head.scale  # the trained head's cosine logit scale
    cache: dict = {}

    def embedded(texts):
        key = tuple(texts)
        if key not in cache:
            cache[key] = (clf.label_scores(texts), clf.encode(texts).astype(np.float64))
        return cache[key]

    def mahalanobis(c):
        inv = np.linalg.inv(c)
        offset = ((means @ inv) * means).sum(1)
        return lambda x: -(((x @ inv) * x).sum(1)[:, None] - 2 * (x @ inv) @ means.T + offset[None]).min(1)

    def knn(k):
        return lambda x: np.sort(unit(x) @ unit_stored.T, 1)[:, -k:].mean(1)

    on_scores = {
        "head: best label's score (the product's)": lambda s: s.max(1),
        "head: best label's probability": lambda s: clf.proba_from_scores(s).max(1),  # predict_proba's
        "head: log-sum-exp of the scores": lambda s: torch.logsumexp(torch.as_tensor(s), 1).numpy(),
        "head: best score + scale · σ²/(2 n_c)": lambda s: (s + head_scale * sigma2 / (2 * counts)).max(1),
    }
    on_points = {
        **{f"stored examples: mean cosine of the {k} nearest": knn(k) for k in (1, 5, 10, 25)},
        "nearest label prototype: cosine": lambda x: (unit(x) @ protos.T).max(1),
        "Mahalanobis, shared covariance": mahalanobis(cov),
        "Mahalanobis, covariance shrunk halfway": mahalanobis(shrunk),
    }
    rows = {k: (lambda f: lambda t: f(embedded(t)[0]))(f) for k, f in on_scores.items()}
    rows.update({k: (lambda f: lambda t: f(embedded(t)[1]))(f) for k, f in on_points.items()})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=["full", "generalized"], default="full")
    ap.add_argument("--seed", type=int, default=0, help="the generalized scenario's partition")
    ap.add_argument("--tune", type=float, default=0.0, help="generalized: seconds of DynamicClassifier.tune_saved (0: none)")
    args = ap.parse_args()
    if args.seed < 0:
        raise SystemExit(f"--seed must be an integer >= 0, got {args.seed}")
    if not args.tune >= 0:
        raise SystemExit(f"--tune must be a number of seconds >= 0 (0: no tune), got {args.tune}")
    if args.tune and args.scenario != "generalized":
        raise SystemExit("--tune needs --scenario generalized")
    import torch
    from sklearn.metrics import roc_auc_score

    from bench._intents_data import load_data
    from bench.backbone import header
    from bench.intents import NEW_SHOTS

    header(SimpleNamespace(threads=torch.get_num_threads()))
    data = load_data("clinc150")
    clf, new = build(data, args)
    test, oos = data.test, data.oos_test
    is_new = np.isin(test.y, new)
    groups = {"all": np.ones(len(test.y), bool)}
    if len(new):
        groups.update({"established intents": ~is_new, "new intents": is_new})

    def auroc(s_in, s_out) -> float:
        return roc_auc_score(np.r_[np.ones(len(s_in)), np.zeros(len(s_out))], np.r_[s_in, s_out])

    rows = []
    for name, score in scorers(clf).items():
        s_in, s_out = score(test.texts), score(oos.texts)
        rows.append((name, [auroc(s_in[m], s_out) for m in groups.values()]))
    what = ("fitted on all training texts" if args.scenario == "full" else
            f"generalized scenario, seed {args.seed}: {len(new)} intents added with {NEW_SHOTS} examples"
            + (f", then tuned for {args.tune:g} s" if args.tune else ""))
    print(f"CLINC150, {what}; test {len(test.texts)} in scope ({int(is_new.sum())} of new intents), "
          f"{len(oos.texts)} out of scope")
    print("| out-of-scope score | " + " | ".join(f"AUROC, {g}" for g in groups) + " | all, against the product's |")
    print("|---|" + "---:|" * (len(groups) + 1))
    for name, values in rows:
        print(f"| {name} | " + " | ".join(f"{v:.4f}" for v in values) + f" | {values[0] - rows[0][1][0]:+.4f} |")


if __name__ == "__main__":
    main()
