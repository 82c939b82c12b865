"""What a run keeps on disk: ``results.json`` (opened against the plan's fingerprint, merged between
worker processes under a file lock) and the pretrained weights under ``checkpoints/``."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dyntc._version import __version__
from dyntc.core.files import update_json
from dyntc.errors import DyntcError
from dyntc.core.files import atomic_write, write_json
from dyntc.core.models import load_trainable_state, trainable_state
from dyntc.protocol.plan import RunPlan, cell_key, model_view, scratch_view
from dyntc.protocol.profiles import MODEL_VARIANTS, VARIANTS
from dyntc.core.machine import check_out_dir, machine_description

RESULTS_FORMAT = 1
_ROW_ORDER = ("model", "variant", "n_fine", "split", "acc_all", "acc_new", "acc_old", "train_seconds")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def ordered_row(row: dict) -> dict:
    """A result row with its identifying and accuracy fields first (for people reading results.json)."""
    return {**{k: row[k] for k in _ROW_ORDER if k in row}, **{k: v for k, v in row.items() if k not in _ROW_ORDER}}


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
    merged["updated"] = now()
    return merged


def joined_grid(old: dict, plan: RunPlan) -> dict[str, Any]:
    """The cells a results file stands for: the grid of its earlier invocations (its header) joined
    with this one's, so that a resume selecting fewer n_fine, models or variants neither makes the
    header describe that selection only nor marks the run finished when the selection is done.
    ``scratch_n_fine`` None means scratch at every n_fine; it counts only where scratch was asked for."""
    def scratch(n_fine, variants, scratch_n_fine):
        if "scratch" not in variants:
            return set()
        return set(n_fine) if scratch_n_fine is None else set(scratch_n_fine)

    rows = old.get("rows") or []  # files written before the header was joined still show their cells
    old_n = set(old.get("n_fine") or []) | {r["n_fine"] for r in rows}
    old_models = set(old.get("models") or []) | {r["model"] for r in rows}
    old_variants = set(old.get("variants") or []) | {r["variant"] for r in rows}
    n_fine = sorted(old_n | set(plan.n_fine))
    models = [m for m in MODEL_VARIANTS if m in old_models | set(plan.models)]
    variants = [v for v in VARIANTS if v in old_variants | set(plan.variants)]
    # the header's scratch selection as it is: a few scratch cells of an early invocation at other n_fine
    # must not turn the run's scratch grid into "every n_fine"
    scratch_at = (scratch(old_n, old_variants, old.get("scratch_n_fine"))
                  | scratch(plan.n_fine, plan.variants, plan.scratch_n_fine))
    scratch_n_fine = None if "scratch" not in variants or scratch_at >= set(n_fine) else sorted(scratch_at)
    return {"n_fine": n_fine, "models": models, "variants": variants, "scratch_n_fine": scratch_n_fine}


def _still_valid(old: dict, model: str, saved: dict, fingerprint: dict) -> bool:
    """Whether `model`'s finished work in the results file `old` (written under `saved`) holds under
    `fingerprint`: its settings are the same, or all it has finished is scratch cells, whose settings
    (:func:`scratch_view`) are. Its scratch cells hold only where their own settings are the same."""
    rows = [r for r in old.get("rows") or [] if r.get("model") == model]
    scratch_same = scratch_view(saved, model) == scratch_view(fingerprint, model)
    if not scratch_same and any(r.get("variant") == "scratch" for r in rows):
        return False
    if model_view(saved, model) == model_view(fingerprint, model):
        return True
    pretrained = any(model in by_model for by_model in (old.get("pretraining") or {}).values())
    return not pretrained and all(r.get("variant") == "scratch" for r in rows)


def describe_difference(old: dict, new: dict, prefix: str = "") -> str:
    """The first few fields in which two (nested) fingerprints differ, for an error message."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = describe_difference(a, b, f"{prefix}{key}.")
            if inner:
                out.append(inner)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} there, {b!r} now")
    return "; ".join(out[:4]) + ("; ..." if len(out) > 4 else "")


