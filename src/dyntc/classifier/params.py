"""A :class:`~dyntc.classifier.DynamicClassifier`'s constructor parameters: what each accepts (a
declarative table, checked at ``fit``, scikit-learn style: the constructor only stores them; every
mistake is a :class:`DyntcError` naming the parameter and what it accepts), and what they mean for
the encoder, the network, training and the metric space. Functions of the parameters as a mapping
(``clf.get_params()``): they read no classifier state."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dyntc.errors import DyntcError, is_int, is_number

from dyntc.classifier.live_head import HEADS, head_config
from dyntc.core.geometry import METRICS

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
    "head": ((lambda v: v is None or v in HEADS), "None (nearest prototype) or " + " or ".join(repr(h) for h in HEADS)),
    "head_options": ((lambda v: v is None or (isinstance(v, Mapping) and all(isinstance(k, str) for k in v))),
                     "a dict of cosine-head options (HeadConfig fields, refresh_delay), or None"),
    "batch_size": _int(1),
    "seed": ((lambda v: is_int(v) and v >= 0), "an integer >= 0"),  # numpy's generators refuse negative seeds
    "device": ((lambda v: True), "a torch device"),  # checked by check_device, which knows what is there
    "progress": _BOOL,
}


def check_param(name: str, value: Any) -> None:
    check, what = PARAMETER_CONSTRAINTS[name]
    if not check(value):
        raise DyntcError(f"{name} must be {what}, got {value!r}")


def _train_modes(params: Mapping[str, Any]) -> tuple[str, ...]:
    from dyntc.core.encoders import encoder_kind

    return encoder_kind(params["encoder"]).train_modes


def validate_params(params: Mapping[str, Any]) -> None:
    """Check every parameter against PARAMETER_CONSTRAINTS, the train mode against the encoder, the
    device, the head's options and the encoder's options (builds nothing)."""
    from dyntc.core.encoders import check_encoder_options
    from dyntc.core.machine import check_device

    for name in PARAMETER_CONSTRAINTS:
        check_param(name, params[name])
    modes = _train_modes(params)
    if params["train"] is not None and params["train"] not in modes:
        raise DyntcError(f"train={params['train']!r} does not apply to encoder {params['encoder']!r}, which takes "
                         f"{' or '.join(repr(m) for m in modes)} (or None = {modes[0]!r})")
    check_device(params["device"], "device")
    head_config(params["head_options"])
    try:
        check_encoder_options(params["encoder"], **encoder_options(params))
    except DyntcError as exc:
        raise DyntcError(f"{exc} (encoder={params['encoder']!r}, encoder_options={params['encoder_options']!r})") from None


def training_mode(params: Mapping[str, Any]) -> str:
    """`train` resolved: what fit trains (see the class docstring)."""
    return params["train"] if params["train"] is not None else _train_modes(params)[0]


def encoder_options(params: Mapping[str, Any]) -> dict:
    """Keyword options of the encoder factory; ``encoder_options`` override (None = the encoder's default)."""
    from dyntc.core.encoders import encoder_options_for

    training = training_mode(params)
    p = params
    if training == "encoder":  # the SRU, trained as a whole
        shape = {"hidden_size": p["hidden_size"], "num_layers": p["num_layers"], "dropout": p["dropout"],
                 "embeddings": p["embeddings"]}
    elif training == "head":
        shape = {"mode": "frozen", "hidden_size": p["hidden_size"], "num_layers": p["num_layers"], "dropout": p["dropout"]}
    elif training == "backbone":
        shape = {"mode": "finetune", "num_layers": 0, "train_layers": BACKBONE_LAYERS}
    else:
        shape = {"mode": "frozen", "num_layers": 0}
    return encoder_options_for(p["encoder"], max_len=p["max_len"], overrides=p["encoder_options"], **shape)


def network_options(params: Mapping[str, Any]) -> dict:
    """Keyword options of the :class:`~dyntc.core.models.PrototypicalNetwork` (its logit scale)."""
    # No head: unit-length backbone embeddings have d² <= 4, so softmax(-d²) is nearly flat (ECE 0.89
    # on CLINC150). Untrained, the scale is fixed near what calibration finds there (1/T ≈ 18); trained,
    # it is learnt, starting from 10 (docs/results.md §9)
    training = training_mode(params)
    if training == "backbone":
        return {"logit_scale": 10.0, "learn_scale": True}
    return {"logit_scale": 16.0} if training == "none" else {}


def train_config(params: Mapping[str, Any], episodes: int, lr: float):
    """The :class:`~dyntc.core.training.TrainConfig` of the episodic training these parameters ask for."""
    from dyntc.core.machine import check_device
    from dyntc.core.training import TrainConfig

    p = params
    return TrainConfig(
        lr=lr, max_episodes=episodes, n_support=p["n_support"], n_query=p["n_query"],
        max_classes=p["max_classes"], hard_fraction=p["hard_fraction"], eval_every=p["eval_every"],
        patience=p["patience"], time_budget_s=p["time_budget_s"], seed=p["seed"],
        device=str(check_device(p["device"], "device")), progress=p["progress"],
    )


def space_options(params: Mapping[str, Any]) -> dict:
    """The :class:`~dyntc.classifier.space.MetricSpace` attributes that follow the parameters at once."""
    return {"device": str(params["device"]), "batch_size": params["batch_size"], "extend_vocab": params["extend_vocab"]}


def check_new_params(owner: str, valid: list[str], params: Mapping[str, Any]) -> None:
    """What ``set_params`` checks before it changes anything: each name is a parameter of `owner`
    and each value one it accepts (a device that exists, head options its head knows)."""
    from dyntc.core.machine import check_device

    for name, value in params.items():
        if name not in valid:
            raise DyntcError(f"invalid parameter {name!r} for {owner}; valid ones: {', '.join(valid)}")
        check_param(name, value)
        if name == "device":
            check_device(value, "device")
        if name == "head_options":
            head_config(value)
