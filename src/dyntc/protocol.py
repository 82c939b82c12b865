"""The paper's dynamic classification protocol (Wohlwend et al. 2019, Sections 4-5), end to end.

For each random label split (:mod:`dyntc.data.dynamic`) and each model (MLP, EUC, HYP):

1. **pretrain** on the pretraining pool labelled with ``Y_old`` (early stopping on ``dev_old``);
2. for each ``n_fine``, take ``n_fine`` examples per class of ``Y_new`` from the fine-tuning pool and
   evaluate three variants on the test set (labelled with ``Y_new``):

   - ``fine-tuned``: train the pretrained model further on the ``n_fine`` examples (MLP: new output
     layer + supervised training; EUC/HYP: episodic training); prototypes from those examples;
   - ``un-tuned``: no training; prototypes from the pretrained encoder and the ``n_fine`` examples
     (MLP: k-NN, k=5, on its penultimate layer = the paper's MLP-KNN);
   - ``scratch``: the fine-tuned recipe applied to a freshly initialised model (no pretraining);

   Early stopping during fine-tuning / scratch training uses the dev set labelled with ``Y_new``
   (``dev_new``), with prototypes built from the ``n_fine`` examples.

Accuracy is reported over all test examples (``acc_all``), over those whose true label is a new class
(``acc_new``) and over the others (``acc_old``). Every finished (model, variant, n_fine, split) cell is
written at once to ``results.json`` (atomically), so an interrupted run resumes where it stopped.
Pretrained weights are cached under ``checkpoints/`` of the run directory, and so is the state of
a training stage while it runs (``*.partial.pt``, rewritten at each dev evaluation): a run stopped
mid-stage resumes that stage where it was, with the same result.

Texts are featurized once per run (the SRU vocabulary comes from the full training split's texts:
GloVe is frozen, so this leaks no label information) and reused by every split, model and ``n_fine``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
import time
import typing
import zlib
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from dyntc import __version__
from dyntc.checkpoint import update_json
from dyntc.files import atomic_write, write_json
from dyntc.data.dynamic import DynamicSplit, check_fraction, make_split
from dyntc.data.types import Dataset
from dyntc.errors import DyntcError
from dyntc.models import PrototypicalNetwork, build_model, load_trainable_state, trainable_state
from dyntc.training import (
    Encoded,
    TrainConfig,
    TrainResult,
    check_device,
    check_out_dir,
    embed,
    embed_points,
    machine_description,
    train_prototypical,
    train_supervised,
)

RESULTS_FORMAT = 1
METRIC_MODELS = ("euc", "hyp")
ALL_MODELS = ("mlp", "euc", "hyp", "logreg")
DEFAULT_MODELS = ("mlp", "euc", "hyp")
VARIANTS = ("fine-tuned", "un-tuned", "scratch")
# Model -> the variants it has. logreg (SetFit-style probe on a frozen pretrained backbone) has no
# Y_old pretraining stage of its own: it is only trained on the n_fine examples.
MODEL_VARIANTS = {"mlp": VARIANTS, "euc": VARIANTS, "hyp": VARIANTS, "logreg": ("fine-tuned",)}
HIERARCHICAL_DEFAULT_N_FINE = (5, 10, 20, 50, 100, 500)  # NEWS / WOS: Table 2 plus Table 3's 50 and 500
FLAT_DEFAULT_N_FINE = (5, 10, 20, 100)  # Table 2


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------


@dataclass
class Profile:
    """Every hyperparameter of a protocol run. Per-dataset values are dicts with a ``"*"`` default."""

    name: str
    splits: int = 5
    n_fine: dict[str, tuple[int, ...]] = field(
        default_factory=lambda: {"news": HIERARCHICAL_DEFAULT_N_FINE, "wos": HIERARCHICAL_DEFAULT_N_FINE, "*": FLAT_DEFAULT_N_FINE}
    )
    p: float = 0.3
    # encoder (SRU options; a pretrained encoder takes only max_len / dropout when it supports them)
    hidden_size: int = 128
    num_layers: int = 4
    dropout: dict[str, float] = field(default_factory=lambda: {"wos": 0.3, "*": 0.5})
    max_len: dict[str, int] = field(default_factory=lambda: {"*": 200})
    # optimisation (Adam)
    lr: float = 1e-3
    n_support: int = 4  # N_S
    n_query: int = 64  # N_Q, per episode in total
    max_classes: int = 50  # N_C = all classes, at most this many
    batch_size: int = 64  # MLP
    # pretraining on Y_old
    pretrain_episodes: int = 10_000
    pretrain_epochs: int = 100
    pretrain_eval_every: int = 100
    pretrain_patience: int = 10
    pretrain_eval_support_per_class: int | None = None  # dev prototypes from at most this many examples per class
    # EUC/HYP pretraining's slow-start guard (docs/results.md §7-8; 0 = off): no early stop before this
    # many episodes, nor while the training loss is still at chance (dyntc.stopping: held evaluations)
    pretrain_min_episodes: int = 0
    # fine-tuning (and training from scratch) on the n_fine examples
    finetune_episodes: int = 10_000
    finetune_epochs: int = 100
    finetune_eval_every: int = 100
    finetune_patience: int = 10
    # MLP fine-tuning / scratch: with n_fine examples per class an epoch is only a batch or two, so epochs
    # (and the patience, in epochs) are raised until at least this many batches may run (0 = epochs as given)
    finetune_min_steps: int = 0
    # Adam's learning rate while fine-tuning and training from scratch (None: the model's lr)
    finetune_lr: float | None = None
    finetune_eval_support_per_class: int | None = None  # EUC/HYP dev-time prototypes while fine-tuning (test: all n_fine)
    # the costly scratch variant only at the run's smallest and largest n_fine (the two ends the
    # pretraining-gain figure compares); a cell selection like --scratch-n-fine, so not in the fingerprint
    scratch_ends_only: bool = False
    # evaluation
    dev_per_class: dict[str, int | None] = field(default_factory=lambda: {"*": None})  # cap on early-stopping dev sets, per class
    test_per_class: int | None = None  # None = the full test set (always, except in `tiny`)
    knn_k: int = 5  # MLP-KNN
    stage_time_budget_s: float | None = None  # optional cap on any single training stage
    # EUC/HYP options (dyntc.models.PrototypicalNetwork): logits -logit_scale * d² (learnt from that
    # start when learn_scale), encoder output's norm soft-clipped below max_norm before the lift
    logit_scale: float = 1.0
    learn_scale: bool = False
    max_norm: float | None = None
    fixed_norm: float | None = None  # encoder output projected to this norm (direction only) before the lift
    # HYP: backpropagate through the Fréchet mean. The paper detached it; on SENT's dev sets the gradient
    # through the mean wins clearly (docs/results.md §7), so it is the default of every profile
    differentiable_mean: bool = True
    # per dataset, per model: overrides of lr, dropout and the options above, e.g.
    # {"*": {"hyp": {"learn_scale": True}}}; `dyntc reproduce --tune` writes its choice here
    per_model: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"*": {}})
    description: str = ""

    def __post_init__(self) -> None:
        from dyntc.tuning import TUNABLE

        for dataset, models in self.per_model.items():
            for model, values in (models or {}).items():
                if model not in ALL_MODELS:
                    raise DyntcError(f"profile {self.name}: per_model[{dataset!r}] names unknown model {model!r}")
                bad = sorted(set(values) - set(TUNABLE))
                if bad:
                    raise DyntcError(f"profile {self.name}: per_model[{dataset!r}][{model!r}] sets {bad}; "
                                     f"settable per model: {', '.join(TUNABLE)}")

    def for_dataset(self, dataset: str) -> dict[str, Any]:
        """The profile with per-dataset values resolved, as a JSON-able dict."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, dict):
                value = value.get(dataset, value.get("*"))
            if isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