class ResultsFile:
    """A run directory's ``results.json``: the run's header, its finished cells (``rows``), each split's
    label sets (``split_info``) and each pretraining stage's record (``pretraining``).

    Opening checks the file against the plan's fingerprint: a run with another configuration is refused,
    unless the difference concerns only models with nothing finished (or only scratch cells whose own
    settings did not change). `redo` models whose settings changed first lose their finished cells
    (except scratch cells the change does not touch) and pretraining records, and, once the run is accepted,
    their fine-tuned cells' snapshots (their pretrained weights and pretraining snapshots stay: a
    stage uses them only where they fit its settings). A worker process (``worker=True``) merges its rows into the file
    and leaves the run-level fields to the parent.
    """

    def __init__(self, out: Path, plan: RunPlan, *, force: bool = False, redo: tuple[str, ...] = (),
                 worker: bool = False, log: Callable[[str], None] = print):
        self.out, self.plan, self.worker, self.log = Path(out), plan, worker, log
        self.path = self.out / "results.json"
        self.data = self._open(force, redo)
        # the pretraining records as last read from or written to the file: a save sends only those this
        # process changed since, so that another worker's newer record is not overwritten by a stale copy
        self._synced = copy.deepcopy(self.data.get("pretraining") or {})

    def _open(self, force: bool, redo: tuple[str, ...]) -> dict:
        fingerprint = self.plan.fingerprint()
        check_out_dir(self.out)
        if not self.path.is_file():
            self.out.mkdir(parents=True, exist_ok=True)
            return {**self._header(started=None), "rows": [], "split_info": {}, "pretraining": {}}
        try:
            old = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DyntcError(f"{self.path} is not valid JSON ({exc}); move it away or pass --force") from exc
        if not isinstance(old, dict):
            raise DyntcError(f"{self.path} is not a dyntc results file; move it away or pass --force")
        if force:
            self.log(f"--force: discarding {len(old.get('rows', []))} finished cells in {self.out}")
            shutil.rmtree(self.out / "checkpoints", ignore_errors=True)
            return {**self._header(started=None), "rows": [], "split_info": {}, "pretraining": {}}
        redone = self._forget(old, redo) if redo else ()
        if old.get("fingerprint") != fingerprint:
            saved = old.get("fingerprint") or {}
            finished = {r.get("model") for r in old.get("rows", [])} | {
                m for models in (old.get("pretraining") or {}).values() for m in models}
            contradicted = sorted(m for m in finished if not _still_valid(old, m, saved, fingerprint))
            difference = describe_difference(saved, fingerprint)
            if contradicted or not isinstance(saved.get("hyperparameters"), dict):
                raise DyntcError(
                    f"{self.out} holds results of a different configuration ({difference}) for "
                    f"{', '.join(contradicted) or 'its models'}; use another --out, pass --redo "
                    f"{','.join(contradicted) or 'MODEL'} to recompute the cells the change touches, or --force to discard them all")
            # the change concerns only models with nothing finished (e.g. one model's per-model
            # settings): their running stages' snapshots are checked against their own settings
            self.log(f"{self.path}: taking the new configuration ({difference}); "
                     f"it changes nothing for the finished work of {', '.join(sorted(finished)) or 'no model'}")
        for model in redone:  # only now that the run is accepted: its fine-tuned cells' snapshots started
            # from the old pretrained weights, which their keys do not name
            for snapshot in self.out.glob(f"checkpoints/split*/{model}-fine-tuned-*.partial.pt"):
                snapshot.unlink()
        grid = joined_grid(old, self.plan)
        old.update(self._header(started=old.get("started")))
        old.update(grid)
        old["config"] = {**old["config"], "n_fine": grid["n_fine"]}  # not the selection's n_fine
        return old

    def _forget(self, old: dict, models: tuple[str, ...]) -> tuple[str, ...]:
        """``--redo``: drop from `old` the finished work of `models` that their changed settings touch:
        the scratch cells where the settings scratch reads changed (:func:`scratch_view`), the other
        cells and the pretraining records where the others did; return the latter models (their
        fine-tuning snapshots started from the old weights). A model whose settings are the file's
        keeps its work, so that the same command line run again resumes instead of starting over. Their
        pretrained weights stay on disk: a stage uses them only where they fit its settings."""
        saved, fingerprint = old.get("fingerprint") or {}, self.plan.fingerprint()
        rows = old.get("rows") or []
        retrained = tuple(m for m in models if model_view(saved, m) != model_view(fingerprint, m))
        scratch_changed = {m for m in models if scratch_view(saved, m) != scratch_view(fingerprint, m)}
        changed = tuple(m for m in models if m in retrained or m in scratch_changed)
        if set(models) - set(changed):
            self.log(f"--redo: {', '.join(m for m in models if m not in changed)} kept: the settings are those of "
                     f"its finished work in {self.out} (resuming)")
        if not changed:
            return ()

        def stale(r: dict) -> bool:
            return r.get("model") in (scratch_changed if r.get("variant") == "scratch" else retrained)

        old["rows"] = [r for r in rows if not stale(r)]
        kept = sum(r.get("model") in changed and r.get("variant") == "scratch" for r in old["rows"])
        pretrained = sum(by_model.pop(m, None) is not None
                         for by_model in (old.get("pretraining") or {}).values() for m in retrained)
        self.log(f"--redo {','.join(changed)}: discarding {len(rows) - len(old['rows'])} finished cells and "
                 f"{pretrained} pretraining records in {self.out} (other settings: {describe_difference(saved, fingerprint)})"
                 + (f"; keeping {kept} scratch cells, which the change does not touch" if kept else ""))
        return retrained

    def _header(self, started: str | None) -> dict:
        plan = self.plan
        return {
            "format": RESULTS_FORMAT,
            "dataset": plan.dataset,
            "profile": plan.profile.name,
            "profile_description": plan.profile.description,
            "encoder": plan.encoder,
            "p": plan.hp["p"],
            "seed": plan.seed,
            # the run's grid, joined over invocations (joined_grid); this invocation's selection below
            "n_fine": list(plan.n_fine),
            "splits": plan.splits,
            "models": list(plan.models),
            "variants": list(plan.variants),
            "scratch_n_fine": None if plan.scratch_n_fine is None else list(plan.scratch_n_fine),
            "last_invocation": {"n_fine": list(plan.n_fine), "models": list(plan.models), "variants": list(plan.variants),
                                "only_splits": None if plan.only_splits is None else list(plan.only_splits)},
            "config": plan.hp,
            "fingerprint": plan.fingerprint(),
            "dyntc_version": __version__,
            "machine": machine_description(),
            "device": plan.device,
            "torch_threads": torch.get_num_threads(),
            "started": started or now(),
            "finished": None,
            "early_stopping": "pretraining: dev set relabelled to Y_old; fine-tuning and scratch: dev set on Y_new, "
                              "prototypes (EUC/HYP) from the n_fine examples",
        }

    def grid_cells(self) -> list[tuple[str, str, int, int]]:
        """Every cell of the run's grid (all invocations, all splits), in the plan's order."""
        grid = {k: tuple(v) if v is not None else None for k, v in joined_grid(self.data, self.plan).items()}
        plan = dataclasses.replace(self.plan, **grid)
        return [c for s in range(plan.splits) for c in plan.cells(s)]

    def done(self) -> set[str]:
        return {cell_key(r["model"], r["variant"], r["n_fine"], r["split"]) for r in self.data["rows"]}

    def save(self, replace: bool = False, header_only: bool = False) -> None:
        """Merge this process's results into the file under a file lock (other workers may be writing);
        `replace` writes them as they are (the start of a run: old results kept or --force).
        `header_only`: merge only the run-level fields and take everything else from the file (the
        parent of worker processes, whose copies of their rows and pretraining records may be stale:
        a model pretrained again would otherwise get its old record back)."""
        ours = self.data
        ours["updated"] = now()
        if header_only and not replace:
            ours = {k: v for k, v in ours.items() if k not in ("rows", "split_info", "pretraining")}
        elif not replace:
            changed = {s: {m: r for m, r in by_model.items() if r != (self._synced.get(s) or {}).get(m)}
                       for s, by_model in (ours.get("pretraining") or {}).items()}
            ours = {**ours, "pretraining": {s: v for s, v in changed.items() if v}}
        self.data = update_json(
            self.path, lambda disk: ours if replace or disk is None else merge_results(disk, ours, header=not self.worker))
        self._synced = copy.deepcopy(self.data.get("pretraining") or {})

    def check_vocabulary(self, entry: dict[str, Any], source: str) -> None:
        """Record the frozen vocabulary's digest `entry`, or refuse one that differs from the run's (a
        resume with other word vectors would mix two encoders' cells in one table)."""
        known = self.data.get("vocabulary")
        if known is None:
            self.data["vocabulary"] = entry
        elif known != entry:
            raise DyntcError(
                f"the vocabulary built from {source} ({entry['words']} words x {entry['dim']}) differs from the one "
                f"{self.path} was made with ({known['words']} x {known['dim']}, sha256 {known['sha256'][:12]}...): "
                "pass the same --embeddings as the run's, another --out, or --force to discard its results")


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
