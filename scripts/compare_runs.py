"""Compare protocol runs cell by cell: the figures of docs/results.md §3 and §8 that pair two runs.

    python scripts/compare_runs.py RUN/results.json                  # vs the paper: ours ± std [paper; diff, SE]
    python scripts/compare_runs.py RUN/results.json --base OTHER/results.json
        # paired: mean over the splits both runs have of (acc_all here − acc_all in OTHER), same cell,
        # with its standard error over those splits
    python scripts/compare_runs.py RUN/results.json --versus euc --per-split
        # paired within one run: every model's cell minus EUC's, same variant, n_fine and split
    python scripts/compare_runs.py RUN/results.json --versus-variant un-tuned
        # the gain of fine-tuning: every cell minus the same model's un-tuned cell, same n_fine and split;
        # [the paper's difference] where its tables print both (Table 2 fine-tuned, Table 3 un-tuned)
    python scripts/compare_runs.py RUN/results.json --claims
        # the paper's claims (Analysis section) as a markdown table: our paired differences [the paper's]
Options: --markdown (against the paper, as a table), --splits 0,2,4 (only those splits), --field best_dev_acc (the early-stopping dev accuracy
instead of the test accuracy; no paper numbers then), --per-split (each split's figure too).

SE of the difference to the paper: sqrt(s_ours²/n + s_paper²/5), with the paper's std where its
Table 2 gives one and ours in its place otherwise (Table 3 prints means only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from dyntc.protocol.report import PAPER_PRETRAIN_ERROR_REDUCTION, PAPER_TABLE2, PAPER_TABLE3

ROWS = [("mlp", "fine-tuned"), ("euc", "fine-tuned"), ("hyp", "fine-tuned"), ("mlp", "un-tuned"), ("euc", "un-tuned"),
        ("hyp", "un-tuned"), ("mlp", "scratch"), ("euc", "scratch"), ("hyp", "scratch")]


def cells(results: dict, field: str = "acc_all", splits: set[int] | None = None) -> dict[tuple, float]:
    return {(r["model"], r["variant"], r["n_fine"], r["split"]): 100 * r[field] for r in results["rows"]
            if r.get(field) is not None and (splits is None or r["split"] in splits)}


def n_splits(results: dict, ours: dict) -> int:
    """The run's number of label splits (its header's; else one past the highest split with a cell)."""
    return results.get("splits") or max((k[3] for k in ours), default=-1) + 1


def read_results(path: Path, option: str) -> dict:
    """A run's results.json, or a clear exit naming the option and what is wrong with the file."""
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{option} {path}: not a readable results.json ({exc}); pass the results.json of a dyntc reproduce run")
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list) or "dataset" not in results:
        raise SystemExit(f"{option} {path}: no 'dataset' and 'rows' in it: pass the results.json of a dyntc reproduce run")
    return results


def paper_value(dataset: str, model: str, variant: str, n: int) -> tuple[float | None, float | None]:
    if variant == "fine-tuned":
        mean_std = PAPER_TABLE2.get(dataset, {}).get(model, {}).get(n)
        return mean_std if mean_std else (None, None)
    if variant == "un-tuned":
        for (m, v), values in PAPER_TABLE3.get(dataset, {}).items():
            if m == model and v != "fine-tuned" and n in values:
                return values[n], None
    return None, None


def versus_paper(results: dict, ours: dict, per_split: bool, with_paper: bool) -> None:
    for model, variant in ROWS:
        out = []
        for n in sorted({r["n_fine"] for r in results["rows"]}):
            got = sorted((k[3], a) for k, a in ours.items() if k[:3] == (model, variant, n))
            v = [a for _, a in got]
            if not v:
                continue
            mean, sd = float(np.mean(v)), (float(np.std(v, ddof=1)) if len(v) > 1 else float("nan"))
            pm, ps = paper_value(results["dataset"], model, variant, n) if with_paper else (None, None)
            each = f" ({', '.join(f's{k} {a:.1f}' for k, a in got)})" if per_split else ""
            if pm is None:
                out.append(f"{n}: {mean:.1f} ± {sd:.1f}{each}")
                continue
            se = math.sqrt(sd ** 2 / len(v) + (ps if ps is not None else sd) ** 2 / 5)
            out.append(f"{n}: {mean:.1f} ± {sd:.1f} [{pm}; {mean - pm:+.1f}, SE {se:.1f}]{each}")
        if out:
            print(f"{model} {variant:10s} " + " | ".join(out))


NAMES = {("mlp", "un-tuned"): "MLP-KNN (un-tuned)"}