PAPER = Profile(
    name="paper",
    pretrain_min_episodes=3_000,
    # NEWS: HYP's encoder output soft-clipped to norm <= 10 before the lift, and a learnt logit scale.
    # Without the clip HYP sat at chance-level loss for 4,000 episodes, its points drifting outwards;
    # with the clip alone its points saturate at the bound and it stalls (docs/results.md §8). Chosen on
    # dev_old of split 2 against no clip, clips at 5 and 10, and a projection to norm 10
    per_model={"news": {"hyp": {"max_norm": 10.0, "learn_scale": True}}, "*": {}},
    description=(
        "The paper's hyperparameters: SRU 4 x 128 on frozen GloVe, Adam 1e-3, up to 10,000 episodes / 100 epochs "
        "with early stopping (patience 10 evaluations, every 100 episodes / every epoch), N_S=4, N_Q=64, N_C=all "
        "(<=50), dropout 0.5 (0.3 WOS), 5 splits, p=0.3. Fine-tuning uses the same budget. Meant for a GPU. "
        "Changes from the paper (issue 11): HYP backpropagates through the Fréchet mean (differentiable_mean); "
        "EUC/HYP pretraining does not stop early before 3,000 episodes, nor while its training loss is at chance "
        "(pretrain_min_episodes; held evaluations do not count towards the patience). NEWS: HYP soft-clips "
        "its encoder output to norm <= 10 before the lift and learns its logit scale (per_model; without them HYP "
        "stays at chance, then stalls, on NEWS)."
    ),
)

QUICK = Profile(
    name="quick",
    splits=3,
    n_fine={"*": (5, 10, 20, 100)},
    hidden_size=128,
    num_layers=2,
    max_len={"news": 64, "wos": 64, "*": 32},
    lr=3e-3,
    pretrain_episodes=3_000,
    pretrain_epochs=10,
    pretrain_eval_every=100,
    pretrain_patience=5,
    pretrain_eval_support_per_class=50,
    finetune_episodes=400,
    finetune_epochs=10,
    finetune_eval_every=25,
    finetune_patience=4,
    finetune_min_steps=60,
    finetune_lr=1e-3,
    finetune_eval_support_per_class=20,
    scratch_ends_only=True,
    dev_per_class={"clinc150": 10, "hwu64": 10, "wos": 10, "*": 30},
    description=(
        "CPU-sized, chosen to track `paper` on SENT (docs/results.md §3): the protocol, models and variants of "
        "`paper` with a 2-layer SRU (hidden 128), texts truncated to 32 tokens (64 for NEWS/WOS), pretraining "
        "with Adam 3e-3 (fewer episodes than 1e-3) for <=3,000 episodes / 10 epochs with patience 5, "
        "fine-tuning with Adam 1e-3 for <=400 episodes (dev every 25, patience 4; >=60 batches for the MLP), "
        "scratch only at the smallest and largest n_fine, dev sets capped at 30 examples per class (10 for "
        "the 64-150-class datasets), 3 splits, n_fine 5, 10, 20, 100."
    ),
)

TINY = Profile(
    name="tiny",
    splits=1,
    n_fine={"*": (5, 10)},
    hidden_size=32,
    num_layers=1,
    dropout={"*": 0.1},
    max_len={"*": 16},
    n_query=32,
    max_classes=10,
    pretrain_episodes=20,
    pretrain_epochs=1,
    pretrain_eval_every=10,
    pretrain_patience=1,
    pretrain_eval_support_per_class=10,
    finetune_episodes=10,
    finetune_epochs=2,
    finetune_eval_every=5,
    finetune_patience=1,
    finetune_min_steps=4,
    dev_per_class=10,
    test_per_class=30,
    description="Smoke test (seconds): 1 split, 2 n_fine values, a 1 x 32 SRU, a few episodes, test capped at 30 per class.",
)

PROFILES = {p.name: p for p in (PAPER, QUICK, TINY)}


def get_profile(name: str | Profile) -> Profile:
    if isinstance(name, Profile):
        return name
    if name not in PROFILES:
        raise DyntcError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
    return PROFILES[name]


def _allows_none(hint) -> bool:
    """Whether a type hint admits None anywhere (``int | None``, ``dict[str, int | None]``)."""
    return hint is type(None) or any(_allows_none(arg) for arg in typing.get_args(hint))


def override(profile: Profile, settings: dict[str, str]) -> Profile:
    """A copy of `profile` with fields set from ``{"field": "value"}`` strings (``--set field=value``).

    Per-dataset fields are set for every dataset; tuples take comma-separated values; ``none`` = None.
    """
    if not settings:
        return profile
    types = {f.name: f for f in fields(profile)}
    hints = typing.get_type_hints(Profile)
    changes: dict[str, Any] = {}
    for key, raw in settings.items():
        if key not in types or key in ("name", "description"):
            raise DyntcError(f"unknown profile setting {key!r}: choose from {', '.join(k for k in types if k not in ('name', 'description'))}")
        current = getattr(profile, key)
        sample = current.get("*") if isinstance(current, dict) else current
        if raw.lower() == "none" and not _allows_none(hints[key]):
            raise DyntcError(f"--set {key}=none: {key} cannot be none (it is {current!r} in this profile)")
        try:
            if raw.lower() == "none":
                value: Any = None
            elif isinstance(sample, tuple):
                value = tuple(int(v) for v in raw.split(",") if v.strip())
            elif isinstance(sample, bool):
                value = raw.lower() in ("1", "true", "yes")
            elif isinstance(sample, int) or (sample is None and key.endswith(("_per_class", "splits"))):
                value = int(raw)
            else:
                value = float(raw)
        except ValueError:
            expected = {"int": "an integer", "float": "a number", "tuple": "comma-separated integers"}
            raise DyntcError(f"setting {key}={raw!r}: expected {expected.get(type(sample).__name__, 'a number')}") from None
        changes[key] = {"*": value} if isinstance(current, dict) else value
    return replace(profile, **changes)


