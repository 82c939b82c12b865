"""New-intent discovery benchmark: the standard semi-supervised protocol, run through the product.

Protocol (Lin et al. 2020; DeepAligned, Zhang et al. AAAI 2021; MTP-CLNN, Zhang et al. ACL 2022): per
dataset, known-class ratio (KCR) and seed, a random KCR share of the intents is *known*; 10 % of each
known intent's training texts are labelled (LAR 10 %); every other training text is unlabelled
(known and new intents mixed); the test split is clustered into all intents and scored by NMI, ARI
and ACC (Hungarian matching), in percent.

``ours``: ``DynamicClassifier(seed=s).fit(labelled)`` (frozen MiniLM, the cosine head), ``discover``
on the unlabelled texts with ``n_new`` given (the true number of new intents) or estimated
(``ours:est``), ``accept`` every proposed cluster, ``predict`` the test texts: the predicted labels
are the clustering; ``refresh()`` before ``predict`` trains the cosine head on the accepted labels, as
its background refresh does about a second after ``accept`` (without it the new labels are scored by
their imprinted prototypes). ``--adapt-s SECONDS`` adds ``ours:adapted``: the same with ``n_new`` given and
``discover(..., adapt_s=SECONDS)`` (a copy of the backbone's top layers fine-tuned on the texts first,
classifier/discovery_tuning.py). ``--tune-s SECONDS`` adds ``ours:tuned``: ``ours`` with the accepted
model saved, tuned by ``tune_saved(store, SECONDS)`` (the backbone's top layers fine-tuned on every
stored example, the accepted clusters' texts included) and its new version loaded before ``predict``.
``--fit-s SECONDS`` adds ``ours:backbone`` (with ``--tune-s`` too: ``ours:backbone+tuned``, fitted, then
tuned after accepting, instead of the two rows): ``ours`` (``n_new`` given) with
``DynamicClassifier(train="backbone", time_budget_s=SECONDS).fit(labelled)``, the backbone's top layers
fine-tuned on the labelled texts of the known intents before ``discover`` clusters in its space (as the
first stage of DeepAligned and MTP-CLNN trains on the known intents); with ``--fit-layers N`` the top N
transformer layers are trained (``encoder_options={"train_layers": N}``) instead of the default two, and
with ``--fit-lr LR`` at the backbone learning rate LR (``backbone_lr``) instead of its default; with
``--adapt-s`` too, its ``discover`` adapts that fine-tuned backbone first. ``--words-weight W`` runs discover
with ``words_weight=W`` (0: the encoder's points alone, without the texts' latent-semantic vectors);
``--split dev`` clusters the dev split instead of the test split, to compare settings without looking
at the test split. Baselines in the same run, on the same frozen embeddings: ``kmeans`` (k-means with the true number of intents
on all training texts, test texts assigned to the nearest centre),
``agglo`` (Ward agglomerative clustering of the test texts), ``seeded`` (spherical k-means seeded with
the known labels' prototypes, labelled texts fixed; no metric adaptation), ``metric`` (discover's
own clustering with ``n_new`` given, the test texts assigned to its centres in its space, the words'
vectors included, rather than by the product's ``predict`` over the raw embeddings: what predicting
in that space would add; not through the product). Time: seconds of
fit + discover + accept + predict with the embeddings already in the product's memory cache (the
first line per dataset says how long embedding every text took, from the disk cache or not).

``--suggestions``: merge/split suggestions on CLINC150 and HWU64 train splits with planted truth
(10 random pairs of intents merged into one label: a split should be suggested; 10 other intents
divided into two random halves under two names: a merge should be suggested): precision and recall
of the top 20, the purity of a suggested split's parts against the original intents, and how many
suggestions an untouched label set gets.

``--ceiling``: how far the backbone goes when nothing is left to discover: per dataset and seed,
``DynamicClassifier(seed=s).fit(train texts, their true labels)`` (every training text labelled, every
intent known; with ``--fit-s`` / ``--fit-layers`` the backbone fine-tuned on them as ``ours:backbone``
does), the cosine head trained, ``predict`` the test texts, scored as above. A perfect discovery with
``add_examples=True`` hands the classifier these same labels, so no ``ours`` row through that backbone
should score above it (up to the head's training); the best published figure of each ratio is
printed beside it.

``--estimates``: only the number of new intents, on the protocol's unlabelled training texts (no test
text is used): ``fit`` on the labelled texts, then ``discover(unlabelled)`` without ``n_new``, beside
DeepAligned's rule as published (over-cluster into 4 × the known intents, at least 40, and count the
new clusters holding at least the mean cluster size) on the same points; each estimate's absolute
error against the true number.

    DYNTC_DATA=../shared/datasets python -m bench.discovery [--mode fast] [--datasets mcid,stackoverflow] [--adapt-s 360]
    DYNTC_DATA=../shared/datasets python -m bench.discovery --split dev --words-weight 0 --no-baselines
    DYNTC_DATA=../shared/datasets python -m bench.discovery --suggestions
    DYNTC_DATA=../shared/datasets python -m bench.discovery --estimates
    DYNTC_DATA=../shared/datasets python -m bench.discovery --ceiling [--fit-s 600 --fit-layers 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "runs" / "discovery"
ADD_EXAMPLES = os.environ.get("ADD", "1") == "1"
HEAD = None if os.environ.get("HEAD") == "none" else "cosine"
DATASETS = ("clinc150", "hwu64", "stackoverflow", "mcid")

# Published results (NMI / ARI / ACC), LAR 10 %, number of intents given.
TEXTOIR = ("TEXTOIR open_intent_discovery/results/result.md (thuiar/TEXTOIR, commit 1ee7280), "
           "cluster-number factor 1")
ANCHORS: dict[tuple[str, float], list[tuple[str, tuple[float, float, float], str]]] = {
    ("clinc150", 0.25): [("DeepAligned", (88.97, 64.63, 74.07), TEXTOIR), ("MTP-CLNN", (93.17, 76.20, 83.26), TEXTOIR),
                         ("USNID", (94.17, 77.95, 83.12), TEXTOIR)],
    ("clinc150", 0.5): [("DeepAligned", (91.59, 72.56, 80.70), TEXTOIR), ("MTP-CLNN", (94.30, 80.17, 86.18), TEXTOIR),
                        ("USNID", (95.48, 82.99, 87.28), TEXTOIR)],
    ("clinc150", 0.75): [("DeepAligned", (93.89, 79.75, 86.49), "Zhang et al. AAAI 2021, Table 2"),
                         ("MTP-CLNN", (95.45, 84.30, 89.46), TEXTOIR), ("USNID", (96.42, 86.77, 90.36), TEXTOIR)],
    ("stackoverflow", 0.25): [("DeepAligned", (50.86, 37.96, 54.50), TEXTOIR),
                              ("MTP-CLNN", (73.35, 54.80, 74.70), TEXTOIR), ("USNID", (74.91, 65.45, 75.76), TEXTOIR)],
    ("stackoverflow", 0.5): [("DeepAligned", (68.28, 57.62, 74.52), TEXTOIR),
                             ("MTP-CLNN", (76.66, 62.24, 80.36), TEXTOIR), ("USNID", (78.77, 71.63, 82.06), TEXTOIR)],
    ("stackoverflow", 0.75): [("DeepAligned", (73.28, 60.09, 77.97), TEXTOIR),
                              ("MTP-CLNN", (82.56, 75.66, 87.63), "Zhang et al. ACL 2022, Table 3"),
                              ("USNID", (80.13, 74.90, 85.66), TEXTOIR)],
    ("mcid", 0.75): [("MTP-CLNN", (83.75, 73.22, 84.36), "Zhang et al. ACL 2022, Table 3")],
}


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                    platform.processor())
    except OSError:
        return platform.processor()


# --------------------------------------------------------------------------- metrics


def cluster_acc(y: np.ndarray, p: np.ndarray) -> float:
    """Accuracy under the best one-to-one matching of predicted clusters to classes (Hungarian)."""
    from scipy.optimize import linear_sum_assignment

    size = max(p.max(), y.max()) + 1
    w = np.zeros((size, size), np.int64)
    np.add.at(w, (p, y), 1)
    rows, cols = linear_sum_assignment(-w)
    return float(w[rows, cols].sum() / len(y))


def scores(y_true: list, y_pred: list) -> tuple[float, float, float]:
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

    codes: dict = {}
    y = np.array([codes.setdefault(("t", v), len(codes)) for v in y_true])
    codes = {}
    p = np.array([codes.setdefault(v, len(codes)) for v in y_pred])
    return (100 * normalized_mutual_info_score(y, p), 100 * adjusted_rand_score(y, p), 100 * cluster_acc(y, p))


# --------------------------------------------------------------------------- protocol


def protocol_split(train_texts: list[str], train_labels: list[str], kcr: float, seed: int, lar: float = 0.1):
    """(known intents, labelled (texts, labels), unlabelled texts): seeded choice of ``round(KCR · C)``
    known intents and of ``max(1, round(LAR · n))`` labelled texts of each; the rest unlabelled,
    each distinct text once and none that is also labelled."""
    rng = np.random.default_rng(seed)
    classes = sorted(set(train_labels))
    known = set(rng.choice(classes, size=max(1, int(round(kcr * len(classes)))), replace=False).tolist())
    by: dict[str, list[int]] = {}
    for i, y in enumerate(train_labels):
        by.setdefault(y, []).append(i)
    lab, unl = [], []
    for y in classes:
        idx = list(by[y])
        if y in known:
            rng.shuffle(idx)
            n = max(1, int(round(lar * len(idx))))
            lab += idx[:n]
            unl += idx[n:]
        else:
            unl += idx
    lab_texts = [train_texts[i] for i in sorted(lab)]
    seen = set(lab_texts)
    unlabelled = [t for t in dict.fromkeys(train_texts[i] for i in sorted(unl)) if t not in seen]
    return sorted(known), (lab_texts, [train_labels[i] for i in sorted(lab)]), unlabelled


def fit_options(fit_s: float | None, fit_layers: int | None, fit_lr: float | None = None) -> dict:
    """The classifier's options for ``--fit-s`` / ``--fit-layers`` / ``--fit-lr``: the backbone's top layers
    (`fit_layers` of them instead of its default, at learning rate `fit_lr` instead of its default) fine-tuned
    for `fit_s` seconds at ``fit``; none without `fit_s`."""
    if fit_s is None:
        return {}
    encoder = {**({} if fit_layers is None else {"train_layers": fit_layers}),
               **({} if fit_lr is None else {"backbone_lr": fit_lr})}
    return {"train": "backbone", "time_budget_s": fit_s, **({"encoder_options": encoder} if encoder else {})}


def run_product(labelled, unlabelled, test_texts, n_new, mode: str, seed: int, adapt_s: float | None = None,
                words_weight: float | None = None, tune_s: float | None = None, fit_s: float | None = None,
                fit_layers: int | None = None, fit_lr: float | None = None):
    from dyntc import DynamicClassifier

    start = time.perf_counter()
    clf = DynamicClassifier(seed=seed, head=HEAD, **fit_options(fit_s, fit_layers, fit_lr)).fit(*labelled)
    if clf.train_result_ is not None:  # a fit bounded by time: how far it got, as the tune below reports
        print(f"  fit {clf.train_result_.steps} episodes in {time.perf_counter() - start:.0f} s", flush=True)
    found = clf.discover(unlabelled, n_new, mode=mode, adapt_s=adapt_s,
                         **({} if words_weight is None else {"words_weight": words_weight}))
    clf.accept(found, add_examples=ADD_EXAMPLES)
    if tune_s is not None:  # the accepted labels served, then the model tuned on them as a new version
        clf = tuned(clf, tune_s)
    if HEAD is not None:  # the head as the service has it a second after accept (its background refresh)
        clf.refresh()
    pred = clf.predict(test_texts)
    return pred, found, time.perf_counter() - start


def tuned(clf, tune_s: float):
    """`clf` saved as a store's version, ``tune_saved(store, tune_s)``, and the tuned version loaded."""
    import tempfile

    from dyntc import DynamicClassifier

    with tempfile.TemporaryDirectory(prefix="dyntc-bench-discovery-tune-") as path:
        clf.save(path)
        report = DynamicClassifier.tune_saved(path, tune_s)
        print(f"  tuned {report.episodes} episodes in {report.train_seconds:.0f} s ({report.seconds:.0f} s in all)",
              flush=True)
        return DynamicClassifier.load(path)


