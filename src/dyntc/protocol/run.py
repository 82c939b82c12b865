"""One ``dyntc reproduce`` run: its (split, model) work units, each a pretraining stage and its cells.

The orchestration (order of the units, worker processes, progress and ETA) is :mod:`dyntc.protocol.reproduce`'s;
the protocol itself is described in :mod:`dyntc.protocol`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from dyntc.protocol.data.dynamic import DynamicSplit, make_split
from dyntc.protocol.data.types import Dataset
from dyntc.errors import DyntcError
from dyntc.core.files import atomic_write
from dyntc.core.models import build_model, model_kind
from dyntc.protocol.evaluation import (
    accuracies,
    check_frozen_items,
    logreg_predict,
    prototype_predict,
    train_info,
    untuned_predict,
)
from dyntc.protocol.features import RunEncoders
from dyntc.protocol.plan import PRETRAIN_STOPPING, RunPlan, cell_key, derive_seed, model_view, without_stopping_rule
from dyntc.protocol.results import ResultsFile, load_weights, now, ordered_row, save_weights
from dyntc.core.stopping import chance_loss, ended_under
from dyntc.core.encoders.base import embed
from dyntc.core.training import TrainConfig, train_prototypical, train_supervised
from dyntc.core.inference import Encoded, embed_points
from dyntc.core.machine import machine_description

@dataclass
class Unit:
    """A (split, model) work unit: the model's pretraining on that split, then its cells. Units share
    nothing but the featurized texts and every seed comes from :func:`derive_seed`, so they may run in
    any order, or in parallel processes (``dyntc.protocol.reproduce``), with the same results."""

    split: int
    model: str
    cells: list[tuple[str, str, int, int]]

    @property
    def name(self) -> str:
        return f"split {self.split} {self.model}"

    @property
    def pretrains(self) -> bool:
        """Whether the unit pretrains its model first: a network with a fine-tuned or un-tuned cell (the
        scratch cells start from nothing)."""
        return model_kind(self.model).network and any(v in ("fine-tuned", "un-tuned") for _, v, _, _ in self.cells)


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



class ProtocolRun:
    """One ``dyntc reproduce`` run: a dataset, a plan, an output directory.

    The orchestration (order of the units, processes, progress and ETA) is :mod:`dyntc.protocol.reproduce`'s;
    this class prepares the units (:meth:`prepare`), runs one (:meth:`run_unit`) and closes the run
    (:meth:`finish`). A worker process opens its own instance with ``worker=True``: it merges its rows
    into ``results.json`` and leaves the run-level fields to the parent.
    """

    def __init__(self, data: Dataset, plan: RunPlan, out: Path, *, force: bool = False, redo: tuple[str, ...] = (),
                 progress: bool = True, log: Callable[[str], None] | None = None, worker: bool = False):
        self.data, self.plan, self.out = data, plan, Path(out)
        self.hp = plan.hp
        self.progress = progress
        self.worker = worker
        self.log = log or (lambda msg: tqdm.write(msg))
        self.file = ResultsFile(self.out, plan, force=force, redo=redo, worker=worker, log=self.log)
        self.encoders = RunEncoders(data, plan, self.file.check_vocabulary, self.log)
        self._splits: dict[int, DynamicSplit] = {}
        self._split_data: dict[int, SplitData] = {}
        self._on_work: Callable[[int], None] | None = None  # hears of training work (sequences), for the ETA
        # called after every save: a unit run on another machine sends its new results to the driver from here
        self.on_save: Callable[[], None] | None = None
        # per row and pretraining: a run resumed elsewhere (another CPU, a GPU) mixes machines
        self._machine = f"{machine_description()}, device {plan.device}"

    # ---- results file (dyntc.protocol.results) ---------------------------------------------------

    @property
    def results(self) -> dict:
        """The run's results as this process knows them (``results.json``'s content after its last save)."""
        return self.file.data

    @property
    def results_path(self) -> Path:
        return self.file.path

    def done(self) -> set[str]:
        return self.file.done()

    def save(self, replace: bool = False, header_only: bool = False) -> None:
        self.file.save(replace, header_only)
        if self.on_save is not None:
            self.on_save()

    def merge_output(self, output: dict, source: str) -> None:
        """A unit's results made elsewhere (a Ray task, :mod:`dyntc.protocol.executors`) into this run:
        the files it wrote under ``checkpoints/`` (pretrained weights, snapshots of running stages;
        written atomically), its vocabulary digest (checked against the run's, as a local process's
        is), the split's info, its pretraining record and its new rows, then saved through the same
        merge as this process's own cells (:meth:`save`). The snapshots of the stages it finished are
        removed, as a local unit removes them."""
        for rel, content in (output.get("files") or {}).items():
            path = (self.out / rel).resolve()
            if not path.is_relative_to((self.out / "checkpoints").resolve()):
                raise DyntcError(f"{source} sent a file outside the run's checkpoints/: {rel!r}")
            with atomic_write(path) as tmp:
                tmp.write_bytes(content)
        if not set(output) - {"files"}:  # a running stage's snapshot: nothing for results.json yet
            return
        if output.get("vocabulary") is not None:
            self.file.check_vocabulary(output["vocabulary"], f"the word vectors on {source}")
        for s, info in (output.get("split_info") or {}).items():
            self.results["split_info"].setdefault(s, {}).update(info)
        for s, by_model in (output.get("pretraining") or {}).items():
            self.results["pretraining"].setdefault(s, {}).update(by_model)
        done = self.done()
        rows = [r for r in output.get("rows") or [] if cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) not in done]
        self.results["rows"].extend(rows)
        self.save()
        for r in rows:
            self._snapshot(r["split"], r["model"], r["variant"], r["n_fine"]).unlink(missing_ok=True)
        for s, by_model in (output.get("pretraining") or {}).items():
            for model in by_model:
                self._snapshot(int(s), model, "pretrain").unlink(missing_ok=True)

    def new_model(self, model_name: str, enc0, split_seed: int, n_classes: int):
        """An untrained `model_name` on a copy of the split's encoder, seeded alike in every stage."""
        encoder = self.encoders.for_model(model_name, enc0, split_seed)  # before seeding: a fresh one draws numbers
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, model_name, "init"))
        return build_model(model_name, encoder, n_classes, **self.plan.model_options(model_name))

    def pretrain_dev_score(self, model_name: str, split: int = 0) -> tuple[float | None, dict]:
        """Pretrain `model_name` on split `split` as the run would and return its best ``dev_old``
        accuracy (what :func:`dyntc.protocol.tuning.tune_profile` selects on). Trains on the pretraining
        pool and scores on dev_old only; writes no weights."""
        d = self.split_data(split)
        model = self.new_model(model_name, d.enc0, d.seed, len(d.pretrain.classes))
        result = self._train_pretraining(model, model_name, d)
        return result.best_dev_acc, {"steps": result.steps, "stopped_early": result.stopped_early}

    # ---- training configs -----------------------------------------------------------------------

    def _snapshot(self, split: int, model: str, *stage: Any) -> Path:
        """File of a training stage's state while it runs (``checkpoints/``, like the pretrained weights):
        a run stopped mid-stage resumes that stage from its last dev evaluation, not from its start."""
        return self.out / "checkpoints" / f"split{split}" / f"{'-'.join(map(str, (model, *stage)))}.partial.pt"

    def _cfg(self, stage: str, seed: int, n_support: int | None = None, n_train: int | None = None,
             model: str | None = None, snapshot: Path | None = None) -> TrainConfig:
        cfg = self.plan.train_config(stage, seed, model=model, n_support=n_support, n_train=n_train)
        return replace(cfg, progress=self.progress, on_work=self._on_work, snapshot=snapshot)

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
            if s not in plan.selected_splits():
                continue
            todo = [c for c in plan.cells(s) if cell_key(*c) not in done]
            units += [Unit(s, m, [c for c in todo if c[0] == m]) for m in dict.fromkeys(c[0] for c in todo)]
        self.save(replace=True)
        n_todo, n_all = sum(len(u.cells) for u in units), sum(len(plan.cells(s)) for s in range(plan.splits))
        if n_todo == 0:
            self.log(f"all {n_all} cells already in {self.results_path}; rewriting tables and plots")
        else:
            only = "" if plan.only_splits is None else f" (now only split(s) {','.join(map(str, plan.only_splits))})"
            self.log(f"{self.data.name}: {n_todo} of {n_all} cells to run{only} ({plan.splits} splits x models {','.join(plan.models)} "
                     f"x variants x n_fine {','.join(map(str, plan.n_fine))}); profile {plan.profile.name}, device {plan.device}")
        return units

    def finish(self, seconds: float) -> dict:
        """Record whether every cell of the run's grid (all invocations) is done and the run's wall time;
        rows in the grid's order."""
        self.results["last_run_seconds"] = seconds
        self.save(header_only=True)  # fetches what worker processes wrote (this process saved its own cells)
        grid, done = self.file.grid_cells(), self.done()
        self.results["finished"] = now() if all(cell_key(*c) in done for c in grid) else None
        order = {cell_key(*c): i for i, c in enumerate(grid)}
        self.results["rows"].sort(key=lambda r: order.get(cell_key(r["model"], r["variant"], r["n_fine"], r["split"]), len(order)))
        self.save(replace=True)
        self.write_report()
        return self.results

    def write_report(self) -> None:
        from dyntc.protocol.report import write_report

        write_report(self.results, self.out)

    def _weights_fit(self, info: dict, model_name: str, pretrain: Encoded) -> dict | None:
        """Saved pretrained weights' `info` if they are this run's: pretrained with its settings, or
        under another stopping rule (e.g. a selection run of scripts/pretrain_stage.py, which does not
        stop early) that the run's own rule, replayed on their dev history, ends alike or sooner with the
        same best weights (then `info` as the run's rule would have ended it, with a note); else None."""
        saved = model_view(info.get("fingerprint") or {}, model_name, pretraining=True)
        now = model_view(self.plan.fingerprint(), model_name, pretraining=True)
        if saved == now:
            return info
        if without_stopping_rule(saved) != without_stopping_rule(now):
            return None
        cfg = self.plan.train_config("pretrain", 0, model=model_name)
        if model_kind(model_name).episodic:
            loop, chance = "prototypical", chance_loss(pretrain.labels, cfg.max_classes)
        else:
            loop, chance = "supervised", None
        ended = ended_under(info, cfg, loop, chance)
        if ended is None:
            return None
        rule = {k: saved["hyperparameters"].get(k) for k in PRETRAIN_STOPPING}
        if ended.get("steps") != info.get("steps"):
            return {**ended, "note": f"pretrained under another stopping rule ({rule}) to step {info.get('steps')}; this "
                                     f"run's ends it at step {ended.get('steps')}, and no later dev score beat its best by then"}
        return {**ended, "note": f"pretrained under another stopping rule ({rule}), which this run's ends alike"}

    def split_data(self, s: int) -> SplitData:
        """The featurized sets of split `s` (made once per process; every process makes the same)."""
        if s in self._split_data:
            return self._split_data[s]
        plan, hp, split = self.plan, self.hp, self.split(s)
        split_seed = plan.seed + s
        enc0 = self.encoders.fresh(split_seed)
        feats = self.encoders.features(enc0)
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
        if not all(model_kind(m).network for m in plan.models):  # a probe fits frozen sentence embeddings
            check_frozen_items(feats.train)
        self._split_data[s] = data
        return data

    def run_unit(self, unit: Unit, report: Callable[[tuple, int, bool], None] | None = None) -> None:
        """Pretrain `unit.model` on its split (or load its checkpoint), then run and save its cells.

        `report(stage, n, finished)` hears of the work for the ETA: `n` sequences through the encoder in
        `stage` (``(split, "pretrain", model)`` or ``(split, model, variant, n_fine)``), and each stage's end.
        """
        report = report or (lambda stage, n, finished: None)
        s, model_name = unit.split, unit.model
        d = self.split_data(s)
        pretrained = None
        if unit.pretrains:
            stage = (s, "pretrain", model_name)
            self._on_work = lambda n: report(stage, n, False)
            pretrained = self.pretrained(s, model_name)
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
                cell_seconds=time.perf_counter() - t0, finished=now(), machine=self._machine,
            )
            self.results["rows"].append(ordered_row(row))
            self.save()
            self._snapshot(s, model_name, variant, n_fine).unlink(missing_ok=True)
            report(stage, len(d.test) + (len(fine) if variant == "un-tuned" else 0), True)
            acc_new = "n/a" if row["acc_new"] is None else f"{row['acc_new']:.3f}"
            self.log(f"  split {s} {model_name:6s} {variant:10s} n_fine={n_fine:<4d} acc_all={row['acc_all']:.3f} "
                     f"acc_new={acc_new} ({row['train_seconds']:.0f}s train)")
        self._on_work = None

    def _train_pretraining(self, model, model_name: str, d: SplitData, snapshot: Path | None = None):
        cfg = self._cfg("pretrain", derive_seed(self.plan.seed, d.seed, model_name, "pretrain"), model=model_name,
                        snapshot=snapshot)
        train = train_prototypical if model_kind(model_name).episodic else train_supervised
        return train(model, d.pretrain, d.dev_old, cfg)

    def pretrained(self, s: int, model_name: str):
        """Split `s`'s pretrained `model_name`: its saved weights when they fit the run, else trained
        (resuming the stage's snapshot) and saved."""
        d = self.split_data(s)
        model = self.new_model(model_name, d.enc0, d.seed, len(d.pretrain.classes))
        path = self.out / "checkpoints" / f"split{s}" / f"{model_name}.safetensors"
        info = load_weights(path, model)
        info = self._weights_fit(info, model_name, d.pretrain) if info is not None else None
        if info is not None:
            self.log(f"split {s} {model_name}: pretrained weights loaded from {path}"
                     + (f" ({info['note']})" if "note" in info else ""))
        else:
            if path.is_file():  # weights of other settings (or a part of them) were loaded: not the stage's start
                model = self.new_model(model_name, d.enc0, d.seed, len(d.pretrain.classes))
            snapshot = self._snapshot(s, model_name, "pretrain")
            result = self._train_pretraining(model, model_name, d, snapshot)
            info = {"fingerprint": self.plan.fingerprint(), "seconds": result.seconds, "machine": self._machine, **train_info(result),
                    "n_train": len(d.pretrain), "n_dev": len(d.dev_old)}
            save_weights(path, model, info)
            snapshot.unlink(missing_ok=True)
            self.log(f"split {s} {model_name}: pretrained {result.steps} {model_kind(model_name).steps} "
                     f"in {result.seconds:.0f}s, best dev_old acc {result.best_dev_acc:.3f}")
        self.results["pretraining"].setdefault(str(s), {})[model_name] = {k: v for k, v in info.items() if k != "fingerprint"}
        return model.to(self.plan.device).eval()

    def _cell(self, model_name, variant, n_fine, s, split_seed, enc0, pretrained, fine: Encoded, dev_new: Encoded,
              test: Encoded, test_new_mask, cache) -> dict:
        plan, hp = self.plan, self.hp
        n_classes = len(fine.classes)
        seed = derive_seed(plan.seed, split_seed, model_name, variant, n_fine)
        info: dict[str, Any] = {"train_seconds": 0.0}
        if not model_kind(model_name).network:  # the logistic-regression probe
            t0 = time.perf_counter()
            pred = logreg_predict(fine, test, seed)
            info["train_seconds"] = time.perf_counter() - t0
            info.update(accuracies(pred, test.labels, test_new_mask))
            return info

        if variant == "un-tuned":
            pred = untuned_predict(model_name, pretrained, fine, test, hp["knn_k"], cache)
            info.update(train_info(None))
            info.update(accuracies(pred, test.labels, test_new_mask))
            return info

        # fine-tuned or scratch: train on the n_fine examples, early stopping on dev_new
        if variant == "fine-tuned":
            model = copy.deepcopy(pretrained)
        else:
            model = self.new_model(model_name, enc0, split_seed, n_classes)
        torch.manual_seed(seed)
        if model_kind(model_name).has_output_layer:  # a new output layer, trained by mini-batches
            if variant == "fine-tuned":
                model.replace_head(n_classes)
            stage = "finetune" if variant == "fine-tuned" else "scratch"  # a fitted head needs a pretrained encoder
            result = train_supervised(model, fine, dev_new, self._cfg(stage, seed, n_train=len(fine), model=model_name,
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
                stage = "finetune" if variant == "fine-tuned" else "scratch"
                result = train_prototypical(model, fine, dev_new, self._cfg(stage, seed, n_support, model=model_name,
                                                                            snapshot=self._snapshot(s, model_name, variant, n_fine)))
            model.eval()
            pred = prototype_predict(model, embed_points(model, fine.items), fine.labels, n_classes, embed_points(model, test.items))
        info["train_seconds"] = result.seconds if result is not None else 0.0
        info.update(train_info(result))
        info.update(accuracies(pred, test.labels, test_new_mask))
        return info