# --------------------------------------------------------------------------------------------------
# Run configuration
# --------------------------------------------------------------------------------------------------


def parse_int_list(text: str | None, what: str) -> tuple[int, ...] | None:
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if not isinstance(text, str):
        return tuple(int(v) for v in text)
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise DyntcError(f"{what} must be comma-separated integers, got {text!r}") from None
    return values


def parse_names(text: str | None | tuple, allowed: tuple[str, ...], what: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(v.strip().lower() for v in (text.split(",") if isinstance(text, str) else text) if v.strip())
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise DyntcError(f"unknown {what} {bad or names!r}: choose from {', '.join(allowed)}")
    return tuple(dict.fromkeys(names))


# Profile fields added after runs were recorded, at the value that behaves as before they existed:
# left out of the fingerprint at that value, so those runs still resume.
_NEW_FIELD_DEFAULTS: dict[str, Any] = {"finetune_lr": None, "fixed_norm": None}


@dataclass
class RunPlan:
    dataset: str
    profile: Profile
    hp: dict[str, Any]  # the profile resolved for the dataset (plus the options below)
    splits: int
    n_fine: tuple[int, ...]
    models: tuple[str, ...]
    variants: tuple[str, ...]
    encoder: str
    seed: int
    device: str
    scratch_n_fine: tuple[int, ...] | None = None  # the scratch variant only at these n_fine (None: at all)
    # GloVe text file for the sru encoder (None: the packaged glove.6B.50d). Not in the fingerprint: the
    # vocabulary digest in results.json guards resumes instead, so a subset file of the same vectors
    # (``dyntc export-glove``) resumes a run made with the package, e.g. on a GPU host without it.
    embeddings: str | None = None

    def cells(self, split: int) -> list[tuple[str, str, int, int]]:
        return [
            (m, v, n, split)
            for m in self.models
            for n in self.n_fine
            for v in self.variants
            if v in MODEL_VARIANTS[m] and not (v == "scratch" and self.scratch_n_fine is not None
                                                and n not in self.scratch_n_fine)
        ]

    def fingerprint(self) -> dict[str, Any]:
        """What must match between a results directory and a rerun (selection of cells excluded)."""
        hp = {k: v for k, v in self.hp.items() if k not in ("splits", "n_fine", "scratch_ends_only", "description")
              and not (k in _NEW_FIELD_DEFAULTS and v == _NEW_FIELD_DEFAULTS[k])}
        return {"dataset": self.dataset, "encoder": self.encoder, "seed": self.seed, "hyperparameters": hp}


def make_plan(
    dataset: str,
    profile: str | Profile,
    *,
    splits: int | None = None,
    n_fine: str | tuple[int, ...] | None = None,
    models: str | tuple[str, ...] | None = None,
    variants: str | tuple[str, ...] | None = None,
    encoder: str = "sru",
    p: float | None = None,
    seed: int = 0,
    device: str = "cpu",
    settings: dict[str, str] | None = None,
    scratch_n_fine: str | tuple[int, ...] | None = None,
    embeddings: str | Path | None = None,
) -> RunPlan:
    """Validate the options of a run (every mistake is a :class:`DyntcError`, raised before any work).

    `scratch_n_fine` limits the (costly) scratch variant to some of the n_fine values, e.g. the low
    and the high end that the pretraining-gain figure needs (without it, a profile with
    ``scratch_ends_only`` keeps the run's smallest and largest n_fine); like the other selections it
    is not part of the fingerprint, so a run can be resumed with another choice."""
    from dyntc.data.datasets import resolve_name

    try:  # aliases ("20news", ...) get the dataset's own hyperparameters
        dataset = resolve_name(dataset)
    except DyntcError:  # a Dataset of the user's own: the profile's "*" values
        pass
    prof = override(get_profile(profile), settings or {})
    if p is not None:
        prof = replace(prof, p=check_fraction(p))
    check_fraction(prof.p)
    hp = prof.for_dataset(dataset)
    n_splits = prof.splits if splits is None else int(splits)
    if n_splits < 1:
        raise DyntcError(f"--splits must be >= 1, got {n_splits}")
    fine = parse_int_list(n_fine, "--n-fine") if n_fine is not None else tuple(hp["n_fine"])
    if not fine:
        raise DyntcError("--n-fine needs at least one value")
    if any(n < 1 for n in fine):
        raise DyntcError(f"--n-fine values must be >= 1, got {list(fine)}")
    fine = tuple(sorted(set(fine)))
    chosen_models = parse_names(models, ALL_MODELS, "model(s)") or DEFAULT_MODELS
    chosen_variants = parse_names(variants, VARIANTS, "variant(s)") or VARIANTS
    check_device(device)
    if "logreg" in chosen_models and encoder == "sru":
        raise DyntcError(
            "the logreg baseline fits a logistic regression on frozen pretrained sentence embeddings; "
            "it needs --encoder minilm (or a local sentence-transformers model), not sru"
        )
    trains_metric = any(m in METRIC_MODELS for m in chosen_models) and any(
        v in ("fine-tuned", "scratch") for v in chosen_variants
    )
    if trains_metric and min(fine) < hp["n_support"] + 1:
        raise DyntcError(
            f"n_fine={min(fine)} is too small for episodic fine-tuning of euc/hyp with n_support={hp['n_support']}: "
            f"each class needs n_support + 1 = {hp['n_support'] + 1} examples (raise --n-fine or set n_support lower)"
        )
    for name in ("hidden_size", "num_layers", "n_support", "n_query", "batch_size", "knn_k", "max_len"):
        if hp[name] is not None and hp[name] < 1:
            raise DyntcError(f"profile setting {name} must be >= 1, got {hp[name]}")
    if hp["max_classes"] < 2:
        raise DyntcError(f"profile setting max_classes must be >= 2, got {hp['max_classes']}")
    scratch = None
    if scratch_n_fine is not None:
        scratch = tuple(sorted(set(parse_int_list(scratch_n_fine, "--scratch-n-fine"))))
        stray = sorted(set(scratch) - set(fine))
        if not scratch or stray:
            raise DyntcError(f"--scratch-n-fine must list some of the run's n_fine values {list(fine)}; "
                             f"got {list(scratch) if scratch else 'none'}")
        if "scratch" not in chosen_variants:
            raise DyntcError("--scratch-n-fine is given but the scratch variant is not among --variants")
    elif hp["scratch_ends_only"] and "scratch" in chosen_variants:
        scratch = tuple(sorted({fine[0], fine[-1]}))
    if embeddings is not None:
        if encoder != "sru":
            raise DyntcError(f"--embeddings (a GloVe file) applies to the sru encoder only, not to --encoder {encoder}")
        if not Path(embeddings).is_file():
            raise DyntcError(f"--embeddings {str(embeddings)!r} is not a file: pass a GloVe text file "
                             "('word v1 ... vd' per line, e.g. from dyntc export-glove), or omit it for the packaged glove.6B.50d")
        embeddings = str(Path(embeddings).resolve())
    hp["splits"], hp["n_fine"] = n_splits, list(fine)
    return RunPlan(dataset, prof, hp, n_splits, fine, chosen_models, chosen_variants, encoder, int(seed), device,
                   scratch, embeddings)


# --------------------------------------------------------------------------------------------------
# Helpers: seeds, featurized data, evaluation
# --------------------------------------------------------------------------------------------------


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (same on every run and machine)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


def cell_key(model: str, variant: str, n_fine: int, split: int) -> str:
    return f"{model}/{variant}/{n_fine}/{split}"


@dataclass
class Featurized:
    """Featurized items of a dataset's train / dev / test texts, shared by all splits."""

    train: list[Any]
    dev: list[Any]
    test: list[Any]
    signature: Any  # the encoder's extra_files(): equal signatures featurize identically

    def encoded(self, part: str, indices: np.ndarray, labels: list[str], classes: list[str]) -> Encoded:
        items = getattr(self, part)
        return Encoded.from_items([items[i] for i in indices], labels, classes)


@torch.no_grad()
def _proto_predict(model: PrototypicalNetwork, support_points: torch.Tensor, support_labels: np.ndarray,
                   n_classes: int, query_points: torch.Tensor) -> np.ndarray:
    was = model.training
    model.eval()
    try:
        protos = model.prototypes(support_points, torch.as_tensor(support_labels, device=support_points.device), n_classes)
        return model.logits(query_points, protos).argmax(1).cpu().numpy()
    finally:
        model.train(was)


def _knn_predict(features_support: torch.Tensor, labels: np.ndarray, features_query: torch.Tensor, k: int) -> np.ndarray:
    from dyntc.models import KNNProbe

    probe = KNNProbe(k).fit(features_support.cpu(), torch.as_tensor(labels))
    return probe.predict(features_query.cpu()).numpy()


def accuracies(pred: np.ndarray, truth: np.ndarray, new_mask: np.ndarray) -> dict[str, float | None]:
    correct = pred == truth
    out: dict[str, float | None] = {"acc_all": float(correct.mean())}
    out["acc_new"] = float(correct[new_mask].mean()) if new_mask.any() else None
    out["acc_old"] = float(correct[~new_mask].mean()) if (~new_mask).any() else None
    return out


def _train_info(result: TrainResult | None) -> dict[str, Any]:
    if result is None:
        return {"steps": 0, "stopped_early": None, "best_dev_acc": None}
    return {"steps": result.steps, "stopped_early": result.stopped_early, "best_dev_acc": result.best_dev_acc}


def save_weights(path: Path, model: nn.Module, info: dict) -> None:
    """Trainable weights (frozen ones, e.g. GloVe, are rebuilt from the encoder) and a JSON side file."""
    from safetensors.torch import save_file

    state = {k: v.detach().cpu().contiguous() for k, v in trainable_state(model).items()}
    with atomic_write(path) as tmp:
        save_file(state, str(tmp))
    write_json(path.with_suffix(".json"), info)


def load_weights(path: Path, model: nn.Module) -> dict | None:
    """Load what :func:`save_weights` wrote into `model`; None (and nothing loaded) if absent or unusable."""
    from safetensors.torch import load_file

    side = path.with_suffix(".json")
    if not (path.is_file() and side.is_file()):
        return None
    try:
        load_trainable_state(model, load_file(str(path), device="cpu"))
        return json.loads(side.read_text(encoding="utf-8"))
    except (OSError, RuntimeError, ValueError):  # DyntcError is a ValueError
        return None


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Unit:
    """A (split, model) work unit: the model's pretraining on that split, then its cells. Units share
    nothing but the featurized texts and every seed comes from :func:`derive_seed`, so they may run in
    any order, or in parallel processes (``dyntc.runner``), with the same results."""

    split: int
    model: str
    cells: list[tuple[str, str, int, int]]

    @property
    def name(self) -> str:
        return f"split {self.split} {self.model}"


@dataclass
class SplitData:
    """What the units of one split share: the freshly initialised encoder and the featurized sets."""

    seed: int
    split: DynamicSplit
    enc0: Any
    pretrain: Encoded
    dev_old: Encoded
    dev_new: Encoded
    pool: Encoded
    test: Encoded
    test_new_mask: np.ndarray


def merge_results(disk: dict, ours: dict, *, header: bool) -> dict:
    """`ours` merged into `disk` (the results file as another process left it): rows joined by cell (a
    cell already on disk is kept: it was computed from the same seeds), ``split_info`` and
    ``pretraining`` per split and model; with `header`, our run-level fields win (the parent process)."""
    merged = {**disk, **{k: v for k, v in ours.items() if k not in ("rows", "split_info", "pretraining")}} if header else dict(disk)
    rows = list(disk.get("rows", []))
    have = {cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) for r in rows}
    rows += [r for r in ours.get("rows", []) if cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) not in have]
    merged["rows"] = rows
    for part in ("split_info", "pretraining"):
        merged[part] = {s: dict(v) for s, v in disk.get(part, {}).items()}
        for s, v in ours.get(part, {}).items():
            merged[part].setdefault(s, {}).update(v)
    if "vocabulary" in ours:  # a worker may be the first process to build the encoder
        merged.setdefault("vocabulary", ours["vocabulary"])
    merged["updated"] = _now()
    return merged