def baselines(clf_encode, unlabelled, labelled, test_texts, n_total: int, n_new: int, seed: int,
              words_weight: float | None = None) -> dict:
    from sklearn.cluster import AgglomerativeClustering, KMeans

    from dyntc.classifier import clustering as cl
    from dyntc.classifier.discovery import MIN_CLUSTER_SIZE, MODE_SETTINGS, SHRINK, WORDS_WEIGHT

    train_x = cl.unit(clf_encode(labelled[0] + unlabelled))
    test_x = cl.unit(clf_encode(test_texts))
    out = {}
    km = KMeans(n_total, n_init=3, random_state=seed).fit(train_x)
    out["kmeans"] = km.predict(test_x).tolist()
    out["agglo"] = AgglomerativeClustering(n_total, linkage="ward").fit_predict(test_x).tolist()
    known = sorted(set(labelled[1]))
    ky = np.array([known.index(y) for y in labelled[1]])
    _, centres, _ = cl.seeded_kmeans(train_x[len(ky):], train_x[:len(ky)], ky, len(known), n_new, seed=seed)
    out["seeded"] = (test_x @ centres.T).argmax(1).tolist()
    # discover's own clustering (the same words, metric, seeding, restarts and searches), the test texts assigned to
    # its centres in that space instead of by the product's predict over the raw embeddings; the words'
    # vectors fitted on the training and test texts together (no label is used)
    weight = WORDS_WEIGHT if words_weight is None else words_weight
    lexical = cl.lexical(labelled[0] + unlabelled + list(test_texts), seed=seed) if weight else None
    if lexical is not None:
        train_x = cl.joined(train_x, lexical[:len(train_x)], weight)
        test_x = cl.joined(test_x, lexical[len(train_x):], weight)
    w = cl.adapt_metric(train_x[:len(ky)], ky, SHRINK)
    lab_w, unl_w = cl.unit(train_x[:len(ky)] @ w), cl.unit(train_x[len(ky):] @ w)
    _, centres, _ = cl.seeded_kmeans(unl_w, lab_w, ky, len(known), n_new, seed=seed, min_size=MIN_CLUSTER_SIZE,
                                     **MODE_SETTINGS["default"])
    out["metric"] = (cl.unit(test_x @ w) @ centres.T).argmax(1).tolist()
    return out


