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

The parts, none of which knows this class: :class:`~dyntc.classifier.space.MetricSpace` (encoder +
metric), the :class:`~dyntc.classifier.labels.LabelSet` (support sets, prototypes, label
operations), :mod:`~dyntc.classifier.params` (what the parameters accept and mean),
:mod:`~dyntc.classifier.trainer` (the trainer: takes a network and a config, returns what it trained),
:class:`~dyntc.classifier.live_head.LiveHead` (the cosine head and its background refresh),
:mod:`~dyntc.classifier.calibration` and :mod:`~dyntc.classifier.saving` over the versioned
:class:`~dyntc.classifier.store.ModelStore`. This class holds the state and the public methods.

The SRU encoder's vocabulary is fixed at ``fit`` (the training words GloVe knows). With
``extend_vocab=True`` (the default) the words of later examples that GloVe knows are appended to it
(their frozen GloVe vectors, no training needed), so new labels are not reduced to ``<unk>`` tokens;
texts embedded earlier keep their points.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch

from sklearn.base import BaseEstimator, ClassifierMixin

from dyntc.classifier import answers, hygiene, rejection, replay, saving, suggestions, trainer, tuning
from dyntc.classifier import discovery as _discovery
from dyntc.classifier.calibration import (
    OOS_WEIGHT, Calibration, check_max_drop, check_oos_weight, check_threshold, require_calibration,
)
from dyntc.classifier.labels import LabelSet, check_examples
from dyntc.classifier.live_head import LiveHead, adopt
from dyntc.classifier.space import MetricSpace
from dyntc.classifier.params import (
    check_new_params, encoder_options, network_options, space_options, train_config, training_mode, validate_params,
)
from dyntc.classifier.replay import recorded
from dyntc.classifier.store import ModelStore
from dyntc.classifier.targets import LabelCodec, as_texts, flat_labels, json_label
from dyntc.core.machine import seeded
from dyntc.errors import DyntcError, NotFittedError



