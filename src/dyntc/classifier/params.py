"""A :class:`~dyntc.classifier.DynamicClassifier`'s constructor parameters: their checks (done at
``fit``, scikit-learn style: the constructor only stores them; every mistake is a :class:`DyntcError`
naming the parameter and what it accepts), what they mean for the encoder, the network, training
and the metric space, and the scikit-learn conventions over them (:class:`ParamsMixin`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Self

from dyntc.classifier.replay import recorded
from dyntc.errors import DyntcError, is_int, is_number

METRICS = ("euclidean", "hyperbolic")
BACKBONE_LAYERS = 2  # train="backbone": the top transformer layers trained (docs/results.md §9)
PRETRAINED_TRAINING = ("none", "backbone", "head")


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise DyntcError(msg)


def validate_params(clf: Any) -> None:
    """Check every parameter of `clf`, the encoder's options included (builds nothing)."""
    _need(isinstance(clf.encoder, str) and bool(clf.encoder),
          f"encoder must be 'minilm', 'sru' or a model path, got {clf.encoder!r}")
    _need(clf.metric in METRICS, f"metric must be 'euclidean' or 'hyperbolic', got {clf.metric!r}")
    if clf.encoder == "sru":
        _need(clf.train in (None, "encoder"), f"train={clf.train!r} does not apply to the SRU encoder, which is always "
              "trained as a whole: use train=None or 'encoder'")
    else:
        _need(clf.train in (None,) + PRETRAINED_TRAINING, f"train must be one of {PRETRAINED_TRAINING} (or None) for "
              f"a pretrained encoder, got {clf.train!r}")
    for name in ("hidden_size", "num_layers", "max_len", "episodes", "n_support", "n_query",
                 "eval_every", "patience", "batch_size"):
        value = getattr(clf, name)
        if value is None and name in ("num_layers", "max_len"):
            continue
        _need(is_int(value) and value >= 1, f"{name} must be an integer >= 1, got {value!r}")
    _need(is_int(clf.max_classes) and clf.max_classes >= 2,
          f"max_classes must be an integer >= 2, got {clf.max_classes!r}")
    _need(is_number(clf.hard_fraction) and 0 <= clf.hard_fraction <= 0.5,
          f"hard_fraction must be a number in [0, 0.5] (each partner label needs an anchor), got {clf.hard_fraction!r}")
    _need(clf.dropout is None or (is_number(clf.dropout) and 0 <= clf.dropout < 1),
          f"dropout must be in [0, 1), got {clf.dropout!r}")
    _need(is_number(clf.lr) and clf.lr > 0, f"lr must be a number > 0, got {clf.lr!r}")
    _need(clf.time_budget_s is None or (is_number(clf.time_budget_s) and clf.time_budget_s > 0),
          f"time_budget_s must be None or > 0 seconds, got {clf.time_budget_s!r}")
    _need(clf.encoder_options is None or (isinstance(clf.encoder_options, Mapping)
                                          and all(isinstance(k, str) for k in clf.encoder_options)),
          f"encoder_options must be a dict with option names as keys, or None; got {clf.encoder_options!r}")
    _need(is_int(clf.seed), f"seed must be an integer, got {clf.seed!r}")
    for name in ("extend_vocab", "debias"):
        _need(isinstance(getattr(clf, name), bool), f"{name} must be True or False, got {getattr(clf, name)!r}")
    clf._check_device(clf.device)
    from dyntc.encoders import check_encoder_options

    try:
        check_encoder_options(clf.encoder, **encoder_options(clf))
    except DyntcError as exc:
        raise DyntcError(f"{exc} (encoder={clf.encoder!r}, encoder_options={clf.encoder_options!r})") from None


def training_mode(clf: Any) -> str:
    """`train` resolved: what fit trains (see the class docstring)."""
    if clf.train is not None:
        return clf.train
    return "encoder" if clf.encoder == "sru" else "none"