class ProtocolRun:
    """One ``dyntc reproduce`` run: a dataset, a plan, an output directory.

    The orchestration (order of the units, processes, progress and ETA) is :mod:`dyntc.runner`'s;
    this class prepares the units (:meth:`prepare`), runs one (:meth:`run_unit`) and closes the run
    (:meth:`finish`). A worker process opens its own instance with ``worker=True``: it merges its rows
    into ``results.json`` and leaves the run-level fields to the parent.
    """

    def __init__(self, data: Dataset, plan: RunPlan, out: Path, *, force: bool = False, progress: bool = True,
                 log: Callable[[str], None] | None = None, worker: bool = False):
        self.data, self.plan, self.out = data, plan, Path(out)
        self.hp = plan.hp
        self.progress = progress
        self.worker = worker
        self.log = log or (lambda msg: tqdm.write(msg))
        self.results_path = self.out / "results.json"
        self.results = self._open(force)
        self._featurized: Featurized | None = None
        self._enc_options: dict[str, Any] = {}
        self._splits: dict[int, DynamicSplit] = {}
        self._split_data: dict[int, SplitData] = {}
        self._on_work: Callable[[int], None] | None = None  # hears of training work (sequences), for the ETA

    # ---- results file -------------------------------------------------------------------------

    def _open(self, force: bool) -> dict:
        fingerprint = self.plan.fingerprint()
        check_out_dir(self.out)
        if self.results_path.is_file():
            try:
                old = json.loads(self.results_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise DyntcError(f"{self.results_path} is not valid JSON ({exc}); move it away or pass --force") from exc
            if not isinstance(old, dict):
                raise DyntcError(f"{self.results_path} is not a dyntc results file; move it away or pass --force")
            if force:
                self.log(f"--force: discarding {len(old.get('rows', []))} finished cells in {self.out}")
                shutil.rmtree(self.out / "checkpoints", ignore_errors=True)
            elif old.get("fingerprint") != fingerprint:
                saved = old.get("fingerprint") or {}
                finished = {r.get("model") for r in old.get("rows", [])} | {
                    m for models in (old.get("pretraining") or {}).values() for m in models}
                contradicted = sorted(m for m in finished if model_view(saved, m) != model_view(fingerprint, m))
                if contradicted or not isinstance(saved.get("hyperparameters"), dict):
                    raise DyntcError(
                        f"{self.out} holds results of a different configuration ({_diff(saved, fingerprint)}) for "
                        f"{', '.join(contradicted) or 'its models'}; use another --out, or pass --force to discard them")
                # the change concerns only models with nothing finished (e.g. one model's per-model
                # settings): their running stages' snapshots are checked against their own settings
                self.log(f"{self.results_path}: taking the new configuration ({_diff(saved, fingerprint)}); "
                         f"it changes nothing for the finished work of {', '.join(sorted(finished)) or 'no model'}")
                old.update(self._header(started=old.get("started")))
                return old
            else:
                old.update(self._header(started=old.get("started")))
                return old
        self.out.mkdir(parents=True, exist_ok=True)
        return {**self._header(started=None), "rows": [], "split_info": {}, "pretraining": {}}

    def _header(self, started: str | None) -> dict:
        plan = self.plan
        return {
            "format": RESULTS_FORMAT,
            "dataset": plan.dataset,
            "profile": plan.profile.name,
            "profile_description": plan.profile.description,
            "encoder": plan.encoder,
            "p": self.hp["p"],
            "seed": plan.seed,
            "n_fine": list(plan.n_fine),
            "splits": plan.splits,
            "models": list(plan.models),
            "variants": list(plan.variants),
            "scratch_n_fine": None if plan.scratch_n_fine is None else list(plan.scratch_n_fine),
            "config": self.hp,
            "fingerprint": plan.fingerprint(),
            "dyntc_version": __version__,
            "machine": machine_description(),
            "device": plan.device,
            "torch_threads": torch.get_num_threads(),
            "started": started or _now(),
            "finished": None,
            "early_stopping": "pretraining: dev set relabelled to Y_old; fine-tuning and scratch: dev set on Y_new, "
                              "prototypes (EUC/HYP) from the n_fine examples",
        }

    def done(self) -> set[str]:
        return {cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) for r in self.results["rows"]}

    def _save(self, replace: bool = False) -> None:
        """Merge this process's results into ``results.json`` under a file lock (other workers may be
        writing); `replace` writes them as they are (the start of a run: old results kept or --force)."""
        ours = self.results
        ours["updated"] = _now()
        self.results = update_json(
            self.results_path, lambda disk: ours if replace or disk is None else merge_results(disk, ours, header=not self.worker))

    # ---- encoder and features -----------------------------------------------------------------

    def _fresh_encoder(self, split_seed: int, dropout: float | None = None):
        from dyntc.encoders import create_encoder

        hp = self.hp
        if self.plan.encoder == "sru":
            dropout = hp["dropout"] if dropout is None else dropout
            options = dict(hidden_size=hp["hidden_size"], num_layers=hp["num_layers"], dropout=dropout, max_len=hp["max_len"],
                           embeddings=self.plan.embeddings)
        else:  # a pretrained backbone: max_len counts word pieces; the head keeps its own dropout default
            options = dict(max_len=hp["max_len"], hidden_size=hp["hidden_size"])
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, "encoder"))
        try:
            enc = create_encoder(self.plan.encoder, self.data.train.texts, **options)
        except TypeError as exc:  # a pretrained encoder that takes fewer options
            raise DyntcError(f"encoder {self.plan.encoder!r} does not accept the profile's options ({exc})") from exc
        self._enc_options = options
        if self.plan.encoder == "sru":
            self._check_vocabulary(enc)
        return enc

    def _check_vocabulary(self, enc) -> None:
        """Record the frozen vocabulary's digest, or refuse one that differs from the run's (a resume
        with other word vectors would mix two encoders' cells in one table)."""
        digest = hashlib.sha256("\n".join(enc.vocab.tokens).encode("utf-8"))
        digest.update(enc.embedding.weight.detach().cpu().numpy().astype("<f4").tobytes())
        entry = {"words": len(enc.vocab), "dim": int(enc.embedding.weight.shape[1]), "sha256": digest.hexdigest()}
        known = self.results.get("vocabulary")
        if known is None:
            self.results["vocabulary"] = entry
        elif known != entry:
            source = self.plan.embeddings or "the packaged glove.6B.50d"
            raise DyntcError(
                f"the vocabulary built from {source} ({entry['words']} words x {entry['dim']}) differs from the one "
                f"{self.results_path} was made with ({known['words']} x {known['dim']}, sha256 {known['sha256'][:12]}...): "
                "pass the same --embeddings as the run's, another --out, or --force to discard its results")

    def _features(self, enc) -> Featurized:
        signature = enc.extra_files()
        if self._featurized is None or self._featurized.signature != signature:
            t0 = time.perf_counter()
            self._featurized = Featurized(
                enc.featurize(self.data.train.texts), enc.featurize(self.data.dev.texts),
                enc.featurize(self.data.test.texts), signature,
            )
            self.log(f"featurized {len(self.data.train) + len(self.data.dev) + len(self.data.test)} texts "
                     f"in {time.perf_counter() - t0:.1f}s")
        return self._featurized

    # ---- per-model settings (tuning hook) ----------------------------------------------------------

    def model_hp(self, model: str) -> dict[str, Any]:
        """The resolved profile with `model`'s ``per_model`` overrides (lr, dropout, prototype options)."""
        return {**self.hp, **((self.hp.get("per_model") or {}).get(model) or {})}

    def model_options(self, model: str) -> dict[str, Any]:
        """Keyword options of :func:`dyntc.models.build_model` for `model` (none for the MLP)."""
        if model not in METRIC_MODELS:
            return {}
        hp = self.model_hp(model)
        from dyntc.tuning import MODEL_OPTIONS

        return {k: hp[k] for k in MODEL_OPTIONS}

    def _encoder_for(self, model: str, enc0, split_seed: int):
        """A copy of the split's encoder, or a fresh one (same seed) where `model` has its own dropout."""
        dropout = self.model_hp(model)["dropout"]
        if self.plan.encoder != "sru" or dropout == self.hp["dropout"]:
            return copy.deepcopy(enc0)
        return self._fresh_encoder(split_seed, dropout=dropout)

    def pretrain_dev_score(self, model_name: str, split: int = 0) -> tuple[float | None, dict]:
        """Pretrain `model_name` on split `split` as the run would and return its best ``dev_old``
        accuracy (what :func:`dyntc.tuning.tune` selects on). Sees the pretraining pool and dev only."""
        split_seed = self.plan.seed + split
        data_split = make_split(self.data, split_seed, self.hp["p"])
        enc0 = self._fresh_encoder(split_seed)
        feats = self._features(enc0)
        old = data_split.old_labels
        pretrain = feats.encoded("train", data_split.pretrain_idx, data_split.pretrain.labels, old)
        dev_old = feats.encoded("dev", data_split.dev_old_idx, data_split.dev_old.labels, old).per_class(
            self.hp["dev_per_class"], derive_seed(self.plan.seed, split, "dev"))
        encoder = self._encoder_for(model_name, enc0, split_seed)  # before seeding: a fresh one draws numbers
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, model_name, "init"))
        model = build_model(model_name, encoder, len(old), **self.model_options(model_name))
        cfg = self._cfg("pretrain", derive_seed(self.plan.seed, split_seed, model_name, "pretrain"), model=model_name)
        train = train_supervised if model_name == "mlp" else train_prototypical
        result = train(model, pretrain, dev_old, cfg)
        return result.best_dev_acc, {"steps": result.steps, "stopped_early": result.stopped_early}

    # ---- training configs -----------------------------------------------------------------------

    def _snapshot(self, split: int, model: str, *stage: Any) -> Path:
        """File of a training stage's state while it runs (``checkpoints/``, like the pretrained weights):
        a run stopped mid-stage resumes that stage from its last dev evaluation, not from its start."""
        return self.out / "checkpoints" / f"split{split}" / f"{'-'.join(map(str, (model, *stage)))}.partial.pt"

    def _cfg(self, stage: str, seed: int, n_support: int | None = None, n_train: int | None = None,
             model: str | None = None, snapshot: Path | None = None) -> TrainConfig:
        hp = self.model_hp(model) if model else self.hp
        pre = stage == "pretrain"
        epochs, patience = hp["pretrain_epochs" if pre else "finetune_epochs"], hp["pretrain_patience" if pre else "finetune_patience"]
        if not pre and n_train and hp["finetune_min_steps"]:
            batches = math.ceil(n_train / hp["batch_size"])
            epochs = max(epochs, math.ceil(hp["finetune_min_steps"] / batches))
            patience = max(patience, math.ceil(hp["finetune_min_steps"] / (3 * batches)))
        return TrainConfig(
            lr=hp["lr"] if pre or hp["finetune_lr"] is None else hp["finetune_lr"],
            max_episodes=hp["pretrain_episodes" if pre else "finetune_episodes"],
            max_epochs=epochs,
            batch_size=hp["batch_size"],
            n_support=n_support or hp["n_support"],
            n_query=hp["n_query"],
            max_classes=hp["max_classes"],
            eval_every=hp["pretrain_eval_every" if pre else "finetune_eval_every"],
            patience=patience,
            eval_support_per_class=hp["pretrain_eval_support_per_class" if pre else "finetune_eval_support_per_class"],
            min_steps=hp["pretrain_min_episodes"] if pre and model != "mlp" else 0,
            hold_at_chance=bool(pre and model != "mlp" and hp["pretrain_min_episodes"]),
            time_budget_s=hp["stage_time_budget_s"],
            seed=seed,
            device=self.plan.device,
            progress=self.progress,
            on_work=self._on_work,
            snapshot=snapshot,
        )

    # ---- the units --------------------------------------------------------------------------------

    def split(self, s: int) -> DynamicSplit:
        if s not in self._splits:
            self._splits[s] = make_split(self.data, self.plan.seed + s, self.hp["p"])
        return self._splits[s]

    def prepare(self) -> list[Unit]:
        """Write the run's header and every split's label sets; return the units with cells still to run."""
        plan = self.plan
        done = self.done()
        units = []
        for s in range(plan.splits):
            self.results["split_info"].setdefault(str(s), {}).update(self.split(s).describe())
            todo = [c for c in plan.cells(s) if cell_key(*c) not in done]
            units += [Unit(s, m, [c for c in todo if c[0] == m]) for m in dict.fromkeys(c[0] for c in todo)]
        self._save(replace=True)
        n_todo, n_all = sum(len(u.cells) for u in units), sum(len(plan.cells(s)) for s in range(plan.splits))
        if n_todo == 0:
            self.log(f"all {n_all} cells already in {self.results_path}; rewriting tables and plots")
        else:
            self.log(f"{self.data.name}: {n_todo} of {n_all} cells to run ({plan.splits} splits x models {','.join(plan.models)} "
                     f"x variants x n_fine {','.join(map(str, plan.n_fine))}); profile {plan.profile.name}, device {plan.device}")
        return units

    def finish(self, seconds: float) -> dict:
        """Record whether every planned cell is done and the run's wall time; rows in the plan's order."""
        plan = self.plan
        self.results["last_run_seconds"] = seconds
        self._save()  # merges what worker processes wrote
        self.results["finished"] = _now() if not any(
            cell_key(*c) not in self.done() for s in range(plan.splits) for c in plan.cells(s)) else None
        order = {cell_key(*c): i for i, c in enumerate(c for s in range(plan.splits) for c in plan.cells(s))}
        self.results["rows"].sort(key=lambda r: order.get(cell_key(r["model"], r["variant"], r["n_fine"], r["split"]), len(order)))
        self._save(replace=True)
        self.write_report()
        return self.results

    def write_report(self) -> None:
        from dyntc.report import write_report

        write_report(self.results, self.out)

    def _data(self, s: int) -> SplitData:
        """The featurized sets of split `s` (made once per process; every process makes the same)."""
        if s in self._split_data:
            return self._split_data[s]
        plan, hp, split = self.plan, self.hp, self.split(s)
        split_seed = plan.seed + s
        enc0 = self._fresh_encoder(split_seed)
        feats = self._features(enc0)
        self.log(f"split {s} (seed {split_seed}): {len(split.old_labels)} old labels, {len(split.new_labels)} new labels, "
                 f"new classes {split.new_classes}" + (f"; collapsed {list(split.collapsed)}" if split.collapsed else ""))
        old, new = split.old_labels, split.new_labels
        rng_seed = derive_seed(plan.seed, s, "dev")
        test = feats.encoded("test", split.test_idx, split.test.labels, new).per_class(hp["test_per_class"], derive_seed(plan.seed, "test"))
        new_ids = np.array([new.index(c) for c in split.new_classes], dtype=np.int64)
        data = SplitData(
            seed=split_seed, split=split, enc0=enc0,
            pretrain=feats.encoded("train", split.pretrain_idx, split.pretrain.labels, old),
            dev_old=feats.encoded("dev", split.dev_old_idx, split.dev_old.labels, old).per_class(hp["dev_per_class"], rng_seed),
            dev_new=feats.encoded("dev", split.dev_new_idx, split.dev_new.labels, new).per_class(hp["dev_per_class"], rng_seed),
            pool=feats.encoded("train", split.finetune_idx, split.finetune_pool.labels, new),
            test=test, test_new_mask=np.isin(test.labels, new_ids),
        )
        self.results["split_info"].setdefault(str(s), {}).update(
            n_test_evaluated=len(data.test), n_dev_old_used=len(data.dev_old), n_dev_new_used=len(data.dev_new))
        if "logreg" in plan.models:
            _check_frozen_items(feats.train)
        self._split_data[s] = data
        return data

    def run_unit(self, unit: Unit, report: Callable[[tuple, int, bool], None] | None = None) -> None:
        """Pretrain `unit.model` on its split (or load its checkpoint), then run and save its cells.

        `report(stage, n, finished)` hears of the work for the ETA: `n` sequences through the encoder in
        `stage` (``(split, "pretrain", model)`` or ``(split, model, variant, n_fine)``), and each stage's end.
        """
        report = report or (lambda stage, n, finished: None)
        s, model_name = unit.split, unit.model
        d = self._data(s)
        pretrained = None
        if model_name != "logreg" and any(v in ("fine-tuned", "un-tuned") for _, v, _, _ in unit.cells):
            stage = (s, "pretrain", model_name)
            self._on_work = lambda n: report(stage, n, False)
            pretrained = self._pretrained(s, d.seed, model_name, d.enc0, d.pretrain, d.dev_old)
            report(stage, 0, True)
        cache: dict[str, Any] = {}
        for _, variant, n_fine, _ in unit.cells:
            stage = (s, model_name, variant, n_fine)
            self._on_work = lambda n: report(stage, n, False)
            idx, short = d.split.finetune_indices(n_fine)
            # finetune_indices are positions in the fine-tuning pool, as are pool's rows
            fine = d.pool.take(idx)
            t0 = time.perf_counter()
            row = self._cell(model_name, variant, n_fine, s, d.seed, d.enc0, pretrained, fine, d.dev_new, d.test,
                             d.test_new_mask, cache)
            row.update(
                model=model_name, variant=variant, n_fine=n_fine, split=s, seed=d.seed,
                n_train=len(fine), shortfall=short, n_test=len(d.test), n_test_new=int(d.test_new_mask.sum()),
                cell_seconds=time.perf_counter() - t0, finished=_now(),
            )
            self.results["rows"].append(_ordered(row))
            self._save()
            self._snapshot(s, model_name, variant, n_fine).unlink(missing_ok=True)
            report(stage, len(d.test) + (len(fine) if variant == "un-tuned" else 0), True)
            acc_new = "n/a" if row["acc_new"] is None else f"{row['acc_new']:.3f}"
            self.log(f"  split {s} {model_name:6s} {variant:10s} n_fine={n_fine:<4d} acc_all={row['acc_all']:.3f} "
                     f"acc_new={acc_new} ({row['train_seconds']:.0f}s train)")
        self._on_work = None

    def _pretrained(self, s, split_seed, model_name, enc0, pretrain, dev_old):
        encoder = self._encoder_for(model_name, enc0, split_seed)  # before seeding: a fresh one draws numbers
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, model_name, "init"))
        model = build_model(model_name, encoder, len(pretrain.classes), **self.model_options(model_name))
        path = self.out / "checkpoints" / f"split{s}" / f"{model_name}.safetensors"
        info = load_weights(path, model)
        if info is not None and model_view(info.get("fingerprint") or {}, model_name) == model_view(self.plan.fingerprint(), model_name):
            self.log(f"split {s} {model_name}: pretrained weights loaded from {path}")
        else:
            snapshot = self._snapshot(s, model_name, "pretrain")
            cfg = self._cfg("pretrain", derive_seed(self.plan.seed, split_seed, model_name, "pretrain"), model=model_name,
                            snapshot=snapshot)
            if model_name == "mlp":
                result = train_supervised(model, pretrain, dev_old, cfg)
            else:
                result = train_prototypical(model, pretrain, dev_old, cfg)
            info = {"fingerprint": self.plan.fingerprint(), "seconds": result.seconds, **_train_info(result),
                    "n_train": len(pretrain), "n_dev": len(dev_old), "history": result.history}
            save_weights(path, model, info)
            snapshot.unlink(missing_ok=True)
            self.log(f"split {s} {model_name}: pretrained {result.steps} {'batches' if model_name == 'mlp' else 'episodes'} "
                     f"in {result.seconds:.0f}s, best dev_old acc {result.best_dev_acc:.3f}")
        self.results["pretraining"].setdefault(str(s), {})[model_name] = {k: v for k, v in info.items() if k != "fingerprint"}
        return model.to(self.plan.device).eval()

    def _cell(self, model_name, variant, n_fine, s, split_seed, enc0, pretrained, fine: Encoded, dev_new: Encoded,
              test: Encoded, test_new_mask, cache) -> dict:
        plan, hp = self.plan, self.hp
        n_classes = len(fine.classes)
        seed = derive_seed(plan.seed, split_seed, model_name, variant, n_fine)
        info: dict[str, Any] = {"train_seconds": 0.0}
        if model_name == "logreg":
            t0 = time.perf_counter()
            pred = _logreg_predict(fine, test, seed)
            info["train_seconds"] = time.perf_counter() - t0
            info.update(accuracies(pred, test.labels, test_new_mask))
            return info

        if variant == "un-tuned":
            if "test" not in cache:  # the pretrained model is fixed: embed the test set once per model
                cache["test"] = (embed(pretrained.encoder, pretrained.encoder, test.items) if model_name == "mlp"
                                 else embed_points(pretrained, test.items))
            if model_name == "mlp":
                support = embed(pretrained.encoder, pretrained.encoder, fine.items)
                pred = _knn_predict(support, fine.labels, cache["test"], hp["knn_k"])
            else:
                pred = _proto_predict(pretrained, embed_points(pretrained, fine.items), fine.labels, n_classes, cache["test"])
            info.update(_train_info(None))
            info.update(accuracies(pred, test.labels, test_new_mask))
            return info

        # fine-tuned or scratch: train on the n_fine examples, early stopping on dev_new
        if variant == "fine-tuned":
            model = copy.deepcopy(pretrained)
        else:
            encoder = self._encoder_for(model_name, enc0, split_seed)  # before seeding: a fresh one draws numbers
            torch.manual_seed(derive_seed(plan.seed, split_seed, model_name, "init"))
            model = build_model(model_name, encoder, n_classes, **self.model_options(model_name))
        torch.manual_seed(seed)
        if model_name == "mlp":
            if variant == "fine-tuned":
                model.replace_head(n_classes)
            result = train_supervised(model, fine, dev_new, self._cfg("finetune", seed, n_train=len(fine), model=model_name,
                                                                      snapshot=self._snapshot(s, model_name, variant, n_fine)))
            logits = embed(model, model.encoder, test.items)
            pred = logits.argmax(1).cpu().numpy()
        else:
            counts = np.bincount(fine.labels, minlength=n_classes)
            n_support = min(hp["n_support"], int(counts.min()) - 1)
            if n_support < 1:
                info["note"] = f"not trained: a class has only {int(counts.min())} example(s)"
                result = None
            else:
                if n_support < hp["n_support"]:
                    info["n_support_used"] = n_support
                result = train_prototypical(model, fine, dev_new, self._cfg("finetune", seed, n_support, model=model_name,
                                                                            snapshot=self._snapshot(s, model_name, variant, n_fine)))
            model.eval()
            pred = _proto_predict(model, embed_points(model, fine.items), fine.labels, n_classes, embed_points(model, test.items))
        info["train_seconds"] = result.seconds if result is not None else 0.0
        info.update(_train_info(result))
        info.update(accuracies(pred, test.labels, test_new_mask))
        return info


