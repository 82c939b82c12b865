"""Per-model hyperparameter selection on the pretraining dev set.

The paper (Section 5): "We tuned the learning rate and dropout for each model on a held-out
validation set." :func:`tune_profile` does this for a protocol run: for each model, every candidate
of a small grid (:func:`candidates`) is pretrained on the first label split's pretraining pool
(``Y_old``) with the run's early stopping, and scored by its best accuracy on ``dev_old`` (the dev
set relabelled to ``Y_old``). The candidate with the highest dev score wins; ties go to the candidate
closest to the profile's own values, then to the first listed (:func:`select`). The test set is never
loaded into the selection: :func:`select` sees only ``(candidate, dev score)`` pairs, and the
pretraining runs see only the pretraining pool and ``dev_old``.

The choice is written into the profile's ``per_model`` field (``{model: {lr, dropout, ...}}``), so it
enters the run's fingerprint and ``results.json``; :func:`tune` also returns every candidate's score.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dyntc.protocol.data.types import Dataset
from dyntc.errors import DyntcError, is_number
from dyntc.core.files import write_json
from dyntc.protocol.plan import RunPlan
from dyntc.core.models import model_kind
from dyntc.protocol.profiles import HYP_ONLY, MODEL_OPTIONS, TUNABLE, parse_setting
from dyntc.protocol.run import ProtocolRun
from dyntc.core.machine import check_out_dir


@dataclass
class TuningGrid:
    """Values tried per model: ``{"*": {"lr": (...), "dropout": (...)}, "hyp": {"learn_scale": (...)}}``.

    A model's grid is the ``"*"`` entry updated with its own entry (e.g. HYP-only options).
    """

    space: dict[str, dict[str, tuple]] = field(
        default_factory=lambda: {"*": {"lr": (1e-3, 3e-3, 1e-2), "dropout": (0.3, 0.5)}}
    )

    def for_model(self, model: str) -> dict[str, tuple]:
        out = dict(self.space.get("*", {}))
        out.update(self.space.get(model, {}))
        kind = model_kind(model)
        if not kind.prototypical:  # the MLP has no prototype options
            out = {k: v for k, v in out.items() if k not in MODEL_OPTIONS}
        if not kind.euclidean_warmup:
            out = {k: v for k, v in out.items() if k not in HYP_ONLY}
        for key, values in out.items():
            if key not in TUNABLE:
                raise DyntcError(f"tuning grid: unknown setting {key!r}; choose from {', '.join(TUNABLE)}")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
                raise DyntcError(f"tuning grid: {key} needs a non-empty list of values, got {values!r}")
        return out


def parse_grid(text: str | None) -> TuningGrid:
    """``"lr=1e-3,3e-3;dropout=0.3,0.5;hyp.learn_scale=0,1"`` -> :class:`TuningGrid` (None: the default grid)."""
    if text is None or not text.strip():
        return TuningGrid()
    space: dict[str, dict[str, tuple]] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        if "=" not in part:
            raise DyntcError(f"--tune-grid: expected SETTING=V1,V2 (or MODEL.SETTING=...), got {part!r}")
        key, raw = (s.strip() for s in part.split("=", 1))
        model, _, name = key.rpartition(".")
        if name == "finetune_lr":
            raise DyntcError("--tune-grid: finetune_lr cannot be tuned here: --tune scores the pretraining stage on "
                             "dev_old only. Set it per model in the profile's per_model (chosen on dev_new, see "
                             "scripts/mlp_finetune_probe.py) or for all models with --set finetune_lr=VALUE")
        if name not in TUNABLE:
            raise DyntcError(f"--tune-grid: unknown setting {name!r}; choose from {', '.join(TUNABLE)}")
        try:
            values = tuple(parse_setting(name, v.strip()) for v in raw.split(",") if v.strip())
        except DyntcError as exc:
            raise DyntcError(f"--tune-grid: {exc} (in {key}={raw!r})") from None
        if not values:
            raise DyntcError(f"--tune-grid: {key} has no values")
        space.setdefault(model or "*", {})[name] = values
    return TuningGrid(space)


def candidates(space: Mapping[str, Sequence], defaults: Mapping[str, Any]) -> list[dict]:
    """Every combination of `space` (cartesian product), the `defaults` combination first.

    `defaults` holds the current value of each setting (the profile's), so that with ties the
    selection keeps what the profile already uses.
    """
    names = list(space)
    combos = [dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names))]
    first = {n: defaults.get(n) for n in names}
    combos.sort(key=lambda c: c != first)  # stable: the default combination (if in the grid) first
    return combos


def select(scored: Sequence[tuple[dict, float | None]], defaults: Mapping[str, Any] | None = None) -> tuple[dict, float]:
    """The candidate with the highest dev score. Ties go to the candidate with the most settings equal
    to `defaults` (a setting that makes no difference keeps the profile's value), then to the earliest.
    Candidates scored None (no dev evaluation happened) lose to any scored one."""
    if not scored:
        raise DyntcError("nothing to select: the tuning grid is empty")
    defaults = defaults or {}

    def same_as_default(cand: dict) -> int:
        return sum(1 for k, v in cand.items() if k in defaults and defaults[k] == v)

    best_i, best = None, None
    for i, (cand, score) in enumerate(scored):
        if score is None:
            continue
        if not is_number(score):
            raise DyntcError(f"dev score of candidate {i} is {score!r}, expected a number")
        if best is None or score > best or (score == best and same_as_default(cand) > same_as_default(scored[best_i][0])):
            best_i, best = i, score
    if best_i is None:
        raise DyntcError("no tuning candidate has a dev score (was there a dev set?)")
    return dict(scored[best_i][0]), float(best)


def tune(
    models: Sequence[str],
    grid: TuningGrid,
    defaults: Callable[[str], Mapping[str, Any]],
    pretrain_dev_score: Callable[[str, dict], tuple[float | None, dict]],
    log: Callable[[str], None] = lambda msg: None,
) -> dict[str, dict]:
    """Run the grid for each model; ``{model: {"chosen": {...}, "dev_acc": ..., "candidates": [...]}}``.

    `pretrain_dev_score(model, candidate)` pretrains `model` with `candidate`'s settings and returns
    ``(best dev accuracy, extra info)``; it is the only thing that sees data, and it must see the
    pretraining pool and its dev set only. `defaults(model)` gives the current values (listed first).
    """
    out: dict[str, dict] = {}
    for model in models:
        space = grid.for_model(model)
        rows: list[dict] = []
        scored: list[tuple[dict, float | None]] = []
        current = defaults(model)
        for cand in candidates(space, current):
            t0 = time.perf_counter()
            score, info = pretrain_dev_score(model, cand)
            rows.append({"values": cand, "dev_acc": score, "seconds": time.perf_counter() - t0, **info})
            scored.append((cand, score))
            log(f"tune {model} {cand}: dev_old acc {score if score is None else round(score, 4)}")
        chosen, best = select(scored, current)
        out[model] = {"chosen": chosen, "dev_acc": best, "selected_on": "dev_old (pretraining dev set, split 0)",
                      "candidates": rows}
        log(f"tune {model}: chose {chosen} (dev_old acc {best:.4f})")
    return out


def tune_profile(dataset: Dataset, plan: RunPlan, out: Path, *, grid: str | None = None,
                 log: Callable[[str], None] | None = None) -> dict[str, dict]:
    """Select each model's lr / dropout (and grid options) on split 0's ``dev_old``, as the paper tuned
    them on a held-out validation set (:func:`tune`). Cached in ``out/tuning.json`` (reused when
    the plan and grid are the same). The test set plays no part: only pretraining runs are scored."""
    log = log or (lambda msg: tqdm.write(msg))
    parsed = parse_grid(grid)
    key = {"fingerprint": plan.fingerprint(), "grid": {m: {k: list(v) for k, v in parsed.for_model(m).items()}
                                                       for m in plan.models if model_kind(m).network}}
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
    def score(model: str, candidate: dict) -> tuple[float | None, dict]:
        per_model = {**(plan.hp.get("per_model") or {})}
        per_model[model] = {**per_model.get(model, {}), **candidate}
        prof = replace(plan.profile, per_model={**plan.profile.per_model, plan.dataset: per_model})
        cand_plan = replace(plan, profile=prof, hp={**plan.hp, "per_model": per_model})
        run = ProtocolRun(dataset, cand_plan, scratch, force=True, progress=False, log=lambda m: None)
        return run.pretrain_dev_score(model, split=0)

    result = tune([m for m in plan.models if model_kind(m).network], parsed, plan.model_hp, score, log=log)
    shutil.rmtree(scratch, ignore_errors=True)
    write_json(cache, {"key": key, "tuning": result})
    return result
