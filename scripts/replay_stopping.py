"""Replay a finished run's pretraining histories under the current early-stopping rule.

    python scripts/replay_stopping.py docs/runs/sent-sru-paper/results.json

For every pretraining stage in ``results.json`` (split x model) it prints the step the stage stopped
at and the step the rule of the run's profile, as the code now builds it (``RunPlan.train_config``:
floor, chance hold, patience), stops the same history at. Equal steps everywhere mean a change of the
stopping rule leaves the run's results as they are (the stages are deterministic up to their stop).
Exits with status 1 if any stage differs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from dyntc.protocol import make_plan
from dyntc.core.stopping import stop_step


def replayed_stop(history: list[dict], cfg, chance: float | None) -> int:
    """The step at which `cfg`'s rule stops `history` (its last step if it never does)."""
    stop = stop_step(history, cfg, chance)
    return history[-1].get("step", history[-1].get("epoch")) if stop is None else stop


def main(path: str) -> int:
    results = json.loads(Path(path).read_text(encoding="utf-8"))
    plan = make_plan(results["dataset"], results["profile"], seed=results["seed"])
    differ = 0
    for split, models in sorted(results["pretraining"].items(), key=lambda kv: int(kv[0])):
        for model, info in models.items():
            cfg = plan.train_config("pretrain", 0, model=model)
            n_old = len(results["split_info"][split]["old_labels"])
            chance = None if model == "mlp" else math.log(min(cfg.max_classes, n_old))
            replayed = replayed_stop(info["history"], cfg, chance)
            # the MLP's steps are batches, its evaluations are per epoch: compare its last evaluated epoch
            actual = info["history"][-1]["epoch"] if model == "mlp" else info["steps"]
            unit = "epoch" if model == "mlp" else "episode"
            mark = "" if replayed == actual else "   <- differs"
            differ += bool(mark)
            print(f"split {split} {model}: stopped at {unit} {actual}, current rule stops at {replayed}{mark}")
    print(f"{differ} stage(s) differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
