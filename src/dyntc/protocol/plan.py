"""A run's plan: the dataset, the resolved profile and the selection of splits, models, variants and
n_fine, validated before any work; its fingerprint (what a resumed run must match); stable seeds."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dyntc.protocol.data.dynamic import check_fraction
from dyntc.errors import DyntcError
from dyntc.protocol.options import PlanOptions
from dyntc.protocol.profiles import (
    ALL_MODELS,
    DEFAULT_MODELS,
    HYP_ONLY,
    MODEL_OPTIONS,
    MODEL_VARIANTS,
    VARIANTS,
    Profile,
    get_profile,
    override,
)
from dyntc.core.encoders import encoder_kind
from dyntc.core.models import model_kind
from dyntc.core.training import TrainConfig
from dyntc.core.machine import check_device


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
_NEW_FIELD_DEFAULTS: dict[str, Any] = {"finetune_lr": None, "fixed_norm": None, "lr_cosine": False,
                                        "finetune_fit_head": False, "euclidean_warmup": 0,
                                        "euclidean_warmup_lr": None, "scratch_like_pretraining": False,
                                        "scratch_unclipped_warmup": False}
# Profile fields only the scratch variant reads: other cells (and pretrained weights) do not depend on them
SCRATCH_ONLY = ("scratch_like_pretraining", "scratch_unclipped_warmup")


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
    # run only these of the plan's splits now (None: all); the others' cells stay to do, so that a run can
    # go on split by split or be shared between machines. A selection: not in the fingerprint
    only_splits: tuple[int, ...] | None = None
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

    def selected_splits(self) -> list[int]:
        """The splits this invocation runs (``--only-splits``, else all of them)."""
        return [s for s in range(self.splits) if self.only_splits is None or s in self.only_splits]

    def fingerprint(self) -> dict[str, Any]:
        """What must match between a results directory and a rerun (selection of cells excluded)."""
        hp = {k: v for k, v in self.hp.items() if k not in ("splits", "n_fine", "scratch_ends_only", "description")
              and not (k in _NEW_FIELD_DEFAULTS and v == _NEW_FIELD_DEFAULTS[k])}
        return {"dataset": self.dataset, "encoder": self.encoder, "seed": self.seed, "hyperparameters": hp}

    def model_hp(self, model: str) -> dict[str, Any]:
        """The resolved profile with `model`'s ``per_model`` overrides (lr, dropout, prototype options)."""
        return {**self.hp, **((self.hp.get("per_model") or {}).get(model) or {})}

    def model_options(self, model: str) -> dict[str, Any]:
        """Keyword options of :func:`dyntc.core.models.build_model` for `model` (none for the MLP)."""
        if not model_kind(model).prototypical:
            return {}
        hp = self.model_hp(model)
        return {k: hp[k] for k in MODEL_OPTIONS}

    def scratch_like_pretraining(self, model: str | None) -> bool:
        """Whether `model`'s scratch cells train with the pretraining recipe (EUC/HYP only)."""
        return model is not None and model_kind(model).episodic and bool(self.model_hp(model)["scratch_like_pretraining"])

    def train_config(self, stage: str, seed: int, *, model: str | None = None, n_support: int | None = None,
                     n_train: int | None = None) -> TrainConfig:
        """The training loop's settings for `model`'s ``"pretrain"``, ``"finetune"`` or ``"scratch"`` stage
        (the last two share the fine-tuning settings, except the MLP's fitted head, which needs a
        pretrained encoder, and EUC/HYP scratch under ``scratch_like_pretraining``, which takes the
        pretraining ones); `n_train` examples raise the MLP's few-shot epochs."""
        hp = self.model_hp(model) if model else self.hp
        kind = model_kind(model) if model else None
        pre = stage == "pretrain" or (stage == "scratch" and self.scratch_like_pretraining(model))
        episodic = kind is not None and kind.episodic
        by_batches = kind is not None and kind.network and not kind.episodic
        hyp_pre = pre and kind is not None and kind.euclidean_warmup  # its Euclidean warm-up applies
        epochs, patience = hp["pretrain_epochs" if pre else "finetune_epochs"], hp["pretrain_patience" if pre else "finetune_patience"]
        if not pre and n_train and hp["finetune_min_steps"]:
            batches = math.ceil(n_train / hp["batch_size"])
            epochs = max(epochs, math.ceil(hp["finetune_min_steps"] / batches))
            patience = max(patience, math.ceil(hp["finetune_min_steps"] / (3 * batches)))
        return TrainConfig(
            lr=hp["lr"] if pre or hp["finetune_lr"] is None else hp["finetune_lr"],
            lr_cosine=bool(hp["lr_cosine"]) and episodic,
            fit_head=bool(hp["finetune_fit_head"]) and stage == "finetune" and kind is not None and kind.has_output_layer,
            euclidean_warmup=int(hp["euclidean_warmup"]) if hyp_pre else 0,
            euclidean_warmup_lr=hp["euclidean_warmup_lr"] if hyp_pre else None,
            euclidean_warmup_clip=not (hyp_pre and stage == "scratch" and hp["scratch_unclipped_warmup"]
                                       and hp["euclidean_warmup"]),
            max_episodes=hp["pretrain_episodes" if pre else "finetune_episodes"],
            max_epochs=epochs,
            batch_size=hp["batch_size"],
            n_support=n_support or hp["n_support"],
            n_query=hp["n_query"],
            max_classes=hp["max_classes"],
            eval_every=hp["pretrain_eval_every" if pre else "finetune_eval_every"],
            patience=patience,
            eval_support_per_class=hp["pretrain_eval_support_per_class" if pre else "finetune_eval_support_per_class"],
            min_steps=hp["pretrain_min_episodes"] if pre and not by_batches else 0,
            hold_at_chance=bool(pre and not by_batches and hp["pretrain_min_episodes"]),
            time_budget_s=hp["stage_time_budget_s"],
            seed=seed,
            device=self.device,
        )


