"""Tuning a classifier's backbone on its own support sets, in memory or as a new version of a served model.

A model is served at once from a frozen pretrained backbone (``train="none"``); :func:`tune_model`
fine-tunes the backbone's top layers (what ``train="backbone"`` trains at ``fit``:
:data:`~dyntc.classifier.params.BACKBONE_LAYERS` layers, the same trainer and episodes) on the
support sets of the store's newest version, without the store's write lock, then commits **one**
version holding the tuned layers (content-addressed: only the trained tensors are stored,
:func:`~dyntc.classifier.space.stored_state`), every support example embedded again and the head
retrained. Label changes other writers committed while it trained are taken from the newest version
under the lock: a label whose examples are unchanged keeps its tuned points, the others are embedded
with the tuned backbone, so nothing a writer was acknowledged is lost. Failing or interrupted
anywhere before the commit, it leaves the store as it was.

The calibration (temperature, out-of-scope threshold) was fitted on the old backbone's scores: it is
refitted on held-out texts given to the tune, or dropped with a :class:`~dyntc.errors.DyntcWarning`,
never applied to scores it was not fitted on.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from dyntc.classifier import saving, trainer
from dyntc.classifier.calibration import OOS_WEIGHT, Calibration
from dyntc.classifier.labels import LabelSet
from dyntc.classifier.live_head import carry
from dyntc.classifier.params import encoder_options, network_options, train_config, training_mode
from dyntc.classifier.space import MetricSpace, stored_state
from dyntc.classifier.targets import LabelCodec
from dyntc.core.machine import seeded
from dyntc.errors import DyntcError, DyntcWarning, is_int, is_number

#: Seconds of training when none are given: the ten minutes in which the fine-tuned MiniLM overtook
#: the frozen one on CLINC150 on two CPU cores (docs/classifier.md, "Tuning a served model").
DEFAULT_BUDGET_S = 600.0
TUNABLE = ("none", "backbone")  # the train modes whose network is the backbone alone
#: A label with fewer examples than both of these (a count, and a share of the median label's) is
#: "few-shot": a tune leaves it out of its episodes and the tuned backbone embeds its texts like any
#: other. Trained on, its few texts are memorised: on HWU64 (seed 0) its 5-example intents fell from
#: 77.4 (frozen) to 68.7 with them in the episodes, to 78.2 left out (docs/intents.md, "Serve, then
#: tune"). The count keeps established labels of tens of examples in the training.
FEW_EXAMPLES = 20
FEW_EXAMPLES_SHARE = 0.5


@dataclass
class TuneReport:
    """What :func:`tune_model` did, JSON-able with :meth:`to_dict`."""

    location: str
    base_version: int  # the version whose support sets were trained on
    version: int  # the version committed
    episodes: int
    train_seconds: float
    seconds: float  # the whole tune, loading to commit
    few_shot: int  # labels with few examples (FEW_EXAMPLES, FEW_EXAMPLES_SHARE), left out of the episodes
    replayed: list[str]  # labels changed by other writers meanwhile, embedded with the tuned backbone
    weights_bytes: int  # the stored tuned layers
    calibration: str | None  # "refitted", "dropped" or None (there was none)

    def to_dict(self) -> dict:
        return asdict(self)


def check_budget(budget_s: Any, arg: str = "budget_s") -> float:
    if isinstance(budget_s, bool) or not is_number(budget_s) or not math.isfinite(budget_s) or budget_s <= 0:
        raise DyntcError(f"{arg} must be a finite number of seconds > 0, got {budget_s!r}")
    return float(budget_s)


def check_tunable(clf: Any, episodes: Any) -> set[str]:
    """A clear error unless `clf` has a pretrained backbone alone and enough examples for episodes;
    returns the labels the tune leaves out (:func:`few_shot_labels`)."""
    from dyntc.core.encoders import encoder_kind

    params = clf.get_params()
    if "backbone" not in encoder_kind(params["encoder"]).train_modes:
        raise DyntcError(f"tune fine-tunes a pretrained backbone; encoder {params['encoder']!r} has none "
                         "(use encoder='minilm' or the path of a sentence-transformers model)")
    if training_mode(params) not in TUNABLE:
        raise DyntcError(f"tune fine-tunes a model fitted with train='none' or 'backbone', not "
                         f"train={training_mode(params)!r} (its projection head would be lost): refit it")
    if episodes is not None and not (is_int(episodes) and episodes >= 1):
        raise DyntcError(f"episodes must be None (the model's own, {params['episodes']}) or an integer >= 1, "
                         f"got {episodes!r}")
    few_shot = set(few_shot_labels(clf))
    trained = [c for c in clf.labels_.classes if c not in few_shot]
    try:
        trainer.episodic_classes([c for c in trained for _ in clf.labels_.support(c).texts], trained,
                                 params["n_support"])
    except DyntcError as exc:
        left = (f" ({len(few_shot)} labels with under {FEW_EXAMPLES} examples and under half the median label's "
                "are left out of a tune)") if few_shot else ""
        raise DyntcError(f"too few examples to tune: {exc}{left}") from None
    return few_shot


def few_shot_labels(clf: Any) -> list[str]:
    """The labels a tune leaves out of its episodes: those with fewer than :data:`FEW_EXAMPLES`
    examples and fewer than :data:`FEW_EXAMPLES_SHARE` of the median label's."""
    sizes = {name: len(support.texts) for name, support in clf.labels_.items()}
    floor = min(FEW_EXAMPLES, FEW_EXAMPLES_SHARE * statistics.median(sizes.values()))
    return [name for name, n in sizes.items() if n < floor]


