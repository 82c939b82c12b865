"""Compare protocol runs cell by cell: the figures of docs/results.md §3 and §8 that pair two runs.

    python scripts/compare_runs.py RUN/results.json                  # vs the paper: ours ± std [paper; diff, SE]
    python scripts/compare_runs.py RUN/results.json --base OTHER/results.json
        # paired: mean over the splits both runs have of (acc_all here − acc_all in OTHER), same cell

SE of the difference to the paper: sqrt(s_ours²/n + s_paper²/5), with the paper's std where its
Table 2 gives one and ours in its place otherwise (Table 3 prints means only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from dyntc.report import PAPER_TABLE2, PAPER_TABLE3

ROWS = [("mlp", "fine-tuned"), ("euc", "fine-tuned"), ("hyp", "fine-tuned"), ("mlp", "un-tuned"), ("euc", "un-tuned"),
        ("hyp", "un-tuned"), ("mlp", "scratch"), ("euc", "scratch"), ("hyp", "scratch")]


def cells(results: dict) -> dict[tuple, float]:
    return {(r["model"], r["variant"], r["n_fine"], r["split"]): 100 * r["acc_all"] for r in results["rows"]}


def paper_value(dataset: str, model: str, variant: str, n: int) -> tuple[float | None, float | None]:
    if variant == "fine-tuned":
        mean_std = PAPER_TABLE2.get(dataset, {}).get(model, {}).get(n)
        return mean_std if mean_std else (None, None)
    if variant == "un-tuned":
        for (m, v), values in PAPER_TABLE3.get(dataset, {}).items():
            if m == model and v != "fine-tuned" and n in values:
                return values[n], None
    return None, None


def versus_paper(results: dict) -> None:
    ours = cells(results)
    for model, variant in ROWS:
        out = []
        for n in sorted({r["n_fine"] for r in results["rows"]}):
            v = [a for (m, var, k, _), a in ours.items() if (m, var, k) == (model, variant, n)]
            if not v:
                continue
            mean, sd = float(np.mean(v)), (float(np.std(v, ddof=1)) if len(v) > 1 else float("nan"))
            pm, ps = paper_value(results["dataset"], model, variant, n)
            if pm is None:
                out.append(f"{n}: {mean:.1f} ± {sd:.1f}")
                continue
            se = math.sqrt(sd ** 2 / len(v) + (ps if ps is not None else sd) ** 2 / 5)
            out.append(f"{n}: {mean:.1f} ± {sd:.1f} [{pm}; {mean - pm:+.1f}, SE {se:.1f}]")
        if out:
            print(f"{model} {variant:10s} " + " | ".join(out))


def paired(results: dict, base: dict) -> None:
    ours, theirs = cells(results), cells(base)
    for model, variant in ROWS:
        out = []
        for n in sorted({r["n_fine"] for r in results["rows"]}):
            d = [ours[k] - theirs[k] for k in ours if k[:3] == (model, variant, n) and k in theirs]
            if d:
                out.append(f"{n}: {np.mean(d):+.1f} (n={len(d)})")
        if out:
            print(f"{model} {variant:10s} " + " | ".join(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--base", type=Path, help="another run's results.json: paired differences instead of the paper")
    args = ap.parse_args()
    results = json.loads(args.results.read_text(encoding="utf-8"))
    if args.base is None:
        versus_paper(results)
    else:
        paired(results, json.loads(args.base.read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()
