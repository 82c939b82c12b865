"""Early stopping and resumable training stages, shared by both training loops (dyntc.core.training).

Early stopping. After each dev evaluation the best score so far is kept (with a copy of its
weights, restored at the end); training stops when `patience` evaluations in a row bring no
improvement. Some evaluations are *held*: they cannot stop training and do not count towards the
patience. An evaluation is held

- before the no-stop floor ``min_steps`` (episodes, or epochs of the supervised loop), and
- with ``hold_at_chance``, while the mean training loss since the previous evaluation is still at or
  above chance, ``ln N_C`` for episodes of N_C classes: the model has not started to learn. At the
  paper's learning rate prototypical training sits there for ~1,600-1,900 episodes on SENT and for
  more than 3,000 with HYP on NEWS (docs/results.md §7 and §8), and patience alone would end it.

Snapshots. A loop given a snapshot file saves its state at every dev evaluation (weights, Adam,
early-stopping state, random generators, history) and, at its end, its result. Restarted with the
same file it goes on after the last evaluation and ends exactly as an uninterrupted loop would. A
snapshot is keyed by what the loop computes (:func:`snapshot_key`: the loop's settings and the
model's configuration), without the stopping rule
(:data:`STOPPING_FIELDS`): the stopping state is replayed from the saved dev scores and losses under
the current rule, and an unfinished snapshot fits when that rule would not have stopped it before
the saved step. So a stage whose slow start outlasts its floor can get a higher one (or the chance
hold) without losing its work. A finished snapshot fits the rule it stopped under and any rule that
would have ended it alike (:func:`ended_under`: at the same evaluation, or not before its budget), as
a run's saved pretrained weights do (dyntc.protocol.run). A stage that went on past where the current
rule stops it (e.g. a selection run without early stopping) fits too when no later dev score beat
its best by then: the best weights it keeps are then those that rule restores, and its result is cut
back to that evaluation (:func:`cut_at`).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import math
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dyntc.core.files import atomic_write
from dyntc.core.models import load_trainable_state, trainable_state

# config fields that do not change what a loop computes (a resumed loop may differ in them)
NOT_IN_KEY = ("progress", "on_work", "snapshot", "device", "time_budget_s")
# the stopping rule: replayed from a snapshot's history instead of being part of its key
STOPPING_FIELDS = ("min_steps", "patience", "hold_at_chance")
# fields added after snapshots were written: left out of the key at the value that behaves as before
KEY_DEFAULTS = {"lr_cosine": False, "fit_head": False, "euclidean_warmup": 0, "euclidean_warmup_lr": None,
                "euclidean_warmup_clip": True}


def is_held(cfg: Any, step: int, loss: float | None, chance: float | None) -> bool:
    """Whether the evaluation after `step` (mean training loss `loss` since the previous one) is held."""
    return step < cfg.min_steps or (bool(cfg.hold_at_chance) and chance is not None and loss is not None
                                    and loss >= chance)


class Patience:
    """The stopping rule on a sequence of dev scores: best score, evaluations since it (held ones not counted)."""

    def __init__(self, patience: int):
        self.patience = patience
        self.best: float | None = None
        self.bad = 0

    def update(self, score: float, held: bool = False) -> tuple[bool, bool]:
        """Record a dev score; returns (improved, stop)."""
        improved = self.best is None or score > self.best
        if improved:
            self.best, self.bad = score, 0
        elif not held:
            self.bad += 1
        return improved, not held and self.bad >= self.patience


class EarlyStopping(Patience):
    """:class:`Patience` plus a copy of the best weights (trainable tensors only), restored at the end."""

    def __init__(self, model: nn.Module, patience: int):
        super().__init__(patience)
        self.model = model
        self.best_state: dict | None = None

    def update(self, score: float, held: bool = False) -> bool:  # type: ignore[override]
        """Record a dev score; True when training should stop."""
        improved, stop = super().update(score, held)
        if improved:
            self.best_state = copy.deepcopy(trainable_state(self.model))
        return stop

    def restore(self) -> None:
        if self.best_state is not None:
            load_trainable_state(self.model, self.best_state)


def stop_step(history: list[dict], cfg: Any, chance: float | None) -> int | None:
    """The step (episode, or epoch) at whose evaluation `cfg`'s rule stops `history`; None if it does not."""
    return replay(history, cfg, chance)[1]


