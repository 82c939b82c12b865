"""A :class:`~dyntc.classifier.DynamicClassifier`'s constructor parameters: their checks (done at
``fit``, scikit-learn style: the constructor only stores them; every mistake is a :class:`DyntcError`
naming the parameter and what it accepts), what they mean for the encoder, the network, training
and the metric space, and the scikit-learn conventions over them (:class:`ParamsMixin`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Self

from dyntc.classifier.replay import recorded
from dyntc.errors import DyntcError, is_int, is_number

from dyntc.geometry import METRICS

BACKBONE_LAYERS = 2  # train="backbone": the top transformer layers trained (docs/results.md §9)


def _int(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: is_int(v) and v >= low), f"an integer >= {low}"


def _optional(rule: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or rule[0](v)), f"None or {rule[1]}"


_BOOL = (lambda v: isinstance(v, bool)), "True or False"

#: What each constructor parameter accepts: (check, description). ``fit`` checks them all, then the
#: encoder's options and the train mode against the encoder (``_train_modes``), then the device.
PARAMETER_CONSTRAINTS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "encoder": ((lambda v: isinstance(v, str) and bool(v)), "'minilm', 'sru', 'hashing' or a model path"),
    "metric": ((lambda v: v in METRICS), " or ".join(repr(m) for m in METRICS)),
    "train": ((lambda v: v is None or isinstance(v, str)), "None or a train mode (see the class docstring)"),
    "hidden_size": _int(1),
    "num_layers": _optional(_int(1)),
    "dropout": ((lambda v: v is None or (is_number(v) and 0 <= v < 1)), "None or a number in [0, 1)"),
    "max_len": _optional(_int(1)),
    "embeddings": ((lambda v: v is None or isinstance(v, str)), "the path of a GloVe text file or None"),
    "encoder_options": ((lambda v: v is None or (isinstance(v, Mapping) and all(isinstance(k, str) for k in v))),
                        "a dict with option names as keys, or None"),
    "episodes": _int(1),
    "lr": ((lambda v: is_number(v) and v > 0), "a number > 0"),
    "n_support": _int(1),
    "n_query": _int(1),
    "max_classes": _int(2),
    "hard_fraction": ((lambda v: is_number(v) and 0 <= v <= 0.5),
                      "a number in [0, 0.5] (each partner label needs an anchor)"),
    "eval_every": _int(1),
    "patience": _int(1),
    "time_budget_s": ((lambda v: v is None or (is_number(v) and v > 0)), "None or a number of seconds > 0"),
    "extend_vocab": _BOOL,
    "debias": _BOOL,
    "batch_size": _int(1),
    "seed": ((lambda v: is_int(v)), "an integer"),
    "device": ((lambda v: True), "a torch device"),  # checked by check_device, which knows what is there
    "progress": _BOOL,
}


def check_param(name: str, value: Any) -> None:
    check, what = PARAMETER_CONSTRAINTS[name]
    if not check(value):
        raise DyntcError(f"{name} must be {what}, got {value!r}")


def _train_modes(clf: Any) -> tuple[str, ...]:
    from dyntc.encoders import encoder_kind

    return encoder_kind(clf.encoder).train_modes


def validate_params(clf: Any) -> None:
    """Check every parameter of `clf` against PARAMETER_CONSTRAINTS, the train mode against the
    encoder, and the encoder's options (builds nothing)."""
    for name in PARAMETER_CONSTRAINTS:
        check_param(name, getattr(clf, name))
    modes = _train_modes(clf)
    if clf.train is not None and clf.train not in modes:
        raise DyntcError(f"train={clf.train!r} does not apply to encoder {clf.encoder!r}, which takes "
                         f"{' or '.join(repr(m) for m in modes)} (or None = {modes[0]!r})")
    clf._check_device(clf.device)
    from dyntc.encoders import check_encoder_options

    try:
        check_encoder_options(clf.encoder, **encoder_options(clf))
    except DyntcError as exc:
        raise DyntcError(f"{exc} (encoder={clf.encoder!r}, encoder_options={clf.encoder_options!r})") from None


def training_mode(clf: Any) -> str:
    """`train` resolved: what fit trains (see the class docstring)."""
    return clf.train if clf.train is not None else _train_modes(clf)[0]


def encoder_options(clf: Any) -> dict:
    """Keyword options of the encoder factory; ``encoder_options`` override (None = the encoder's default)."""
    training = training_mode(clf)
    if training == "encoder":  # the SRU, trained as a whole
        options = {"hidden_size": clf.hidden_size, "num_layers": clf.num_layers, "dropout": clf.dropout,
                   "max_len": clf.max_len, "embeddings": clf.embeddings}
    elif clf.encoder == "hashing":  # nothing to shape but its own options
        options = {}
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
            check_param(name, value)
            if name == "device":
                self._check_device(value)
            if name == "debias":
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
        from dyntc.machine import check_device

        return check_device(device, "device")

    def _sync_space(self) -> None:
        space = getattr(self, "space_", None)
        if space is not None:
            for name, value in space_options(self).items():
                setattr(space, name, value)