def tunable_network(clf: Any):
    """A new network on `clf`'s backbone in fine-tuning mode: a copy of its tuned one, or a fresh one
    (``train="backbone"``'s top layers trainable)."""
    from dyntc.core.encoders import build_encoder, create_encoder
    from dyntc.core.models import PrototypicalNetwork

    space = clf.space_
    if training_mode(clf.get_params()) == "backbone":  # tuned before: go on from its weights
        doc = space.document()
        model = PrototypicalNetwork(build_encoder(doc["encoder"], doc.get("encoder_files") or {}), **doc["model"])
        model.load_state_dict(space.model.state_dict())
        return model
    params = {**clf.get_params(), "train": "backbone"}
    overrides = {k: v for k, v in (params["encoder_options"] or {}).items() if k != "runtime"}  # runtime: frozen only
    params["encoder_options"] = overrides or None
    encoder = create_encoder(params["encoder"], [], **encoder_options(params))
    served = getattr(space.model.encoder, "fingerprint", None)
    if served is not None and served != encoder.fingerprint:
        raise DyntcError(f"the backbone at {encoder.path} differs from the one this model was fitted on: install the "
                         "same model version")
    return PrototypicalNetwork(encoder, clf.metric, **network_options(params))


def train(clf: Any, budget_s: float, device: str, episodes: int | None, progress: bool
          ) -> tuple[MetricSpace, dict[str, torch.Tensor], Any, int]:
    """Fine-tune a new network on `clf`'s support sets (`clf` is unchanged; those of
    :func:`few_shot_labels` left out); returns its space (on `device`), every support text's tuned
    point, the training result and how many labels were left out."""
    few_shot = check_tunable(clf, episodes)
    params = clf.get_params()
    config = train_config({**params, "time_budget_s": budget_s, "device": device, "progress": progress},
                          params["episodes"] if episodes is None else episodes, params["lr"])
    with seeded(params["seed"]):
        model = tunable_network(clf)
        stored = clf.labels_.items()
        texts = [t for _, s in stored for t in s.texts]
        labels = [c for c, s in stored for _ in s.texts]
        items = model.encoder.featurize(texts)
        kept = [i for i, c in enumerate(labels) if c not in few_shot]
        result = trainer.train_episodic(model, [texts[i] for i in kept], [labels[i] for i in kept],
                                        [items[i] for i in kept], None, config)
    space = MetricSpace(model, device=str(device), batch_size=params["batch_size"], extend_vocab=params["extend_vocab"])
    unique = dict(zip(texts, items))
    points = space.embed(list(unique), list(unique.values()))
    return space, dict(zip(unique, points)), result, len(few_shot)


def _points(space: MetricSpace, known: dict[str, torch.Tensor], groups: Mapping[str, tuple]) -> list[str]:
    """Embed the texts of `groups` not in `known` into it; returns the labels that had such texts."""
    new = list(dict.fromkeys(t for texts, *_ in groups.values() for t in texts if t not in known))
    known.update(zip(new, space.embed(new)))
    fresh = set(new)
    return [name for name, (texts, *_) in groups.items() if fresh.intersection(texts)]