def make_plan(
    dataset: str,
    profile: str | Profile,
    options: PlanOptions | None = None,
    *,
    device_here: bool = True,
    **changes: Any,
) -> RunPlan:
    """Validate the options of a run (every mistake is a :class:`DyntcError`, raised before any work).

    The options are `options` (default: :class:`PlanOptions`'s defaults) with `changes` to its fields
    (``make_plan("sent", "paper", models="euc,hyp")``). `scratch_n_fine` limits the (costly) scratch
    variant to some of the n_fine values, e.g. the low and the high end that the pretraining-gain
    figure needs (without it, a profile with ``scratch_ends_only`` keeps the run's smallest and
    largest n_fine); like the other selections it is not part of the fingerprint, so a run can be
    resumed with another choice. `only_splits` (split indices below `splits`) is such a selection
    too: only those splits' cells run now. Without `device_here` the units run on other machines (a
    Ray cluster, which checks its GPUs itself): a CUDA `device` need not exist here, and is each
    unit's one GPU (``cuda``)."""
    from dyntc.protocol.data.datasets import resolve_name

    try:  # aliases ("20news", ...) get the dataset's own hyperparameters
        dataset = resolve_name(dataset)
    except DyntcError:  # a Dataset of the user's own: the profile's "*" values
        pass
    opts = replace(options or PlanOptions(), **changes)
    prof = override(get_profile(profile), opts.settings or {})
    if opts.p is not None:
        prof = replace(prof, p=check_fraction(opts.p))
    check_fraction(prof.p)
    hp = prof.for_dataset(dataset)
    n_splits = prof.splits if opts.splits is None else int(opts.splits)
    if n_splits < 1:
        raise DyntcError(f"--splits must be >= 1, got {n_splits}")
    fine = parse_int_list(opts.n_fine, "--n-fine") if opts.n_fine is not None else tuple(hp["n_fine"])
    if not fine:
        raise DyntcError("--n-fine needs at least one value")
    if any(n < 1 for n in fine):
        raise DyntcError(f"--n-fine values must be >= 1, got {list(fine)}")
    fine = tuple(sorted(set(fine)))
    chosen_models = parse_names(opts.models, ALL_MODELS, "model(s)") or DEFAULT_MODELS
    chosen_variants = parse_names(opts.variants, VARIANTS, "variant(s)") or VARIANTS
    if device_here or not str(opts.device).startswith("cuda"):
        check_device(opts.device)
    elif opts.device not in ("cuda", "cuda:0"):
        raise DyntcError(f"--device {opts.device!r}: on a cluster each unit runs on one GPU of its node: give --device cuda")
    probes = [m for m in chosen_models if not model_kind(m).network]
    if probes and encoder_kind(opts.encoder).word_vectors:
        raise DyntcError(
            f"the {probes[0]} baseline fits a logistic regression on frozen pretrained sentence embeddings; "
            f"it needs --encoder minilm (or a local sentence-transformers model), not {opts.encoder}"
        )
    trains_metric = any(model_kind(m).episodic for m in chosen_models) and any(
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
    if opts.scratch_n_fine is not None:
        scratch = tuple(sorted(set(parse_int_list(opts.scratch_n_fine, "--scratch-n-fine"))))
        stray = sorted(set(scratch) - set(fine))
        if not scratch or stray:
            raise DyntcError(f"--scratch-n-fine must list some of the run's n_fine values {list(fine)}; "
                             f"got {list(scratch) if scratch else 'none'}")
        if "scratch" not in chosen_variants:
            raise DyntcError("--scratch-n-fine is given but the scratch variant is not among --variants")
    elif hp["scratch_ends_only"] and "scratch" in chosen_variants:
        scratch = tuple(sorted({fine[0], fine[-1]}))
    chosen_splits = None
    if opts.only_splits is not None:
        chosen_splits = tuple(sorted(set(parse_int_list(opts.only_splits, "--only-splits") or ())))
        stray = [s for s in chosen_splits if not 0 <= s < n_splits]
        if not chosen_splits or stray:
            raise DyntcError(f"--only-splits must list split indices from 0 to {n_splits - 1} (the run has {n_splits} "
                             f"split(s)); got {list(chosen_splits) if chosen_splits else 'none'}")
    embeddings = opts.embeddings
    if embeddings is not None:
        if not encoder_kind(opts.encoder).word_vectors:
            raise DyntcError(f"--embeddings (a GloVe file) applies to the sru encoder only, not to --encoder {opts.encoder}")
        if not Path(embeddings).is_file():
            raise DyntcError(f"--embeddings {str(embeddings)!r} is not a file: pass a GloVe text file "
                             "('word v1 ... vd' per line, e.g. from dyntc export-glove), or omit it for the packaged glove.6B.50d")
        embeddings = str(Path(embeddings).resolve())
    hp["splits"], hp["n_fine"] = n_splits, list(fine)
    plan = RunPlan(dataset, prof, hp, n_splits, fine, chosen_models, chosen_variants, opts.encoder, int(opts.seed),
                   opts.device, scratch, chosen_splits, embeddings)
    for model in chosen_models:  # HYP's own pretraining settings (the warm-up's) checked before any work
        if not model_kind(model).euclidean_warmup:
            continue
        plan.train_config("pretrain", 0, model=model)
        own = plan.model_hp(model)
        if own["scratch_unclipped_warmup"] and not (own["scratch_like_pretraining"] and own["euclidean_warmup"]):
            raise DyntcError(f"scratch_unclipped_warmup turns the soft clip off in the Euclidean warm-up of {model.upper()}'s "
                             "scratch cells, which have none here: it needs scratch_like_pretraining=yes and euclidean_warmup "
                             f"(episodes) for {model} too, or scratch_unclipped_warmup=no")
    return plan


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (same on every run and machine)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


def cell_key(model: str, variant: str, n_fine: int, split: int) -> str:
    return f"{model}/{variant}/{n_fine}/{split}"


def model_view(fingerprint: dict, model: str, pretraining: bool = False) -> dict:
    """A run fingerprint as one model sees it: the per-model settings of the other models left out, so
    that tuning one model leaves the others' finished work valid (also :data:`HYP_ONLY` settings made for
    the whole profile). With `pretraining`, also without the
    settings of the later stages (``finetune_*``, MLP-KNN's k, the test cap): what a pretrained model's
    weights depend on, so that changing how a model is fine-tuned keeps its pretraining. Settings only
    the scratch variant reads (:data:`SCRATCH_ONLY`) are left out: :func:`scratch_view` has them."""
    return _own_view(fingerprint, model, pretraining, unread=SCRATCH_ONLY)


def _own_view(fingerprint: dict, model: str, pretraining: bool = False, unread: tuple[str, ...] = ()) -> dict:
    """:func:`model_view` with the fields in `unread` left out (none: as the scratch variant sees it)."""
    hp = fingerprint.get("hyperparameters")
    if not isinstance(hp, dict):
        return fingerprint
    per_model = hp.get("per_model") or {}
    own = per_model.get(model) if isinstance(per_model, dict) else per_model
    hp = {k: v for k, v in hp.items() if k not in unread}
    if isinstance(own, dict) and any(k in own for k in unread):
        own = {k: v for k, v in own.items() if k not in unread} or None
    if not model_kind(model).euclidean_warmup:
        hp = {k: v for k, v in hp.items() if k not in HYP_ONLY}
    if pretraining:
        def later(key: str) -> bool:
            return key.startswith("finetune_") or key in ("knn_k", "test_per_class")

        hp = {k: v for k, v in hp.items() if not later(k)}
        own = ({k: v for k, v in own.items() if not later(k)} or None) if isinstance(own, dict) else own
    return {**fingerprint, "hyperparameters": {**hp, "per_model": own}}


def scratch_view(fingerprint: dict, model: str) -> dict:
    """A :func:`model_view` as the scratch variant sees it, resolved for `model`: without the settings
    only pretraining reads (``pretrain_*``, the Euclidean warm-up) or only other variants read (the
    MLP's fitted head, MLP-KNN's k), and with the learning rate scratch trains at (``finetune_lr``,
    else ``lr``). Under ``scratch_like_pretraining`` (EUC/HYP) it is the other way round: the
    pretraining stage's settings, its lr and HYP's warm-up, without the fine-tuning stage's. Scratch
    cells never see pretrained weights, so a change of the stage whose recipe they do not take keeps
    them: its scratch cells at n_fine 500 may cost as much as its pretraining."""
    view = _own_view(fingerprint, model)
    hp = view.get("hyperparameters")
    own = hp.get("per_model") if isinstance(hp, dict) else None
    if not isinstance(hp, dict) or not isinstance(own, (dict, type(None))):
        return view
    resolved = {**_NEW_FIELD_DEFAULTS, **{k: v for k, v in hp.items() if k != "per_model"}, **(own or {})}
    kind = model_kind(model)
    like_pretraining = kind.episodic and bool(resolved["scratch_like_pretraining"])
    if like_pretraining:  # the pretraining stage's settings (the warm-up too, for HYP), not fine-tuning's
        warmup = () if kind.euclidean_warmup else (*HYP_ONLY, "scratch_unclipped_warmup")
        stage, unread = "finetune_", ("knn_k", *warmup)
    else:
        if resolved["finetune_lr"] is not None:
            resolved["lr"] = resolved["finetune_lr"]
        stage, unread = "pretrain_", ("finetune_lr", "finetune_fit_head", "knn_k", *HYP_ONLY, *SCRATCH_ONLY)
    kept = {k: v for k, v in resolved.items() if not k.startswith(stage) and k not in unread}
    return {**view, "hyperparameters": kept}


# the pretraining stage's stopping rule as profile fields (TrainConfig's min_steps, hold_at_chance, patience)
PRETRAIN_STOPPING = ("pretrain_min_episodes", "pretrain_patience")


def without_stopping_rule(view: dict) -> dict:
    """A :func:`model_view` without the pretraining stage's stopping rule: weights pretrained under
    another rule are the run's where its own rule, replayed on their dev history, ends the stage alike
    (:func:`dyntc.core.stopping.ended_under`)."""
    hp = view.get("hyperparameters")
    if not isinstance(hp, dict):
        return view

    def strip(entry):
        return {k: v for k, v in entry.items() if k not in PRETRAIN_STOPPING} if isinstance(entry, dict) else entry

    return {**view, "hyperparameters": {**strip(hp), "per_model": strip(hp.get("per_model"))}}