_ROW_ORDER = ("model", "variant", "n_fine", "split", "acc_all", "acc_new", "acc_old", "train_seconds")


def _ordered(row: dict) -> dict:
    return {**{k: row[k] for k in _ROW_ORDER if k in row}, **{k: v for k, v in row.items() if k not in _ROW_ORDER}}


def model_view(fingerprint: dict, model: str) -> dict:
    """A run fingerprint as one model sees it: the per-model settings of the other models left out, so
    that tuning one model leaves the others' finished work valid."""
    hp = fingerprint.get("hyperparameters")
    if not isinstance(hp, dict):
        return fingerprint
    per_model = hp.get("per_model") or {}
    return {**fingerprint, "hyperparameters": {**hp, "per_model": per_model.get(model) if isinstance(per_model, dict) else per_model}}


def _diff(old: dict, new: dict, prefix: str = "") -> str:
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = _diff(a, b, f"{prefix}{key}.")
            if inner:
                out.append(inner)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} there, {b!r} now")
    return "; ".join(out[:4]) + ("; ..." if len(out) > 4 else "")


def _check_frozen_items(items: list[Any]) -> None:
    if not items or not all(isinstance(x, torch.Tensor) and x.dim() == 1 and x.is_floating_point() for x in items[:10]):
        raise DyntcError(
            "the logreg baseline needs a frozen pretrained encoder whose featurized items are sentence embeddings "
            "(1-D float tensors); this encoder featurizes texts into something else (token ids?)"
        )