class DynamicClassifier(ClassifierMixin, BaseEstimator):
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
        offset). ``label_scores`` gives these scores and ``top_k`` / ``prediction_records`` the
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

    #: Whether the cosine head refreshes by itself: in a background thread after label operations, and
    #: at the first prediction of a classifier never refreshed (copies inherit it). Set False on an
    #: instance to refresh only by calling :meth:`refresh`; changed labels are then scored by their
    #: prototype and no prediction ever trains (a service holding many versions of one model refreshes
    #: only the newest and passes the result on with :meth:`adopt_head`).
    auto_refresh: bool = True

    def __init__(
        self,
        encoder: str = "minilm",
        metric: str = "euclidean",
        *,
        train: str | None = None,
        hidden_size: int = 128, num_layers: int | None = None, dropout: float | None = None, max_len: int = 64,
        embeddings: str | None = None,
        encoder_options: dict | None = None,
        episodes: int = 1000, lr: float = 1e-3, n_support: int = 4, n_query: int = 64, max_classes: int = 50,
        hard_fraction: float = 0.0,
        eval_every: int = 100, patience: int = 10, time_budget_s: float | None = None,
        extend_vocab: bool = True,
        debias: bool = True,
        head: str | None = "cosine",
        head_options: dict | None = None,
        batch_size: int = 256,
        seed: int = 0, device: str = "cpu", progress: bool = False,
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

    # ------------------------------------------------------------------ scikit-learn conventions
    # get_params, clone, __repr__ and score's accuracy come from BaseEstimator and ClassifierMixin.

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # one text per sample, not a feature matrix
        tags.input_tags.string = True
        tags.non_deterministic = self.train not in (None, "none")  # episodic training draws episodes
        return tags

    def __sklearn_is_fitted__(self) -> bool:
        return getattr(self, "space_", None) is not None

    @recorded
    def set_params(self, **params) -> Self:
        """Set constructor parameters; they apply at the next ``fit`` (``device``, ``batch_size``,
        ``extend_vocab``, ``debias``, ``head``, ``head_options`` and ``progress`` apply at once: a new
        head or new head options retrain the head at the next prediction and drop the calibration).
        Unlike scikit-learn's own estimators, a bad value is refused here, not at the next ``fit``."""
        check_new_params(type(self).__name__, self._get_param_names(), params)
        for name, value in params.items():
            labels = self.__dict__.get("_labels")
            if name in ("head", "head_options") and value != getattr(self, name):
                live = self.__dict__.pop("_live", None)
                if live is not None:
                    live.retire()  # a refresh it is running is dropped, not installed
                if labels is not None:
                    labels.head = labels.head_view = None  # retrained at the next prediction
                    self.calibration_ = None
            if name == "debias" and labels is not None and labels.debias != value:
                labels.debias = value
                self.calibration_ = None  # fitted on the other distances
            setattr(self, name, value)
        if getattr(self, "space_", None) is not None:
            for name, value in space_options(self.get_params()).items():
                setattr(self.space_, name, value)
        return self

    # ------------------------------------------------------------------ fitted state

    def _check_fitted(self) -> None:
        if getattr(self, "space_", None) is None:
            raise NotFittedError(
                "this DynamicClassifier is not fitted yet: call fit(texts, labels) or DynamicClassifier.load(path) first"
            )

    @property
    def model_(self):
        """The trained :class:`~dyntc.core.models.PrototypicalNetwork`."""
        self._check_fitted()
        return self.space_.model

    @property
    def labels_(self) -> LabelSet:
        """The label set (support examples, prototypes, label operations)."""
        self._check_fitted()
        return self._labels

    @property
    def classes_(self) -> np.ndarray:
        """The current labels as a NumPy array, sorted as ``np.unique`` sorts them (the column order of
        :meth:`decision_function` and :meth:`predict_proba`); the label objects ``fit`` was given."""
        return self._targets.array(self.labels_.classes)

    @property
    def _targets(self) -> LabelCodec:
        """Label objects <-> the label set's names (:mod:`~dyntc.classifier.targets`)."""
        return self.__dict__.setdefault("_codec", LabelCodec())

    @property
    def n_classes_(self) -> int:
        return len(self.labels_)

    @property
    def store_id_(self) -> str | None:
        """The id of the store this classifier was loaded from or last committed to (None if never): a
        store re-created or replaced at the same location has another id."""
        self._check_fitted()
        return self._source[0] if self._source else None

    @property
    def version_(self) -> int | None:
        """The store version this classifier was loaded from or last committed as (None if never)."""
        self._check_fitted()
        return self._source[1] if self._source else None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_live", None)  # a lock and a thread: a deep copy or an unpickled one makes its own
        return state

    def copy(self) -> "DynamicClassifier":
        """A copy with its own label set, sharing the trained network: label operations on the copy
        leave this classifier unchanged (a reader of it keeps seeing the old labels). Training the copy
        (:meth:`fine_tune`) would change the shared network: refit or load instead."""
        self._check_fitted()
        other = copy.copy(self)
        other.__dict__.pop("_replay", None)  # a copy starts without a replay log (replay.py)
        other.__dict__.pop("_live", None)  # ... and refreshes its own head in its own thread
        if self.head_options is not None:
            other.head_options = dict(self.head_options)
        other._labels = self._labels.copy()  # shares the head's last refresh: immutable
        return other

    # ------------------------------------------------------------------ fit / fine-tune

    def fit(self, texts: Sequence[str], labels: Sequence[Any], dev: tuple[Sequence[str], Sequence[Any]] | None = None
            ) -> "DynamicClassifier":
        """Train the encoder episodically on (`texts`, `labels`) and build one prototype per label from
        all of its training examples. `texts`: a list, 1-D array or Series of strings; `labels`: one
        hashable label per text, all of one type (str, int, tuple, ...; :mod:`~dyntc.classifier.targets`).

        `dev` = ``(texts, labels)`` enables early stopping on dev accuracy (dev labels must be among
        the training labels). Labels with fewer than ``n_support + 1`` examples take no part in the
        episodes but still get a prototype; at least two labels must have enough examples. Duplicate
        texts, a text under two labels and labels with few examples are warned about
        (:class:`~dyntc.errors.DyntcWarning`, :mod:`~dyntc.classifier.hygiene`).
        """
        from dyntc.core.encoders import create_encoder
        from dyntc.core.models import PrototypicalNetwork

        params = self.get_params()
        validate_params(params)
        codec = LabelCodec.of(flat_labels(labels))
        texts, labels = trainer.check_pairs(*codec.encoded(texts, labels))
        hygiene.check_training_set(texts, codec.labels(labels), stacklevel=2)
        dev = codec.encoded_dev(dev)
        classes = sorted(set(labels))
        dev_pair = trainer.check_dev(dev, classes)
        training = training_mode(params)
        if training != "none":
            trainer.episodic_classes(labels, classes, self.n_support)  # fail before building the encoder
        with seeded(self.seed):
            encoder = create_encoder(self.encoder, texts, **encoder_options(params))
            model = PrototypicalNetwork(encoder, self.metric, **network_options(params))
            items = encoder.featurize(texts)  # once, for the episodes and the prototypes
            self.train_result_ = None
            if training != "none":
                self.train_result_ = trainer.train_episodic(model, texts, labels, items, dev_pair,
                                                             train_config(params, self.episodes, self.lr))
            self._adopt(model, texts, labels, items, codec)
        return self

    @classmethod
    def from_network(cls, network, texts: Sequence[str], labels: Sequence[str], **params) -> "DynamicClassifier":
        """A fitted classifier around an already trained :class:`~dyntc.core.models.PrototypicalNetwork`
        (``dyntc train`` writes its models this way): one prototype per label from (`texts`,
        `labels`), nothing trained but the head (if any). `params` are the constructor's; ``encoder``,
        ``metric`` and the encoder's shape default to the network's (a different ``metric`` is an
        error). ``head=None, debias=False`` predicts exactly by the network's nearest prototype."""
        from dyntc.core.encoders import encoder_name
        from dyntc.core.models import PrototypicalNetwork

        if not isinstance(network, PrototypicalNetwork):
            raise DyntcError(f"network must be a PrototypicalNetwork, got {type(network).__name__}: an MLP has an "
                             "output layer, not prototypes")
        if params.setdefault("metric", network.metric) != network.metric:
            raise DyntcError(f"metric={params['metric']!r} but the network measures with {network.metric!r}")
        config = network.encoder.config()
        params.setdefault("encoder", encoder_name(config))
        for name in ("hidden_size", "num_layers", "dropout", "max_len", "embeddings"):
            if name in config and name in cls._get_param_names():
                params.setdefault(name, config[name])
        clf = cls(**params)
        validate_params(clf.get_params())
        codec = LabelCodec.of(flat_labels(labels))
        texts, labels = trainer.check_pairs(*codec.encoded(texts, labels))
        clf.train_result_ = None
        clf._adopt(network, texts, labels, None, codec)
        return clf

    def _adopt(self, model, texts: Sequence[str], labels: Sequence[str], items: list | None, codec: LabelCodec) -> None:
        """Make `model` this classifier's network and (`texts`, label names `labels`) its label set."""
        self._codec = codec
        self.space_ = MetricSpace(model, **space_options(self.get_params()))
        self._labels = LabelSet.embedded(self.space_, texts, labels, items, debias=self.debias)
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
        params = self.get_params()
        if not any(p.requires_grad for p in self.space_.model.parameters()):
            raise DyntcError(f"this classifier has nothing to train (train={training_mode(params)!r}: a frozen "
                             "backbone without head); fit one with train='backbone' or train='head' to fine-tune")
        names = self._labels.classes
        texts, labels = trainer.check_fine_tune(*self._targets.encoded(texts, labels, optional=True), names, episodes, lr)
        dev_pair = trainer.check_dev(self._targets.encoded_dev(dev), names)  # before anything changes
        config = train_config(params, episodes, self.lr if lr is None else lr)
        self.fine_tune_result_, self._labels = trainer.fine_tune(self._labels, texts, labels, dev_pair, config,
                                                                 add_to_support=add_to_support)
        self.calibration_ = None  # distances moved: calibrate again
        if self.head is not None:
            self.refresh(wait=True)
        return self

    # ------------------------------------------------------------------ tuning the backbone (classifier/tuning.py)

    # tune(budget_s=600, *, device=None, episodes=None, calibration=None) -> self, in memory;
    # tune_saved(path, budget_s=600, *, device="cpu", ...) -> TuneReport, a saved model tuned as one new version
    tune = tuning.tune_for
    tune_saved = classmethod(tuning.tune_saved_for)

    # ------------------------------------------------------------------ label operations
    # Each changes the label set at once and returns the new ``classes_``; the cosine head scores a
    # touched label by its prototype until the background refresh retrains it.

    def support(self, name: Any) -> list[str]:
        """The support texts of label `name` (a copy)."""
        return list(self.labels_.support(self._targets.name(name, "name")).texts)

    def support_counts(self) -> dict[Any, int]:
        """Number of support examples of every label, in ``classes_`` order."""
        counts = self.labels_.counts()
        return {label: counts[self._targets.name(label)] for label in self.classes_.tolist()}

    def _labels_changed(self) -> list:
        live = self._live_head()
        if live is not None:
            live.labels_changed(self._labels)
        return self.classes_.tolist()

    @recorded
    def add_label(self, name: Any, examples: Sequence[str]) -> list:
        """Add label `name` defined by its `examples` (at least one). Returns the new label set. Duplicate
        examples, examples stored under another label and a label of few examples are warned about."""
        key = self._targets.name(name, "name")
        self.labels_.require_new(key)
        examples = check_examples(as_texts(examples))
        hygiene.check_new_examples(self._labels, name, examples, new_label=True, stacklevel=3)
        self._labels.add_label(key, examples)
        return self._labels_changed()

    @recorded
    def add_examples(self, name: Any, examples: Sequence[str]) -> list:
        """Add support `examples` to the existing label `name`; its prototype moves at once (warned
        about as in :meth:`add_label`)."""
        key = self._targets.name(name, "name")
        examples = check_examples(as_texts(examples))
        self.labels_.require(key)
        hygiene.check_new_examples(self._labels, key, examples, new_label=False, stacklevel=3)
        self._labels.add_examples(key, examples)
        return self._labels_changed()

    @recorded
    def remove_examples(self, name: Any, examples: Sequence[str]) -> list:
        """Remove `examples` (every occurrence of each) from label `name`; at least one must remain.
        The other examples keep their stored points: nothing is re-encoded."""
        self.labels_.remove_examples(self._targets.name(name, "name"), examples)
        return self._labels_changed()

    @recorded
    def remove_label(self, name: Any) -> list:
        """Remove label `name` (it can no longer be predicted). At least one label must remain."""
        self.labels_.remove_label(self._targets.name(name, "name"))
        return self._labels_changed()

    @recorded
    def split_label(self, name: Any, parts: Mapping[Any, Sequence[str]], *, reassign: bool = False) -> list:
        """Replace label `name` by the new labels of `parts` (``{new_name: examples}``, at least two).

        Rule: the given examples define the new labels; the old label and its prototype disappear.
        A new name may reuse `name` itself but no other existing label. With ``reassign=True`` every
        stored support example of the old label also joins the new label whose prototype (from the
        given examples) is nearest to it; its stored point is reused, nothing is re-encoded. Without
        it, the stored examples not among the given ones are dropped, with a
        :class:`~dyntc.errors.DyntcWarning` saying how many.
        """
        key, parts = self._targets.name(name, "name"), self._targets.keyed(parts, "new label name")
        old = self.labels_.support(key).texts
        self._labels.split_label(key, parts, reassign=reassign)
        if not reassign:
            hygiene.warn_dropped(name, old, parts, stacklevel=3)
        return self._labels_changed()

    @recorded
    def merge_labels(self, names: Sequence[Any], into: Any) -> list:
        """Merge the labels `names` (at least two) into one label `into` whose support set is their
        union. `into` may be one of `names` or a new name (not another existing label)."""
        self.labels_.merge_labels(self._targets.names(names, "names", lenient=True), self._targets.name(into, "into"))
        return self._labels_changed()

    @recorded
    def rename_label(self, old: Any, new: Any) -> list:
        """Rename label `old` to `new` (a name not in use); its examples and prototype are kept."""
        self.labels_.rename_label(self._targets.name(old, "old"), self._targets.name(new, "new"))
        return self._labels_changed()

    # ------------------------------------------------------------------ discovery (classifier/discovery.py, suggestions.py)

    # discover(texts, n_new=None, **options) -> Discovery; accept(discovery, clusters=None, *,
    # add_examples=False) -> classes; suggest(**options) -> [Suggestion] (documented where they live)
    discover = _discovery.discover_for
    accept = recorded(_discovery.accept)
    suggest = suggestions.suggest_for

    # ------------------------------------------------------------------ the cosine head

    def _scorer(self) -> str:
        """What the scores are: ``"prototype"`` (``head=None``) or the head's name."""
        return "prototype" if self.head is None else self.head

    def _live_head(self) -> LiveHead | None:
        """This classifier's own :class:`LiveHead` (None with ``head=None``); made at first use."""
        if self.head is None:
            return None
        live = self.__dict__.get("_live")
        if live is None:
            owner = weakref.ref(self)
            live = self.__dict__.setdefault("_live", LiveHead(
                self.head_options, lambda: getattr(owner(), "_labels", None),
                auto=lambda: getattr(owner(), "auto_refresh", True)))
        return live

    def refresh(self, wait: bool = True) -> dict | None:
        """Retrain the cosine head on every stored example now. ``wait=True``: synchronously, returning
        what it did (``seconds``, ``examples``, ``imprinted``: labels changed meanwhile by another
        thread); a background refresh scheduled by earlier label operations is dropped (this one covers
        them) and a running one awaited, so ``head_status()["refreshing"]`` is False afterwards unless
        another thread changed labels meanwhile. ``wait=False``: start the background refresh at once
        and return None. Label operations schedule it by themselves; this is for tests and batch jobs."""
        self._check_fitted()
        if not isinstance(wait, bool):
            raise DyntcError(f"wait must be True or False, got {wait!r}")
        live = self._live_head()
        if live is None:
            raise DyntcError("refresh() applies to the cosine head; this classifier has head=None")
        if not wait:
            live.refresher.schedule(self._labels, delay=0.0)
            return None
        live.refresher.close()  # drop the scheduled refresh, wait for a running one
        return live.refresh(self._labels, force=True)

    def adopt_head(self, other: "DynamicClassifier") -> list[str]:
        """Score with the cosine head `other` (another version of the same model) last trained, for
        every label whose examples are the same in both; the other labels are scored by their
        prototype until the next refresh. Nothing is trained: a version just loaded answers at once
        with what the version before it learnt. Returns the labels scored by their prototype."""
        if not (isinstance(other, DynamicClassifier) and self.head is not None and
                (other.head, other.head_options) == (self.head, self.head_options)):
            raise DyntcError("adopt_head takes a DynamicClassifier with the same head and head_options, got "
                             f"{other!r}")
        return adopt(self._live_head(), self.labels_, other.labels_)

    def wait_for_refresh(self, timeout: float | None = None) -> bool:
        """Block until no background refresh is pending or running (at most `timeout` seconds); True if idle."""
        live = self.__dict__.get("_live")
        return True if live is None else live.refresher.wait(timeout)

    def head_status(self) -> dict | None:
        """The head's state, JSON-able: ``imprinted`` (labels scored by their prototype until the next
        refresh), ``refreshing`` (a background refresh pending or running) and the last refresh's
        ``seconds`` and ``examples``; None with ``head=None`` or before the head was first trained."""
        self._check_fitted()
        live = self._live_head()
        status = None if live is None else live.status(self._labels)
        return None if status is None else {"head": self.head, **status}

    # ------------------------------------------------------------------ prediction

    def _scores(self, texts: Sequence[str], *, leave_one_out: bool = False) -> torch.Tensor:
        """Scores of `texts` for every label, ``(n, n_classes)`` float64 (higher = better), ``classes_`` order,
        lowered for the calibration's out-of-scope examples (:mod:`~dyntc.classifier.rejection`)."""
        self._check_fitted()
        texts = check_examples(as_texts(texts), "texts", allow_empty=True)
        return rejection.pushed(self, *self._unshifted_scores(texts), texts, leave_one_out)

    def _unshifted_scores(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scores, points)`` of checked `texts`: the scores before any out-of-scope examples' push."""
        self._check_fitted()
        labels = self._labels
        if not texts:
            return torch.zeros(0, len(labels), dtype=torch.float64), torch.zeros(0, self.space_.dim)
        points = self.space_.embed(texts)
        live = self._live_head()
        scores = -labels.sq_distances(points).double() if live is None else live.scores(labels, points)
        return self._targets.public(scores, labels.classes), points  # label-set name order -> classes_ order

    def warm(self) -> Self:
        """Embed now what the first prediction would otherwise wait for: the calibration's out-of-scope
        examples (a service calls this on a version it has just read, before serving it)."""
        rejection.warm(self)
        return self

    def squared_distances(self, scores: torch.Tensor | np.ndarray) -> torch.Tensor:
        """The squared distances that :meth:`label_scores` stand for, ``(n, n_classes)``:
        ``-s`` with ``head=None`` (``d²`` to the nearest part's prototype, support-size corrected); with
        the cosine head ``2 − 2 s / scale``, the squared distance on the unit sphere between the text's
        direction and the label's weight (plus twice the offset of an imprinted label). The nearest
        label is always the best-scored one; ``top_k``, the records and the rejection threshold use these."""
        live, scores = self._live_head(), answers.check_scores(scores, len(self.classes_))
        return -torch.as_tensor(scores).double() if live is None else live.sq_distances(scores)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Points of `texts` in the metric space: ``(n, d)`` Euclidean, ``(n, d + 1)`` on the hyperboloid."""
        self._check_fitted()
        return self.space_.embed(check_examples(as_texts(texts), "texts", allow_empty=True)).numpy()

    def predict(self, texts: Sequence[str], *, reject: bool = False) -> np.ndarray:
        """The best-scored label for every text (the nearest prototype with ``head=None``), as a NumPy
        array of ``classes_``' labels. With ``reject=True`` (after :meth:`calibrate`) a text farther than
        the calibrated threshold from every label (with the head: whose top score is below the matching
        score) is out of scope and gets ``None`` (the array is then of dtype object)."""
        threshold = self.require_calibration("predict(reject=True)").threshold if reject else None
        return answers.best(self.classes_, self.squared_distances(self._scores(texts)), threshold)

    def label_scores(self, texts: Sequence[str]) -> np.ndarray:
        """Every label's score, ``(n, n_classes)`` (higher = better); columns in ``classes_`` order: the
        cosine head's ``scale · (cos − offset)``, or ``-d²`` to every prototype with ``head=None``; once
        :meth:`calibrate` kept out-of-scope examples, lowered for a text that resembles them by the
        same amount for every label.
        :meth:`predict`, :meth:`predict_proba`, :meth:`top_k`, :meth:`rank` and :meth:`prediction_records`
        all derive from it, so a caller needing several of them embeds the texts once with this."""
        return self._scores(texts).numpy()

    def decision_function(self, texts: Sequence[str]) -> np.ndarray:
        """:meth:`label_scores` as scikit-learn shapes it: ``(n, n_classes)``, except with two labels
        ``(n,)``, the second label's score minus the first's (> 0: ``classes_[1]``)."""
        scores = self.label_scores(texts)
        return scores[:, 1] - scores[:, 0] if scores.shape[1] == 2 else scores

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """``softmax(scores / T)`` over :meth:`label_scores`, ``(n, n_classes)``; columns in
        ``classes_`` order. Until :meth:`calibrate` fits T it is ``prior_temperature_`` (1 with the head,
        whose scores are logits already; ``1/s`` for the model's logit scale s with ``head=None``)."""
        return self.proba_from_scores(self._scores(texts))

    def proba_from_scores(self, scores: torch.Tensor | np.ndarray) -> np.ndarray:
        """:meth:`predict_proba` from scores already computed (:meth:`label_scores`, or the
        :meth:`decision_function` of a two-label classifier)."""
        scores = answers.as_matrix(answers.check_scores(scores, len(self.classes_), one_d=True))
        return torch.softmax(scores / self.temperature_, dim=1).numpy()

    def top_k(self, texts: Sequence[str], k: int = 3) -> list[list[tuple[Any, float]]]:
        """For every text, the `k` best labels as ``(label, distance)``, nearest (best-scored) first;
        the distance is the square root of :meth:`squared_distances`."""
        return self.nearest_labels(self.squared_distances(self._scores(texts)), answers.check_k(k))

    def nearest_labels(self, sq_distances: torch.Tensor | np.ndarray, k: int) -> list[list[tuple[Any, float]]]:
        """From squared distances ``(n, n_classes)`` (``squared_distances(label_scores(texts))``), the
        `k` nearest labels of every row as ``(label, distance)``, nearest first."""
        d2 = answers.check_scores(sq_distances, len(self.classes_), "sq_distances")
        return answers.nearest(self.classes_.tolist(), d2, answers.check_k(k))

    def rank(self, texts: Sequence[str], k: int | None = answers.RANKING_LENGTH) -> list[list[tuple[Any, float]]]:
        """For every text, its `k` most probable labels (all with ``k=None``) as ``(label, confidence)``,
        most probable first: :meth:`predict_proba`'s row, like Rasa's ``intent_ranking``. Confidences
        are calibrated once :meth:`calibrate` has fitted the temperature."""
        k = self.n_classes_ if k is None else answers.check_k(k)
        return answers.ranking(self.classes_.tolist(), self.predict_proba(texts), k)

    def prediction_records(self, scores: np.ndarray, *, top_k: int = 1, proba: bool = False,
                           reject: bool = False, ranking: int = 0) -> list[dict]:
        """One JSON-able answer per row of `scores` (from :meth:`label_scores`): ``label`` (None
        with `reject` when the nearest label is farther than the calibrated threshold, as in
        :meth:`predict`), with `proba` its ``probability``, with `top_k` > 1 the ``top_k`` nearest
        labels and their distances (:meth:`top_k`'s), with `ranking` > 0 the ``ranking`` of that many
        labels by probability (``[{"label", "confidence"}]``, :meth:`rank`'s); numbers rounded to 6
        digits. ``dyntc predict`` and ``dyntc serve`` answer with these records."""
        answers.check_record_args(scores, len(self.classes_), top_k, ranking)
        threshold = self.require_calibration("reject").threshold if reject else None
        scores = torch.as_tensor(scores).double()
        probs = self.proba_from_scores(scores) if proba or ranking else None
        classes = [json_label(y) for y in self.classes_]
        return answers.records(classes, self.squared_distances(scores), probs, top_k=top_k, threshold=threshold,
                               probability=proba, ranking_length=ranking)

    def score(self, texts: Sequence[str], labels: Sequence[Any], sample_weight: Sequence[float] | None = None) -> float:
        """Accuracy of :meth:`predict` on (`texts`, `labels`), weighted by `sample_weight` if given."""
        labels = flat_labels(labels)
        texts, _ = trainer.check_pairs(*self._targets.encoded(texts, labels))
        weights = trainer.check_sample_weight(sample_weight, len(texts))
        hits = [p == y for p, y in zip(self.predict(texts).tolist(), labels)]
        return float(np.average(hits, weights=weights))

    # ------------------------------------------------------------------ calibration
    # The temperature of predict_proba and the out-of-scope threshold of predict(reject=True)
    # (classifier/calibration.py), fitted on held-out texts.

    def _calibration(self) -> Calibration | None:
        """``calibration_`` if it was fitted on this classifier's scorer (a stored one may predate the head)."""
        cal = self.calibration_
        return cal if cal is not None and cal.scorer == self._scorer() else None

    @property
    def temperature_(self) -> float:
        """The temperature T of :meth:`predict_proba`: calibrated, or before :meth:`calibrate` the model's own
        (``prior_temperature_``)."""
        self._check_fitted()
        cal = self._calibration()
        return cal.temperature if cal is not None else self.prior_temperature_

    @property
    def prior_temperature_(self) -> float:
        """The temperature before calibration: with ``head=None`` ``1/s`` for the model's logit scale s (its
        logits are ``-s d²``); with the head 1 (its scores are logits already)."""
        self._check_fitted()
        return 1.0 if self.head is not None else 1.0 / float(self.space_.model.scale())

    def require_calibration(self, what: str) -> Calibration:
        """The calibration, or a clear error naming `what` needed it."""
        self._check_fitted()
        return require_calibration(self.calibration_, self._scorer(), self.head, what)

    @recorded
    def calibrate(self, texts: Sequence[str], labels: Sequence[str], oos_texts: Sequence[str] | None = None, *,
                  max_accuracy_drop: float = 0.02, threshold: float | None = None,
                  oos_weight: float = OOS_WEIGHT) -> Self:
        """Fit :meth:`predict_proba`'s temperature and the out-of-scope threshold on held-out texts.

        `texts`, `labels`: labelled in-scope texts that are not support examples (a dev split).
        The threshold is the smallest distance to the nearest label (:meth:`squared_distances`) that costs at most
        `max_accuracy_drop` accuracy on them when farther texts are rejected; `threshold` sets it
        instead. `oos_texts` (optional out-of-scope examples, such as requests the assistant must not
        take) are kept with the calibration: a text resembling them is pushed away from every label
        (its distances grow, its predicted label and probabilities stay), by `oos_weight` (0: they only
        measure the share the threshold rejects); see :mod:`~dyntc.classifier.calibration`. What was
        fitted and measured (expected calibration error before/after, accuracies, OOS recall, each
        example left out of its own push) is in ``calibration_``; it is saved with the classifier."""
        self._check_fitted()
        self.calibration_ = rejection.calibrate(
            self, texts, labels, oos_texts, max_accuracy_drop=check_max_drop(max_accuracy_drop),
            threshold=None if threshold is None else check_threshold(threshold), oos_weight=check_oos_weight(oos_weight))
        return self

    @recorded
    def add_out_of_scope(self, texts: Sequence[str]) -> Self:
        """Keep `texts` as more out-of-scope examples of the calibration (``oos_examples``; a text
        already kept is kept once): texts that resemble them are pushed away from every label from now
        on, at the calibration's ``oos_weight`` (0.5 if it had none). Nothing is refitted: the
        threshold, temperature and the figures measured by :meth:`calibrate` stay as they were (the
        push can only take in-scope texts near these examples past the threshold); calibrate again on
        held-out texts to refit them. The console's inbox calls this for captured texts marked out of
        scope."""
        self.calibration_ = rejection.with_examples(self, texts)
        return self

    # ------------------------------------------------------------------ persistence (classifier/saving.py)

    def save(self, path: str | Path | ModelStore) -> str | Path:
        """Commit the classifier to the model directory `path` (or a ``postgresql://`` URL) as a new
        version; returns the location (a Path, or the URL).

        The location holds a versioned store (:mod:`dyntc.classifier.store`): saving a classifier
        loaded from `path` stores only the labels changed since, and fails with a clear error if
        another writer committed in between (its changes would be lost); saving any other classifier
        replaces the content, keeping the older versions restorable. A crash never leaves half a
        version on disk.
        """
        self._check_fitted()
        store = saving.target_store(path)
        with store.transaction() as txn:
            version = saving.write_version(txn, self.space_, self._labels, self.get_params(), self.calibration_,
                                           self._source, "save", check_base=True, label_type=self._targets.document())
            store_id = txn.store_id
        self._committed(store_id, version)
        return store.location

    def _committed(self, store_id: str, version: int) -> None:
        """After a commit landed (never before: a commit that fails must leave the changes pending)."""
        self._labels.changed.clear()
        self._labels.log.clear()
        self._source = (store_id, version)

    @classmethod
    def load(cls, path: str | Path | ModelStore, version: int | None = None, *,
             base: "DynamicClassifier | None" = None) -> Self:
        """Load a saved classifier (its newest version, or `version`) from a model directory, a
        ``postgresql://`` URL or an open :class:`~dyntc.classifier.store.ModelStore`, on the CPU (set
        ``device`` afterwards to move it). `base`: an earlier version of the same store already
        loaded; the newest version is then read as its difference to `base` when only labels changed
        in between (the changed labels read and recomputed, the rest shared with `base`, which is left
        as it was), else in full."""
        store = saving.open_store(path)
        newer = None if base is None or version is not None else saving.read_changes(store, base)
        return newer if newer is not None else cls._from_snapshot(store.read(version))

    @classmethod
    def _from_snapshot(cls, snap) -> Self:
        clf = cls(**saving.stored_params(snap, cls._get_param_names()))
        clf.space_, clf._labels, clf.calibration_ = saving.read_version(snap, clf.get_params())
        clf._codec = LabelCodec.from_document(snap.document.get("label_type"))
        clf._source = (snap.store_id, snap.version)
        return clf

    def _become(self, other: "DynamicClassifier") -> None:
        """Take `other`'s parameters and state (network, labels, calibration, version, last fine-tuning),
        in place: how :func:`~dyntc.classifier.saving.commit_edit` hands an edit replayed on a newer
        version back to the classifier the caller holds."""
        live = self.__dict__.pop("_live", None)
        if live is not None:
            live.retire()  # a refresh of the old labels must not be installed over the new ones
        for name, value in other.get_params().items():
            setattr(self, name, value)
        self.space_, self._labels, self.calibration_, self._source = (other.space_, other._labels,
                                                                      other.calibration_, other._source)
        self._codec = other._targets
        if hasattr(other, "fine_tune_result_"):
            self.fine_tune_result_ = other.fine_tune_result_

    @classmethod
    @contextmanager
    def edit(cls, path: str | Path | ModelStore, *, base: "DynamicClassifier | None" = None,
             op: str = "edit") -> Iterator[Self]:
        """Read-modify-write of a saved classifier, committed as one version::

            with DynamicClassifier.edit("model/") as clf:
                clf.add_label("refund", ["I want my money back", ...])

        The block runs without the store's write lock (readers and other writers never wait for
        its embedding); the lock is taken only to commit, as one version (named by its label
        operations, or `op` if it recorded none), when the block ends without error (nothing is
        committed otherwise). If another writer committed meanwhile, the block's label operations, ``calibrate``, ``set_params`` and
        ``fine_tune`` calls are applied again to the newest version, so no change is lost. Changes
        made by assigning attributes directly are not replayed. `base`: a classifier already loaded
        from this store, edited as a copy instead of loading (a service that holds one)."""
        if base is not None and not isinstance(base, DynamicClassifier):
            raise DyntcError(f"base must be a DynamicClassifier loaded from {path!r} (or None), got {type(base).__name__}")
        if not (isinstance(op, str) and op.strip()):
            raise DyntcError(f"op must be a non-empty string naming the change in the store's history, got {op!r}")
        store = saving.open_store(path)
        clf = cls.load(store) if base is None else base.copy()  # without the write lock
        log = replay.start(clf)
        try:
            yield clf
        finally:
            replay.stop(clf)
        if clf._labels.changed or clf._labels.log or clf.space_.weights_dirty:
            clf._committed(*saving.commit_edit(store, clf, log, op))

    @staticmethod
    def versions(path: str | Path | ModelStore, limit: int | None = None) -> list[dict]:
        """The committed versions of the classifier saved at `path`, newest first."""
        return saving.list_versions(path, limit)

    @staticmethod
    def restore(path: str | Path | ModelStore, version: int) -> int:
        """Make `version` of the classifier at `path` its newest version again (a new version; nothing
        is deleted). Returns the new version's id."""
        return saving.restore_version(path, version)

    @staticmethod
    def prune(path: str | Path | ModelStore, keep: int) -> dict:
        """Delete the versions of the classifier at `path` older than the newest `keep` (they can no
        longer be loaded or restored) and compact its store. Returns a summary (versions removed, the
        range kept, bytes before and after)."""
        return saving.prune_versions(path, keep)

    # ------------------------------------------------------------------ misc

    def describe(self) -> dict:
        """A JSON-able summary: parameters, labels and their support counts."""
        self._check_fitted()
        return {"params": self.get_params(), "n_classes": self.n_classes_, "support_counts": self._labels.counts(),
                "version": self.version_, "head": self.head_status()}