def tuned_classifier(cls: type, space: MetricSpace, points: dict[str, torch.Tensor], params: dict, codec: LabelCodec,
                     groups: Mapping[str, tuple], calibration: Any, source: tuple[str, int] | None) -> Any:
    """A classifier of `cls` on the tuned `space` with the support sets `groups` (``{name: (texts,
    points, parts)}``, points ignored: each text gets its tuned point), `params` with
    ``train="backbone"``, nothing refreshed yet."""
    clf = cls(**{**params, "train": "backbone"})
    clf._codec = codec
    clf.space_ = space
    clf._labels = LabelSet.from_groups(space, {
        name: (list(texts), torch.stack([points[t] for t in texts]), list(parts))
        for name, (texts, _, parts) in groups.items()}, debias=clf.debias)
    clf._labels.changed = set(clf._labels.classes)
    clf.calibration_ = calibration
    clf._source = source
    return clf


def settle_calibration(clf: Any, had: Any, held_out: Sequence | None) -> str | None:
    """Refit `clf`'s calibration on `held_out` (``(texts, labels)`` or ``(texts, labels, oos_texts)``),
    with the settings of the old one `had` (its kept out-of-scope examples too, unless `held_out` gives
    others); else drop it, with a warning if there was one."""
    kept = had is not None and bool(had.oos_examples)
    if held_out is not None:
        texts, labels, *oos = held_out
        oos_texts = oos[0] if oos else (list(had.oos_examples) if kept else None)
        clf.calibrate(texts, labels, oos_texts, max_accuracy_drop=had.max_accuracy_drop if had is not None else 0.02,
                      oos_weight=had.oos_weight if kept else OOS_WEIGHT)
        return "refitted"
    clf.calibration_ = None
    if had is None:
        return None
    examples = f" (its {len(had.oos_examples)} out-of-scope examples with it)" if kept else ""
    warnings.warn(f"the calibration (temperature and out-of-scope threshold) was fitted on the untuned backbone's "
                  f"scores and is dropped{examples}: calibrate the tuned model on held-out texts (`dyntc calibrate`, "
                  "DynamicClassifier.calibrate, or the tune's calibration argument)", DyntcWarning, stacklevel=3)
    return "dropped"


def check_held_out(held_out: Any) -> None:
    if held_out is not None and not (isinstance(held_out, (tuple, list)) and len(held_out) in (2, 3)):
        raise DyntcError("calibration must be None or (texts, labels) or (texts, labels, oos_texts) of held-out texts, "
                         f"got {type(held_out).__name__}")


def _check_network(snap: Any, base_weights: str, location: str) -> None:
    if snap.weights_hash != base_weights:
        raise DyntcError(f"{location}: version {snap.version} holds another network than the one this tune started "
                         "from (another tune or a restore committed meanwhile); nothing was committed: tune again")


def tune_model(cls: type, location: Any, budget_s: Any = DEFAULT_BUDGET_S, *, device: str = "cpu",
               episodes: int | None = None, calibration: Sequence | None = None, progress: bool = False
               ) -> tuple[Any, TuneReport]:
    """Tune the newest version of the model at `location` (see the module docstring) and commit the
    result as one version; returns the tuned classifier (of `cls`) and a :class:`TuneReport`."""
    from dyntc.core.machine import check_device

    started = time.perf_counter()
    budget_s = check_budget(budget_s)
    device = str(check_device(device, "device"))
    check_held_out(calibration)
    store = saving.open_store(location)
    base = cls.load(store)
    base_weights = base.space_.weights()[1]
    space, points, result, few_shot = train(base, budget_s, device, episodes, progress)
    space.device = "cpu"  # served, loaded and embedded on the CPU like every stored version
    snap = store.read()  # catch up without the lock: writers committed meanwhile
    _check_network(snap, base_weights, store.where)
    replayed = _points(space, points, snap.labels)
    params = saving.stored_params(snap, cls._get_param_names())
    codec = LabelCodec.from_document(snap.document.get("label_type"))
    tuned = tuned_classifier(cls, space, points, params, codec, snap.labels, None, None)
    if tuned.head is not None:
        tuned.refresh(wait=True)
    stored = snap.document.get("calibration")
    had = None if stored is None else Calibration.from_dict(stored)
    how = settle_calibration(tuned, had, calibration)
    with store.transaction() as txn:
        if txn.head != snap.version:  # more writes since: their labels, embedded under the lock (few)
            snap = txn.read()
            _check_network(snap, base_weights, store.where)
            replayed += [n for n in _points(space, points, snap.labels) if n not in replayed]
            params = saving.stored_params(snap, cls._get_param_names())
            head = tuned._labels.head
            tuned = tuned_classifier(cls, space, points, params, codec, snap.labels, tuned.calibration_, None)
            tuned._labels.head = carry(head, tuned._labels)  # unchanged labels keep their refreshed head rows
        replayed = sorted(n for n in set(replayed) if n in snap.labels)
        tuned._labels.log = [{"op": "tune", "base": base.version_, "episodes": result.steps,
                              "seconds": round(result.seconds, 1), "few_shot": few_shot,
                              "replayed": replayed}]
        version = saving.write_version(txn, space, tuned._labels, tuned.get_params(), tuned.calibration_,
                                       (txn.store_id, txn.head), "tune", label_type=tuned._targets.document())
        store_id = txn.store_id
    tuned._committed(store_id, version)
    weights = sum(v.numel() * v.element_size() for v in stored_state(space.model).values())
    report = TuneReport(store.where, base.version_, version, result.steps, round(result.seconds, 2),
                        round(time.perf_counter() - started, 2), few_shot, replayed, weights, how)
    return tuned, report


