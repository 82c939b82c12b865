"""Changing the label set of a trained classifier on CLINC150, without retraining.

1. Fit a hyperbolic prototypical classifier (GloVe + SRU) on the intents of 7 of CLINC150's 10 domains.
2. Add the 105 + 45 = 150-label world: the 45 intents of the 3 other domains, 5 examples each,
   through ``add_label``; test accuracy on old and new intents before and after.
3. Merge the two old intents the model confuses most into one label, then split that label back
   into the two intents from 5 examples each (with and without reassigning the merged support set).
4. Optionally fine-tune on the 5-shot examples (the paper's fine-tuned variant).
5. Costs on this machine: ms per ``add_label``, prediction throughput (batch) and one-text latency.

Run (prints a markdown table; ``--json`` also writes the numbers)::

    DYNTC_DATA=/path/to/datasets python examples/clinc_dynamic.py --time-budget 240 --json runs/clinc_dynamic.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from dyntc import DynamicClassifier
from dyntc.protocol.data.datasets import load
from dyntc.core.machine import cpu_model


def accuracy(pred, gold, mapping=None):
    mapping = mapping or {}
    return float(np.mean([p == mapping.get(g, g) for p, g in zip(pred, gold)])) if gold else float("nan")


def subset(split, labels):
    keep = set(labels)
    idx = [i for i, y in enumerate(split.labels) if y in keep]
    return [split.texts[i] for i in idx], [split.labels[i] for i in idx]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metric", default="hyperbolic", choices=["hyperbolic", "euclidean"])
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds of training at most")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--shots", type=int, default=5, help="examples per new intent")
    ap.add_argument("--n-new-domains", type=int, default=3)
    ap.add_argument("--fine-tune-episodes", type=int, default=100, help="0 = skip the fine-tuning step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(args.seed)
    out: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}

    data = load("clinc150")
    tree = data.hierarchy
    domains = sorted(tree.children["ROOT"])
    new_domains = sorted(rng.choice(domains, args.n_new_domains, replace=False).tolist())
    old_domains = [d for d in domains if d not in new_domains]
    old = sorted(i for d in old_domains for i in tree.children[d])
    new = sorted(i for d in new_domains for i in tree.children[d])
    print(f"old domains ({len(old)} intents): {', '.join(old_domains)}")
    print(f"new domains ({len(new)} intents, {args.shots} examples each): {', '.join(new_domains)}")

    train_x, train_y = subset(data.train, old)
    dev_x, dev_y = subset(data.dev, old)
    test_old_x, test_old_y = subset(data.test, old)
    test_new_x, test_new_y = subset(data.test, new)

    clf = DynamicClassifier(
        encoder="sru", metric=args.metric, episodes=args.episodes, eval_every=args.eval_every, patience=5,
        time_budget_s=args.time_budget, seed=args.seed, progress=False,
    )
    t0 = time.perf_counter()
    clf.fit(train_x, train_y, dev=(dev_x, dev_y))
    fit_s = time.perf_counter() - t0
    res = clf.train_result_
    print(f"fit: {len(train_x)} texts, {res.steps} episodes, {fit_s:.0f}s (training {res.seconds:.0f}s), "
          f"best dev acc {res.best_dev_acc:.4f}")

    rows = []  # (step, labels, acc old, acc new, acc all)

    def evaluate(step: str, mapping=None):
        p_old = clf.predict(test_old_x)
        p_new = clf.predict(test_new_x) if set(new) & set(clf.classes_) else None
        a_old = accuracy(p_old, test_old_y, mapping)
        a_new = accuracy(p_new, test_new_y, mapping) if p_new is not None else float("nan")
        a_all = accuracy(p_old + p_new, test_old_y + test_new_y, mapping) if p_new is not None else float("nan")
        rows.append({"step": step, "labels": clf.n_classes_, "old": a_old, "new": a_new, "all": a_all})
        return p_old

    pred_before = evaluate(f"fitted on {len(old)} old intents")

    # ---- add the new intents, a few examples each
    shots = {}
    for intent in new:
        pool = [t for t, y in zip(data.train.texts, data.train.labels) if y == intent]
        shots[intent] = [pool[i] for i in rng.choice(len(pool), args.shots, replace=False)]
    add_ms = []
    for intent in new:
        t0 = time.perf_counter()
        clf.add_label(intent, shots[intent])
        add_ms.append((time.perf_counter() - t0) * 1000)
    evaluate(f"+ add_label x{len(new)} ({args.shots} examples each)")

    # ---- merge the most confused pair of old intents, then split it back
    confused = Counter(tuple(sorted((y, p))) for y, p in zip(test_old_y, pred_before) if y != p)
    (a, b), n_conf = confused.most_common(1)[0]
    merged = f"{a}|{b}"
    snapshot = clf.save(Path(os.environ.get("TMPDIR", "/tmp")) / f"clinc_dynamic_{os.getpid()}")
    pair_x = [t for t, y in zip(test_old_x, test_old_y) if y in (a, b)]
    pair_y = [y for y in test_old_y if y in (a, b)]
    pair_acc_before = accuracy(clf.predict(pair_x), pair_y)
    t0 = time.perf_counter()
    clf.merge_labels([a, b], into=merged)
    merge_ms = (time.perf_counter() - t0) * 1000
    evaluate(f"+ merge_labels([{a}, {b}])", {a: merged, b: merged})
    pair_acc_merged = accuracy(clf.predict(pair_x), pair_y, {a: merged, b: merged})

    split_results = {}
    for reassign in (False, True):
        trial = DynamicClassifier.load(snapshot)
        trial.merge_labels([a, b], into=merged)
        parts = {}
        for intent in (a, b):
            pool = [t for t, y in zip(data.train.texts, data.train.labels) if y == intent]
            parts[intent] = [pool[i] for i in rng.choice(len(pool), args.shots, replace=False)]
        t0 = time.perf_counter()
        trial.split_label(merged, parts, reassign=reassign)
        ms = (time.perf_counter() - t0) * 1000
        split_results[reassign] = {"pair_acc": accuracy(trial.predict(pair_x), pair_y), "ms": ms,
                                   "support": {k: len(trial.support(k)) for k in parts}}
        if reassign:
            clf = trial
    evaluate(f"+ split_label({merged} -> {a}, {b}; {args.shots} ex. each, reassign=True)")

    # ---- the paper's fine-tuned variant: a few episodes on the stored support sets
    if args.fine_tune_episodes:
        tuned = DynamicClassifier.load(snapshot)
        t0 = time.perf_counter()
        tuned.fine_tune(episodes=args.fine_tune_episodes)
        ft_s = time.perf_counter() - t0
        clf_saved, clf = clf, tuned
        evaluate(f"alt.: after add_label, fine_tune({args.fine_tune_episodes} episodes, {ft_s:.0f}s)")
        clf = clf_saved

    # ---- costs
    all_x = test_old_x + test_new_x
    clf.predict(all_x[:256])  # warm-up
    t0 = time.perf_counter()
    clf.predict(all_x)
    batch_s = time.perf_counter() - t0
    singles = []
    for text in all_x[:100]:
        t0 = time.perf_counter()
        clf.predict([text])
        singles.append((time.perf_counter() - t0) * 1000)
    clf.refresh()  # what the background refresh does a second after the last change; load trains the same head
    t0 = time.perf_counter()
    path = clf.save(snapshot)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = DynamicClassifier.load(path)
    load_s = time.perf_counter() - t0
    identical = bool(np.array_equal(again.predict_proba(all_x[:500]), clf.predict_proba(all_x[:500])))

    # ---- report
    print()
    print("| step | labels | acc. old intents | acc. new intents | acc. all |")
    print("|---|---:|---:|---:|---:|")
    fmt = lambda x: "–" if x != x else f"{x:.4f}"  # noqa: E731
    for r in rows:
        print(f"| {r['step']} | {r['labels']} | {fmt(r['old'])} | {fmt(r['new'])} | {fmt(r['all'])} |")
    print()
    print(f"Merge/split pair: `{a}` / `{b}` ({n_conf} of their {len(pair_y)} test texts confused with each other).")
    print()
    print("| pair step | accuracy on the pair's test texts |")
    print("|---|---:|")
    print(f"| before (two labels, 100 examples each) | {pair_acc_before:.4f} |")
    print(f"| merged into `{merged}` (either counts) | {pair_acc_merged:.4f} |")
    for reassign, r in split_results.items():
        sizes = ", ".join(f"{k}: {v}" for k, v in r["support"].items())
        print(f"| split back, {args.shots} ex. each, reassign={reassign} (support {sizes}) | {r['pair_acc']:.4f} |")
    print()
    threads = torch.get_num_threads()
    print(f"| cost (CPU: {cpu_model()}, {threads} torch threads) | value |")
    print("|---|---:|")
    print(f"| add_label, {args.shots} examples (mean / max over {len(add_ms)}) | "
          f"{statistics.mean(add_ms):.1f} / {max(add_ms):.1f} ms |")
    print(f"| merge_labels (2 x 100 examples) | {merge_ms:.1f} ms |")
    print(f"| split_label, reassign=False / True | {split_results[False]['ms']:.1f} / {split_results[True]['ms']:.1f} ms |")
    print(f"| predict, batch of {len(all_x)} texts | {len(all_x) / batch_s:.0f} texts/s |")
    print(f"| predict, one text (median / p90 of {len(singles)}) | "
          f"{statistics.median(singles):.1f} / {np.percentile(singles, 90):.1f} ms |")
    print(f"| save / load ({clf.n_classes_} labels, {sum(clf.support_counts().values())} support texts) | "
          f"{save_s * 1000:.0f} / {load_s * 1000:.0f} ms |")
    print(f"| predictions identical after save/load | {identical} |")
    print(f"| fit ({res.steps} episodes, {len(train_x)} texts) | {fit_s:.0f} s |")

    out.update({
        "old_domains": old_domains, "new_domains": new_domains, "fit_seconds": fit_s, "episodes": res.steps,
        "best_dev_acc": res.best_dev_acc, "rows": rows, "pair": [a, b], "pair_confusions": n_conf,
        "pair_acc_before": pair_acc_before, "pair_acc_merged": pair_acc_merged,
        "split": {str(k): v for k, v in split_results.items()}, "add_label_ms": add_ms, "merge_ms": merge_ms,
        "predict_texts_per_s": len(all_x) / batch_s, "predict_one_ms_median": statistics.median(singles),
        "save_ms": save_s * 1000, "load_ms": load_s * 1000, "identical_after_load": identical,
        "machine": f"{cpu_model()}, {os.cpu_count()} cores, {threads} torch threads",
    })
    shutil.rmtree(snapshot, ignore_errors=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