def markdown_table(results: dict, ours: dict) -> None:
    """The versus-paper figures as a markdown table: mean ± std [paper's mean], bold where ours is more
    than 2 points under the paper (the bar a cell must clear to count as reproduced); `(n=k)` where fewer splits have the cell."""
    ns = sorted({r["n_fine"] for r in results["rows"]})
    splits = n_splits(results, ours)
    print(f"| {results['dataset'].upper()} | " + " | ".join(f"n_fine {n}" if i == 0 else str(n) for i, n in enumerate(ns)) + " |")
    print("|---|" + "---|" * len(ns))
    for model, variant in ROWS:
        out = []
        for n in ns:
            v = [a for k, a in ours.items() if k[:3] == (model, variant, n)]
            if not v:
                out.append("")
                continue
            mean = float(np.mean(v))
            sd = f" ± {np.std(v, ddof=1):.1f}" if len(v) > 1 else ""
            pm = paper_value(results["dataset"], model, variant, n)[0]
            figure = f"**{mean:.1f}**" if pm is not None and mean < pm - 2 else f"{mean:.1f}"
            out.append(figure + sd + (f" (n={len(v)})" if len(v) < splits else "") + (f" [{pm}]" if pm is not None else ""))
        if any(out):
            name = NAMES.get((model, variant), f"{model.upper()} {variant}")
            print(f"| {name} | " + " | ".join(out) + " |")


def _mean_se(d: list[float]) -> str:
    """A paired difference over splits: its mean, the standard error of that mean (from the spread
    over splits; none for one split) and the number of splits."""
    se = f"SE {np.std(d, ddof=1) / math.sqrt(len(d)):.1f}, " if len(d) > 1 else ""
    return f"{np.mean(d):+.1f} ({se}n={len(d)})"


def paired(results: dict, ours: dict, theirs: dict, per_split: bool, versus: str | None = None) -> None:
    """Differences ours − theirs per (model, variant, n_fine), same split; with `versus`, theirs is that
    model's cell of the same variant, n_fine and split."""
    for model, variant in ROWS:
        if model == versus:
            continue
        out = []
        for n in sorted({r["n_fine"] for r in results["rows"]}):
            d = sorted((k[3], ours[k] - theirs[other]) for k in ours if k[:3] == (model, variant, n)
                       and (other := (versus or k[0], *k[1:])) in theirs)
            if d:
                each = f" ({', '.join(f's{s} {x:+.1f}' for s, x in d)})" if per_split else ""
                out.append(f"{n}: {_mean_se([x for _, x in d])}{each}")
        if out:
            print(f"{model} {variant:10s} " + " | ".join(out))


def versus_variant(results: dict, ours: dict, base_variant: str, per_split: bool) -> None:
    """Each cell minus the same model's `base_variant` cell, same n_fine and split."""
    for model, variant in ROWS:
        if variant == base_variant:
            continue
        out = []
        for n in sorted({r["n_fine"] for r in results["rows"]}):
            d = sorted((k[3], ours[k] - ours[(model, base_variant, n, k[3])]) for k in ours
                       if k[:3] == (model, variant, n) and (model, base_variant, n, k[3]) in ours)
            if not d:
                continue
            each = f" ({', '.join(f's{s} {x:+.1f}' for s, x in d)})" if per_split else ""
            pm, pb = paper_value(results["dataset"], model, variant, n)[0], paper_value(results["dataset"], model, base_variant, n)[0]
            paper = f" [{pm - pb:+.1f}]" if pm is not None and pb is not None else ""
            out.append(f"{n}: {_mean_se([x for _, x in d])}{paper}{each}")
        if out:
            print(f"{model} {variant:10s} " + " | ".join(out))


def _paired_mean(ours: dict, a: tuple[str, str], b: tuple[str, str], n: int) -> tuple[float, int, int] | None:
    """Mean over the splits both cells have of (cell a − cell b) at `n`, the number of such splits and
    how many of them a is ahead on."""
    d = [ours[(*a, n, s)] - ours[(*b, n, s)] for (m, v, k, s) in ours if (m, v, k) == (*a, n) and (*b, n, s) in ours]
    return (float(np.mean(d)), len(d), sum(x > 0 for x in d)) if d else None