def run_discovery(args) -> list[dict]:
    from dyntc.core.encoders import create_encoder
    from dyntc.protocol.data.datasets import load

    from dyntc import DynamicClassifier
    from dyntc.classifier.params import encoder_options

    # the product's own encoder settings (max_len ...), so that its embedding cache is shared with fit/predict
    encoder = create_encoder("minilm", ["warm up"], **encoder_options(DynamicClassifier().get_params()))

    def encode(texts):
        import torch

        return torch.stack(encoder.featurize(list(texts))).numpy().astype(np.float32)

    rows = []
    for name in args.datasets:
        data = load(name)
        n_total = len(set(data.train.labels))
        start = time.perf_counter()  # every text once, through the product's encoder: later calls hit its memory cache
        evaluated = data.dev if args.split == "dev" else data.test
        encode(list(dict.fromkeys(data.train.texts + evaluated.texts)))
        print(f"{name}: embeddings of {len(data.train) + len(evaluated)} texts ready in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        for kcr in args.kcr:
            for seed in args.seeds:
                known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, kcr, seed)
                n_new = n_total - len(known)
                row = {"dataset": name, "kcr": kcr, "seed": seed, "n_new": n_new, "known": len(known),
                       "labelled": len(labelled[0]), "unlabelled": len(unlabelled), "test": len(evaluated)}
                runs = [("ours", n_new, None), ("ours:est", None, None)]
                if args.adapt_s is not None:
                    runs.append(("ours:adapted", n_new, args.adapt_s))
                if args.tune_s is not None and args.fit_s is not None:  # the backbone fitted, then tuned
                    runs.append(("ours:backbone+tuned", n_new, args.adapt_s))
                elif args.tune_s is not None:
                    runs.append(("ours:tuned", n_new, None))
                elif args.fit_s is not None:
                    runs.append(("ours:backbone", n_new, args.adapt_s))  # with --adapt-s: fit, then adapt
                for tag, given, adapt_s in runs:
                    pred, found, seconds = run_product(labelled, unlabelled, evaluated.texts, given, args.mode, seed,
                                                       adapt_s, args.words_weight,
                                                       args.tune_s if "tuned" in tag else None,
                                                       args.fit_s if tag.startswith("ours:backbone") else None,
                                                       args.fit_layers, args.fit_lr)
                    row[tag] = {"scores": scores(evaluated.labels, pred), "seconds": seconds,
                                "n_new": found.n_new, "clusters": len(found.clusters),
                                "discover_seconds": found.seconds}
                    if adapt_s is not None:
                        row[tag].update(adapt_steps=found.settings["adapt_steps"],
                                        adapt_train_s=found.settings["adapt_train_s"])
                    if tag == "ours:adapted":
                        print(f"{name} kcr={kcr} seed={seed}: adapted {fmt(row[tag]['scores'])} ({seconds:.0f}s, "
                              f"{found.settings['adapt_steps']} steps in {found.settings['adapt_train_s']} s)", flush=True)
                    if tag in ("ours:tuned", "ours:backbone", "ours:backbone+tuned"):
                        print(f"{name} kcr={kcr} seed={seed}: {tag[5:]} {fmt(row[tag]['scores'])} ({seconds:.0f}s)",
                              flush=True)
                if not args.no_baselines:
                    for tag, pred in baselines(encode, unlabelled, labelled, evaluated.texts, n_total, n_new,
                                               seed, args.words_weight).items():
                        row[tag] = {"scores": scores(evaluated.labels, pred)}
                rows.append(row)
                est = row["ours:est"]
                print(f"{name} kcr={kcr} seed={seed}: ours {fmt(row['ours']['scores'])} "
                      f"({row['ours']['seconds']:.0f}s), est {fmt(est['scores'])} n_new {est['n_new']} "
                      f"(true {n_new}, {est['clusters']} kept)", flush=True)
    return rows


