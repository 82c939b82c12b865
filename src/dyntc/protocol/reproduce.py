"""``dyntc reproduce`` as a function (:func:`reproduce`): plan the run, tune it if asked, run its work
units with an executor (this process, ``--jobs N`` worker processes or a Ray cluster:
:mod:`dyntc.protocol.executors`) with an honest ETA, and write its tables. What a unit does is
:mod:`dyntc.protocol.run`'s.

A unit is one (split, model): the model's pretraining on that split, then its (variant, n_fine) cells
(:class:`dyntc.protocol.Unit`). Units share nothing but the featurized texts and take every seed from
``derive_seed``, so they run in any order, anywhere, with the same results. With several at once
(``jobs > 1`` or Ray) each unit runs in a worker with `threads` torch threads (one by default: the
SRU's small matrices gain little from more), the longest units first; each worker featurizes the
texts itself (the same vocabulary, the same ids). Local workers merge every finished cell into
``results.json`` under a file lock; Ray tasks send theirs to this process, which merges them. The
parent (driver) plans, shows progress and writes the tables.

The ETA counts sequences through the encoder. Planned work is an upper bound: every stage at its
full episode / epoch budget. Measured throughput is real sequences per second of wall time. Early
stopping usually ends a stage well before its budget, so besides the upper bound the ETA gives an
estimate scaled by the fraction of the budget that finished stages actually used.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from dyntc.protocol.data.types import Dataset
from dyntc.errors import DyntcError, is_int
from dyntc.protocol import ALL_MODELS, Profile, ProtocolRun, Unit, make_plan, parse_names, tune_profile
from dyntc.protocol.executors import Events, Executor, LocalExecutor, make_executor
from dyntc.protocol.options import ReproduceOptions
from dyntc.core.models import model_kind

REPORT_EVERY_S = 600.0  # tables.md and the plots are also rewritten this often while workers log (not only per unit)

# ---- planned work (upper bounds) -----------------------------------------------------------------


def stage_costs(run: ProtocolRun, unit: Unit) -> dict[tuple, float]:
    """Planned sequences through the encoder of each stage of `unit` (full budgets: an upper bound).

    Keys are the stages that ``ProtocolRun.run_unit`` reports: ``(split, "pretrain", model)`` and
    ``(split, model, variant, n_fine)``.
    """
    hp, split = run.hp, run.split(unit.split)
    s, model = unit.split, unit.model
    n_new, n_test = len(split.new_labels), len(split.test)
    if hp["test_per_class"] is not None:  # tiny: the test set is capped per class
        n_test = min(n_test, hp["test_per_class"] * n_new)

    like_pretraining = run.plan.scratch_like_pretraining(model)
    kind = model_kind(model)

    def cost(stage: str, n_train: int, n_classes: int) -> float:
        pre = stage == "pretrain" or (stage == "scratch" and like_pretraining)
        if not kind.network:  # a probe fitted in a moment
            return 1.0
        if stage == "un-tuned":
            return float(n_train)
        if not kind.episodic:
            epochs = hp["pretrain_epochs" if pre else "finetune_epochs"]
            floor = 0 if pre else hp["finetune_min_steps"] * min(n_train, hp["batch_size"])
            return float(max(epochs * n_train, floor))
        episodes = hp["pretrain_episodes" if pre else "finetune_episodes"]
        return float(episodes * (min(n_classes, hp["max_classes"]) * hp["n_support"] + hp["n_query"]))

    costs: dict[tuple, float] = {}
    if unit.pretrains:
        costs[(s, "pretrain", model)] = cost("pretrain", len(split.pretrain), len(split.old_labels))
    for _, variant, n_fine, _ in unit.cells:
        n_train = n_fine * n_new
        stage = {"un-tuned": "un-tuned", "scratch": "scratch"}.get(variant, "finetune")
        costs[(s, model, variant, n_fine)] = cost(stage, n_train, n_new) + n_test
    return costs


# ---- progress and ETA ----------------------------------------------------------------------------


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Planned work per stage, work actually done, and the ETA from measured throughput."""

    def __init__(self, costs: dict[str, dict[tuple, float]], jobs: int, show: bool, log: Callable[[str], None]):
        """`costs`: planned work per stage of each unit (:func:`stage_costs`)."""
        self.jobs, self.log = jobs, log
        self.costs = {stage: c for stages in costs.values() for stage, c in stages.items()}
        self.units = {name: set(stages) for name, stages in costs.items()}  # units not finished yet
        self.planned = sum(self.costs.values())
        self.done_stages: set[tuple] = set()
        self.actual: dict[tuple, float] = {}  # real sequences per stage
        self.used: list[tuple[float, float]] = []  # (actual, planned) of finished training stages
        self.start = time.perf_counter()
        self._announced = False
        self._last_postfix = 0.0
        self.bar = tqdm(total=self.planned, desc="reproduce", unit="seq", unit_scale=True, disable=not show or self.planned == 0,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}{postfix}")

    def credited(self, stages=None) -> float:
        """Planned work accounted for (of `stages`, default all): finished stages in full, running ones
        by what they did."""
        stages = self.costs.keys() if stages is None else stages
        return sum(self.costs[k] if k in self.done_stages else min(self.actual.get(k, 0.0), self.costs[k]) for k in stages)

    def report(self, stage: tuple, n: float, finished: bool) -> None:
        if stage in self.done_stages:
            return
        before = self.credited()
        self.actual[stage] = self.actual.get(stage, 0.0) + n
        if finished:
            self.done_stages.add(stage)
            if self.costs.get(stage, 0.0) > 0:
                self.used.append((self.actual[stage], self.costs[stage]))
            if not self._announced and self.rate() > 0 and time.perf_counter() - self.start > 10:
                self._announced = True
                self.log(f"measured {self.rate():.0f} sequences/s; estimated total wall {self.eta_text(total=True)}")
        self.bar.update(self.credited() - before)
        if time.perf_counter() - self._last_postfix > 1.0 or finished:
            self._last_postfix = time.perf_counter()
            self.bar.set_postfix_str(self.eta_text(), refresh=False)

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.start
        return sum(self.actual.values()) / elapsed if elapsed > 0 else 0.0

    def eta_text(self, total: bool = False) -> str:
        """``ETA <= upper (~expected)``: remaining planned work over measured throughput; the expected
        figure scales the remaining budget by the share of it that finished stages used (early stopping).
        With several workers a lone long unit at the end cannot go faster than one worker's rate."""
        rate = self.rate()
        elapsed = time.perf_counter() - self.start
        if rate <= 0 or (not self.done_stages and elapsed < 30):
            return "ETA: measuring"
        remaining = max(self.planned - self.credited(), 0.0)
        parallel = max(1, min(self.jobs, len(self.units)))
        longest = max((sum(self.costs[k] for k in st) - self.credited(st) for st in self.units.values()), default=0.0)
        upper = max(remaining / rate, longest / (rate / parallel))
        used = sum(a for a, _ in self.used) / sum(p for _, p in self.used) if self.used else None
        expected = None if used is None else max(remaining * used / rate, longest * used / (rate / parallel))
        if total:
            text = f"<= {_hms(elapsed + upper)} (no early stopping)"
            return text + (f", ~{_hms(elapsed + expected)} if stages stop as early as so far" if expected is not None else "")
        return f"ETA <= {_hms(upper)}" + (f" (~{_hms(expected)} with early stopping as so far)" if expected is not None else "")

    def unit_done(self, unit: Unit, seconds: float, cpu: float, n_done: int, n_units: int) -> None:
        """`cpu`: the unit's CPU seconds in its process (on a busy machine well below `seconds`)."""
        self.units.pop(unit.name, None)
        self.log(f"[{n_done}/{n_units} units] {unit.name} done in {_hms(seconds)} wall, {_hms(cpu)} CPU ({len(unit.cells)} cells); "
                 f"elapsed {_hms(time.perf_counter() - self.start)}, {self.eta_text()}")

    def close(self) -> None:
        self.bar.close()