def claims_table(results: dict, ours: dict, ours_new: dict) -> None:
    """The paper's claims (its Analysis section) restated from one run: paired differences averaged
    over the splits both cells have, `(k/n)` = ahead on k of n splits, [the paper's difference] where
    its tables print both cells. The verdicts are left to the reader (docs/results.md)."""
    ds, ns = results["dataset"], sorted({r["n_fine"] for r in results["rows"]})
    splits = n_splits(results, ours)

    def diff(a, b, n):
        got = _paired_mean(ours, a, b, n)
        if got is None:
            return None
        mean, k, ahead = got
        pa, pb = paper_value(ds, *a, n)[0], paper_value(ds, *b, n)[0]
        paper = f" [{pa - pb:+.1f}]" if pa is not None and pb is not None else ""
        return f"{n}: {mean:+.1f}" + (f" ({ahead}/{k})" if k < splits or ahead < k else "") + paper

    def row(claim: str, pairs: list[tuple[str, tuple, tuple]], fines: list[int]) -> None:
        parts = []
        for label, a, b in pairs:
            got = [x for n in fines if (x := diff(a, b, n))]
            if got:
                parts.append(f"{label} " + ", ".join(got))
        print(f"| {claim} | {'; '.join(parts) or 'no such cells'} |")

    ft, ut, sc = "fine-tuned", "un-tuned", "scratch"
    low = [n for n in ns if n <= 10]
    print(f"| claim (paper) | {ds.upper()}: ours − other, by n_fine (splits ahead) [paper] |")
    print("|---|---|")
    row("metric models beat the MLP at low n_fine", [(m.upper(), (m, ft), ("mlp", ft)) for m in ("euc", "hyp")], low)
    row("… and stay ahead at n_fine 100", [(m.upper(), (m, ft), ("mlp", ft)) for m in ("euc", "hyp")], [100])
    row("HYP beats EUC at low n_fine (hierarchical data)", [(v, ("hyp", v), ("euc", v)) for v in (ft, ut)], ns)
    row("un-tuned metric models beat MLP-KNN", [(m.upper(), (m, ut), ("mlp", ut)) for m in ("euc", "hyp")], ns)
    row("fine-tuning pays off only with more data (fine-tuned − un-tuned)",
        [(m.upper(), (m, ft), (m, ut)) for m in ("mlp", "euc", "hyp")], ns)
    rises = []
    for m in ("mlp", "euc", "hyp"):
        lo, hi = min(ns), 100
        a = [ours.get((m, ft, hi, s), np.nan) - ours.get((m, ft, lo, s), np.nan) for s in range(splits)]
        b = [ours_new.get((m, ft, hi, s), np.nan) - ours_new.get((m, ft, lo, s), np.nan) for s in range(splits)]
        if not np.all(np.isnan(a)):
            rises.append(f"{m.upper()} new {np.nanmean(b):+.1f} vs all {np.nanmean(a):+.1f}")
    print(f"| gains concentrate on new classes (rise {min(ns)} → 100, new vs all classes) | {'; '.join(rises) or 'no such cells'} |")
    reductions = []
    for n in [n for n in ns if any(k[:3] == (m, sc, n) for k in ours for m in ("mlp", "euc", "hyp"))]:
        each = []
        for m in ("euc", "hyp", "mlp"):
            r = [(ours[(m, ft, n, s)] - ours[(m, sc, n, s)]) / (100 - ours[(m, sc, n, s)])
                 for s in range(splits) if (m, ft, n, s) in ours and (m, sc, n, s) in ours]
            if r:
                paper = PAPER_PRETRAIN_ERROR_REDUCTION.get(ds, {}).get(n, {}).get(m)
                each.append(f"{m.upper()} {100 * np.mean(r):.0f}%" + (f" (n={len(r)})" if len(r) < splits else "")
                            + (f" [{paper}]" if paper else ""))
        reductions.append(f"{n}: " + ", ".join(each))
    print("| pretraining helps the metric models more than the MLP (error reduction of fine-tuned over scratch) | "
          + ("; ".join(reductions) or "no scratch cells") + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--base", type=Path, help="another run's results.json: paired differences instead of the paper")
    ap.add_argument("--versus", help="a model of the same run (e.g. euc): paired differences against it")
    ap.add_argument("--versus-variant", choices=("fine-tuned", "un-tuned", "scratch"),
                    help="a variant (e.g. un-tuned): each cell minus that variant's, same model")
    ap.add_argument("--splits", help="comma-separated split indices (default: all)")
    ap.add_argument("--field", default="acc_all", choices=("acc_all", "acc_new", "acc_old", "best_dev_acc"))
    ap.add_argument("--per-split", action="store_true", help="print each split's figure too")
    ap.add_argument("--markdown", action="store_true", help="against the paper: a markdown table (docs/results.md §3)")
    ap.add_argument("--claims", action="store_true", help="the paper's claims restated from this run: a markdown table")
    args = ap.parse_args()
    if sum(x is not None for x in (args.base, args.versus, args.versus_variant)) > 1:
        ap.error("--base, --versus and --versus-variant: give one of them")
    if args.markdown and (args.base or args.versus or args.versus_variant or args.field != "acc_all"):
        ap.error("--markdown prints a run's acc_all against the paper: leave out --base, --versus, --versus-variant and --field")
    if args.claims and (args.markdown or args.base or args.versus or args.versus_variant or args.field != "acc_all" or args.per_split):
        ap.error("--claims prints its own table from one run: leave out --markdown, --base, --versus, --versus-variant, --field and --per-split")
    try:
        splits = None if args.splits is None else {int(x) for x in args.splits.split(",") if x.strip()}
    except ValueError:
        ap.error(f"--splits {args.splits!r}: expected comma-separated integers, e.g. 0,2,4")
    results = read_results(args.results, "results")
    ours = cells(results, args.field, splits)
    if args.base is not None:
        base = read_results(args.base, "--base")
        paired(results, ours, cells(base, args.field, splits), args.per_split)
    elif args.versus is not None:
        paired(results, ours, ours, args.per_split, versus=args.versus)
    elif args.versus_variant is not None:
        versus_variant(results, ours, args.versus_variant, args.per_split)
    elif args.markdown:
        markdown_table(results, ours)
    elif args.claims:
        claims_table(results, ours, cells(results, "acc_new", splits))
    else:
        versus_paper(results, ours, args.per_split, with_paper=args.field == "acc_all")


if __name__ == "__main__":
    main()
