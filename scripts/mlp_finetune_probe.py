"""Ways of fine-tuning the pretrained MLP on the n_fine examples (issue 11, the SENT MLP gap): the
protocol's rule (a fresh linear layer, the whole network trained at the profile's settings) against
other learning rates and a fresh layer trained on the frozen encoder, by Adam with early stopping or
(rule LOGREG) fitted to convergence as an L2-regularised logistic regression on the encoder's eval-mode
features, its strength chosen on dev_new. (A longer budget is the profile field finetune_min_steps:
`dyntc reproduce --set finetune_min_steps=1000`.)

    DYNTC_DATA=../shared/datasets python scripts/mlp_finetune_probe.py --run runs/sent-mlp --splits 0,1

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

from dyntc.data.datasets import load
from dyntc.encoders.base import embed
from dyntc.errors import DyntcError
from dyntc.protocol import make_plan
from dyntc.protocol.plan import derive_seed
from dyntc.protocol.run import read_only_run
from dyntc.training import supervised_accuracy, train_supervised

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
}
LOGREG = "frozen encoder logreg"
LP_FT = "logreg head then protocol"  # the LOGREG layer as the new head, then the protocol's fine-tuning
LOGREG_C = (0.001, 0.003, 0.01, 0.03, 0.1, 1.0, 10.0)  # inverse L2 strengths; dev_new picks one per cell


def logreg_head(features: dict[str, torch.Tensor], labels: dict[str, np.ndarray], seed: int) -> dict:
    """A new output layer on frozen features, fitted to convergence (multinomial logistic regression,
    L-BFGS), its regularisation chosen on dev_new; the test accuracy is read at that choice only.
    ``weight``/``bias``: the fitted layer on the raw (unstandardised) features."""
    from sklearn.linear_model import LogisticRegression

    x = {k: v.cpu().double().numpy() for k, v in features.items()}
    # standardised on the n_fine examples: the raw features have norms of 28-50, which leaves L-BFGS
    # thousands of iterations at weak regularisation
    mean, std = x["fine"].mean(0), x["fine"].std(0) + 1e-6
    x = {k: (v - mean) / std for k, v in x.items()}
    best = None
    for c in LOGREG_C:
        clf = LogisticRegression(C=c, max_iter=5000, random_state=seed).fit(x["fine"], labels["fine"])
        dev = float((clf.predict(x["dev"]) == labels["dev"]).mean())
        if best is None or dev > best[0]:
            best = (dev, c, clf)
    dev, c, clf = best
    weight = clf.coef_ / std
    bias = clf.intercept_ - weight @ mean
    return {"dev_new": dev, "test": float((clf.predict(x["test"]) == labels["test"]).mean()), "C": c,
            "weight": torch.as_tensor(weight, dtype=torch.float32), "bias": torch.as_tensor(bias, dtype=torch.float32)}


def fine_tune(pretrained, fine, dev, cfg, changes: dict, frozen: bool):
    model = copy.deepcopy(pretrained)
    model.replace_head(len(fine.classes))
    if frozen:
        for p in model.encoder.parameters():
            p.requires_grad_(False)
    result = train_supervised(model, fine, dev, replace(cfg, snapshot=None, progress=False, **changes))
    model.eval()
    return model, result


def linear_probe_then_fine_tune(pretrained, fine, dev, cfg, head: dict):
    """LP-FT (Kumar et al. 2022): the new head starts as the fitted logistic regression, then the whole
    network is fine-tuned by the protocol's rule; the fine-tuning is kept only if it beats the start on
    dev_new (the protocol's early stopping, with the fitted head as its epoch 0)."""
    model = copy.deepcopy(pretrained)
    model.replace_head(len(fine.classes))
    with torch.no_grad():
        model.head.weight.copy_(head["weight"])
        model.head.bias.copy_(head["bias"])
    start_dev, start_state = supervised_accuracy(model, dev), copy.deepcopy(model.state_dict())
    result = train_supervised(model, fine, dev, replace(cfg, snapshot=None, progress=False))
    tuned_dev = max(h["dev_acc"] for h in result.history)
    if start_dev >= tuned_dev:
        model.load_state_dict(start_state)
    model.eval()
    return model, {"dev_new": max(start_dev, tuned_dev), "dev_start": start_dev, "dev_tuned": tuned_dev}, result.steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--splits", "--only-splits", dest="splits", default="0", help="comma-separated split indices")
    ap.add_argument("--n-fine", default=None, help="comma-separated (default: the run's)")
    ap.add_argument("--rules", default=",".join(RULES), help="comma-separated names of RULES")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rules = [r.strip() for r in args.rules.split(",")]
    unknown = [r for r in rules if r not in RULES and r not in (LOGREG, LP_FT)]
    if unknown:
        raise DyntcError(f"--rules: unknown {unknown}; known: {[*RULES, LOGREG, LP_FT]}")
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
            d = run._data(s)
            pretrained = run._pretrained(s, d.seed, "mlp", d.enc0, d.pretrain, d.dev_old)
            features = {}
            if LOGREG in rules or LP_FT in rules:  # the frozen encoder's features of dev_new and test, shared by every n_fine
                features = {k: embed(pretrained.encoder, pretrained.encoder, v.items) for k, v in
                            (("dev", d.dev_new), ("test", d.test))}
            for n in n_fine:
                idx, _ = d.split.finetune_indices(n)
                fine = d.pool.take(idx)
                seed = derive_seed(plan.seed, d.seed, "mlp", "fine-tuned", n)
                cfg = plan.train_config("finetune", seed, model="mlp", n_train=len(fine))
                head = None
                if LOGREG in rules or LP_FT in rules:
                    feats = {**features, "fine": embed(pretrained.encoder, pretrained.encoder, fine.items)}
                    labels = {"fine": fine.labels, "dev": d.dev_new.labels, "test": d.test.labels}
                    head = logreg_head(feats, labels, seed)
                for name in rules:
                    if name == LOGREG:
                        row = {"split": s, "n_fine": n, "rule": name, "dev_new": head["dev_new"], "test": head["test"],
                               "C": head["C"], "steps": None}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        continue
                    if name == LP_FT:
                        torch.manual_seed(seed)
                        model, devs, steps = linear_probe_then_fine_tune(pretrained, fine, d.dev_new, cfg, head)
                        pred = embed(model, model.encoder, d.test.items).argmax(1).cpu().numpy()
                        row = {"split": s, "n_fine": n, "rule": name, **devs,
                               "test": float((pred == d.test.labels).mean()), "steps": steps}
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
