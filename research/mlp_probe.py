"""Measured: few-shot rules on a finished run's pretrained encoders, for the MLP gap (docs/results.md
§8.3): for each split and
n_fine, test accuracy of the MLP's penultimate layer (the encoder output) with the protocol's 5-NN
vote, a 5-NN vote on L2-normalised features (cosine), and the nearest class mean; and of EUC's space
with the 5-NN vote and the nearest prototype (the protocol's un-tuned EUC).

    python research/mlp_probe.py --run docs/runs/sent-sru-paper --splits 0,1

Needs the run's pretrained weights (``checkpoints/splitK/{mlp,euc}.safetensors``, kept on the machine
that ran it, never committed). The run directory is only read: its results file and weights are
copied to a temporary directory first. The support sets are the protocol's own (same split, same
n_fine examples), so the "5-NN" and "nearest prototype" columns equal the run's un-tuned rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from dyntc.protocol.data.datasets import load
from dyntc.core.encoders.base import embed
from dyntc.errors import DyntcError
from dyntc.core.geometry import euclidean
from dyntc.core.models import KNNProbe
from dyntc.protocol import make_plan
from finished_run import read_only_run
from dyntc.core.inference import embed_points


def nearest_mean(support: torch.Tensor, labels: torch.Tensor, queries: torch.Tensor) -> np.ndarray:
    means = torch.stack([support[labels == c].mean(0) for c in range(int(labels.max()) + 1)])
    return euclidean.sq_distance_matrix(queries, means).argmin(1).numpy()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a finished `dyntc reproduce` directory")
    ap.add_argument("--splits", default="0", help="comma-separated split numbers")
    ap.add_argument("--k", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = json.loads((args.run / "results.json").read_text(encoding="utf-8"))
    splits = [int(s) for s in args.splits.split(",")]
    for s in splits:
        for model in ("mlp", "euc"):
            if not (args.run / "checkpoints" / f"split{s}" / f"{model}.safetensors").is_file():
                raise DyntcError(f"{args.run}/checkpoints/split{s}/{model}.safetensors is missing: the probe needs the "
                                 "run's pretrained weights (rerun the split's mlp and euc un-tuned cells to make them)")
    plan = make_plan(results["dataset"], results["profile"], splits=max(splits) + 1, models="mlp,euc",
                     variants="un-tuned", n_fine=tuple(results["n_fine"]), seed=results["seed"])
    data = load(plan.dataset, None, seed=plan.seed)
    rows = []
    with read_only_run(args.run, plan, data, log=lambda m: print(m, file=sys.stderr)) as run:
        for s in splits:
            d = run.split_data(s)
            mlp = run.pretrained(s, "mlp")
            euc = run.pretrained(s, "euc")
            mlp_test = embed(mlp.encoder, mlp.encoder, d.test.items).float()
            euc_test = embed_points(euc, d.test.items).float()
            y = d.test.labels
            for n_fine in plan.n_fine:
                idx, _ = d.split.finetune_indices(n_fine)
                fine = d.pool.take(idx)
                labels = torch.as_tensor(fine.labels)
                mlp_sup = embed(mlp.encoder, mlp.encoder, fine.items).float()
                euc_sup = embed_points(euc, fine.items).float()
                unit = torch.nn.functional.normalize
                preds = {
                    "mlp 5-NN": KNNProbe(args.k).fit(mlp_sup, labels).predict(mlp_test).numpy(),
                    "mlp 5-NN cosine": KNNProbe(args.k).fit(unit(mlp_sup, dim=1), labels).predict(unit(mlp_test, dim=1)).numpy(),
                    "mlp nearest mean": nearest_mean(mlp_sup, labels, mlp_test),
                    "euc 5-NN": KNNProbe(args.k).fit(euc_sup, labels).predict(euc_test).numpy(),
                    "euc nearest prototype": nearest_mean(euc_sup, labels, euc_test),
                }
                row = {"split": s, "n_fine": n_fine, "mlp_feature_norm": float(mlp_test.norm(dim=1).mean()),
                       **{k: float((p == y).mean()) for k, p in preds.items()}}
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\nmean over splits (test accuracy, %):")
    for n_fine in plan.n_fine:
        sel = [r for r in rows if r["n_fine"] == n_fine]
        keys = [k for k in sel[0] if k not in ("split", "n_fine", "mlp_feature_norm")]
        print(f"  n_fine={n_fine:<4d} " + ", ".join(f"{k} {100 * np.mean([r[k] for r in sel]):.1f}" for k in keys))


if __name__ == "__main__":
    main()