def _logreg_predict(fine: Encoded, test: Encoded, seed: int) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    _check_frozen_items(fine.items)
    x_train = torch.stack(fine.items).float().numpy()
    x_test = torch.stack(test.items).float().numpy()
    clf = LogisticRegression(max_iter=2000, random_state=seed)
    clf.fit(x_train, fine.labels)
    return clf.predict(x_test)


def tune_profile(dataset: Dataset, plan: RunPlan, out: Path, *, grid: str | None = None,
                 log: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Select each model's lr / dropout (and grid options) on split 0's ``dev_old``, as the paper tuned
    them on a held-out validation set (:mod:`dyntc.tuning`). Cached in ``out/tuning.json`` (reused when
    the plan and grid are the same). The test set plays no part: only pretraining runs are scored."""
    from dyntc.tuning import parse_grid, tune

    log = log or (lambda msg: tqdm.write(msg))
    parsed = parse_grid(grid)
    key = {"fingerprint": plan.fingerprint(), "grid": {m: {k: list(v) for k, v in parsed.for_model(m).items()}
                                                       for m in plan.models if m != "logreg"}}
    cache = Path(out) / "tuning.json"
    if cache.is_file():
        try:
            saved = json.loads(cache.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            saved = None
        if isinstance(saved, dict) and saved.get("key") == json.loads(json.dumps(key)):
            log(f"tuning: reusing the choice in {cache}")
            return saved["tuning"]
    check_out_dir(Path(out))
    scratch = Path(out) / "tuning-runs"
    defaults_run = ProtocolRun(dataset, plan, scratch, force=True, progress=False, log=lambda m: None)

    def defaults(model: str) -> dict:
        return defaults_run.model_hp(model)

    def score(model: str, candidate: dict) -> tuple[float | None, dict]:
        per_model = {**(plan.hp.get("per_model") or {})}
        per_model[model] = {**per_model.get(model, {}), **candidate}
        prof = replace(plan.profile, per_model={**plan.profile.per_model, plan.dataset: per_model})
        cand_plan = replace(plan, profile=prof, hp={**plan.hp, "per_model": per_model})
        run = ProtocolRun(dataset, cand_plan, scratch, force=True, progress=False, log=lambda m: None)
        return run.pretrain_dev_score(model, split=0)

    result = tune([m for m in plan.models if m != "logreg"], parsed, defaults, score, log=log)
    shutil.rmtree(scratch, ignore_errors=True)
    write_json(cache, {"key": key, "tuning": result})
    return result


__all__ = [
    "PAPER", "PROFILES", "QUICK", "TINY", "Profile", "ProtocolRun", "RunPlan", "SplitData", "Unit", "accuracies",
    "cell_key", "derive_seed", "get_profile", "make_plan", "merge_results", "override",
]