def replay(history: list[dict], cfg: Any, chance: float | None) -> tuple[Patience, int | None]:
    """`cfg`'s rule replayed on `history`: its stopping state, and the step at which it stops (None: it
    does not; the state is then the one after the whole history)."""
    rule = Patience(cfg.patience)
    for record in history:
        if "dev_acc" not in record:  # e.g. a monitor's record before the first episode
            continue
        step = _step(record)
        if rule.update(record["dev_acc"], is_held(cfg, step, record.get("loss"), chance))[1]:
            return rule, step
    return rule, None


LOOP_KINDS = ("prototypical", "supervised")


def chance_loss(labels: Any, max_classes: int) -> float:
    """The episodic loss of uniform logits, ``ln N_C``, for episodes drawn from these training labels
    (as the episode sampler counts classes: those present, at most `max_classes`)."""
    return math.log(min(max_classes, len(set(np.asarray(labels).tolist()))))


def ended_under(result: dict, cfg: Any, kind: str, chance: float | None) -> dict | None:
    """A finished loop's `result` (its ``history`` and ``stopped_early``) as the loop would have
    returned it under `cfg`'s stopping rule, when that rule, replayed on the dev scores, ends it alike:
    at the same evaluation, or, for a loop that ran to its budget (`kind` ``"prototypical"``:
    episodes, ``"supervised"``: epochs), not before its last one. The best weights restored are then
    the same; only ``stopped_early`` may change (a rule that stops at the budget's evaluation says
    so). None when the rule would have ended it otherwise (or the result has no dev evaluation)."""
    if kind not in LOOP_KINDS:
        raise ValueError(f"kind must be one of {LOOP_KINDS}, got {kind!r}")
    evaluations = [r for r in result.get("history", []) if "dev_acc" in r]
    if not evaluations:
        return None
    last = evaluations[-1].get("step", evaluations[-1].get("epoch"))
    stop = stop_step(evaluations, cfg, chance)
    budget = cfg.max_episodes if kind == "prototypical" else cfg.max_epochs
    alike = stop == last if result.get("stopped_early") else last == budget and stop in (None, last)
    if alike:
        return {**result, "stopped_early": stop is not None}
    return None if stop is None or stop > last else cut_at(result, stop)


def _step(record: dict) -> int:
    return record.get("step", record.get("epoch", 0))


def cut_at(result: dict, stop: int) -> dict | None:
    """A loop's `result` (``best_dev_acc``, ``steps``, ``seconds``, ``stopped_early``, ``history``) as a
    loop stopped at the evaluation after step `stop` returns it, when the loop went on past it without
    beating the best dev score it had by then: the weights it restores (those of the first best score)
    are then the same. None if a later score was higher. ``seconds`` stay the time the loop ran."""
    evaluations = [r for r in result.get("history", []) if "dev_acc" in r]
    by_then = [r["dev_acc"] for r in evaluations if _step(r) <= stop]
    if not by_then or max(r["dev_acc"] for r in evaluations) > max(by_then):
        return None
    history = [r for r in result.get("history", []) if _step(r) <= stop]
    return {**result, "best_dev_acc": max(by_then), "steps": stop, "stopped_early": True, "history": history}


def model_signature(model: nn.Module | None) -> dict:
    """The model's and its encoder's configuration (architecture and options such as HYP's max_norm):
    part of a snapshot's key, so a stage never resumes another model's state."""
    if model is None:
        return {}
    encoder = getattr(model, "encoder", None)
    enc = encoder.config() if hasattr(encoder, "config") else None
    if isinstance(enc, dict) and enc.get("embeddings") is not None:
        # which file the GloVe vectors came from is not the model: a dataset's subset of them (`dyntc
        # export-glove`, e.g. on a GPU host) gives the same vectors, and a run checks their digest
        enc = {**enc, "embeddings": None}
    return {"model": type(model).__name__, "config": model.config() if hasattr(model, "config") else None,
            "encoder": enc}


def snapshot_key(cfg: Any, kind: str, model: nn.Module | None = None) -> str:
    skip = NOT_IN_KEY + STOPPING_FIELDS
    pairs = ((f, getattr(cfg, f)) for f in cfg.__dataclass_fields__ if f not in skip)
    return repr((kind, sorted((f, v) for f, v in pairs if not (f in KEY_DEFAULTS and v == KEY_DEFAULTS[f])),
                 model_signature(model)))