# ---- running the units ---------------------------------------------------------------------------


def execute(run: ProtocolRun, jobs: int = 1, threads: int = 1, executor: Executor | None = None) -> dict:
    """Run every unit of `run` still to do with `executor` (default: `jobs` local processes with
    `threads` torch threads each), then write results and report."""
    executor = executor or LocalExecutor(jobs, threads)
    t_run = time.perf_counter()
    run.results.update(executor.header())
    units = run.prepare()
    if not units:
        return run.finish(time.perf_counter() - t_run)
    costs = {u.name: stage_costs(run, u) for u in units}
    totals = {name: sum(c.values()) for name, c in costs.items()}
    with executor:
        slots = executor.slots(run, units)
        run.results.update(executor.header(slots))
        run.log(f"{len(units)} work units (split x model), {executor.describe(slots)}; planned work at most "
                f"{sum(totals.values()) / 1e6:.2f}M sequences through the encoder (full budgets, no early stopping); "
                f"the ETA follows once throughput is measured")
        progress = Progress(costs, slots, run.progress, run.log)
        try:
            # several at once: the longest units first, so that no long one is left alone at the end
            ordered = units if slots == 1 else sorted(units, key=lambda u: -totals[u.name])
            executor.run(run, ordered, _events(run, progress, slots, len(units)))
        finally:
            progress.close()
    return run.finish(time.perf_counter() - t_run)