def run_ceiling(args) -> list[dict]:
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    fine_tuned = fit_options(args.fit_s, args.fit_layers, args.fit_lr)
    rows = []
    for name in args.datasets:
        data = load(name)
        evaluated = data.dev if args.split == "dev" else data.test
        for seed in args.seeds:
            start = time.perf_counter()
            clf = DynamicClassifier(seed=seed, head=HEAD, **fine_tuned).fit(data.train.texts, data.train.labels)
            if HEAD is not None:
                clf.refresh()
            pred = clf.predict(evaluated.texts)
            row = {"dataset": name, "seed": seed, "scores": scores(evaluated.labels, pred),
                   "seconds": time.perf_counter() - start, "labelled": len(data.train), "test": len(evaluated),
                   "fit_episodes": None if clf.train_result_ is None else clf.train_result_.steps}
            rows.append(row)
            print(f"{name} seed={seed}: ceiling {fmt(row['scores'])} ({row['seconds']:.0f}s"
                  + ("" if row["fit_episodes"] is None else f", fit {row['fit_episodes']} episodes") + ")", flush=True)
    return rows


def ceiling_table(rows: list[dict]) -> str:
    lines = ["| dataset | every training text labelled: NMI / ARI / ACC (mean ± std) | s / run | best published "
             "by NMI (KCR 25 / 50 / 75 %, LAR 10 %, GPU) |", "|---|---|---:|---|"]
    for ds in [d for d in DATASETS if any(r["dataset"] == d for r in rows)]:
        g = [r for r in rows if r["dataset"] == ds]
        best = []
        for kcr in (0.25, 0.5, 0.75):
            anchors = ANCHORS.get((ds, kcr), [])
            if anchors:
                method, s, _ = max(anchors, key=lambda a: a[1][0])
                best.append(f"{kcr:.0%}: {method} {fmt(s)}")
        lines.append(f"| {ds} | {mean_std([r['scores'] for r in g])} | {np.mean([r['seconds'] for r in g]):.0f} | "
                     f"{'; '.join(best) or 'none published'} |")
    return "\n".join(lines)