def tune_in_place(clf: Any, budget_s: Any, device: str | None, episodes: int | None, calibration: Sequence | None) -> Any:
    """:meth:`~dyntc.classifier.DynamicClassifier.tune`: `clf` takes the tuned network, its support
    embedded again, the head retrained and the calibration settled; returns the training result."""
    from dyntc.core.machine import check_device

    budget_s = check_budget(budget_s)
    device = str(check_device(clf.device if device is None else device, "device"))
    check_held_out(calibration)
    if "_replay" in clf.__dict__:
        raise DyntcError("tune cannot run inside DynamicClassifier.edit (a replay would train again under the store's "
                         "lock): use DynamicClassifier.tune_saved(path), which replays the writes made meanwhile")
    space, points, result, few_shot = train(clf, budget_s, device, episodes, clf.progress)
    space.device = clf.device
    groups = {name: (s.texts, s.points, s.stored_parts()) for name, s in clf.labels_.items()}
    tuned = tuned_classifier(type(clf), space, points, clf.get_params(), clf._targets, groups, None, clf._source)
    tuned._labels.log = clf._labels.log + [{"op": "tune", "episodes": result.steps, "seconds": round(result.seconds, 1),
                                            "few_shot": few_shot}]
    had = clf.calibration_
    clf._become(tuned)
    if clf.head is not None:
        clf.refresh(wait=True)
    settle_calibration(clf, had, calibration)
    return result


def tune_for(clf: Any, budget_s: float = DEFAULT_BUDGET_S, *, device: str | None = None, episodes: int | None = None,
             calibration: Sequence | None = None) -> Any:
    """Fine-tune the pretrained backbone's top layers on the current support sets for at most
    `budget_s` seconds (or ``episodes`` episodes, default the ``episodes`` parameter) on `device`
    (default the ``device`` parameter), as ``train="backbone"`` does at ``fit``; then every support
    example is embedded again and the head retrained, and the classifier has ``train="backbone"``.
    The calibration is refitted on `calibration` = ``(texts, labels[, oos_texts])`` held out from
    the support sets, or dropped with a :class:`~dyntc.errors.DyntcWarning`. Labels with under 20
    examples and under half the median label's are left out of the episodes (:func:`few_shot_labels`)
    and embedded by the tuned backbone like the rest. A model that serves
    from a store is tuned with :meth:`tune_saved`, which does not block its writers. The training
    result is ``tune_result_``. Returns the classifier."""
    clf._check_fitted()
    clf.tune_result_ = tune_in_place(clf, budget_s, device, episodes, calibration)
    return clf


def tune_saved_for(cls: type, path: Any, budget_s: float = DEFAULT_BUDGET_S, *, device: str = "cpu",
                   episodes: int | None = None, calibration: Sequence | None = None, progress: bool = False
                   ) -> TuneReport:
    """:meth:`tune` the newest version of the classifier saved at `path` (a model directory, a
    ``postgresql://`` URL or an open store) without holding its store's lock, and commit the result
    as one new version (:func:`tune_model`): label changes other writers committed meanwhile are
    embedded with the tuned backbone before the commit, so none is lost, and a tune that fails or is
    interrupted commits nothing. Services following the store serve the new version like any other.
    `progress`: a bar over the training episodes. Returns a :class:`TuneReport`."""
    return tune_model(cls, path, budget_s, device=device, episodes=episodes, calibration=calibration,
                      progress=progress)[1]