def _events(run: ProtocolRun, progress: Progress, slots: int, n_units: int) -> Events:
    """The driver's side of an executor's events: progress and ETA, the report kept current."""
    n_done = 0
    reported = time.perf_counter()

    def started(unit: Unit, where: str) -> None:
        if slots == 1:
            progress.bar.set_description_str(f"reproduce ({unit.name})")

    def done(unit: Unit, seconds: float, cpu: float) -> None:
        nonlocal n_done, reported
        n_done += 1
        progress.unit_done(unit, seconds, cpu, n_done, n_units)
        run.write_report()
        reported = time.perf_counter()

    def log(message: str) -> None:
        nonlocal reported
        run.log(message)
        if time.perf_counter() - reported > REPORT_EVERY_S:
            # a unit takes up to hours: keep tables.md and the plots current for a run that is stopped
            run.save(header_only=True)
            run.write_report()
            reported = time.perf_counter()

    return Events(work=progress.report, started=started, done=done, log=log)


def reproduce(
    dataset: str | Dataset,
    profile: str | Profile = "quick",
    out: str | Path = "runs/reproduce",
    options: ReproduceOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
    **changes: Any,
) -> dict:
    """Run (or resume) the protocol; returns the results dict also written to ``out/results.json``.

    The options are `options` (default: :class:`ReproduceOptions`'s defaults) with `changes` to its
    fields (``reproduce("sent", "quick", "runs/sent", models="euc,hyp", jobs=2)``).
    `dataset` is a name for :func:`dyntc.protocol.data.datasets.load` or a :class:`Dataset`. `jobs` work units
    run at once, each in its own process (1: in this process). ``executor="ray"`` runs the units as
    tasks on the Ray cluster at `address` instead (default: ``RAY_ADDRESS``, else a local instance for
    the run): see :class:`dyntc.protocol.executors.RayExecutor`. `threads` sets ``torch.set_num_threads``
    in each process (the SRU's matrices are small: one thread is usually fastest on CPU, and several
    threads are much slower on a busy machine). With ``device="cuda"`` the `jobs` processes share the
    GPU: one SRU unit keeps it far from busy (its time goes to kernel launches), so several run at
    once at little cost to each. `tune` first selects each model's settings on the
    pretraining dev set (:func:`dyntc.protocol.tune_profile`; grid `tune_grid`, see
    :func:`dyntc.protocol.tuning.parse_grid`). `embeddings` is a GloVe text file for the sru encoder (default:
    the packaged glove.6B.50d; ``dyntc export-glove`` writes a dataset's subset of it). `only_splits`
    runs only those split indices now; the other splits' cells stay to do (a later call runs them).
    `redo` models (among `models`) whose settings differ from `out`'s file lose their finished cells
    there instead of the run being refused (their pretrained weights are reused only where they fit);
    the other models' work stays.
    """
    opts = replace(options or ReproduceOptions(), **changes)
    jobs, threads, executor = opts.jobs, opts.threads, opts.executor
    if not is_int(jobs) or jobs < 1:
        raise DyntcError(f"--jobs must be an integer >= 1 (work units run at once, one process each), got {jobs!r}")
    if threads is not None and threads < 1:
        raise DyntcError(f"--threads must be >= 1, got {threads}")
    if executor != "local" and jobs != 1:
        raise DyntcError(f"--jobs is for the local executor: with --executor {executor} the cluster's free CPUs "
                         f"(and GPUs) set how many units run at once")
    chosen = make_executor(executor, jobs=jobs, threads=threads or 1, address=opts.address)  # Ray missing: refused here
    if threads is not None:
        torch.set_num_threads(threads)
    name = dataset.name if isinstance(dataset, Dataset) else str(dataset)
    device_here = chosen.runs_here or opts.tune  # --tune trains here, before the units
    plan = make_plan(name, profile, opts, device_here=device_here)
    redone = parse_names(opts.redo, ALL_MODELS, "--redo model(s)") or ()
    if redone and opts.force:
        raise DyntcError("--force discards every model's results already: give --force or --redo, not both")
    if set(redone) - set(plan.models):
        raise DyntcError(f"--redo {','.join(redone)}: {', '.join(sorted(set(redone) - set(plan.models)))} not among "
                         f"--models {','.join(plan.models)}; add it there to run it again now")
    if not isinstance(dataset, Dataset):
        from dyntc.protocol.data.datasets import load

        dataset = load(name, opts.data_dir, seed=opts.seed)
    tuning = None
    if opts.tune:
        tuning = tune_profile(dataset, plan, Path(out), grid=opts.tune_grid, log=log)
        per_model = {**(plan.hp.get("per_model") or {})}
        for model, entry in tuning.items():
            per_model[model] = {**per_model.get(model, {}), **entry["chosen"]}
        prof = replace(plan.profile, per_model={**plan.profile.per_model, plan.dataset: per_model})
        # the plan's profile holds the --set values already; setting them again would drop the tuned
        # per-model values of the same fields
        plan = make_plan(name, prof, replace(opts, settings=None), device_here=device_here)
    run = ProtocolRun(dataset, plan, Path(out), force=opts.force, redo=redone, progress=opts.progress, log=log)
    if tuning is not None:
        run.results["tuning"] = tuning
    return execute(run, jobs, threads or 1, chosen)


__all__ = ["Progress", "execute", "reproduce", "stage_costs"]
