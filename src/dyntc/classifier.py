"""``DynamicClassifier``: a text classifier whose label set changes without retraining.

An encoder maps texts into a metric space (Euclidean, or the hyperboloid model of hyperbolic space);
a label is the prototype (mean, or Fréchet mean) of its embedded support examples; a text gets the
label of the nearest prototype. Adding, removing, splitting, merging or renaming a label only
changes the support sets, so it takes effect at once, without training::

    from dyntc import DynamicClassifier

    clf = DynamicClassifier(metric="hyperbolic", episodes=500).fit(texts, labels)
    clf.add_label("book_hotel", ["find me a hotel in paris", "book a room for two nights", ...])
    clf.predict(["I need a room in rome for friday"])          # -> ["book_hotel"]
    clf.save("model/");  clf = DynamicClassifier.load("model/")

Storage: for every label the classifier keeps its support texts and their points in the metric
space (computed once, when the examples arrive), and its prototype. A label operation touches only
the labels it names: their prototypes are recomputed (one batched mean over those labels); no
stored example is ever re-encoded. Only :meth:`~DynamicClassifier.fine_tune`, which changes the
encoder, re-embeds every stored example and rebuilds every prototype.

The SRU encoder's vocabulary is fixed at ``fit`` (the training words GloVe knows). With
``extend_vocab=True`` (the default) the words of later examples that GloVe knows are appended to it
(their frozen GloVe vectors, no training needed), so new labels are not reduced to ``<unk>`` tokens;
texts embedded earlier keep their points.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dyntc.errors import DyntcError, NotFittedError, is_int, is_number

__all__ = ["DynamicClassifier", "CLASSIFIER_FORMAT"]

#: Version of the classifier part of a saved model (``support.json`` and the ``classifier`` meta);
#: the weights file has its own ``format_version`` checked by :mod:`dyntc.checkpoint`.
CLASSIFIER_FORMAT = 1
_SUPPORT_FILE = "support.json"
_METRICS = ("hyperbolic", "euclidean")


@dataclass
class _Support:
    """One label's support set: its texts and their points in the metric space (CPU, float32)."""

    texts: list[str]
    points: torch.Tensor  # (n, dim)


def _check_name(name: Any, arg: str = "name") -> str:
    if not isinstance(name, str):
        raise DyntcError(f"{arg} must be a label name (str), got {type(name).__name__}")
    if not name.strip():
        raise DyntcError(f"{arg} must be a non-empty label name, got {name!r}")
    return name


def _check_examples(examples: Any, arg: str = "examples", *, allow_empty: bool = False) -> list[str]:
    from dyntc.training import check_texts

    if isinstance(examples, str):
        raise DyntcError(f"{arg} must be a list of texts, not a single string: wrap it as [{examples[:30]!r}]")
    if not isinstance(examples, Iterable):
        raise DyntcError(f"{arg} must be a list of texts, got {type(examples).__name__}")
    examples = list(examples)
    if not examples and not allow_empty:
        raise DyntcError(f"{arg} is empty: a label needs at least one example text")
    check_texts(examples, arg)
    return examples