def _stopping(cfg: Any) -> dict:
    return {f: getattr(cfg, f) for f in STOPPING_FIELDS}


def _split_key(saved: Any) -> tuple[str, dict] | None:
    """A saved key as (key without the stopping fields, the stopping fields it names). Keys written
    before the stopping rule left the key still name min_steps and patience."""
    try:
        kind, pairs, *model = ast.literal_eval(saved)
        rest = [(f, v) for f, v in pairs if f not in STOPPING_FIELDS]
        return repr((kind, rest, *model)), {f: v for f, v in pairs if f in STOPPING_FIELDS}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def load_snapshot(cfg: Any, kind: str, chance: float | None = None, model: nn.Module | None = None) -> dict | None:
    """The state `cfg.snapshot` holds for a loop of this `kind`, config and `model` configuration (see
    the module docstring), with its stopping state ("best", "bad") replayed under `cfg`'s rule; else
    None (no file, or the snapshot of another loop, which is then overwritten). `chance`: the loop's
    chance-level loss."""
    if cfg.snapshot is None or not Path(cfg.snapshot).is_file():
        return None
    try:
        state = torch.load(cfg.snapshot, map_location="cpu", weights_only=True)
    except Exception as exc:  # writes are atomic, so this is a foreign or damaged file: start afresh, say so
        warnings.warn(f"training snapshot {cfg.snapshot} is unreadable ({type(exc).__name__}: {exc}); "
                      "the stage starts from its beginning and overwrites it", stacklevel=3)
        return None
    split = _split_key(state.get("key")) if isinstance(state, dict) else None
    if split is None or split[0] != snapshot_key(cfg, kind, model):
        return None
    saved_rule = {"hold_at_chance": False, **split[1], **state.get("stopping", {})}
    if state.get("done"):
        if saved_rule == _stopping(cfg):
            return state
        result = ended_under(state.get("result") or {}, cfg, kind, chance)
        return None if result is None else {**state, "result": result}
    rule, stop = replay(state.get("history", []), cfg, chance)
    if stop is None:
        state["best"], state["bad"] = rule.best, rule.bad
        return state
    # the loop went on past where this rule stops it: its result then, if its best weights are still those
    cut = cut_at({"best_dev_acc": state.get("best"), "steps": state.get("step"), "seconds": state.get("elapsed"),
                  "stopped_early": False, "history": state.get("history", [])}, stop)
    if cut is None or state.get("best_state") is None:
        warnings.warn(f"training snapshot {cfg.snapshot} went on past episode/epoch {stop}, where this stopping rule "
                      "ends the stage, and beat its best dev score after it, so it does not hold that stage's result; "
                      "the stage starts from its beginning and overwrites it (move the file away to keep it)", stacklevel=3)
        return None
    return {"key": state["key"], "stopping": _stopping(cfg), "done": True, "model": state["best_state"], "result": cut}


def save_snapshot(path: str | Path, state: dict) -> None:
    """Write a loop's state atomically (a kill mid-write leaves the previous snapshot)."""
    with atomic_write(path) as tmp:
        torch.save(state, tmp)


def _rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def loop_state(cfg: Any, key: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               stopper: EarlyStopping, device: torch.device, start: float) -> dict:
    """What both loops need to go on after `step` (an episode, or an epoch of the supervised loop)."""
    return {"key": key, "stopping": _stopping(cfg), "step": step, "model": trainable_state(model),
            "optimizer": optimizer.state_dict(), "best": stopper.best, "bad": stopper.bad,
            "best_state": stopper.best_state, "rng": _rng_state(device), "elapsed": time.perf_counter() - start}


def resume(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer, stopper: EarlyStopping,
           device: torch.device) -> int:
    """Load :func:`loop_state`'s state (as :func:`load_snapshot` returns it); returns its step."""
    load_trainable_state(model, state["model"])
    optimizer.load_state_dict(state["optimizer"])
    stopper.best, stopper.bad, stopper.best_state = state["best"], state["bad"], state["best_state"]
    _set_rng_state(state["rng"], device)
    return state["step"]


def finished_state(cfg: Any, key: str, model: nn.Module, result: Any) -> dict:
    """The final snapshot: the loop's result and weights (a restarted loop returns them at once)."""
    return {"key": key, "stopping": _stopping(cfg), "done": True, "model": trainable_state(model),
            "result": dataclasses.asdict(result)}
