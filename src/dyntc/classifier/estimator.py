"""``DynamicClassifier``: a text classifier whose label set changes without retraining.

An encoder maps texts into a metric space (Euclidean, or the hyperboloid model of hyperbolic space);
a label is the prototype (mean, or Fréchet mean) of its embedded support examples; a text gets the
label of the nearest prototype. Adding, removing, splitting, merging or renaming a label only
changes the support sets, so it takes effect at once, without training::

    from dyntc import DynamicClassifier

    clf = DynamicClassifier().fit(texts, labels)                 # MiniLM backbone, Euclidean metric
    clf.add_label("book_hotel", ["find me a hotel in paris", "book a room for two nights", ...])
    clf.predict(["I need a room in rome for friday"])          # -> ["book_hotel"]
    clf.save("model/");  clf = DynamicClassifier.load("model/")

The parts: :class:`~dyntc.classifier.model.MetricSpace` (encoder + metric), the
:class:`~dyntc.classifier.labels.LabelSet` (support sets, prototypes, label operations),
:mod:`~dyntc.classifier.fit` (training) and :class:`~dyntc.classifier.store.ModelStore`
(versioned persistence). This class holds the scikit-learn-style parameters, fit, fine-tuning and
prediction; its parameter conventions, label operations, calibration and persistence methods come
from the mixins next to what they use: :class:`~dyntc.classifier.params.ParamsMixin`,
:class:`~dyntc.classifier.labels.LabelOperationsMixin`,
:class:`~dyntc.classifier.calibration.CalibrationMixin` and :class:`~dyntc.classifier.saving.PersistenceMixin`.

The SRU encoder's vocabulary is fixed at ``fit`` (the training words GloVe knows). With
``extend_vocab=True`` (the default) the words of later examples that GloVe knows are appended to it
(their frozen GloVe vectors, no training needed), so new labels are not reduced to ``<unk>`` tokens;
texts embedded earlier keep their points.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch

from dyntc.classifier import fit as trainer
from dyntc.classifier.calibration import CalibrationMixin
from dyntc.classifier.labels import LabelOperationsMixin, LabelSet, check_examples
from dyntc.classifier.model import MetricSpace
from dyntc.classifier.replay import recorded
from dyntc.classifier.saving import PersistenceMixin
from dyntc.classifier.params import (
    ParamsMixin, encoder_options, network_options, space_options, train_config, training_mode,
)
from dyntc.errors import DyntcError, NotFittedError, is_int


class DynamicClassifier(ParamsMixin, LabelOperationsMixin, CalibrationMixin, PersistenceMixin):
    """Nearest-prototype text classifier with an editable label set (scikit-learn conventions).

    Parameters (stored as given by the constructor; validated by :meth:`fit`):

    encoder
        ``"minilm"`` (default: all-MiniLM-L6-v2, frozen; its own embeddings, no head unless
        ``train="head"``), the path of a local sentence-transformers model, or ``"sru"`` (frozen
        GloVe + SRU, the paper's encoder; vocabulary from the training texts).
    metric
        ``"euclidean"`` (default) or ``"hyperbolic"`` (hyperboloid model; prototypes are Fréchet
        means). The defaults are what won on held-out data in the CLINC150 scenario
        (``examples/intent_scenario.py``, docs/results.md §9).
    train
        What :meth:`fit` trains. Pretrained encoders: ``"none"`` (the default: prototypes of the
        backbone's own sentence embeddings; fit only embeds the texts), ``"backbone"`` (episodic
        prototypical fine-tuning of the transformer's top ``train_layers`` layers, 2 unless
        ``encoder_options`` says otherwise; minutes on a CPU: set ``time_budget_s``) or ``"head"`` (a
        projection head of ``hidden_size`` x ``num_layers`` on the frozen backbone). SRU:
        ``"encoder"`` (its only choice). ``None`` = ``"none"`` for pretrained encoders, ``"encoder"``
        for the SRU.
    hidden_size, num_layers, dropout, max_len
        Encoder shape: output size, layers, dropout and tokens kept per text (``train="head"`` and
        the SRU). ``None`` means the encoder's default (SRU: 4 layers, dropout 0.5; head: 1 layer,
        dropout 0.1).
    embeddings
        SRU only: a GloVe text file (None = the packaged glove.6B.50d).
    encoder_options
        Extra keyword options for the encoder factory (e.g. for a pretrained encoder).
    episodes, lr, n_support, n_query, max_classes, eval_every, patience, time_budget_s
        Episodic training: at most ``episodes`` episodes of ``max_classes`` classes with ``n_support``
        support examples each and ``n_query`` queries in total; Adam with learning rate ``lr``. With a
        dev set, accuracy is checked every ``eval_every`` episodes and training stops after
        ``patience`` checks without improvement (the best weights are kept).
    hard_fraction
        With more labels than ``max_classes``, the share of each episode's labels (at most 0.5)
        drawn as confusable partners of the others rather than at random: each partner is drawn
        for a random anchor label with probability proportional to how confusable the two are,
        learnt from the training episodes' own predictions. 0 (default) = the paper's uniform draw.
    extend_vocab
        Append the GloVe-known new words of later examples to the SRU vocabulary (see module doc).
    debias
        Correct each label's distances for its support size (subtract ``σ²/n``, the expected excess
        squared distance of a prototype estimated from ``n`` examples; see
        :mod:`dyntc.classifier.labels`), so that a 5-example label is not predicted less often than a
        100-example one. Applies at once; a change drops the calibration.
    batch_size
        Texts per batch when embedding (prediction, label operations).
    seed, device, progress
        Random seed; torch device for training and prediction (``"cpu"``, ``"cuda"``); progress bars.
    """

    def __init__(
        self,
        encoder: str = "minilm",
        metric: str = "euclidean",
        *,
        train: str | None = None,
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
        hard_fraction: float = 0.0,
        eval_every: int = 100,
        patience: int = 10,
        time_budget_s: float | None = None,
        extend_vocab: bool = True,
        debias: bool = True,
        batch_size: int = 256,
        seed: int = 0,
        device: str = "cpu",
        progress: bool = False,
    ):
        self.encoder = encoder
        self.metric = metric
        self.train = train
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
        self.hard_fraction = hard_fraction
        self.eval_every = eval_every
        self.patience = patience
        self.time_budget_s = time_budget_s
        self.extend_vocab = extend_vocab
        self.debias = debias
        self.batch_size = batch_size
        self.seed = seed
        self.device = device
        self.progress = progress

    # ------------------------------------------------------------------ fitted state

    def _check_fitted(self) -> None:
        if getattr(self, "space_", None) is None:
            raise NotFittedError(
                "this DynamicClassifier is not fitted yet: call fit(texts, labels) or DynamicClassifier.load(path) first"
            )

    @property
    def model_(self):
        """The trained :class:`~dyntc.models.PrototypicalNetwork`."""
        self._check_fitted()
        return self.space_.model

    @property
    def labels_(self) -> LabelSet:
        """The label set (support examples, prototypes, label operations)."""
        self._check_fitted()
        return self._labels

    @property
    def classes_(self) -> list[str]:
        """The current label set, sorted (the column order of :meth:`predict_proba`)."""
        return self.labels_.classes

    @property
    def n_classes_(self) -> int:
        return len(self.labels_)

    def copy(self) -> "DynamicClassifier":
        """A copy with its own label set, sharing the trained network: label operations on the copy
        leave this classifier unchanged (a reader of it keeps seeing the old labels). Training the copy
        (:meth:`fine_tune`) would change the shared network: refit or load instead."""
        self._check_fitted()
        other = copy.copy(self)
        other.__dict__.pop("_replay", None)  # a copy starts without a replay log (replay.py)
        other._labels = self._labels.copy()
        return other

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

        self._validate_params()
        texts, labels = trainer.check_pairs(texts, labels)
        classes = sorted(set(labels))
        dev_pair = trainer.check_dev(dev, classes)
        training = training_mode(self)
        if training != "none":
            trainer.episodic_classes(labels, classes, self.n_support)  # fail before building the encoder
        torch.manual_seed(self.seed)
        encoder = create_encoder(self.encoder, texts, **encoder_options(self))
        model = PrototypicalNetwork(encoder, self.metric, **network_options(self))
        items = encoder.featurize(texts)  # once, for the episodes and the prototypes
        self.train_result_ = None
        if training != "none":
            self.train_result_ = trainer.train_episodic(model, texts, labels, items, dev_pair,
                                                         train_config(self, self.episodes, self.lr))
        self.space_ = MetricSpace(model, **space_options(self))
        self._install(texts, labels, items)
        self.calibration_ = None
        self._source: tuple[str, int] | None = None
        return self

    @recorded
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
        self._check_fitted()
        trainer.fine_tune(self, texts, labels, episodes=episodes, lr=lr, dev=dev, add_to_support=add_to_support)
        return self

    def _install(self, texts: Sequence[str], labels: Sequence[str], items: list | None = None,
                 parts: Sequence[int] | None = None) -> None:
        """A fresh label set from (`texts`, `labels`) (and each text's part of its label, for merged
        labels): every text embedded again, every prototype rebuilt."""
        points = self.space_.embed(texts, items)
        groups: dict[str, list[int]] = {}
        for i, y in enumerate(labels):
            groups.setdefault(y, []).append(i)
        self._labels = LabelSet.from_groups(self.space_, {
            y: ([texts[i] for i in idx], points[torch.as_tensor(idx, dtype=torch.long)].clone(),
                None if parts is None else [parts[i] for i in idx])
            for y, idx in groups.items()
        }, debias=self.debias)
        self._labels.changed = set(groups)

    # ------------------------------------------------------------------ prediction

    def _query(self, texts: Sequence[str]) -> torch.Tensor:
        self._check_fitted()
        texts = check_examples(texts, "texts", allow_empty=True)
        return self._labels.sq_distances(self.space_.embed(texts)) if texts else torch.zeros(0, self.n_classes_)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Points of `texts` in the metric space: ``(n, d)`` Euclidean, ``(n, d + 1)`` on the hyperboloid."""
        self._check_fitted()
        return self.space_.embed(check_examples(texts, "texts", allow_empty=True)).numpy()

    def predict(self, texts: Sequence[str], *, reject: bool = False) -> list[str | None]:
        """The label of the nearest prototype for every text. With ``reject=True`` (after
        :meth:`calibrate`) a text farther than the calibrated threshold from every prototype is
        out of scope and gets ``None``."""
        d2 = self._query(texts)
        classes = self.classes_
        labels: list[str | None] = [classes[i] for i in d2.argmin(1).tolist()]
        if reject:
            threshold = self.require_calibration("predict(reject=True)").threshold
            far = (d2.min(1).values.clamp_min(0).sqrt() > threshold).tolist() if len(d2) else []
            labels = [None if out else label for label, out in zip(labels, far)]
        return labels

    def decision_function(self, texts: Sequence[str]) -> np.ndarray:
        """``-d²`` to every prototype, ``(n, n_classes)`` (higher = nearer); columns in ``classes_``
        order. :meth:`predict`, :meth:`predict_proba` and :meth:`top_k` all derive from it, so a
        caller needing several of them embeds the texts once with this."""
        return (-self._query(texts).double()).numpy()

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``softmax(-d² / T)`` over the prototypes, ``(n, n_classes)``; columns in ``classes_`` order.
        Until :meth:`calibrate` fits T it is ``1/s`` for the model's logit scale s (``prior_temperature_``)."""
        return self.proba_from_scores(-self._query(texts))

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

    def prediction_records(self, scores: np.ndarray, *, top_k: int = 1, proba: bool = False,
                           reject: bool = False) -> list[dict]:
        """One JSON-able answer per row of `scores` (from :meth:`decision_function`): ``label`` (None
        with `reject` when the nearest prototype is farther than the calibrated threshold, as in
        :meth:`predict`), with `proba` its ``probability``, with `top_k` > 1 the ``top_k`` nearest
        labels and their distances (numbers rounded to 6 digits). ``dyntc predict`` and ``dyntc
        serve`` answer with these records."""
        if not (is_int(top_k) and top_k >= 1):
            raise DyntcError(f"top_k must be an integer >= 1, got {top_k!r}")
        scores = torch.as_tensor(scores)
        threshold = self.require_calibration("reject").threshold if reject else None
        ranked = self.nearest_labels(-scores, top_k)
        probs = self.proba_from_scores(scores).max(1).tolist() if proba else None
        records = []
        for i, row in enumerate(ranked):
            record: dict = {"label": None if threshold is not None and row[0][1] > threshold else row[0][0]}
            if probs is not None:
                record["probability"] = round(probs[i], 6)
            if top_k > 1:
                record["top_k"] = [{"label": label, "distance": round(d, 6)} for label, d in row]
            records.append(record)
        return records

    def score(self, texts: Sequence[str], labels: Sequence[str]) -> float:
        """Accuracy of :meth:`predict` on (`texts`, `labels`)."""
        texts, labels = trainer.check_pairs(texts, labels)
        return float(np.mean([p == y for p, y in zip(self.predict(texts), labels)]))

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict:
        """A JSON-able summary: parameters, labels and their support counts."""
        self._check_fitted()
        return {"params": self.get_params(), "n_classes": self.n_classes_, "support_counts": self.support_counts(),
                "version": self.version_}