def deepaligned_estimate(clf, unlabelled: list[str], seed: int) -> int:
    """DeepAligned's rule as published, on discover's own points (its adapted metric): over-cluster into
    ``4 · max(known, 10)`` new clusters and count those of at least the mean cluster size."""
    import torch

    from dyntc.classifier import clustering as cl
    from dyntc.classifier.discovery import SHRINK, _directions, _known, default_max_new

    labels = clf.labels_
    known, known_y, owners = _known(labels)
    w = cl.adapt_metric(known, known_y, SHRINK)
    points = clf.space_.embed(unlabelled)
    x, kx = cl.unit(_directions(torch.as_tensor(points), labels.space.metric) @ w), cl.unit(known @ w)
    max_new = default_max_new(len(unlabelled), len(owners), 3)
    assign, _, _ = cl.seeded_kmeans(x, kx, known_y, len(owners), max_new, seed=seed, n_init=1, max_iter=30)
    sizes = np.bincount(assign, minlength=len(owners) + max_new)[len(owners):]
    return max(1, int((sizes >= len(x) / (len(owners) + max_new)).sum()))


def run_estimates(args) -> list[dict]:
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    rows = []
    for name in args.datasets:
        data = load(name)
        n_total = len(set(data.train.labels))
        for kcr in args.kcr:
            for seed in args.seeds:
                known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, kcr, seed)
                clf = DynamicClassifier(seed=seed, head=HEAD).fit(*labelled)
                start = time.perf_counter()
                found = clf.discover(unlabelled, mode=args.mode)
                seconds = time.perf_counter() - start
                row = {"dataset": name, "kcr": kcr, "seed": seed, "n_new": n_total - len(known),
                       "ours": found.n_new, "deepaligned": deepaligned_estimate(clf, unlabelled, seed),
                       "discover_seconds": seconds, "unlabelled": len(unlabelled)}
                rows.append(row)
                print(f"{name} kcr={kcr} seed={seed}: true {row['n_new']}, ours {row['ours']} ({seconds:.1f} s), "
                      f"DeepAligned's rule {row['deepaligned']}", flush=True)
    return rows


