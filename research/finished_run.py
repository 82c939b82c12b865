"""A finished `dyntc reproduce` run read without writing to it: what the probes of a run's pretrained
models (mlp_probe.py, mlp_finetune_probe.py) start from."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, RunPlan
from dyntc.protocol.data.types import Dataset


@contextmanager
def read_only_run(run_dir: Path, plan: RunPlan, data: Dataset, log: Callable[[str], None] | None = None) -> Iterator[ProtocolRun]:
    """A :class:`ProtocolRun` of `plan` over a temporary copy of `run_dir`'s ``results.json`` and
    ``checkpoints/``, for probes of a finished run: its pretrained models load from the run's weights
    (a missing one is pretrained in the copy), and nothing is written to `run_dir`. `plan` must have
    the run's fingerprint (the same profile, settings and seed), or the weights would not be the run's."""
    run_dir = Path(run_dir)
    results = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    if plan.fingerprint() != results.get("fingerprint"):
        raise DyntcError(f"{run_dir} was run with other settings than the plan given ({plan.profile.name} profile, "
                         f"seed {plan.seed}): rebuild the plan with the run's profile, --set values and seed")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(run_dir / "results.json", tmp)
        if (run_dir / "checkpoints").is_dir():
            shutil.copytree(run_dir / "checkpoints", Path(tmp) / "checkpoints")
        yield ProtocolRun(data, plan, Path(tmp), progress=False, log=log)
