"""Measured: ways of fine-tuning the pretrained MLP on the n_fine examples, for the SENT MLP gap
(docs/results.md §8.3; they chose the profile fields finetune_lr and finetune_fit_head): the
protocol's rule (a fresh linear layer, the whole network trained at the profile's settings) against
other learning rates and a fresh layer trained on the frozen encoder, by Adam with early stopping or
fitted to convergence as a logistic regression on the encoder's features (dyntc.core.training.fit_head,
its L2 strength chosen on dev_new; rule "frozen encoder logreg"), and that fitted layer as the start
of the protocol's fine-tuning (LP-FT; rule "logreg head then protocol", the profile field
finetune_fit_head). Commit a0f83d5 has the script's first version of the last two rules, with its own
regression; the library's loop also counts the fitted start in the patience. (A longer budget is the
profile field finetune_min_steps: `dyntc reproduce --set finetune_min_steps=1000`.)

    python research/mlp_finetune_probe.py --run runs/sent-mlp --splits 0,1

`--run` is a `dyntc reproduce` directory of a profile run with the MLP's pretrained weights
(``checkpoints/splitK/mlp.safetensors``; e.g. ``dyntc reproduce --dataset sent --profile paper --models
mlp --variants fine-tuned,un-tuned --only-splits 0,1 --out runs/sent-mlp``). It is only read. Every rule
runs on the protocol's own fine-tuning examples, seed and dev set (dev_new, for early stopping) of the
split, so the "protocol" rule must give the run's own MLP fine-tuned rows (checked, printed). Each rule
prints its dev_new accuracy (what a selection may look at) beside its test accuracy.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from dyntc.protocol.data.datasets import load
from dyntc.core.encoders.base import embed
from dyntc.errors import DyntcError
from dyntc.protocol import make_plan
from dyntc.protocol.plan import derive_seed
from finished_run import read_only_run
from dyntc.core.training import fit_head, train_supervised
from dyntc.core.inference import supervised_accuracy

# name -> (changes to the fine-tuning TrainConfig, encoder frozen)
RULES = {
    "protocol": ({}, False),
    "lr 1e-4": ({"lr": 1e-4}, False),
    "lr 1e-3": ({"lr": 1e-3}, False),
    "lr 3e-3": ({"lr": 3e-3}, False),
    "lr 1e-2": ({"lr": 1e-2}, False),
    "lr 3e-2": ({"lr": 3e-2}, False),
    "frozen encoder lr 1e-3": ({}, True),
    "frozen encoder lr 1e-2": ({"lr": 1e-2}, True),
    "frozen encoder lr 3e-2": ({"lr": 3e-2}, True),
    "frozen encoder lr 1e-1": ({"lr": 1e-1}, True),
    "logreg head then protocol": ({"fit_head": True}, False),  # LP-FT: the profile's finetune_fit_head
}
LOGREG = "frozen encoder logreg"  # dyntc.core.training.fit_head alone: the new layer fitted, nothing tuned


def fine_tune(pretrained, fine, dev, cfg, changes: dict, frozen: bool):
    model = copy.deepcopy(pretrained)
    model.replace_head(len(fine.classes))
    if frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    result = train_supervised(model, fine, dev, replace(cfg, snapshot=None, progress=False, **changes))
    model.eval()
    return model, result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--splits", "--only-splits", dest="splits", default="0", help="comma-separated split indices")
    ap.add_argument("--n-fine", default=None, help="comma-separated (default: the run's)")
    ap.add_argument("--rules", default=",".join(RULES), help="comma-separated names of RULES")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rules = [r.strip() for r in args.rules.split(",")]
    unknown = [r for r in rules if r not in RULES and r != LOGREG]
    if unknown:
        raise DyntcError(f"--rules: unknown {unknown}; known: {[*RULES, LOGREG]}")
    if not (args.run / "results.json").is_file():
        raise DyntcError(f"--run {str(args.run)!r} holds no results.json: give a `dyntc reproduce` output directory")
    results = json.loads((args.run / "results.json").read_text(encoding="utf-8"))
    # checked by make_plan as the run's own options are (--only-splits: indices below the run's splits)
    plan = make_plan(results["dataset"], results["profile"], splits=results["splits"], models="mlp",
                     variants="fine-tuned", n_fine=args.n_fine or tuple(results["n_fine"]), seed=results["seed"],
                     only_splits=args.splits)
    splits, n_fine = plan.selected_splits(), plan.n_fine
    for s in splits:
        if not (args.run / "checkpoints" / f"split{s}" / "mlp.safetensors").is_file():
            raise DyntcError(f"{args.run}/checkpoints/split{s}/mlp.safetensors is missing: run the split's mlp cells first")
    done = {(r["variant"], r["n_fine"], r["split"]): r for r in results["rows"] if r["model"] == "mlp"}
    data = load(plan.dataset, None, seed=plan.seed)
    rows = []
    with read_only_run(args.run, plan, data, log=lambda m: print(m, file=sys.stderr)) as run:
        for s in splits:
            d = run.split_data(s)
            pretrained = run.pretrained(s, "mlp")
            for n in n_fine:
                idx, _ = d.split.finetune_indices(n)
                fine = d.pool.take(idx)
                seed = derive_seed(plan.seed, d.seed, "mlp", "fine-tuned", n)
                cfg = plan.train_config("finetune", seed, model="mlp", n_train=len(fine))
                for name in rules:
                    if name == LOGREG:
                        model = copy.deepcopy(pretrained)
                        model.replace_head(len(fine.classes))
                        dev = fit_head(model, fine, d.dev_new, seed)
                        row = {"split": s, "n_fine": n, "rule": name, "dev_new": dev,
                               "test": supervised_accuracy(model, d.test), "steps": 0}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        continue
                    torch.manual_seed(seed)
                    model, result = fine_tune(pretrained, fine, d.dev_new, cfg, *RULES[name])
                    pred = embed(model, model.encoder, d.test.items).argmax(1).cpu().numpy()
                    test = float((pred == d.test.labels).mean())
                    dev = max(h["dev_acc"] for h in result.history)
                    row = {"split": s, "n_fine": n, "rule": name, "dev_new": dev, "test": test, "steps": result.steps}
                    if name == "protocol" and ("fine-tuned", n, s) in done:
                        row["run_row"] = done[("fine-tuned", n, s)]["acc_all"]
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print("\nmean over splits, %: dev_new / test")
    for n in n_fine:
        for name in rules:
            sel = [r for r in rows if r["n_fine"] == n and r["rule"] == name]
            print(f"  n_fine={n:<4d} {name:40s} {100 * np.mean([r['dev_new'] for r in sel]):5.1f} / "
                  f"{100 * np.mean([r['test'] for r in sel]):5.1f}")


if __name__ == "__main__":
    try:
        main()
    except DyntcError as exc:
        sys.exit(f"error: {exc}")