def estimates_table(rows: list[dict]) -> str:
    lines = ["| dataset | KCR | new intents (true) | ours: mean estimate (abs. error) | DeepAligned's rule: mean "
             "estimate (abs. error) | discover s |", "|---|---:|---:|---|---|---:|"]
    keys = sorted({(r["dataset"], r["kcr"]) for r in rows}, key=lambda k: (DATASETS.index(k[0]), k[1]))
    for ds, kcr in keys:
        g = [r for r in rows if r["dataset"] == ds and r["kcr"] == kcr]
        cell = lambda key: (f"{np.mean([r[key] for r in g]):.1f} "  # noqa: E731
                            f"({np.mean([abs(r[key] - r['n_new']) for r in g]):.1f})")
        lines.append(f"| {ds} | {kcr:.0%} | {g[0]['n_new']} | {cell('ours')} | {cell('deepaligned')} | "
                     f"{np.mean([r['discover_seconds'] for r in g]):.1f} |")
    err = lambda key: np.mean([abs(r[key] - r["n_new"]) for r in rows])  # noqa: E731
    lines.append(f"| all | | | mean abs. error {err('ours'):.1f} | mean abs. error {err('deepaligned'):.1f} | |")
    return "\n".join(lines)


def fmt(s) -> str:
    return " / ".join(f"{v:.1f}" for v in s)


def mean_std(values: list[tuple]) -> str:
    a = np.array(values)
    return " / ".join(f"{m:.1f}±{s:.1f}" for m, s in zip(a.mean(0), a.std(0)))


