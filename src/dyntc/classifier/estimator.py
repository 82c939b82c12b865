"""``DynamicClassifier``: a text classifier whose label set changes without retraining.

An encoder maps texts into a metric space (Euclidean, or the hyperboloid model of hyperbolic space);
a label is the set of its embedded support examples and their prototype (mean, or Fréchet mean). A
text gets the best-scored label: by default (``head="cosine"``) under a cosine head over the stored
support points, retrained in a background thread after label operations, in which a label changed
since the last refresh is scored at once by its normalised prototype (:mod:`~dyntc.classifier.live_head`);
with ``head=None``, the nearest prototype. Adding, removing, splitting, merging or renaming a label
only changes the support sets, so it takes effect at once, without waiting for training::

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
import threading
from collections.abc import Sequence

import numpy as np
import torch

from dyntc.classifier import fit as trainer
from dyntc.classifier import live_head
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
    """Text classifier with an editable label set (scikit-learn conventions): a cosine head over the
    support examples' points (default) or the nearest prototype.

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
        100-example one. Applies at once; a change drops the calibration. (With the head it only
        matters if ``head_options`` adds the prototype score.)
    head
        The scorer. ``"cosine"`` (default): a cosine classifier over the encoder-space coordinates
        of the stored support points (on the hyperboloid, the spatial part: the direction of the log
        map at the origin), score ``16 · (cos(x, w_c) − o_c)``, trained on every stored example by
        :meth:`fit` and by a background refresh about a second after the last label operation; a
        label changed since the last refresh is scored at once by its normalised prototype (minus an
        offset). ``decision_function`` gives these scores and ``top_k`` / ``prediction_records`` the
        distances ``sqrt(2 − 2 s / 16)`` they stand for (:mod:`~dyntc.classifier.live_head`). ``None``:
        the support-size-corrected nearest-prototype scorer, ``-d²`` (the default before the head).
        Applies at once (the head is trained at the next prediction; the calibration is dropped).
    head_options
        Options of the cosine head: the fields of :class:`~dyntc.classifier.head.HeadConfig`
        (``tau``, ``pull``, ``scale``, ``learn_scale``, ``max_iter``, ``proto_weight``,
        ``imprint_offset``, ``proto_scale``; defaults chosen in docs/intents.md) and
        ``refresh_delay`` (seconds of quiet after a label operation before the background refresh,
        default 1). None = the defaults.
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
        head: str | None = "cosine",
        head_options: dict | None = None,
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
        self.head = head
        self.head_options = head_options
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

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_head_refresh", None)  # a lock and a thread: a deep copy or an unpickled one makes its own
        return state

    def copy(self) -> "DynamicClassifier":
        """A copy with its own label set, sharing the trained network: label operations on the copy
        leave this classifier unchanged (a reader of it keeps seeing the old labels). Training the copy
        (:meth:`fine_tune`) would change the shared network: refit or load instead."""
        self._check_fitted()
        other = copy.copy(self)
        other.__dict__.pop("_replay", None)  # a copy starts without a replay log (replay.py)
        other.__dict__.pop("_head_refresh", None)  # ... and refreshes its own head in its own thread
        if self.head_options is not None:
            other.head_options = dict(self.head_options)
        other._labels = self._labels.copy()  # shares the head's last refresh: immutable
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
        self._adopt(model, texts, labels, items)
        return self

    @classmethod
    def from_network(cls, network, texts: Sequence[str], labels: Sequence[str], **params) -> "DynamicClassifier":
        """A fitted classifier around an already trained :class:`~dyntc.models.PrototypicalNetwork`
        (``dyntc train`` writes its models this way): one prototype per label from (`texts`,
        `labels`), nothing trained but the head (if any). `params` are the constructor's; ``encoder``,
        ``metric`` and the encoder's shape default to the network's (a different ``metric`` is an
        error). ``head=None, debias=False`` predicts exactly by the network's nearest prototype."""
        from dyntc.encoders import encoder_name
        from dyntc.models import PrototypicalNetwork

        if not isinstance(network, PrototypicalNetwork):
            raise DyntcError(f"network must be a PrototypicalNetwork, got {type(network).__name__}: an MLP has an "
                             "output layer, not prototypes")
        if params.setdefault("metric", network.metric) != network.metric:
            raise DyntcError(f"metric={params['metric']!r} but the network measures with {network.metric!r}")
        config = network.encoder.config()
        params.setdefault("encoder", encoder_name(config))
        for name in ("hidden_size", "num_layers", "dropout", "max_len", "embeddings"):
            if name in config and name in cls._param_names():
                params.setdefault(name, config[name])
        clf = cls(**params)
        clf._validate_params()
        texts, labels = trainer.check_pairs(texts, labels)
        clf.train_result_ = None
        clf._adopt(network, texts, labels)
        return clf

    def _adopt(self, model, texts: Sequence[str], labels: Sequence[str], items: list | None = None) -> None:
        """Make `model` this classifier's network and (`texts`, `labels`) its label set."""
        self.space_ = MetricSpace(model, **space_options(self))
        self._install(texts, labels, items)
        self.calibration_ = None
        self._source: tuple[str, int] | None = None
        if self.head is not None:
            self.refresh(wait=True)

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
        if self.head is not None:
            self.refresh(wait=True)
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

    # ------------------------------------------------------------------ the cosine head

    def _scorer(self) -> str:
        """What the scores are: ``"prototype"`` (``head=None``) or the head's name."""
        return "prototype" if self.head is None else self.head

    def _head_config(self) -> tuple[live_head.HeadConfig, float]:
        return live_head.head_config(self.head_options)

    def _head_runtime(self) -> dict:
        """This classifier's own refresh lock and background refresher (a copy makes its own)."""
        runtime = self.__dict__.get("_head_refresh")
        if runtime is None:
            runtime = self.__dict__.setdefault("_head_refresh", {
                "lock": threading.Lock(),
                "refresher": live_head.Refresher(self._refresh_in_background, self._head_config()[1]),
            })
        return runtime

    def _head_view(self, labels: LabelSet) -> live_head.View:
        config = self._head_config()[0]
        if labels.head is None:  # never trained (just loaded, refitted, options changed): train now
            self._refresh_labels(labels, config)
        return live_head.view(labels, config)

    def _refresh_labels(self, labels: LabelSet, config: live_head.HeadConfig, *, force: bool = False) -> dict | None:
        """Train the head on `labels` as they are and install the result (one assignment); under this
        classifier's refresh lock, so never two at once. Labels changed meanwhile stay imprinted and
        schedule the next refresh. Returns the refresh's info (None if another thread just did it)."""
        with self._head_runtime()["lock"]:
            if labels.head is not None and not force:
                return None
            trained, snapshot = live_head.train(labels, config)
            if config != self._head_config()[0]:  # options changed while it trained: the result is stale
                return None
            labels.head = trained
            now = live_head.view(labels, config)
        changed = set(map(id, now.supports)) - set(map(id, snapshot.supports))
        if changed and labels is self._labels:
            self._head_runtime()["refresher"].schedule(labels)
        return {**trained.info, "imprinted": list(now.imprinted)}

    def _refresh_in_background(self, labels: LabelSet) -> None:
        if self.head is not None:
            self._refresh_labels(labels, self._head_config()[0], force=True)

    def _labels_changed(self) -> None:
        """After a label operation: touched labels are imprinted at once; a refresh follows in the background."""
        if self.head is not None and self._labels.head is not None:
            runtime = self._head_runtime()
            runtime["refresher"].delay = self._head_config()[1]
            runtime["refresher"].schedule(self._labels)

    def refresh(self, wait: bool = True) -> dict | None:
        """Retrain the cosine head on every stored example now. ``wait=True``: synchronously (after a
        background refresh in progress, if any), returning what it did (``seconds``, ``examples``,
        ``imprinted``: labels changed meanwhile); ``wait=False``: start the background refresh at once
        and return None. Label operations schedule it by themselves; this is for tests and batch jobs."""
        self._check_fitted()
        if not isinstance(wait, bool):
            raise DyntcError(f"wait must be True or False, got {wait!r}")
        if self.head is None:
            raise DyntcError("refresh() applies to the cosine head; this classifier has head=None")
        if not wait:
            self._head_runtime()["refresher"].schedule(self._labels, delay=0.0)
            return None
        return self._refresh_labels(self._labels, self._head_config()[0], force=True)

    def wait_for_refresh(self, timeout: float | None = None) -> bool:
        """Block until no background refresh is pending or running (at most `timeout` seconds); True if idle."""
        runtime = self.__dict__.get("_head_refresh")
        return True if runtime is None else runtime["refresher"].wait(timeout)

    def head_status(self) -> dict | None:
        """The head's state, JSON-able: ``imprinted`` (labels scored by their prototype until the next
        refresh), ``refreshing`` (a background refresh pending or running) and the last refresh's
        ``seconds`` and ``examples``; None with ``head=None`` or before the head was first trained."""
        self._check_fitted()
        labels = self._labels
        if self.head is None or labels.head is None:
            return None
        view = live_head.view(labels, self._head_config()[0])
        runtime = self.__dict__.get("_head_refresh")
        return {"head": self.head, "imprinted": list(view.imprinted),
                "refreshing": bool(runtime and runtime["refresher"].busy),
                "seconds": round(float(labels.head.info.get("seconds", 0.0)), 4),
                "examples": int(labels.head.info.get("examples", 0))}

    # ------------------------------------------------------------------ prediction

    def _scores(self, texts: Sequence[str]) -> torch.Tensor:
        """Scores of `texts` for every label, ``(n, n_classes)`` float64 (higher = better)."""
        self._check_fitted()
        texts = check_examples(texts, "texts", allow_empty=True)
        labels = self._labels
        if not texts:
            return torch.zeros(0, len(labels), dtype=torch.float64)
        points = self.space_.embed(texts)
        if self.head is None:
            return -labels.sq_distances(points).double()
        return live_head.scores(self._head_view(labels), labels, points, self._head_config()[0])

    def squared_distances(self, scores: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The squared distances that :meth:`decision_function`'s scores stand for, ``(n, n_classes)``:
        ``-s`` with ``head=None`` (``d²`` to the nearest part's prototype, support-size corrected); with
        the cosine head ``2 − 2 s / scale``, the squared distance on the unit sphere between the text's
        direction and the label's weight (plus twice the offset of an imprinted label). The nearest
        label is always the best-scored one; ``top_k``, the records and the rejection threshold use these."""
        s = torch.as_tensor(scores).double()
        if self.head is None:
            return -s
        return live_head.sq_distances(s, self._head_config()[0])

    def _query(self, texts: Sequence[str]) -> torch.Tensor:
        """Squared distances of `texts` to every label (:meth:`squared_distances` of their scores)."""
        return self.squared_distances(self._scores(texts))

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Points of `texts` in the metric space: ``(n, d)`` Euclidean, ``(n, d + 1)`` on the hyperboloid."""
        self._check_fitted()
        return self.space_.embed(check_examples(texts, "texts", allow_empty=True)).numpy()

    def predict(self, texts: Sequence[str], *, reject: bool = False) -> list[str | None]:
        """The best-scored label for every text (the nearest prototype with ``head=None``). With
        ``reject=True`` (after :meth:`calibrate`) a text farther than the calibrated threshold from
        every label (with the head: whose top score is below the matching score) is out of scope and
        gets ``None``."""
        threshold = self.require_calibration("predict(reject=True)").threshold if reject else None
        return [r["label"] for r in self._records(self._scores(texts), 1, False, threshold)]

    def decision_function(self, texts: Sequence[str]) -> np.ndarray:
        """Every label's score, ``(n, n_classes)`` (higher = better); columns in ``classes_`` order: the
        cosine head's ``scale · (cos − offset)``, or ``-d²`` to every prototype with ``head=None``.
        :meth:`predict`, :meth:`predict_proba`, :meth:`top_k` and :meth:`prediction_records` all derive
        from it, so a caller needing several of them embeds the texts once with this."""
        return self._scores(texts).numpy()

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``softmax(scores / T)``, ``(n, n_classes)``; columns in ``classes_`` order. Until :meth:`calibrate`
        fits T it is ``prior_temperature_`` (1 with the head; ``1/s`` for the model's logit scale s
        with ``head=None``)."""
        return self.proba_from_scores(self._scores(texts))

    def top_k(self, texts: Sequence[str], k: int = 3) -> list[list[tuple[str, float]]]:
        """For every text, the `k` best labels as ``(label, distance)``, nearest (best-scored) first;
        the distance is the square root of :meth:`squared_distances`."""
        if not (is_int(k) and k >= 1):
            raise DyntcError(f"k must be an integer >= 1, got {k!r}")
        return self.nearest_labels(self._query(texts), k)

    def nearest_labels(self, sq_distances: torch.Tensor | np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """From squared distances ``(n, n_classes)`` (``squared_distances(decision_function(texts))``), the
        `k` nearest labels of every row as ``(label, distance)``, nearest first."""
        d2 = torch.as_tensor(sq_distances)
        values, index = d2.topk(min(k, d2.shape[1]), dim=1, largest=False)
        classes = self.classes_
        return [[(classes[j], v) for j, v in zip(row_i, row_v)]
                for row_i, row_v in zip(index.tolist(), values.clamp_min(0).sqrt().tolist())]

    def _records(self, scores: torch.Tensor, top_k: int, proba: bool, threshold: float | None) -> list[dict]:
        ranked = self.nearest_labels(self.squared_distances(scores), top_k)
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

    def prediction_records(self, scores: np.ndarray, *, top_k: int = 1, proba: bool = False,
                           reject: bool = False) -> list[dict]:
        """One JSON-able answer per row of `scores` (from :meth:`decision_function`): ``label`` (None
        with `reject` when the nearest label is farther than the calibrated threshold, as in
        :meth:`predict`), with `proba` its ``probability``, with `top_k` > 1 the ``top_k`` nearest
        labels and their distances (:meth:`top_k`'s; numbers rounded to 6 digits). ``dyntc predict``
        and ``dyntc serve`` answer with these records."""
        if not (is_int(top_k) and top_k >= 1):
            raise DyntcError(f"top_k must be an integer >= 1, got {top_k!r}")
        threshold = self.require_calibration("reject").threshold if reject else None
        return self._records(torch.as_tensor(scores).double(), top_k, proba, threshold)

    def score(self, texts: Sequence[str], labels: Sequence[str]) -> float:
        """Accuracy of :meth:`predict` on (`texts`, `labels`)."""
        texts, labels = trainer.check_pairs(texts, labels)
        return float(np.mean([p == y for p, y in zip(self.predict(texts), labels)]))

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict:
        """A JSON-able summary: parameters, labels and their support counts."""
        self._check_fitted()
        return {"params": self.get_params(), "n_classes": self.n_classes_, "support_counts": self.support_counts(),
                "version": self.version_, "head": self.head_status()}
