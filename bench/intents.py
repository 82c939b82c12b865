"""Intent-classification benchmark on frozen all-MiniLM-L6-v2 embeddings: the product's scorer and
its designs against the static peers, every approach on the same cached embeddings in one run.

Scenarios, per dataset (``clinc150``, ``hwu64``):

- ``generalized``: per seed, a random third of the intents is *new* (``--new-shots`` random training
  examples each, added after fitting), the rest *old* (all of their training texts, fitted first).
  Accuracy on the evaluated split over all intents: old / new / all. Dynamic approaches are scored
  twice: ``now`` right after the labels were added (no training) and ``refreshed`` after their
  background refresh (a head retrained on every stored example); static peers only exist retrained.
- ``fewshot-K``: every intent a label with K random training examples (one draw per seed); accuracy.
- ``oos`` (CLINC150, on the generalized scenario's refreshed state): AUROC of the in-scope texts
  against the out-of-scope ones, scored by each approach's top label score; and the out-of-scope
  recall at the threshold that costs at most 2 points of in-scope accuracy (a rejected in-scope
  text counts as an error). ``--split test``: threshold chosen on val (+ oos_val), measured on test
  (+ oos_test). ``--split dev``: val and oos_val are cut in two halves (fixed seed): threshold on one,
  measured on the other; AUROC on all of val.

- ``latency`` (only when named; CLINC150): ``DynamicClassifier()`` with its defaults fitted on 10,000
  training texts, 20 ``add_label`` calls (milliseconds beyond embedding the examples), then the time
  until its background refresh has trained every label.

Approach ``product`` is the real ``DynamicClassifier()`` on the texts (its own encoder path and
cache, the cosine head), ``product:head=none`` the same with ``head=None``; ``product:tune=600`` (the
``tune`` row, generalized scenario) fits the frozen default, adds the new labels, saves it as a store's
version and refreshes by ``DynamicClassifier.tune_saved(store, budget_s=600)`` (fine-tuning the
backbone's top layers on every stored example, one new version), then scores with the tuned version;
the report gives its training time and what its version stored. ``product:oos=train`` (CLINC150;
with ``tune``: ``product:tune=600,oos=train``) measures the out-of-scope block twice on the same
classifier: as it is, then after ``calibrate`` on the evaluated data set's dev split with CLINC150's
100 out-of-scope training texts as the kept examples (``oos_weight=W`` sets calibrate's weight,
``oos_neighbours=K`` the number of nearest examples averaged, while that approach is measured). The others work on the cached embeddings.

``--split dev`` scores CLINC150's val split and HWU64's valid split (designs are chosen there);
``--split test`` the official test splits (reported figures only). Embeddings are computed once with
the product's encoder path and cached under ``runs/intents_cache/``.

Approach ``setfit[:head=balanced]`` is the SetFit peer (optional extra ``.[setfit]``, not in the
default list: it fine-tunes the encoder for ~10 minutes per training set on a 2-core CPU).

    python -m bench.intents --split dev
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import time
from pathlib import Path

import numpy as np

NEW_SHOTS, NEW_FRACTION = 5, 1 / 3  # generalized: examples of each new intent, and the share of intents that are new
APPROACHES_DEFAULT = ("centroid", "cosine", "dc-default", "lr", "lr-balanced", "head", "product")
# published frozen-encoder few-shot anchor: USE+ConveRT (Casanueva et al. 2020), accuracy at 5 / 10 shots
ANCHORS = {"clinc150": {5: 90.49, 10: 93.26}, "hwu64": {5: 80.01, 10: 85.83}}
# "head:<key>=<value>,..." overrides these HeadConfig fields (defaults: HeadConfig's, chosen on dev)
HEAD_KEYS = {"tau": "tau", "pull": "pull", "pw": "proto_weight", "scale": "scale", "ls": "learn_scale",
             "iter": "max_iter", "off": "imprint_offset", "share": "imprint_share"}


# --------------------------------------------------------------------------- approaches


class Approach:
    """Interface: fit(x, y) on the old labels, add(c, x) a new label, refresh(), scores(x) -> (n, C_all)
    with -inf for labels absent. ``dynamic``: has a state before refresh. ``texts``: takes the texts
    (``fit_texts`` / ``add_texts`` / ``scores_texts``) instead of the cached embeddings."""

    texts = False

    dynamic = True

    def __init__(self, n_classes: int):
        self.n_classes = n_classes
        self.support: dict[int, np.ndarray] = {}
        self.refresh_seconds = 0.0
        self.add_ms: list[float] = []

    def fit(self, x, y):
        for c in np.unique(y):
            self.support[int(c)] = x[y == c]

    def add(self, c, x):
        t0 = time.perf_counter()
        self.support[int(c)] = x
        self._added(int(c))
        self.add_ms.append(1000 * (time.perf_counter() - t0))

    def _added(self, c):
        pass

    def refresh(self):
        pass

    def predict_top(self, q):
        """(predicted label ids, in-scope score = the top score)."""
        s = self.scores(q)
        return s.argmax(1), s.max(1)

    def _stack(self):
        labels = sorted(self.support)
        x = np.concatenate([self.support[c] for c in labels])
        y = np.concatenate([np.full(len(self.support[c]), c) for c in labels])
        return labels, x, y

    def _full(self, labels, s):
        out = np.full((len(s), self.n_classes), -np.inf, dtype=np.float64)
        out[:, labels] = s
        return out


class Prototypes(Approach):
    """``centroid`` (−d²), ``dc-default`` (−(d² − σ²/n), the product's label set) or ``cosine``."""

    def __init__(self, n_classes, kind):
        super().__init__(n_classes)
        self.kind = kind

    def scores(self, q):
        from dyntc.classifier.head import normalize, pooled_spread, prototype_scores, prototypes

        labels, x, y = self._stack()
        ids = np.searchsorted(labels, y)
        means, counts, spread = prototypes(x, ids, len(labels))
        if self.kind == "cosine":
            s = normalize(q) @ normalize(means).T
        else:
            s = prototype_scores(q, means, counts, pooled_spread(spread, counts), debias=self.kind == "dc-default")
        return self._full(labels, s)


class ProductLabelSet(Prototypes):
    """``DynamicClassifier()``'s own LabelSet (frozen MiniLM, Euclidean, debias) over the cached points."""

    space = None

    def __init__(self, n_classes):
        super().__init__(n_classes, "dc-default")

    @classmethod
    def metric_space(cls):
        if cls.space is None:
            from dyntc import DynamicClassifier

            clf = DynamicClassifier().fit(["book a table", "reserve a table", "what is the weather", "is it raining"],
                                          ["book", "book", "weather", "weather"])
            cls.space = clf.space_
        return cls.space

    def scores(self, q):
        import torch

        from dyntc.classifier.labels import LabelSet

        labels = sorted(self.support)
        groups = {str(c): ([f"t{c}-{i}" for i in range(len(self.support[c]))], torch.as_tensor(self.support[c]))
                  for c in labels}
        label_set = LabelSet.from_groups(self.metric_space(), groups, debias=True)
        order = [int(c) for c in label_set.classes]
        s = -label_set.sq_distances(torch.as_tensor(q)).double().numpy()
        return self._full(order, s)


class LogReg(Approach):
    """scikit-learn LogisticRegression retrained on every stored example (static: no state before refresh)."""

    dynamic = False

    def __init__(self, n_classes, balanced):
        super().__init__(n_classes)
        self.balanced = balanced
        self.model = None

    def refresh(self):
        from sklearn.linear_model import LogisticRegression

        labels, x, y = self._stack()
        t0 = time.perf_counter()
        self.model = LogisticRegression(class_weight="balanced" if self.balanced else None, max_iter=2000).fit(x, y)
        self.refresh_seconds = time.perf_counter() - t0

    def scores(self, q):
        return self._full([int(c) for c in self.model.classes_], self.model.predict_log_proba(q))


class Head(Approach):
    """``dyntc.classifier.head.CosineHead``: imprinted weights at once, a trained cosine head after refresh."""

    def __init__(self, n_classes, spec):
        from dyntc.classifier.head import CosineHead, HeadConfig

        super().__init__(n_classes)
        kinds = {"learn_scale": lambda v: bool(int(v)), "max_iter": int}
        spec = dict(spec)
        self.oos = spec.pop("oos", "head")
        if self.oos not in ("head", "proto"):
            raise SystemExit(f"head option oos must be head or proto, got {self.oos!r}")
        self.config = HeadConfig(**{HEAD_KEYS[k]: kinds.get(HEAD_KEYS[k], float)(v) for k, v in spec.items()})
        self.head = CosineHead(self.config)

    def fit(self, x, y):
        for c in np.unique(y):
            self.head.add_label(f"{int(c):04d}", x[y == c])

    def add(self, c, x):
        t0 = time.perf_counter()
        self.head.add_label(f"{int(c):04d}", x)
        self.head.scores(x[:1])  # the label is effective: the next query is scored with it
        self.add_ms.append(1000 * (time.perf_counter() - t0))

    def refresh(self):
        info = self.head.refresh()
        self.refresh_seconds = info["seconds"]
        self.info = info

    def scores(self, q):
        return self._full([int(c) for c in self.head.classes], self.head.scores(q))

    def predict_top(self, q):
        """oos=proto: the head predicts, the product's nearest-label score (−min(d² − σ²/n)) is the in-scope score."""
        s = self.scores(q)
        if self.oos == "head":
            return s.argmax(1), s.max(1)
        from dyntc.classifier.head import prototype_scores

        _, means, counts, sigma2, _, _, _ = self.head._state()
        return s.argmax(1), prototype_scores(q, means, counts, sigma2).max(1)


class Cache(Approach):
    """Tip-Adapter-like example cache (Zhang et al. 2022) on a base scorer: ``base + scale · alpha ·
    mean_{i in c} exp(-beta (1 - cos(x, x_i)))`` over every stored example of label c (a per-label mean,
    so a 100-example label does not outweigh a 5-example one). Base ``dc`` (the product's debiased
    prototype score × 16) or ``head`` (the chosen cosine head)."""

    def __init__(self, n_classes, opts):
        super().__init__(n_classes)
        self.alpha, self.beta = float(opts.get("alpha", 1.0)), float(opts.get("beta", 5.0))
        self.base = Head(n_classes, {}) if opts.get("base", "dc") == "head" else ProductLabelSet(n_classes)

    def fit(self, x, y):
        super().fit(x, y)
        self.base.fit(x, y)

    def add(self, c, x):
        t0 = time.perf_counter()
        self.support[int(c)] = x
        self.base.add(c, x)
        self.add_ms.append(1000 * (time.perf_counter() - t0))

    def refresh(self):
        self.base.refresh()
        self.refresh_seconds = self.base.refresh_seconds

    def scores(self, q):
        labels, x, y = self._stack()
        ids = np.searchsorted(labels, y)
        base = self.base.scores(q)
        scale = 16.0 if isinstance(self.base, ProductLabelSet) else 1.0
        counts = np.bincount(ids, minlength=len(labels)).astype(np.float64)
        cache = np.zeros((len(q), len(labels)))
        for start in range(0, len(q), 512):
            k = np.exp(-self.beta * (1.0 - q[start:start + 512] @ x.T))
            cache[start:start + 512] = np.stack([np.bincount(ids, weights=row, minlength=len(labels)) for row in k])
        cache /= counts[None, :]
        out = base * scale
        out[:, labels] += 16.0 * self.alpha * cache
        return out


class Product(Approach):
    """``product[:head=none,metric=hyperbolic,train=backbone,budget=SECONDS]``: the real ``DynamicClassifier()``
    end to end, on the texts: ``fit`` (frozen MiniLM, or with ``train=backbone`` its top layers fine-tuned
    episodically for at most ``budget`` seconds; the cosine head trained synchronously), ``add_label`` per new intent, ``refresh(wait=True)``
    (what the background refresh does a second after the last label operation), ``decision_function``.
    ``refresh_delay`` is set to one hour so that the ``now`` state is measured before the background
    refresh would run (the only change from the defaults; scores do not depend on it)."""

    texts = True

    def __init__(self, n_classes, opts):
        super().__init__(n_classes)
        unknown = set(opts) - {"head", "metric", "train", "budget", "tune", "oos", "oos_weight", "oos_neighbours"}
        if unknown:
            raise SystemExit(f"unknown product options {sorted(unknown)}; known: head, metric, train, budget, tune, oos, "
                             "oos_weight, oos_neighbours")
        # oos=train: before the out-of-scope measures, calibrate(dev texts, dev labels, CLINC150's 100
        # out-of-scope training texts): the product keeps them as examples that push texts like them away
        if opts.get("oos", "train") != "train":
            raise SystemExit(f"product option oos must be train (CLINC150's out-of-scope training texts), got {opts['oos']!r}")
        self.oos_examples = "oos" in opts
        self.oos_weight = {}  # oos_weight=W: calibrate's oos_weight (default: the product's)
        if "oos_weight" in opts:
            try:
                self.oos_weight = {"oos_weight": float(opts["oos_weight"])}
            except ValueError:
                raise SystemExit(f"product option oos_weight must be a number, got {opts['oos_weight']!r}") from None
        self.oos_neighbours = None  # oos_neighbours=K: the product's OOS_NEIGHBOURS for this approach's measures
        if "oos_neighbours" in opts:
            if not opts["oos_neighbours"].isdigit() or int(opts["oos_neighbours"]) < 1:
                raise SystemExit(f"product option oos_neighbours must be a positive integer, got {opts['oos_neighbours']!r}")
            self.oos_neighbours = int(opts["oos_neighbours"])
        head = opts.get("head", "cosine")
        if head not in ("cosine", "none"):
            raise SystemExit(f"product option head must be cosine or none, got {head!r}")
        self.head = None if head == "none" else head
        self.metric = opts.get("metric", "euclidean")
        # train=backbone,budget=600: DynamicClassifier(train="backbone", time_budget_s=600), the rest default
        self.train = {"train": opts["train"]} if "train" in opts else {}
        if "budget" in opts:
            try:
                self.train["time_budget_s"] = float(opts["budget"])
            except ValueError:
                raise SystemExit(f"product option budget must be a number of seconds, got {opts['budget']!r}") from None
        # tune=600: the frozen default served from a store, its labels added, then
        # DynamicClassifier.tune_saved(store, budget_s=600) and the tuned version loaded (the refresh)
        self.tune = None
        if "tune" in opts:
            try:
                self.tune = float(opts["tune"])
            except ValueError:
                raise SystemExit(f"product option tune must be a number of seconds, got {opts['tune']!r}") from None
        self.tune_info: dict | None = None
        self.clf = None
        self.embed_ms: list[float] = []

    @staticmethod
    def name(c) -> str:
        return f"{int(c):04d}"

    def fit_texts(self, texts, y):
        from dyntc import DynamicClassifier

        options = None if self.head is None else {"refresh_delay": 3600.0}
        self.clf = DynamicClassifier(metric=self.metric, head=self.head, head_options=options, **self.train).fit(
            texts, [self.name(c) for c in y])
        self.support = {int(c): np.zeros(int((y == c).sum())) for c in np.unique(y)}  # counts only
        self._status()

    def add_texts(self, c, texts, probe):
        t0 = time.perf_counter()
        self.clf.encode(list(texts) + [probe])  # the embedding, done first (cached in memory for the operation)
        t1 = time.perf_counter()
        self.clf.add_label(self.name(c), list(texts))
        self.clf.decision_function([probe])  # effective: the next text is scored with the new label
        t2 = time.perf_counter()
        self.embed_ms.append(1000 * (t1 - t0))
        self.add_ms.append(1000 * (t2 - t1))
        self.support[int(c)] = np.zeros(len(texts))

    def _status(self):
        status = self.clf.head_status()
        if status is not None:
            self.refresh_seconds = status["seconds"]

    def refresh(self):
        if self.tune is not None and self.add_ms and self.tune_info is None:
            self._tune()
        if self.head is not None:
            self.clf.refresh(wait=True)
            self._status()

    def _tune(self):
        """Serve-then-tune: the classifier as a store's version, tuned by the product, its new version loaded."""
        import tempfile

        from dyntc import DynamicClassifier
        from dyntc.classifier.store import ModelStore

        with tempfile.TemporaryDirectory(prefix="dyntc-bench-tune-") as path:
            self.clf.save(path)
            store = ModelStore.open(path)
            before = store.size_bytes()
            report = DynamicClassifier.tune_saved(path, self.tune)
            self.clf = DynamicClassifier.load(path)  # the tuned version, as a replica would load it
            self.tune_info = {**report.to_dict(), "store_growth_bytes": store.size_bytes() - before}

    @contextlib.contextmanager
    def oos_neighbours_set(self):
        """The product's OOS_NEIGHBOURS set to ``oos_neighbours`` (a trial of another count) while inside."""
        from dyntc.classifier import calibration

        default = calibration.OOS_NEIGHBOURS
        calibration.OOS_NEIGHBOURS = self.oos_neighbours or default
        try:
            yield
        finally:
            calibration.OOS_NEIGHBOURS = default

    def keep_oos_examples(self, data):
        """``calibrate`` on the dev split with the data set's out-of-scope training texts as examples."""
        from dyntc.protocol.data.datasets import clinc150_out_of_scope

        if data.name != "clinc150":
            raise SystemExit("product option oos=train needs CLINC150's out-of-scope training texts: use it on clinc150")
        self.clf.calibrate(data.dev.texts, [self.name(c) for c in data.dev.y], clinc150_out_of_scope("train"),
                           **self.oos_weight)

    def scores_texts(self, texts):
        s = self.clf.label_scores(texts)
        return self._full([int(c) for c in self.clf.classes_], s)

    def predict_top(self, q):
        s = self.scores_texts(q)
        return s.argmax(1), s.max(1)


class SetFitPeer(Approach):
    """``setfit[:head=balanced,steps=N]``: SetFit 1.2.0 (Tunstall et al. 2022) on the same all-MiniLM-L6-v2,
    retrained on every stored example at each refresh (static): its ``Trainer`` fine-tunes the body
    contrastively for ``steps`` batches of 32 pairs (default 400), then fits its default head, a plain
    scikit-learn ``LogisticRegression()`` on the body's embeddings. ``head=balanced`` is the same trained
    body with ``LogisticRegression(class_weight="balanced")`` fitted the way SetFit fits its head (on
    ``model_body.encode`` of the training texts): the body is trained once per training set and shared.
    Scores: the head's ``predict_proba``. Needs ``pip install -e '.[setfit]'``."""

    texts = True
    dynamic = False
    bodies: dict = {}  # digest of (texts, labels, steps, seed) -> (SetFitModel, body training seconds)
    encoded: dict = {}  # (id of the trained model, texts) -> its body's embeddings, shared by both heads

    def __init__(self, n_classes, opts):
        super().__init__(n_classes)
        unknown = set(opts) - {"head", "steps", "seed"}
        if unknown:
            raise SystemExit(f"unknown setfit options {sorted(unknown)}; known: head, steps, seed")
        self.balanced = {"default": False, "balanced": True}.get(opts.get("head", "default"))
        if self.balanced is None:
            raise SystemExit(f"setfit option head must be default or balanced, got {opts.get('head')!r}")
        self.steps, self.seed = int(opts.get("steps", 400)), int(opts.get("seed", 0))
        self.train_texts: list[str] = []
        self.train_y: list[int] = []

    def fit_texts(self, texts, y):
        self.train_texts, self.train_y = list(texts), [int(c) for c in y]
        self.support = {int(c): np.zeros(int((y == c).sum())) for c in np.unique(y)}  # counts only

    def add_texts(self, c, texts, probe):
        self.train_texts += list(texts)
        self.train_y += [int(c)] * len(texts)
        self.support[int(c)] = np.zeros(len(texts))

    def _trained_body(self):
        import hashlib

        os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars from the trainer in the bench's output
        try:
            from datasets import Dataset
            from setfit import SetFitModel, Trainer, TrainingArguments
        except ImportError as exc:
            raise SystemExit(f"the setfit approach needs SetFit ({exc}): pip install -e '.[setfit]'") from exc
        import tempfile

        from dyntc.core.encoders.pretrained import resolve_backbone

        key = hashlib.sha256(json.dumps([self.train_texts, self.train_y, self.steps, self.seed]).encode()).hexdigest()
        if key not in self.bodies:
            model = SetFitModel.from_pretrained(str(resolve_backbone("minilm")))
            with tempfile.TemporaryDirectory() as tmp:
                args = TrainingArguments(output_dir=tmp, batch_size=32, num_epochs=1, max_steps=self.steps, seed=self.seed,
                                         report_to="none", save_strategy="no", show_progress_bar=False)
                t0 = time.perf_counter()
                train = Dataset.from_dict({"text": self.train_texts, "label": self.train_y})
                Trainer(model=model, args=args, train_dataset=train).train()  # body, then its default head
                self.bodies.clear()  # one trained body kept (a MiniLM each), and its embeddings
                self.encoded.clear()
                self.bodies[key] = (model, time.perf_counter() - t0)
        return self.bodies[key]

    def refresh(self):
        from sklearn.linear_model import LogisticRegression

        self.model, seconds = self._trained_body()
        self.head = self.model.model_head
        if self.balanced:
            t0 = time.perf_counter()
            x = self.model.model_body.encode(self.train_texts, normalize_embeddings=self.model.normalize_embeddings)
            self.head = LogisticRegression(class_weight="balanced").fit(x, self.train_y)
            seconds += time.perf_counter() - t0
        self.refresh_seconds = seconds

    def scores_texts(self, texts):
        key = (id(self.model), tuple(texts))  # the OOS part scores the same split several times
        if key not in self.encoded:
            self.encoded[key] = self.model.model_body.encode(list(texts), normalize_embeddings=self.model.normalize_embeddings)
        return self._full([int(c) for c in self.head.classes_], self.head.predict_proba(self.encoded[key]))

    def predict_top(self, q):
        s = self.scores_texts(q)
        return s.argmax(1), s.max(1)


def parse_spec(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    opts = dict(kv.split("=", 1) for kv in rest.split(",") if kv) if rest else {}
    return name, opts


def make(spec: str, n_classes: int) -> Approach:
    name, opts = parse_spec(spec)
    if name in ("centroid", "cosine"):
        return Prototypes(n_classes, name)
    if name == "dc-default":
        return ProductLabelSet(n_classes)
    if name in ("lr", "lr-balanced"):
        return LogReg(n_classes, name == "lr-balanced")
    if name == "cache":
        return Cache(n_classes, opts)
    if name == "product":
        return Product(n_classes, opts)
    if name == "setfit":
        return SetFitPeer(n_classes, opts)
    if name == "head":
        unknown = set(opts) - set(HEAD_KEYS) - {"oos"}
        if unknown:
            raise SystemExit(f"unknown head options {sorted(unknown)}; known: {sorted(HEAD_KEYS) + ['oos']}")
        return Head(n_classes, opts)
    raise SystemExit(f"unknown approach {spec!r}")


# --------------------------------------------------------------------------- metrics


def fit_part(ap, part, idx):
    if ap.texts:
        ap.fit_texts([part.texts[i] for i in idx], part.y[idx])
    else:
        ap.fit(part.x[idx], part.y[idx])


def scores_of(ap, part):
    return ap.scores_texts(part.texts) if ap.texts else ap.scores(part.x)


def top_of(ap, part):
    return ap.predict_top(part.texts if ap.texts else part.x)


def accuracy(scores, y, mask=None):
    ok = scores.argmax(1) == y
    return 100 * float(ok[mask].mean() if mask is not None else ok.mean())


def oos_metrics(ap, ev_in, ev_out, cal_in, cal_out, max_drop=0.02):
    """AUROC (in-scope vs out-of-scope by the approach's in-scope score), and in-scope accuracy with
    rejection / OOS recall at the threshold chosen on the calibration texts (≤ `max_drop` in-scope accuracy)."""
    import torch
    from sklearn.metrics import roc_auc_score

    from dyntc.classifier.calibration import choose_threshold

    pred_in, top_in = top_of(ap, ev_in)
    _, top_out = top_of(ap, ev_out)
    auroc = roc_auc_score(np.r_[np.ones(len(top_in)), np.zeros(len(top_out))], np.r_[top_in, top_out])
    pred_cal, top_cal = top_of(ap, cal_in)
    tau = choose_threshold(torch.as_tensor(-top_cal), torch.as_tensor(pred_cal == cal_in.y), max_drop)
    keep_in = -top_in <= tau
    return {"auroc": float(auroc), "acc_reject": 100 * float(((pred_in == ev_in.y) & keep_in).mean()),
            "oos_recall": 100 * float((-top_out > tau).mean())}


def oos_sets(data, split):
    """(evaluated in-scope, evaluated OOS, calibration in-scope, calibration OOS), or None without OOS texts."""
    if data.oos_dev is None:
        return None
    if split == "test":
        return data.test, data.oos_test, data.dev, data.oos_dev
    # halves of val / oos_val: threshold on one, measured on the other (AUROC: on all of val, below)
    half = np.random.default_rng(12345)
    a = half.permutation(len(data.dev.y))
    b = half.permutation(len(data.oos_dev.y))
    sub = lambda p, i: type(p)(p.x[i], p.y[i], [p.texts[j] for j in i])  # noqa: E731
    return (sub(data.dev, a[len(a) // 2:]), sub(data.oos_dev, b[len(b) // 2:]),
            sub(data.dev, a[: len(a) // 2]), sub(data.oos_dev, b[: len(b) // 2]))


def oos_block(ap, data, split):
    sets = oos_sets(data, split)
    if sets is None:
        return None
    if not getattr(ap, "oos_examples", False):
        return oos_measures(ap, data, split, sets)
    before = oos_measures(ap, data, split, sets)  # the same classifier before and after keeping the examples
    with ap.oos_neighbours_set():
        ap.keep_oos_examples(data)
        return {**oos_measures(ap, data, split, sets), "without_examples": before}


def oos_measures(ap, data, split, sets):
    out = oos_metrics(ap, *sets)
    if split == "dev":
        out["auroc"] = oos_metrics(ap, data.dev, data.oos_dev, data.dev, data.oos_dev)["auroc"]
    return out


# --------------------------------------------------------------------------- scenarios


def draw(rng, x, y, classes, k):
    out = {}
    for c in classes:
        idx = np.flatnonzero(y == c)
        out[c] = np.sort(rng.choice(idx, min(k, len(idx)), replace=False))
    return out


def partition(data, seed, new_shots, new_fraction):
    """The generalized scenario's draw for `seed`: the new intents, the old ones, and the training
    indices of each new intent's ``new_shots`` examples (``{intent: indices}``)."""
    rng = np.random.default_rng(seed)
    n = len(data.classes)
    perm = rng.permutation(n)
    new = np.sort(perm[: int(round(n * new_fraction))])
    old = np.sort(perm[int(round(n * new_fraction)):])
    return new, old, draw(rng, data.train.x, data.train.y, new, new_shots)


def generalized(data, split, seed, specs, new_shots, new_fraction):
    new, old, support = partition(data, seed, new_shots, new_fraction)
    n, tr = len(data.classes), data.train
    old_mask = np.isin(tr.y, old)
    ev = data.dev if split == "dev" else data.test
    is_new = np.isin(ev.y, new)
    rows = {}
    for spec in specs:
        ap = make(spec, n)
        t0 = time.perf_counter()
        fit_part(ap, tr, np.flatnonzero(old_mask))
        if ap.dynamic:
            ap.refresh()  # the state before the new labels: a head trained on the old ones
        fit_s = time.perf_counter() - t0
        for c in new:
            if ap.texts:
                ap.add_texts(c, [tr.texts[i] for i in support[c]], ev.texts[int(c) % len(ev.texts)])
            else:
                ap.add(c, tr.x[support[c]])
        states = {}
        if ap.dynamic:
            s = scores_of(ap, ev)
            states["now"] = {"old": accuracy(s, ev.y, ~is_new), "new": accuracy(s, ev.y, is_new), "all": accuracy(s, ev.y)}
        ap.refresh()
        s = scores_of(ap, ev)
        states["refreshed"] = {"old": accuracy(s, ev.y, ~is_new), "new": accuracy(s, ev.y, is_new), "all": accuracy(s, ev.y),
                               "refresh_s": ap.refresh_seconds, "fit_s": fit_s,
                               "add_ms": float(np.median(ap.add_ms)) if ap.add_ms and ap.dynamic else None,
                               "embed_ms": float(np.median(ap.embed_ms)) if getattr(ap, "embed_ms", None) else None,
                               "n_stored": int(sum(len(v) for v in ap.support.values())) if ap.support else
                               int(old_mask.sum() + sum(len(v) for v in support.values())),
                               "tune": getattr(ap, "tune_info", None)}
        oos = oos_block(ap, data, split)
        if oos is not None:
            states["oos"] = oos
        rows[spec] = states
    return rows


def full(data, split, specs):
    """Every intent a label with all of its training texts (no new labels); accuracy and OOS."""
    ev = data.dev if split == "dev" else data.test
    rows = {}
    for spec in specs:
        ap = make(spec, len(data.classes))
        fit_part(ap, data.train, np.arange(len(data.train.y)))
        ap.refresh()
        rows[spec] = {"acc": accuracy(scores_of(ap, ev), ev.y), "refresh_s": ap.refresh_seconds,
                      "n_stored": len(data.train.y)}
        oos = oos_block(ap, data, split)
        if oos is not None:
            rows[spec]["oos"] = oos
    return rows


def fewshot(data, split, seed, specs, shots):
    rng = np.random.default_rng(1000 + seed)
    n = len(data.classes)
    tr = data.train
    support = draw(rng, tr.x, tr.y, np.arange(n), shots)
    idx = np.concatenate([support[c] for c in range(n)])
    ev = data.dev if split == "dev" else data.test
    rows = {}
    for spec in specs:
        ap = make(spec, n)
        fit_part(ap, tr, idx)
        ap.refresh()
        rows[spec] = {"acc": accuracy(scores_of(ap, ev), ev.y), "refresh_s": ap.refresh_seconds}
    return rows


def latency(data, n_examples=10_000, n_ops=20, shots=5):
    """``DynamicClassifier()`` (defaults, refresh_delay 1 s) fitted on `n_examples` training texts of
    the intents not held out; then `n_ops` ``add_label`` calls of `shots` texts each (held-out intents,
    embedded first so the timing is the label operation beyond embedding, plus one prediction with
    the new label); then the background refresh: seconds from the last operation until no label is
    imprinted, and the refresh's own training seconds."""
    from dyntc import DynamicClassifier

    rng = np.random.default_rng(7)
    tr = data.train
    held = rng.permutation(len(data.classes))[:n_ops]
    pool = np.flatnonzero(~np.isin(tr.y, held))
    idx = np.sort(rng.choice(pool, min(n_examples, len(pool)), replace=False))
    t0 = time.perf_counter()
    clf = DynamicClassifier().fit([tr.texts[i] for i in idx], [data.classes[tr.y[i]] for i in idx])
    fit_s = time.perf_counter() - t0
    fit_refresh_s = clf.head_status()["seconds"]
    probe = data.test.texts[0]
    add_ms, embed_ms = [], []
    for c in held:
        texts = [tr.texts[i] for i in np.flatnonzero(tr.y == c)[:shots]]
        t0 = time.perf_counter()
        clf.encode(texts + [probe])
        t1 = time.perf_counter()
        clf.add_label(data.classes[c], texts)
        clf.decision_function([probe])
        t2 = time.perf_counter()
        embed_ms.append(1000 * (t1 - t0))
        add_ms.append(1000 * (t2 - t1))
    t_last = time.perf_counter()
    imprinted = len(clf.head_status()["imprinted"])
    clf.wait_for_refresh(120)
    until_s = time.perf_counter() - t_last
    status = clf.head_status()
    return {"n_examples": int(len(idx)), "n_ops": int(n_ops), "fit_s": fit_s, "fit_refresh_s": fit_refresh_s,
            "add_ms_median": float(np.median(add_ms)), "add_ms_max": float(np.max(add_ms)),
            "embed_ms_median": float(np.median(embed_ms)), "imprinted_before": imprinted,
            "background_until_trained_s": until_s, "background_refresh_s": status["seconds"],
            "imprinted_after": len(status["imprinted"]), "stored_after": status["examples"]}


# --------------------------------------------------------------------------- report


def ms(values):
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return "–"
    return f"{v.mean():.1f} ± {v.std():.1f}" if len(v) > 1 else f"{v.mean():.1f}"


def ms2(values):
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if len(v) == 0:
        return "–"
    return f"{v.mean():.2f} ± {v.std():.2f}" if len(v) > 1 else f"{v.mean():.2f}"


def report(results, args):
    lines = []
    for ds, res in results.items():
        if "latency" in res:
            v = res["latency"][0]
            lines.append(f"\n### {ds}, label-operation latency (DynamicClassifier() defaults)")
            lines.append(f"fitted on {v['n_examples']} texts in {v['fit_s']:.1f} s (head trained in {v['fit_refresh_s']:.2f} s); "
                         f"{v['n_ops']} add_label calls of 5 texts: median {v['add_ms_median']:.2f} ms, max "
                         f"{v['add_ms_max']:.2f} ms beyond embedding (embedding: median {v['embed_ms_median']:.1f} ms); "
                         f"{v['imprinted_before']} labels imprinted after them; background refresh: trained "
                         f"{v['background_until_trained_s']:.2f} s after the last operation (1 s delay + "
                         f"{v['background_refresh_s']:.2f} s training on {v['stored_after']} examples), "
                         f"{v['imprinted_after']} imprinted after it")
        if "generalized" in res:
            runs = res["generalized"]
            lines.append(f"\n### {ds}, generalized ({args.split}): new = random third of intents, {args.new_shots}-shot; "
                         f"mean ± std over seeds {args.seeds}; examples stored at the refresh: "
                         f"{ms(r[next(iter(r))]['refreshed']['n_stored'] for r in runs)}")
            lines.append("| approach | state | old | new | all | refresh s | add_label ms | embedding ms |")
            lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
            for spec in runs[0]:
                for state in ("now", "refreshed"):
                    if state not in runs[0][spec]:
                        continue
                    vals = [r[spec][state] for r in runs]
                    extra = (f" {ms(v['refresh_s'] for v in vals) if state == 'refreshed' else '–'} |"
                             f" {ms2(v.get('add_ms') for v in vals) if state == 'refreshed' else '–'} |"
                             f" {ms2(v.get('embed_ms') for v in vals) if state == 'refreshed' else '–'} |")
                    lines.append(f"| {spec} | {state} | {ms(v['old'] for v in vals)} | {ms(v['new'] for v in vals)} | "
                                 f"{ms(v['all'] for v in vals)} |{extra}")
            for spec in runs[0]:
                tunes = [r[spec]["refreshed"].get("tune") for r in runs]
                if tunes[0]:
                    lines.append(f"{spec}: tune of {ms(t['train_seconds'] for t in tunes)} s training, "
                                 f"{ms(t['episodes'] for t in tunes)} episodes ({ms(t['few_shot'] for t in tunes)} "
                                 f"few-shot labels left out), {ms(t['seconds'] for t in tunes)} s "
                                 f"in all; its version stored {ms(t['store_growth_bytes'] / 1e6 for t in tunes)} MB "
                                 f"({ms(t['weights_bytes'] / 1e6 for t in tunes)} MB of tuned layers)")
            if "oos" in runs[0][next(iter(runs[0]))]:
                lines.append(f"\n### {ds}, out-of-scope ({args.split}; generalized scenario, refreshed state)")
                lines.append("| approach | AUROC | in-scope acc. with rejection | OOS recall |")
                lines.append("|---|---:|---:|---:|")
                for spec in runs[0]:
                    vals = [r[spec]["oos"] for r in runs]
                    rows = [(f"{spec}, before keeping the examples", [v["without_examples"] for v in vals])] \
                        if "without_examples" in vals[0] else []
                    for name, these in rows + [(spec, vals)]:
                        au = np.array([v["auroc"] for v in these])
                        lines.append(f"| {name} | {au.mean():.4f} ± {au.std():.4f} | "
                                     f"{ms(v['acc_reject'] for v in these)} | {ms(v['oos_recall'] for v in these)} |")
        if "full" in res:
            r = res["full"][0]
            first = next(iter(r))
            lines.append(f"\n### {ds}, all labels with all training texts ({args.split}; {r[first]['n_stored']} stored examples)")
            has_oos = "oos" in r[first]
            lines.append("| approach | accuracy | refresh s |" + (" OOS AUROC | in-scope acc. with rejection | OOS recall |" if has_oos else ""))
            lines.append("|---|---:|---:|" + ("---:|---:|---:|" if has_oos else ""))
            for spec, v in r.items():
                oos = v.get("oos") or {}
                rows = [(f"{spec}, before keeping the examples", oos["without_examples"])] if "without_examples" in oos else []
                for name, o in rows + [(spec, oos)]:
                    extra = f" {o['auroc']:.4f} | {o['acc_reject']:.1f} | {o['oos_recall']:.1f} |" if has_oos else ""
                    lines.append(f"| {name} | {v['acc']:.1f} | {v['refresh_s']:.2f} |{extra}")
        for key in sorted((k for k in res if k.startswith("fewshot-")), key=lambda k: int(k.split("-")[1])):
            k = int(key.split("-")[1])
            runs = res[key]
            lines.append(f"\n### {ds}, all labels {k}-shot ({args.split}); mean ± std over draws {args.seeds}")
            lines.append("| approach | accuracy | refresh s |")
            lines.append("|---|---:|---:|")
            for spec in runs[0]:
                lines.append(f"| {spec} | {ms(r[spec]['acc'] for r in runs)} | {ms(r[spec]['refresh_s'] for r in runs)} |")
            lines.append(f"| published anchor: USE+ConveRT (Casanueva et al. 2020), its own draws/splits | "
                         f"{ANCHORS[ds][k]:.2f} | – |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=["dev", "test"], default="dev")
    ap.add_argument("--datasets", default="clinc150,hwu64")
    ap.add_argument("--scenarios", default="generalized,full,fewshot-5,fewshot-10")
    ap.add_argument("--approaches", default=";".join(APPROACHES_DEFAULT),
                    help="';'-separated: centroid, cosine, dc-default, lr, lr-balanced, head[:key=value,...], "
                         "product[:head=none|tune=SECONDS] (the real DynamicClassifier on the texts; tune: "
                         "served frozen, then tuned as a new version), "
                         "setfit[:head=balanced,steps=400] (needs the setfit extra)")
    ap.add_argument("--seeds", default="0,1,2", help="partition seeds (generalized) and draws (few-shot)")
    ap.add_argument("--new-shots", type=int, default=NEW_SHOTS)
    ap.add_argument("--new-fraction", type=float, default=NEW_FRACTION)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if os.environ.get(var) != str(args.threads):
            print(f"note: {var}={os.environ.get(var)} (set it to {args.threads} before starting Python for BLAS to follow)")
    import torch

    torch.set_num_threads(args.threads)
    from bench._intents_data import load_data
    from dyntc.core.machine import machine_description

    t_start = time.perf_counter()
    specs = [s for s in args.approaches.split(";") if s]
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {machine_description()}; split {args.split}")
    results = {}
    for ds in args.datasets.split(","):
        data = load_data(ds)
        print(f"{ds}: {len(data.classes)} intents, train {len(data.train.y)}, dev {len(data.dev.y)} ({data.dev_note}), "
              f"test {len(data.test.y)}" + (f", oos val/test {len(data.oos_dev.y)}/{len(data.oos_test.y)}" if data.oos_dev else ""),
              flush=True)
        res = results.setdefault(ds, {})
        for scen in args.scenarios.split(","):
            t0 = time.perf_counter()
            if scen == "generalized":
                res[scen] = [generalized(data, args.split, s, specs, args.new_shots, args.new_fraction) for s in seeds]
            elif scen == "latency":
                res[scen] = [latency(data)]
            elif scen == "full":
                res[scen] = [full(data, args.split, specs)]
            elif scen.startswith("fewshot-"):
                res[scen] = [fewshot(data, args.split, s, specs, int(scen.split("-")[1])) for s in seeds]
            else:
                raise SystemExit(f"unknown scenario {scen!r}")
            print(f"  {scen}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(report(results, args))
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "machine": machine_description(),
                                         "results": results}, indent=1, default=float))


if __name__ == "__main__":
    main()