def table(rows: list[dict], approaches=("ours", "ours:est", "ours:adapted", "ours:tuned", "ours:backbone",
                                        "ours:backbone+tuned", "metric", "seeded", "kmeans", "agglo")) -> str:
    lines = ["| dataset | KCR | method | NMI / ARI / ACC (mean ± std) | n_new est. (true) | s / run (of which discover) |",
             "|---|---:|---|---|---|---:|"]
    keys = sorted({(r["dataset"], r["kcr"]) for r in rows}, key=lambda k: (DATASETS.index(k[0]), k[1]))
    for ds, kcr in keys:
        group = [r for r in rows if r["dataset"] == ds and r["kcr"] == kcr]
        for a in approaches:
            if a not in group[0]:
                continue
            est = ""
            if a == "ours:est":
                errs = [abs(r[a]["n_new"] - r["n_new"]) for r in group]
                est = (f"{np.mean([r[a]['n_new'] for r in group]):.1f} ({group[0]['n_new']}), "
                       f"abs. err. {np.mean(errs):.1f}")
            secs = (f"{np.mean([r[a]['seconds'] for r in group]):.0f} (discover "
                    f"{np.mean([r[a]['discover_seconds'] for r in group]):.1f})") if "seconds" in group[0][a] else ""
            lines.append(f"| {ds} | {kcr:.0%} | {a} | {mean_std([r[a]['scores'] for r in group])} | {est} | {secs} |")
        for method, s, src in ANCHORS.get((ds, kcr), []):
            lines.append(f"| {ds} | {kcr:.0%} | *{method}* (published) | {fmt(s)} | given | GPU: {src} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- suggestions


def plant(labels: list[str], seed: int, n: int = 10):
    """Relabel: `n` disjoint random pairs merged (``a+b``), `n` other intents halved (``c#1``, ``c#2``)."""
    rng = np.random.default_rng(seed)
    classes = sorted(set(labels))
    pick = rng.permutation(classes)[:3 * n].tolist()
    pairs = [tuple(sorted(pick[2 * i:2 * i + 2])) for i in range(n)]
    halved = pick[2 * n:]
    merged = {c: f"{a}+{b}" for a, b in pairs for c in (a, b)}
    out = []
    counter: dict[str, int] = {}
    for y in labels:
        if y in merged:
            out.append(merged[y])
        elif y in halved:
            k = counter[y] = counter.get(y, 0) + 1
            out.append(f"{y}#{1 + k % 2}")
        else:
            out.append(y)
    return out, pairs, halved


def run_suggestions(args) -> list[dict]:
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    rows = []
    for name in [d for d in args.datasets if d in ("clinc150", "hwu64")]:
        data = load(name)
        texts = list(dict.fromkeys(data.train.texts))
        first = {}
        for t, y in zip(data.train.texts, data.train.labels):
            first.setdefault(t, y)
        original = [first[t] for t in texts]
        start = time.perf_counter()
        untouched = DynamicClassifier(head=None).fit(texts, original).suggest()
        base_seconds = time.perf_counter() - start
        for seed in args.seeds:
            labels, pairs, halved = plant(original, seed)
            clf = DynamicClassifier(head=None).fit(texts, labels)
            start = time.perf_counter()
            top = clf.suggest(top=20)
            seconds = time.perf_counter() - start
            truth_merge = {tuple(sorted((f"{c}#1", f"{c}#2"))) for c in halved}
            truth_split = {f"{a}+{b}" for a, b in pairs}
            hits, purity = set(), []
            for s in top:
                if s.kind == "merge" and tuple(sorted(s.labels)) in truth_merge:
                    hits.add(tuple(sorted(s.labels)))
                elif s.kind == "split" and s.labels[0] in truth_split:
                    hits.add(s.labels[0])
                    origin = dict(zip(texts, original))
                    purity.append(np.mean([max(np.mean([origin[t] == o for t in part]) for o in s.labels[0].split("+"))
                                           for part in s.parts.values()]))
            correct = sum((s.kind == "merge" and tuple(sorted(s.labels)) in truth_merge)
                          or (s.kind == "split" and s.labels[0] in truth_split) for s in top)
            row = {"dataset": name, "seed": seed, "returned": len(top), "correct": correct,
                   "precision": correct / max(len(top), 1), "recall": len(hits) / 20,
                   "merge_recall": len([h for h in hits if isinstance(h, tuple)]) / 10,
                   "split_recall": len([h for h in hits if isinstance(h, str)]) / 10,
                   "split_purity": float(np.mean(purity)) if purity else None, "seconds": seconds,
                   "untouched_suggestions": len(untouched), "labels": len(set(original)),
                   "untouched_kinds": {k: sum(s.kind == k for s in untouched) for k in ("merge", "split")},
                   "untouched_seconds": base_seconds}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def suggestions_table(rows: list[dict]) -> str:
    lines = ["| dataset | precision@20 | recall@20 (merge / split) | split parts' purity | untouched set: suggestions "
             "(merge / split) of labels | s |", "|---|---|---|---|---|---:|"]
    for ds in ("clinc150", "hwu64"):
        g = [r for r in rows if r["dataset"] == ds]
        if not g:
            continue
        pur = [r["split_purity"] for r in g if r["split_purity"] is not None]
        u = g[0]
        lines.append(f"| {ds} | {np.mean([r['precision'] for r in g]):.2f}±{np.std([r['precision'] for r in g]):.2f} "
                     f"| {np.mean([r['recall'] for r in g]):.2f} ({np.mean([r['merge_recall'] for r in g]):.2f} / "
                     f"{np.mean([r['split_recall'] for r in g]):.2f}) | {np.mean(pur) if pur else float('nan'):.2f} | "
                     f"{u['untouched_suggestions']} ({u['untouched_kinds']['merge']} / {u['untouched_kinds']['split']}) "
                     f"of {u['labels']} | {np.mean([r['seconds'] for r in g]):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=None, help="default: all four (with --suggestions: clinc150,hwu64)")
    parser.add_argument("--kcr", default="0.25,0.5,0.75")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--mode", default="default", choices=("default", "fast"))
    parser.add_argument("--no-baselines", action="store_true")
    parser.add_argument("--adapt-s", type=float, default=None,
                        help="also run discover(..., adapt_s=SECONDS) with n_new given: the row ours:adapted")
    parser.add_argument("--tune-s", type=float, default=None,
                        help="also run ours with the accepted labels' model tuned (tune_saved) for SECONDS before "
                             "predict: the row ours:tuned")
    parser.add_argument("--fit-s", type=float, default=None,
                        help="also run ours with fit(train='backbone', time_budget_s=SECONDS): the backbone's top "
                             "layers fine-tuned on the labelled texts before discover (with --adapt-s, discover "
                             "adapts it first); the row ours:backbone")
    parser.add_argument("--fit-layers", type=int, default=None,
                        help="with --fit-s: fit(..., encoder_options={'train_layers': N}), the top N transformer "
                             "layers trained instead of the default 2")
    parser.add_argument("--fit-lr", type=float, default=None,
                        help="with --fit-s: fit(..., encoder_options={'backbone_lr': LR}), the backbone's learning "
                             "rate instead of its default")
    parser.add_argument("--words-weight", type=float, default=None,
                        help="discover(..., words_weight=W) instead of its default (0: the encoder's points alone)")
    parser.add_argument("--split", default="test", choices=("test", "dev"),
                        help="the split clustered by predict: dev to compare settings without the test split")
    parser.add_argument("--suggestions", action="store_true", help="the merge/split suggestion benchmark instead")
    parser.add_argument("--estimates", action="store_true", help="only the estimated number of new intents")
    parser.add_argument("--ceiling", action="store_true",
                        help="instead: fit on every training text with its true label (with --fit-s: the backbone "
                             "fine-tuned on them), predict the test texts; beside the best published figures")
    parser.add_argument("--table", type=Path, nargs="+", help="print the table of saved runs (runs/discovery/*.json) "
                                                                "and exit")
    args = parser.parse_args()
    for flag, budget in (("--adapt-s", args.adapt_s), ("--tune-s", args.tune_s), ("--fit-s", args.fit_s)):
        if budget is not None and not budget > 0:  # before minutes of other runs, not after them
            parser.error(f"{flag} takes a number of seconds > 0, got {budget:g}")
    if args.fit_layers is not None and (args.fit_s is None or not 1 <= args.fit_layers <= 6):
        parser.error(f"--fit-layers takes 1 to 6 (MiniLM's layers) and applies with --fit-s, got {args.fit_layers}"
                     + ("" if args.fit_s is not None else " without --fit-s"))
    if args.fit_lr is not None and (args.fit_s is None or not args.fit_lr > 0):
        parser.error(f"--fit-lr takes a learning rate > 0 and applies with --fit-s, got {args.fit_lr:g}"
                     + ("" if args.fit_s is not None else " without --fit-s"))
    others = [flag for flag, on in (("--suggestions", args.suggestions), ("--estimates", args.estimates),
                                    ("--adapt-s", args.adapt_s is not None), ("--tune-s", args.tune_s is not None),
                                    ("--words-weight", args.words_weight is not None),
                                    ("--mode", args.mode != "default")) if on]
    if args.ceiling and others:
        parser.error(f"--ceiling fits on every label and discovers nothing: drop {' and '.join(others)}")
    if args.table:
        rows = []
        for path in args.table:
            saved = json.loads(path.read_text())
            print(saved["header"])
            rows += saved["rows"]
        print(suggestions_table(rows) if rows and "precision" in rows[0] else
              estimates_table(rows) if rows and "deepaligned" in rows[0] else
              ceiling_table(rows) if rows and "fit_episodes" in rows[0] else table(rows))
        return
    args.datasets = [d.strip() for d in (args.datasets or ("clinc150,hwu64" if args.suggestions else
                                                           ",".join(DATASETS))).split(",") if d.strip()]
    args.kcr = [float(k) for k in args.kcr.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    header = (f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, CPU {cpu_name()} "
              f"({os.cpu_count()} cores), mode {args.mode}, seeds {args.seeds}, adapt_s {args.adapt_s}, "
              f"tune_s {args.tune_s}, fit_s {args.fit_s}, fit_layers {args.fit_layers}, fit_lr {args.fit_lr}, "
              f"words_weight {'default' if args.words_weight is None else args.words_weight}, split {args.split}")
    print(header, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.suggestions:
        rows = run_suggestions(args)
        text = suggestions_table(rows)
        path = OUT / f"suggestions-{'-'.join(args.datasets)}.json"
    elif args.ceiling:
        rows = run_ceiling(args)
        text = ceiling_table(rows)
        fitted = "" if args.fit_s is None else f"-fit{args.fit_s:g}" + (
            "" if args.fit_layers is None else f"-layers{args.fit_layers}") + (
            "" if args.fit_lr is None else f"-lr{args.fit_lr:g}")
        seeds = "-".join(str(s) for s in args.seeds)
        path = OUT / f"ceiling-{'-'.join(args.datasets)}-s{seeds}{fitted}-{args.split}.json"
    elif args.estimates:
        rows = run_estimates(args)
        text = estimates_table(rows)
        kcrs = "-".join(f"{k:g}" for k in args.kcr)
        path = OUT / f"estimates-{args.mode}-{'-'.join(args.datasets)}-kcr{kcrs}.json"
    else:
        rows = run_discovery(args)
        text = table(rows)
        kcrs = "-".join(f"{k:g}" for k in args.kcr)
        adapted = "" if args.adapt_s is None else f"-adapt{args.adapt_s:g}-s{'-'.join(str(s) for s in args.seeds)}"
        adapted += "" if args.tune_s is None else f"-tune{args.tune_s:g}-s{'-'.join(str(s) for s in args.seeds)}"
        adapted += "" if args.fit_s is None else f"-fit{args.fit_s:g}-s{'-'.join(str(s) for s in args.seeds)}"
        adapted += "" if args.fit_layers is None else f"-layers{args.fit_layers}"
        adapted += "" if args.fit_lr is None else f"-lr{args.fit_lr:g}"
        variant = ("" if args.words_weight is None else f"-words{args.words_weight:g}") + (
            "" if args.split == "test" else f"-{args.split}")
        path = OUT / f"discovery-{args.mode}-{'-'.join(args.datasets)}-kcr{kcrs}{adapted}{variant}.json"
    path.write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    print(header)
    print(text)


if __name__ == "__main__":
    main()