def encoder_options(clf: Any) -> dict:
    """Keyword options of the encoder factory; ``encoder_options`` override (None = the encoder's default)."""
    training = training_mode(clf)
    if clf.encoder == "sru":
        options = {"hidden_size": clf.hidden_size, "num_layers": clf.num_layers, "dropout": clf.dropout,
                   "max_len": clf.max_len, "embeddings": clf.embeddings}
    elif training == "head":
        options = {"mode": "frozen", "hidden_size": clf.hidden_size, "num_layers": clf.num_layers,
                   "dropout": clf.dropout, "max_len": clf.max_len}
    elif training == "backbone":
        options = {"mode": "finetune", "num_layers": 0, "max_len": clf.max_len, "train_layers": BACKBONE_LAYERS}
    else:
        options = {"mode": "frozen", "num_layers": 0, "max_len": clf.max_len}
    return {**options, **(clf.encoder_options or {})}


def network_options(clf: Any) -> dict:
    """Keyword options of the :class:`~dyntc.models.PrototypicalNetwork` (its logit scale)."""
    # No head: unit-length backbone embeddings have d² <= 4, so softmax(-d²) is nearly flat (ECE 0.89
    # on CLINC150). Untrained, the scale is fixed near what calibration finds there (1/T ≈ 18); trained,
    # it is learnt from 10 and settles near 15 (docs/results.md §9)
    training = training_mode(clf)
    if training == "backbone":
        return {"logit_scale": 10.0, "learn_scale": True}
    return {"logit_scale": 16.0} if training == "none" else {}


def train_config(clf: Any, episodes: int, lr: float):
    """The :class:`~dyntc.training.TrainConfig` of `clf`'s episodic training."""
    from dyntc.training import TrainConfig

    return TrainConfig(
        lr=lr, max_episodes=episodes, n_support=clf.n_support, n_query=clf.n_query,
        max_classes=clf.max_classes, hard_fraction=clf.hard_fraction, eval_every=clf.eval_every,
        patience=clf.patience, time_budget_s=clf.time_budget_s, seed=clf.seed,
        device=str(clf._check_device(clf.device)), progress=clf.progress,
    )


def space_options(clf: Any) -> dict:
    """The :class:`~dyntc.classifier.model.MetricSpace` attributes that follow `clf`'s parameters at once."""
    return {"device": str(clf.device), "batch_size": clf.batch_size, "extend_vocab": clf.extend_vocab}


class ParamsMixin:
    """``get_params`` / ``set_params`` / ``repr`` over the constructor's parameters (scikit-learn
    conventions), and the checks a parameter needs when it is set on a fitted classifier."""

    @classmethod
    def _param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor parameters, as a dict (scikit-learn convention)."""
        return {name: getattr(self, name) for name in self._param_names()}

    @recorded
    def set_params(self, **params) -> Self:
        """Set constructor parameters; they apply at the next ``fit`` (``device``, ``batch_size``,
        ``extend_vocab``, ``debias`` and ``progress`` apply at once)."""
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise DyntcError(f"invalid parameter {name!r} for {type(self).__name__}; valid ones: {', '.join(valid)}")
            if name == "batch_size" and not (is_int(value) and value >= 1):
                raise DyntcError(f"batch_size must be an integer >= 1, got {value!r}")
            if name == "device":
                self._check_device(value)
            if name == "debias":
                if not isinstance(value, bool):
                    raise DyntcError(f"debias must be True or False, got {value!r}")
                labels = getattr(self, "_labels", None)
                if labels is not None and labels.debias != value:
                    labels.debias = value
                    self.calibration_ = None  # fitted on the other distances
            setattr(self, name, value)
        self._sync_space()
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if defaults.get(k) != v]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _validate_params(self) -> None:
        validate_params(self)

    @staticmethod
    def _check_device(device: Any):
        from dyntc.training import check_device

        return check_device(device, "device")

    def _sync_space(self) -> None:
        space = getattr(self, "space_", None)
        if space is not None:
            for name, value in space_options(self).items():
                setattr(space, name, value)