class DynamicClassifier:
    """Nearest-prototype text classifier with an editable label set (scikit-learn conventions).

    Parameters (stored as given by the constructor; validated by :meth:`fit`):

    encoder
        ``"sru"`` (frozen GloVe + SRU, the paper's; vocabulary from the training texts), ``"minilm"``
        or the path of a local sentence-transformers model.
    metric
        ``"hyperbolic"`` (hyperboloid model; prototypes are Fréchet means) or ``"euclidean"``.
    hidden_size, num_layers, dropout, max_len
        Encoder shape: output size, layers, dropout and tokens kept per text. ``None`` means the
        encoder's default (SRU: 4 layers, dropout 0.5; pretrained: a 1-layer head, dropout 0.1).
    embeddings
        SRU only: a GloVe text file (None = the packaged glove.6B.50d).
    encoder_options
        Extra keyword options for the encoder factory (e.g. for a pretrained encoder).
    episodes, lr, n_support, n_query, max_classes, eval_every, patience, time_budget_s
        Episodic training: at most ``episodes`` episodes of ``max_classes`` classes with ``n_support``
        support examples each and ``n_query`` queries in total; Adam with learning rate ``lr``. With a
        dev set, accuracy is checked every ``eval_every`` episodes and training stops after
        ``patience`` checks without improvement (the best weights are kept).
    extend_vocab
        Append the GloVe-known new words of later examples to the SRU vocabulary (see module doc).
    batch_size
        Texts per batch when embedding (prediction, label operations).
    seed, device, progress
        Random seed; torch device for training and prediction (``"cpu"``, ``"cuda"``); progress bars.
    """

    def __init__(
        self,
        encoder: str = "sru",
        metric: str = "hyperbolic",
        *,
        hidden_size: int = 128,
        num_layers: int | None = None,
        dropout: float | None = None,
        max_len: int = 64,
        embeddings: str | None = None,
        encoder_options: dict | None = None,
        episodes: int = 1000,
        lr: float = 1e-3,
        n_support: int = 4,
        n_query: int = 64,
        max_classes: int = 50,
        eval_every: int = 100,
        patience: int = 10,
        time_budget_s: float | None = None,
        extend_vocab: bool = True,
        batch_size: int = 256,
        seed: int = 0,
        device: str = "cpu",
        progress: bool = False,
    ):
        self.encoder = encoder
        self.metric = metric
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.dropout = dropout
        self.max_len = max_len
        self.embeddings = embeddings
        self.encoder_options = encoder_options
        self.episodes = episodes
        self.lr = lr
        self.n_support = n_support
        self.n_query = n_query
        self.max_classes = max_classes
        self.eval_every = eval_every
        self.patience = patience
        self.time_budget_s = time_budget_s
        self.extend_vocab = extend_vocab
        self.batch_size = batch_size
        self.seed = seed
        self.device = device
        self.progress = progress

    # ------------------------------------------------------------------ scikit-learn conventions

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters, as a dict (scikit-learn convention)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params) -> "DynamicClassifier":
        """Set constructor parameters; they apply at the next :meth:`fit` (``device``, ``batch_size``
        and ``progress`` apply at once)."""
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise DyntcError(f"invalid parameter {name!r} for DynamicClassifier; valid ones: {', '.join(valid)}")
            if name == "batch_size" and not (is_int(value) and value >= 1):
                raise DyntcError(f"batch_size must be an integer >= 1, got {value!r}")  # applies at once
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if defaults.get(k) != v]
        return f"DynamicClassifier({', '.join(changed)})"

    def _validate_params(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise DyntcError(msg)

        need(isinstance(self.encoder, str) and bool(self.encoder),
             f"encoder must be 'sru', 'minilm' or a model path, got {self.encoder!r}")
        need(self.metric in _METRICS, f"metric must be 'hyperbolic' or 'euclidean', got {self.metric!r}")
        for name in ("hidden_size", "num_layers", "max_len", "episodes", "n_support", "n_query",
                     "eval_every", "patience", "batch_size"):
            value = getattr(self, name)
            if value is None and name in ("num_layers", "max_len"):
                continue
            need(is_int(value) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
        need(is_int(self.max_classes) and self.max_classes >= 2,
             f"max_classes must be an integer >= 2, got {self.max_classes!r}")
        need(self.dropout is None or (is_number(self.dropout) and 0 <= self.dropout < 1),
             f"dropout must be in [0, 1), got {self.dropout!r}")
        need(is_number(self.lr) and self.lr > 0, f"lr must be a number > 0, got {self.lr!r}")
        need(self.time_budget_s is None or (is_number(self.time_budget_s) and self.time_budget_s > 0),
             f"time_budget_s must be None or > 0 seconds, got {self.time_budget_s!r}")
        need(self.encoder_options is None or (isinstance(self.encoder_options, Mapping)
                                              and all(isinstance(k, str) for k in self.encoder_options)),
             f"encoder_options must be a dict with option names as keys, or None; got {self.encoder_options!r}")
        need(is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        self._check_device()
        from dyntc.encoders import check_encoder_options

        try:
            check_encoder_options(self.encoder, **self._encoder_options())
        except DyntcError as exc:
            raise DyntcError(f"{exc} (encoder={self.encoder!r}, encoder_options={self.encoder_options!r})") from None

    def _check_device(self) -> torch.device:
        from dyntc.training import check_device

        return check_device(self.device, "device")

    # ------------------------------------------------------------------ fitted state

    def _check_fitted(self) -> None:
        if getattr(self, "model_", None) is None:
            raise NotFittedError(
                "this DynamicClassifier is not fitted yet: call fit(texts, labels) or DynamicClassifier.load(path) first"
            )

    @property
    def classes_(self) -> list[str]:
        """The current label set, sorted (the column order of :meth:`predict_proba`)."""
        self._check_fitted()
        return sorted(self._support)

    @property
    def n_classes_(self) -> int:
        self._check_fitted()
        return len(self._support)

    def support(self, name: str) -> list[str]:
        """The support texts of label `name` (a copy)."""
        self._check_fitted()
        self._require(name)
        return list(self._support[name].texts)

    def support_counts(self) -> dict[str, int]:
        """Number of support examples of every label, in ``classes_`` order."""
        self._check_fitted()
        return {c: len(self._support[c].texts) for c in self.classes_}

    # ------------------------------------------------------------------ fit / fine-tune

    def fit(self, texts: Sequence[str], labels: Sequence[str], dev: tuple[Sequence[str], Sequence[str]] | None = None
            ) -> "DynamicClassifier":
        """Train the encoder episodically on (`texts`, `labels`) and build one prototype per label from
        all of its training examples.

        `dev` = ``(texts, labels)`` enables early stopping on dev accuracy (dev labels must be among
        the training labels). Labels with fewer than ``n_support + 1`` examples take no part in the
        episodes but still get a prototype; at least two labels must have enough examples.
        """
        from dyntc.encoders import create_encoder
        from dyntc.models import PrototypicalNetwork
        from dyntc.training import train_prototypical

        self._validate_params()
        texts, labels = self._check_pairs(texts, labels, "texts", "labels")
        classes = sorted(set(labels))
        dev_pair = self._check_dev(dev, classes)

        episodic = self._episodic_classes(labels, classes)
        torch.manual_seed(self.seed)
        encoder = create_encoder(self.encoder, texts, **self._encoder_options())
        model = PrototypicalNetwork(encoder, self.metric)
        items = encoder.featurize(texts)  # once, for the episodes and the prototypes
        train = self._episode_set(encoder, texts, labels, episodic, items)
        dev_set = None
        if dev_pair is not None:
            dev_set = self._episode_set(encoder, *dev_pair, episodic)
            if len(dev_set) == 0:
                dev_set = None
        self.train_result_ = train_prototypical(model, train, dev_set, self._train_config(self.episodes, self.lr))
        model.eval()
        self.model_ = model
        self._install_support(texts, labels, items)
        return self

    def fine_tune(
        self,
        texts: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        *,
        episodes: int = 100,
        lr: float | None = None,
        dev: tuple[Sequence[str], Sequence[str]] | None = None,
        add_to_support: bool = True,
    ) -> "DynamicClassifier":
        """Further episodic training on the current label set (the paper's fine-tuned model).

        Episodes are drawn from every label's stored support examples plus the given (`texts`,
        `labels`), whose labels must already exist (add new labels with :meth:`add_label` first).
        With `add_to_support` the given examples also join their labels' support sets. Afterwards
        every stored support example is re-embedded and every prototype rebuilt. Labels with fewer
        than ``n_support + 1`` examples only appear as prototypes, not in episodes.
        """
        from dyntc.training import train_prototypical

        self._check_fitted()
        if not (is_int(episodes) and episodes >= 1):
            raise DyntcError(f"episodes must be an integer >= 1, got {episodes!r}")
        if lr is not None and not (is_number(lr) and lr > 0):
            raise DyntcError(f"lr must be a number > 0 (or None for the classifier's lr), got {lr!r}")
        new_texts: list[str] = []
        new_labels: list[str] = []
        if texts is not None or labels is not None:
            if texts is None or labels is None:
                raise DyntcError("fine_tune needs both texts and labels (or neither)")
            new_texts, new_labels = self._check_pairs(texts, labels, "texts", "labels", allow_empty=True)
            unknown = sorted(set(new_labels) - set(self._support))
            if unknown:
                raise DyntcError(f"labels {unknown[:5]} are not in the label set: add them with add_label first")
        dev_pair = self._check_dev(dev, self.classes_)  # before anything changes
        all_texts = [t for c in self.classes_ for t in self._support[c].texts]
        all_labels = [c for c in self.classes_ for _ in self._support[c].texts]
        pool_texts, pool_labels = all_texts + new_texts, all_labels + new_labels
        episodic = self._episodic_classes(pool_labels, self.classes_)
        self._maybe_extend_vocab(new_texts)
        model = self.model_
        items = model.encoder.featurize(pool_texts)  # once, for the episodes and the prototypes
        train = self._episode_set(model.encoder, pool_texts, pool_labels, episodic, items)
        dev_set = None
        if dev_pair is not None:
            dev_set = self._episode_set(model.encoder, *dev_pair, episodic)
            if len(dev_set) == 0:
                dev_set = None
        self.fine_tune_result_ = train_prototypical(model, train, dev_set, self._train_config(episodes, self.lr if lr is None else lr))
        model.eval()
        if add_to_support and new_texts:
            all_texts, all_labels = pool_texts, pool_labels
        self._install_support(all_texts, all_labels, items[: len(all_texts)])
        return self

    def _check_dev(self, dev, classes: Sequence[str]) -> tuple[list[str], list[str]] | None:
        """`dev` as checked (texts, labels), or None; its labels must be among `classes`."""
        if dev is None:
            return None
        if not (isinstance(dev, (tuple, list)) and len(dev) == 2):
            raise DyntcError("dev must be a pair (texts, labels)")
        dev_texts, dev_labels = self._check_pairs(dev[0], dev[1], "dev texts", "dev labels")
        unknown = sorted(set(dev_labels) - set(classes))
        if unknown:
            raise DyntcError(f"dev labels {unknown[:5]} are not among the labels trained on: remove those dev examples")
        return dev_texts, dev_labels

    def _encoder_options(self) -> dict:
        options = {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "dropout": self.dropout,
                   "max_len": self.max_len}
        if self.encoder == "sru":
            options["embeddings"] = self.embeddings
        return {**options, **(self.encoder_options or {})}  # None values = the encoder's default

    def _train_config(self, episodes: int, lr: float):
        from dyntc.training import TrainConfig

        return TrainConfig(
            lr=lr, max_episodes=episodes, n_support=self.n_support, n_query=self.n_query,
            max_classes=self.max_classes, eval_every=self.eval_every, patience=self.patience,
            time_budget_s=self.time_budget_s, seed=self.seed, device=str(self._check_device()),
            progress=self.progress,
        )

    def _episodic_classes(self, labels: Sequence[str], classes: Sequence[str]) -> list[str]:
        counts: dict[str, int] = {}
        for y in labels:
            counts[y] = counts.get(y, 0) + 1
        eligible = [c for c in classes if counts.get(c, 0) >= self.n_support + 1]
        if len(eligible) < 2:
            raise DyntcError(
                f"episodic training needs at least 2 labels with n_support + 1 = {self.n_support + 1} examples "
                f"each; {len(eligible)} of {len(classes)} labels have that many: add examples or lower n_support"
            )
        return eligible

    @staticmethod
    def _episode_set(encoder, texts: Sequence[str], labels: Sequence[str], classes: Sequence[str],
                     items: Sequence[Any] | None = None):  # fmt: skip
        """The examples of `classes` among (`texts`, `labels`) as a training set; `items`: their
        features when already computed (else only the kept texts are featurized)."""
        from dyntc.training import Encoded

        keep = set(classes)
        idx = [i for i, y in enumerate(labels) if y in keep]
        kept_labels = [labels[i] for i in idx]
        if items is None:
            return Encoded.of(encoder, [texts[i] for i in idx], kept_labels, classes)
        return Encoded.from_items([items[i] for i in idx], kept_labels, classes)

    @staticmethod
    def _check_pairs(texts, labels, tname: str, lname: str, allow_empty: bool = False) -> tuple[list[str], list[str]]:
        from dyntc.training import check_texts

        for value, name in ((texts, tname), (labels, lname)):
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise DyntcError(f"{name} must be a list of strings, got {type(value).__name__}")
        texts, labels = list(texts), list(labels)
        if len(texts) != len(labels):
            raise DyntcError(f"{tname} and {lname} differ in length: {len(texts)} vs {len(labels)}")
        if not texts and not allow_empty:
            raise DyntcError(f"{tname} is empty: nothing to train on")
        check_texts(texts, tname)
        for i, y in enumerate(labels):
            if not isinstance(y, str) or not y.strip():
                raise DyntcError(f"{lname}[{i}] is {y!r}: labels must be non-empty strings (convert them with str())")
        return texts, labels

    # ------------------------------------------------------------------ embedding and prototypes

    def _model_on_device(self) -> nn.Module:
        device = self._check_device()
        model = self.model_
        if next(model.parameters()).device != device:
            model.to(device)
        return model

    def _embed(self, texts: Sequence[str], items: list | None = None) -> torch.Tensor:
        """Points of `texts` (or of their `items`, already featurized) in the metric space,
        ``(n, dim)`` float32 on the CPU, no gradient."""
        from dyntc.training import embed_points

        model = self._model_on_device()
        if not texts:
            return torch.zeros(0, self._dim())
        if items is None:
            items = model.encoder.featurize(texts)
        with torch.inference_mode():
            return embed_points(model, items, self.batch_size).float().cpu()

    def _dim(self) -> int:
        return self.model_.encoder.output_dim + (1 if self.model_.metric == "hyperbolic" else 0)

    def _maybe_extend_vocab(self, texts: Sequence[str]) -> int:
        """Let an encoder that can grow its vocabulary (GloVe + SRU) take the new words of `texts`."""
        extend = getattr(self.model_.encoder, "extend_vocabulary", None)
        if not self.extend_vocab or not texts or extend is None:
            return 0
        return extend(texts)

    def _means(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """Prototypes of the labels `names` from their stored points: one batched (Fréchet) mean."""
        if not names:
            return {}
        points = torch.cat([self._support[n].points for n in names])
        ids = torch.repeat_interleave(torch.arange(len(names)), torch.tensor([len(self._support[n].points) for n in names]))
        model = self.model_
        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                protos = model.prototypes(points.double(), ids, len(names)).float()
        finally:
            model.train(was_training)
        return {n: protos[i] for i, n in enumerate(names)}

    def _refresh(self, names: Iterable[str]) -> None:
        """Recompute the prototypes of `names`; drop those of labels that no longer exist."""
        names = [n for n in dict.fromkeys(names) if n in self._support]
        self._prototypes.update(self._means(names))
        for gone in set(self._prototypes) - set(self._support):
            del self._prototypes[gone]
        self._matrix = None

    def _install_support(self, texts: Sequence[str], labels: Sequence[str], items: list | None = None) -> None:
        points = self._embed(texts, items)
        groups: dict[str, list[int]] = {}
        for i, y in enumerate(labels):
            groups.setdefault(y, []).append(i)
        self._support = {
            y: _Support([texts[i] for i in idx], points[torch.as_tensor(idx, dtype=torch.long)].clone())
            for y, idx in sorted(groups.items())
        }
        self._prototypes = {}
        self._refresh(self._support)

    def _prototype_matrix(self) -> torch.Tensor:
        if getattr(self, "_matrix", None) is None:
            self._matrix = torch.stack([self._prototypes[c] for c in self.classes_])
        return self._matrix

    def _sq_distances(self, points: torch.Tensor, protos: torch.Tensor | None = None) -> torch.Tensor:
        """Squared distances from `points` to `protos` (default: every label's prototype)."""
        protos = self._prototype_matrix() if protos is None else protos
        if self.model_.metric == "hyperbolic":  # float64: float32 hyperboloid coordinates lose small distances
            return self.model_.sq_distances(points.double(), protos.double()).float()
        return self.model_.sq_distances(points, protos)

    # ------------------------------------------------------------------ prediction

    def _query(self, texts: Sequence[str]) -> torch.Tensor:
        self._check_fitted()
        texts = _check_examples(texts, "texts", allow_empty=True)
        return self._sq_distances(self._embed(texts)) if texts else torch.zeros(0, self.n_classes_)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Points of `texts` in the metric space: ``(n, d)`` Euclidean, ``(n, d + 1)`` on the hyperboloid."""
        self._check_fitted()
        return self._embed(_check_examples(texts, "texts", allow_empty=True)).numpy()

    def predict(self, texts: Sequence[str]) -> list[str]:
        """The label of the nearest prototype for every text."""
        d2 = self._query(texts)
        classes = self.classes_
        return [classes[i] for i in d2.argmin(1).tolist()]

    def decision_function(self, texts: Sequence[str]) -> np.ndarray:
        """``-d²`` to every prototype, ``(n, n_classes)`` (higher = nearer); columns in ``classes_``
        order. :meth:`predict`, :meth:`predict_proba` and :meth:`top_k` all derive from it, so a
        caller needing several of them embeds the texts once with this."""
        return (-self._query(texts).double()).numpy()

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``softmax(-d²)`` over the prototypes, ``(n, n_classes)``; columns in ``classes_`` order."""
        return torch.softmax(-self._query(texts).double(), dim=1).numpy()

    def top_k(self, texts: Sequence[str], k: int = 3) -> list[list[tuple[str, float]]]:
        """For every text, the `k` nearest labels as ``(label, distance)``, nearest first."""
        if not (is_int(k) and k >= 1):
            raise DyntcError(f"k must be an integer >= 1, got {k!r}")
        return self.nearest_labels(self._query(texts), k)

    def nearest_labels(self, sq_distances: torch.Tensor | np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """From squared distances ``(n, n_classes)`` (e.g. ``-decision_function(texts)``), the `k`
        nearest labels of every row as ``(label, distance)``, nearest first."""
        d2 = torch.as_tensor(sq_distances)
        values, index = d2.topk(min(k, d2.shape[1]), dim=1, largest=False)
        classes = self.classes_
        return [[(classes[j], v) for j, v in zip(row_i, row_v)]
                for row_i, row_v in zip(index.tolist(), values.clamp_min(0).sqrt().tolist())]

    def score(self, texts: Sequence[str], labels: Sequence[str]) -> float:
        """Accuracy of :meth:`predict` on (`texts`, `labels`)."""
        texts, labels = self._check_pairs(texts, labels, "texts", "labels")
        return float(np.mean([p == y for p, y in zip(self.predict(texts), labels)]))

    # ------------------------------------------------------------------ label operations

    def _require(self, name: Any, arg: str = "name") -> str:
        _check_name(name, arg)
        if name not in self._support:
            known = ", ".join(repr(c) for c in self.classes_[:10])
            more = f" and {self.n_classes_ - 10} more" if self.n_classes_ > 10 else ""
            raise DyntcError(f"label {name!r} does not exist; the labels are {known}{more}")
        return name

    def _require_new(self, name: Any, arg: str = "name", allowed: Iterable[str] = ()) -> str:
        _check_name(name, arg)
        if name in self._support and name not in set(allowed):
            raise DyntcError(f"label {name!r} already exists: use add_examples to give it more examples, or pick another name")
        return name

    def _new_support(self, examples: list[str]) -> _Support:
        self._maybe_extend_vocab(examples)
        return _Support(list(examples), self._embed(examples))

    def add_label(self, name: str, examples: Sequence[str]) -> list[str]:
        """Add label `name` defined by its `examples` (at least one). Returns the new label set."""
        self._check_fitted()
        self._require_new(name)
        examples = _check_examples(examples)
        self._support[name] = self._new_support(examples)
        self._refresh([name])
        return self.classes_

    def add_examples(self, name: str, examples: Sequence[str]) -> list[str]:
        """Add support `examples` to the existing label `name`; its prototype moves at once."""
        self._check_fitted()
        self._require(name)
        examples = _check_examples(examples)
        new = self._new_support(examples)
        old = self._support[name]
        self._support[name] = _Support(old.texts + new.texts, torch.cat([old.points, new.points]))
        self._refresh([name])
        return self.classes_

    def remove_label(self, name: str) -> list[str]:
        """Remove label `name` (it can no longer be predicted). At least one label must remain."""
        self._check_fitted()
        self._require(name)
        if self.n_classes_ == 1:
            raise DyntcError(f"cannot remove {name!r}: it is the only label left and predictions need at least one")
        del self._support[name]
        self._refresh([])
        return self.classes_

    def split_label(self, name: str, parts: Mapping[str, Sequence[str]], *, reassign: bool = False) -> list[str]:
        """Replace label `name` by the new labels of `parts` (``{new_name: examples}``, at least two).

        Rule: the given examples define the new labels; the old label and its prototype disappear.
        A new name may reuse `name` itself but no other existing label. With ``reassign=True`` every
        stored support example of the old label also joins the new label whose prototype (from the
        given examples) is nearest to it; its stored point is reused, nothing is re-encoded.
        """
        self._check_fitted()
        self._require(name)
        if not isinstance(parts, Mapping):
            raise DyntcError("parts must be a dict {new_label: [example texts, ...]}")
        if len(parts) < 2:
            raise DyntcError(f"split_label needs at least two new labels in parts, got {len(parts)}: "
                             "to give the label a new name use rename_label")
        checked = {}
        for new, examples in parts.items():
            self._require_new(new, "new label name", allowed=[name])
            checked[new] = _check_examples(examples, f"examples of {new!r}")
        new_sets = {new: self._new_support(ex) for new, ex in checked.items()}
        old = self._support.pop(name)
        self._support.update(new_sets)
        self._prototypes.pop(name, None)
        if reassign:
            names = list(new_sets)
            protos = torch.stack([p for p in self._means(names).values()])
            nearest = self._sq_distances(old.points, protos).argmin(1)
            for j, new in enumerate(names):
                idx = torch.nonzero(nearest == j).flatten()
                if len(idx):
                    s = self._support[new]
                    self._support[new] = _Support(s.texts + [old.texts[i] for i in idx.tolist()],
                                                  torch.cat([s.points, old.points[idx]]))
        self._refresh(new_sets)
        return self.classes_

    def merge_labels(self, names: Sequence[str], into: str) -> list[str]:
        """Merge the labels `names` (at least two) into one label `into` whose support set is their
        union. `into` may be one of `names` or a new name (not another existing label)."""
        self._check_fitted()
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise DyntcError("names must be a list of at least two label names")
        names = list(names)
        if len(names) < 2:
            raise DyntcError(f"merge_labels needs at least two labels to merge, got {len(names)}")
        if len(set(names)) != len(names):
            raise DyntcError(f"merge_labels got a label twice: {names}")
        for n in names:
            self._require(n, "names")
        self._require_new(into, "into", allowed=names)
        merged = [self._support.pop(n) for n in names]
        self._support[into] = _Support([t for s in merged for t in s.texts], torch.cat([s.points for s in merged]))
        self._refresh([into])
        return self.classes_

    def rename_label(self, old: str, new: str) -> list[str]:
        """Rename label `old` to `new` (a name not in use); its examples and prototype are kept."""
        self._check_fitted()
        self._require(old, "old")
        _check_name(new, "new")
        if new == old:
            raise DyntcError(f"rename_label: old and new names are both {old!r}")
        self._require_new(new, "new")
        self._support[new] = self._support.pop(old)
        self._prototypes[new] = self._prototypes.pop(old)
        self._matrix = None
        return self.classes_

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | Path) -> Path:
        """Write the classifier to directory `path`, atomically (a crash leaves the old one intact).

        Layout: ``config.json`` (format versions, encoder and model config, classifier params and
        labels), ``encoder.json`` (vocabulary), ``model.safetensors`` (weights, plus the tensors
        ``extra.support_points`` and ``extra.prototypes`` in ``classes_`` order) and
        ``support.json`` (every label's support texts, in the row order of ``support_points``).
        """
        from dyntc.checkpoint import atomic_directory, save_model, write_json

        self._check_fitted()
        classes = self.classes_
        params = self.get_params()
        meta = {
            "classifier": {
                "format": CLASSIFIER_FORMAT,
                "params": params,
                "classes": classes,
                "counts": [len(self._support[c].texts) for c in classes],
            }
        }
        tensors = {
            "support_points": torch.cat([self._support[c].points for c in classes]),
            "prototypes": self._prototype_matrix(),
        }
        path = Path(path)
        with atomic_directory(path) as tmp:
            save_model(tmp, self.model_, tensors=tensors, meta=meta)
            write_json(tmp / _SUPPORT_FILE, {"format": CLASSIFIER_FORMAT,
                                             "labels": {c: self._support[c].texts for c in classes}})
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DynamicClassifier":
        """Load a classifier written by :meth:`save`, on the CPU (set ``device`` afterwards to move it)."""
        from dyntc.checkpoint import read_config

        path = Path(path)
        config = read_config(path)  # checks presence, completeness and the weights format version
        try:
            return cls._from_directory(path, config)
        except (KeyError, TypeError, AttributeError, IndexError) as exc:  # well-formed JSON of the wrong shape
            raise DyntcError(f"classifier directory {str(path)!r} is damaged ({type(exc).__name__}: {exc}); "
                             "save it again or restore it") from exc

    @classmethod
    def _from_directory(cls, path: Path, config: dict) -> "DynamicClassifier":
        from dyntc.checkpoint import load_model

        info = config.get("meta", {}).get("classifier")
        if info is None:
            raise DyntcError(f"{path} holds a model saved by `dyntc train`, not a DynamicClassifier: "
                             "train one with `dyntc fit` or DynamicClassifier.fit")
        if info.get("format") != CLASSIFIER_FORMAT:
            raise DyntcError(f"{path} holds a classifier in format {info.get('format')!r}; this dyntc reads format "
                             f"{CLASSIFIER_FORMAT}: refit it or use the dyntc version that wrote it")
        support_file = path / _SUPPORT_FILE
        if not support_file.is_file():
            raise DyntcError(f"model directory {str(path)!r} is incomplete: missing {_SUPPORT_FILE}")
        try:
            stored = json.loads(support_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DyntcError(f"{support_file} is not valid JSON ({exc})") from exc
        model, tensors, _ = load_model(path)
        classes, counts = info["classes"], info["counts"]
        points, protos = tensors.get("support_points"), tensors.get("prototypes")
        labels = stored.get("labels", {})
        if (points is None or protos is None or sorted(labels) != classes or len(protos) != len(classes)
                or len(points) != sum(counts) or [len(labels[c]) for c in classes] != counts):
            raise DyntcError(f"{path} is inconsistent: its support.json, config.json and model.safetensors "
                             "do not describe the same labels; save the classifier again")
        params = {k: v for k, v in info["params"].items() if k in cls._param_names()}
        params["device"] = "cpu"
        self = cls(**params)
        self.model_ = model.eval()
        self._support = {}
        start = 0
        for c, n in zip(classes, counts):
            self._support[c] = _Support(list(labels[c]), points[start:start + n].float().clone())
            start += n
        self._prototypes = {c: protos[i].float().clone() for i, c in enumerate(classes)}
        self._matrix = None
        return self

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict:
        """A JSON-able summary: parameters, labels and their support counts."""
        self._check_fitted()
        return {"params": self.get_params(), "n_classes": self.n_classes_, "support_counts": self.support_counts()}

