"""Tables (markdown) and plots (PNG) from a protocol run's ``results.json``.

- ``tables.md``: the paper's Table 2 layout (fine-tuned models, mean ± std over splits, rows = model,
  columns = n_fine; all classes and new classes only), its Table 3 layout (tuned vs un-tuned), the
  pretraining gain (scratch vs fine-tuned), with the paper's published numbers beside ours where the
  paper reports the dataset (SENT, NEWS, WOS);
- ``accuracy_vs_nfine.png``: accuracy against n_fine with ±1 std error bars (all classes; new classes
  only), one line per model (fine-tuned solid, un-tuned dashed);
- ``pretraining_gain.png``: per model and n_fine, accuracy from scratch (solid bar) and the gain from
  pretraining (translucent bar on top), as in the paper's "benefits of pretraining" figure.

Standard deviations are sample standard deviations over splits (ddof=1; 0 with one split); the
paper does not say which it used.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from dyntc.core.files import atomic_write, write_text
from dyntc.core.models import MODELS, model_kind
from dyntc.protocol.profiles import ALL_MODELS

# ---- the paper's published numbers (Wohlwend et al. 2019), copied from the .tex ------------------

#: Table 2: fine-tuned test accuracy (%, mean ± std over 5 splits), all classes.
PAPER_TABLE2: dict[str, dict[str, dict[int, tuple[float, float]]]] = {
    "sent": {
        "mlp": {5: (37.3, 2.9), 10: (43.8, 3.5), 20: (45.7, 3.8), 100: (57.4, 3.5)},
        "euc": {5: (39.6, 6.4), 10: (45.5, 1.8), 20: (47.7, 4.7), 100: (62.7, 2.1)},
        "hyp": {5: (42.2, 3.5), 10: (47.1, 4.8), 20: (53.0, 2.3), 100: (62.7, 2.2)},
    },
    "news": {
        "mlp": {5: (49.2, 1.0), 10: (55.9, 2.5), 20: (68.5, 1.1), 100: (76.3, 0.5)},
        "euc": {5: (56.5, 0.4), 10: (65.6, 1.0), 20: (74.2, 0.6), 100: (79.8, 0.2)},
        "hyp": {5: (64.8, 2.8), 10: (69.7, 1.0), 20: (72.9, 0.5), 100: (78.8, 0.4)},
    },
    "wos": {
        "mlp": {5: (36.6, 1.1), 10: (46.8, 1.2), 20: (62.8, 0.6), 100: (68.9, 0.5)},
        "euc": {5: (49.4, 1.0), 10: (59.2, 0.4), 20: (70.4, 0.4), 100: (73.3, 0.2)},
        "hyp": {5: (54.5, 1.4), 10: (60.7, 0.9), 20: (70.2, 0.7), 100: (73.5, 0.5)},
    },
}

#: Table 3: tuned vs un-tuned test accuracy (%), keyed by (model, variant). The NEWS columns are
#: printed in the paper as 5, 10, 50, 500, but its fine-tuned EUC/HYP rows equal Table 2's NEWS
#: numbers at n_fine = 5, 10, 20, 100: the last two headers are probably a typo for 20 and 100.
PAPER_TABLE3: dict[str, dict[tuple[str, str], dict[int, float]]] = {
    "sent": {
        ("mlp", "un-tuned"): {5: 38.2, 10: 46.7, 20: 42.4, 100: 46.3},
        ("euc", "fine-tuned"): {5: 39.6, 10: 45.5, 20: 47.7, 100: 62.7},
        ("euc", "un-tuned"): {5: 43.4, 10: 51.2, 20: 47.6, 100: 55.8},
        ("hyp", "fine-tuned"): {5: 42.2, 10: 47.1, 20: 53.0, 100: 62.7},
        ("hyp", "un-tuned"): {5: 45.7, 10: 52.4, 20: 53.3, 100: 53.1},
    },
    "news": {
        ("mlp", "un-tuned"): {5: 29.5, 10: 34.6, 50: 40.3, 500: 42.7},
        ("euc", "fine-tuned"): {5: 56.5, 10: 65.6, 50: 74.2, 500: 79.8},
        ("euc", "un-tuned"): {5: 53.2, 10: 56.5, 50: 59.6, 500: 60.8},
        ("hyp", "fine-tuned"): {5: 64.8, 10: 69.7, 50: 72.9, 500: 78.8},
        ("hyp", "un-tuned"): {5: 60.1, 10: 62.9, 50: 65.4, 500: 66.7},
    },
}

#: Relative error reductions from pretraining quoted in the paper's Analysis (NEWS, n_fine = 5).
PAPER_PRETRAIN_ERROR_REDUCTION = {"news": {5: {"euc": "> 53%", "hyp": "> 62%", "mlp": "about 45%"}}}

MODEL_LABELS = {"mlp": "MLP", "euc": "EUC", "hyp": "HYP", "logreg": "LogReg"}
VARIANT_LABELS = {"fine-tuned": "", "un-tuned": " (un-tuned)", "scratch": " (scratch)"}
UNTUNED_LABELS = {"mlp": "MLP-KNN (un-tuned)", "euc": "EUC (un-tuned)", "hyp": "HYP (un-tuned)"}
COLORS = {"mlp": "#7f7f7f", "euc": "#1f77b4", "hyp": "#d62728", "logreg": "#2ca02c"}
DATASET_LABELS = {"sent": "SENT", "news": "NEWS", "wos": "WOS", "clinc150": "CLINC150", "hwu64": "HWU64"}


# ---- aggregation ----------------------------------------------------------------------------------


def aggregate(results: dict) -> dict[tuple[str, str, int], dict]:
    """``{(model, variant, n_fine): {"all": (mean, std, k), "new": (...), "old": (...), "splits": [...]}}``
    with accuracies in percent, over the splits present."""
    groups: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for row in results.get("rows", []):
        groups[(row["model"], row["variant"], int(row["n_fine"]))].append(row)
    out = {}
    for key, rows in groups.items():
        entry = {"splits": sorted(r["split"] for r in rows)}
        for name in ("all", "new", "old"):
            values = [100.0 * r[f"acc_{name}"] for r in rows if r.get(f"acc_{name}") is not None]
            entry[name] = _mean_std(values)
        entry["train_seconds"] = float(np.mean([r.get("train_seconds", 0.0) for r in rows]))
        out[key] = entry
    return out


def paired_pretraining_gain(results: dict) -> dict[tuple[str, int], tuple[tuple, tuple]]:
    """``{(model, n_fine): (scratch, fine-tuned)}``: accuracy on all classes in percent, (mean, std, k),
    over the k splits that have both cells, so that a gain never compares different splits."""
    acc = {(r["model"], r["variant"], int(r["n_fine"]), r["split"]): 100.0 * r["acc_all"]
           for r in results.get("rows", []) if r.get("acc_all") is not None}
    splits: dict[tuple[str, int], list] = defaultdict(list)
    for m, v, n, s in acc:
        if v == "scratch" and (m, "fine-tuned", n, s) in acc:
            splits[(m, n)].append(s)
    return {(m, n): (_mean_std([acc[(m, "scratch", n, s)] for s in ss]), _mean_std([acc[(m, "fine-tuned", n, s)] for s in ss]))
            for (m, n), ss in splits.items()}


def _mean_std(values: list[float]) -> tuple[float, float, int] | None:
    if not values:
        return None
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, len(arr)


def _fmt(stat: tuple[float, float, int] | None, n_splits: int, with_std: bool = True) -> str:
    if stat is None:
        return "–"
    mean, std, k = stat
    text = f"{mean:.1f} ± {std:.1f}" if with_std else f"{mean:.1f}"
    return text + (f" (n={k})" if k != n_splits else "")


def _n_fine_values(agg: dict) -> list[int]:
    """Every n_fine with cells: a resumed run's header names only its last invocation's selection
    (e.g. `--n-fine 100`), which must not drop the other columns from the tables."""
    return sorted({n for (_, _, n) in agg})


def _models(results: dict, agg: dict) -> list[str]:
    present = {m for (m, _, _) in agg}
    order = [m for m in ALL_MODELS if m in present]
    return order


# ---- markdown -------------------------------------------------------------------------------------


def tables_markdown(results: dict) -> str:
    agg = aggregate(results)
    dataset = results.get("dataset", "?")
    n_splits = int(results.get("splits", 0))
    fines = _n_fine_values(agg)
    models = _models(results, agg)
    name = DATASET_LABELS.get(dataset, dataset)
    lines = [
        f"# Dynamic classification: {name}",
        "",
        f"Profile `{results.get('profile')}`, encoder `{results.get('encoder')}`, p = {results.get('p')}, "
        f"{n_splits} random label split(s), seed {results.get('seed')}; dyntc {results.get('dyntc_version')}; "
        f"{results.get('machine')}; device {results.get('device')}.",
        f"Started {results.get('started')}, finished {results.get('finished') or 'not yet (partial results)'}.",
        "",
        "Test accuracy in %, mean ± std over splits (sample std; `(n=k)` marks cells with fewer splits). "
        "Early stopping: pretraining on the dev set relabelled to Y_old; fine-tuning / scratch on the dev set "
        "labelled with Y_new.",
    ]
    lines += _split_summary(results)
    if not agg:
        return "\n".join(lines + ["", "_No finished cells yet._", ""])
    paper2 = PAPER_TABLE2.get(dataset)
    for scope, title in (("all", "all classes (Y_new)"), ("new", "new classes only (Y_new \\ Y_old)")):
        lines += ["", f"## Table 2 layout: fine-tuned models, {title}", ""]
        if paper2 and scope == "all":
            lines.append("Each cell: ours, then the paper's published number in brackets.")
            lines.append("")
        lines += _table(
            ["Model"] + [f"n_fine={n}" for n in fines],
            [
                [MODEL_LABELS.get(m, m)] + [
                    _fmt(agg.get((m, "fine-tuned", n), {}).get(scope), n_splits)
                    + (_paper2(paper2, m, n) if paper2 and scope == "all" else "")
                    for n in fines
                ]
                for m in models if any((m, "fine-tuned", n) in agg for n in fines)
            ],
        )
    lines += _table3(results, agg, dataset, fines, models, n_splits)
    lines += _scratch_table(agg, fines, models, n_splits)
    lines += _gain_table(paired_pretraining_gain(results), dataset, fines, models, n_splits,
                         _scratch_like_pretraining(results.get("config") or {}))
    lines += _timing(results, agg, fines, models)
    notes = _notes(results, dataset)
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _paper2(paper2: dict, model: str, n: int) -> str:
    value = paper2.get(model, {}).get(n)
    return f" [{value[0]:.1f} ± {value[1]:.1f}]" if value else ""


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _split_summary(results: dict) -> list[str]:
    info = results.get("split_info", {})
    if not info:
        return []
    lines = ["", "## Label splits", "", "| split | seed | old labels | new labels | new classes | removed / collapsed |",
             "|---|---:|---:|---:|---:|---|"]
    for key in sorted(info, key=int):
        s = info[key]
        if s.get("kind") == "hierarchical":
            what = "; ".join(f"{node} ← {len(leaves)} leaves" for node, leaves in s.get("collapsed", {}).items())
        else:
            what = "removed: " + ", ".join(s.get("removed", []))
        lines.append(f"| {key} | {s.get('seed')} | {len(s.get('old_labels', []))} | {len(s.get('new_labels', []))} | "
                     f"{len(s.get('new_classes', []))} | {what} |")
    return lines


def _table3(results, agg, dataset, fines, models, n_splits) -> list[str]:
    rows_spec = []
    for m in models:
        if not model_kind(m).network:  # a probe: no pretraining, so no un-tuned variant to pair
            continue
        if model_kind(m).has_output_layer:  # its un-tuned variant is another model (MLP-KNN), listed first
            rows_spec += [(m, "un-tuned"), (m, "fine-tuned")]
        else:
            rows_spec += [(m, "fine-tuned"), (m, "un-tuned")]
    rows_spec = [rs for rs in rows_spec if any((*rs, n) in agg for n in fines)]
    if not rows_spec:
        return []
    paper3 = PAPER_TABLE3.get(dataset, {})
    lines = ["", "## Table 3 layout: fine-tuned vs un-tuned, all classes", ""]
    if paper3:
        cols = sorted({n for v in paper3.values() for n in v})
        lines.append(f"Each cell: ours, then the paper's published number in brackets (the paper's columns: "
                     f"{', '.join(map(str, cols))}).")
        if dataset == "news":
            lines.append("The paper prints NEWS columns 5, 10, 50, 500, but its fine-tuned EUC/HYP rows there equal its "
                         "Table 2 values at n_fine = 20 and 100; we compare by the printed header.")
        lines.append("")
    table_rows = []
    for model, variant in rows_spec:
        label = UNTUNED_LABELS.get(model, model) if variant == "un-tuned" else MODEL_LABELS.get(model, model)
        cells = []
        for n in fines:
            text = _fmt(agg.get((model, variant, n), {}).get("all"), n_splits)
            pub = paper3.get((model, variant), {}).get(n)
            cells.append(text + (f" [{pub:.1f}]" if pub is not None else ""))
        table_rows.append([label] + cells)
    lines += _table(["Model"] + [f"n_fine={n}" for n in fines], table_rows)
    lines += ["", "Same, new classes only:", ""]
    lines += _table(
        ["Model"] + [f"n_fine={n}" for n in fines],
        [
            [UNTUNED_LABELS.get(m, m) if v == "un-tuned" else MODEL_LABELS.get(m, m)]
            + [_fmt(agg.get((m, v, n), {}).get("new"), n_splits) for n in fines]
            for m, v in rows_spec
        ],
    )
    return lines


def _scratch_like_pretraining(config: dict) -> list[str]:
    """The scratch recipe of each EUC/HYP model that trains its scratch cells with the pretraining recipe
    (the run's config), as the caption says it; HYP's also says whether its warm-up is unclipped."""
    own = config.get("per_model") or {}
    def setting(m, key):
        return (own.get(m) or {}).get(key, config.get(key, False))
    return [f"{MODEL_LABELS.get(m, m)}: the pretraining recipe, scratch_like_pretraining"
            + (", its Euclidean warm-up without the soft clip, scratch_unclipped_warmup"
               if kind.euclidean_warmup and setting(m, "scratch_unclipped_warmup") else "")
            for m, kind in MODELS.items() if kind.episodic and setting(m, "scratch_like_pretraining")]


def _scratch_table(agg, fines, models, n_splits) -> list[str]:
    """Every scratch cell's accuracy, paired with a fine-tuned cell or not (the gain table needs both)."""
    scratch = [m for m in models if any((m, "scratch", n) in agg for n in fines)]
    ns = [n for n in fines if any((m, "scratch", n) in agg for m in scratch)]
    if not scratch:
        return []
    return ["", "## Trained from scratch: all classes / new classes", ""] + _table(
        ["Model"] + [f"n_fine={n}" for n in ns],
        [[MODEL_LABELS.get(m, m)] + [" / ".join(_fmt(agg.get((m, "scratch", n), {}).get(scope), n_splits)
                                                for scope in ("all", "new")) for n in ns] for m in scratch])


def _gain_table(paired, dataset, fines, models, n_splits, like_pretraining=()) -> list[str]:
    rows = []
    for m in models:
        for n in fines:
            if (m, n) not in paired:
                continue
            scratch, tuned = paired[(m, n)]
            t, s = tuned[0], scratch[0]
            reduction = (t - s) / (100.0 - s) * 100.0 if s < 100.0 else float("nan")
            quoted = PAPER_PRETRAIN_ERROR_REDUCTION.get(dataset, {}).get(n, {}).get(m)
            rows.append([MODEL_LABELS.get(m, m), str(n), _fmt(scratch, n_splits), _fmt(tuned, n_splits),
                         f"{t - s:+.1f}", f"{reduction:.0f}%" + (f" [{quoted}]" if quoted else "")])
    if not rows:
        return []
    return ["", "## Benefits of pretraining (all classes)", "",
            "Scratch = the fine-tuning recipe on a freshly initialised model"
            + (f" ({'; '.join(like_pretraining)})" if like_pretraining else "")
            + "; both over the splits that have both cells; relative error reduction = "
            "(acc_pretrained − acc_scratch) / (100 − acc_scratch); brackets: the paper's quoted figure.", ""] + _table(
        ["Model", "n_fine", "scratch", "pretrained + fine-tuned", "gain", "relative error reduction"], rows)


def _steps(model: str) -> str:
    """What `model`'s training steps are called in results.json's pretraining records (which only the
    paper's models have; another name's: episodes)."""
    kind = MODELS.get(model)
    return kind.steps if kind is not None else "episodes"


def _timing(results, agg, fines, models) -> list[str]:
    pre = results.get("pretraining", {})
    lines = ["", "## Training time", ""]
    per_model = defaultdict(list)
    for split in pre.values():
        for m, info in split.items():
            per_model[m].append(info)
    if per_model:
        lines.append("Pretraining (mean over splits): " + "; ".join(
            f"{MODEL_LABELS.get(m, m)} {np.mean([i.get('seconds', 0) for i in infos]):.0f}s, "
            f"{np.mean([i.get('steps', 0) for i in infos]):.0f} {_steps(m)}, "
            f"dev_old acc {np.mean([i.get('best_dev_acc') or 0 for i in infos]):.3f}"
            for m, infos in per_model.items()
        ) + ".")
        lines.append("")
    rows = []
    for m in models:
        for v in ("fine-tuned", "scratch"):
            cells = [agg.get((m, v, n)) for n in fines]
            if any(cells):
                rows.append([MODEL_LABELS.get(m, m) + VARIANT_LABELS[v]] + [f"{c['train_seconds']:.0f}s" if c else "–" for c in cells])
    if rows:
        lines.append("Mean training seconds per cell:")
        lines.append("")
        lines += _table(["Model"] + [f"n_fine={n}" for n in fines], rows)
    shares = time_shares(results)
    if shares:
        total = sum(shares.values())
        lines += ["", f"Where the time went: {total:.0f}s of stages and cells in all (summed over worker processes and machines, "
                  "as each measured it; cells include embedding the test set): " + ", ".join(
                      f"{kind} {sec:.0f}s ({100 * sec / total:.0f}%)" for kind, sec in shares.items()) + "."]
    if results.get("last_run_seconds") is not None:
        lines += ["", f"Wall time of the last invocation: {results['last_run_seconds']:.0f}s."]
    return lines


def time_shares(results: dict) -> dict[str, float]:
    """Seconds a run spent per kind of work: pretraining stages, then cells by variant (``cell_seconds``:
    training and test evaluation; ``train_seconds`` for rows written before it existed). Kinds with no
    recorded time are left out."""
    shares = {"pretraining": sum(info.get("seconds") or 0.0 for split in results.get("pretraining", {}).values()
                                 for info in split.values())}
    for variant in VARIANT_LABELS:
        shares[f"{variant} cells"] = sum(r.get("cell_seconds", r.get("train_seconds")) or 0.0
                                         for r in results.get("rows", []) if r["variant"] == variant)
    return {kind: sec for kind, sec in shares.items() if sec > 0}


def _notes(results: dict, dataset: str) -> list[str]:
    notes = []
    short: dict[int, set[str]] = defaultdict(set)
    for row in results.get("rows", []):
        for label, available in (row.get("shortfall") or {}).items():
            short[int(row["n_fine"])].add(f"{label} ({available})")
    for n in sorted(short):
        items = sorted(short[n])
        notes.append(f"n_fine={n}: {len(items)} class(es) had fewer examples in the fine-tuning pool and used all of them: "
                     + ", ".join(items[:8]) + (" ..." if len(items) > 8 else ""))
    cfg = results.get("config", {})
    if cfg.get("test_per_class"):
        notes.append(f"test set capped at {cfg['test_per_class']} examples per class (profile {results.get('profile')}).")
    if dataset not in PAPER_TABLE2:
        notes.append(f"the paper does not report {DATASET_LABELS.get(dataset, dataset)}; no published numbers to compare.")
    return notes


# ---- plots ----------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_accuracy(results: dict, path: Path) -> Path | None:
    agg = aggregate(results)
    fines = _n_fine_values(agg)
    models = _models(results, agg)
    # a run of scratch cells only has no line to draw (its bars are the pretraining-gain figure's)
    if not fines or not any((m, v, n) in agg for m in models for v in ("fine-tuned", "un-tuned") for n in fines):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=False)
    name = DATASET_LABELS.get(results.get("dataset"), results.get("dataset"))
    for ax, scope, title in ((axes[0], "all", "all classes"), (axes[1], "new", "new classes only")):
        for i, m in enumerate(models):
            for variant, style in (("fine-tuned", "-"), ("un-tuned", "--")):
                xs, ys, es = [], [], []
                # a small horizontal offset per line keeps the error bars apart
                shift = 1.0 + 0.025 * (2 * i + (variant == "un-tuned") - len(models))
                for n in fines:
                    stat = agg.get((m, variant, n), {}).get(scope)
                    if stat:
                        xs.append(n * shift), ys.append(stat[0]), es.append(stat[1])
                if not xs:
                    continue
                label = MODEL_LABELS.get(m, m) if variant == "fine-tuned" else UNTUNED_LABELS.get(m, m)
                ax.errorbar(xs, ys, yerr=es, fmt=style + "o", color=COLORS.get(m), capsize=3, markersize=4,
                            linewidth=1.6 if variant == "fine-tuned" else 1.0, alpha=1.0 if variant == "fine-tuned" else 0.65,
                            label=label)
        ax.set_xscale("log")
        ax.set_xticks(fines)
        ax.set_xticklabels([str(n) for n in fines])
        ax.minorticks_off()
        ax.set_xlabel("n_fine (examples per class)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"{name}: {title}")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"mean ± 1 std over {results.get('splits')} split(s), profile {results.get('profile')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_pretraining_gain(results: dict, path: Path) -> Path | None:
    agg, paired = aggregate(results), paired_pretraining_gain(results)
    fines = _n_fine_values(agg)
    models = [m for m in _models(results, agg) if any((m, n) in paired for n in fines)]
    if not models:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(8.0, 1.5 * len(fines) + 3), 4.8))
    width = 0.8 / len(models)
    lost = False
    for i, m in enumerate(models):
        for j, n in enumerate(fines):
            if (m, n) not in paired:
                continue
            scratch, tuned = paired[(m, n)]
            x = j + (i - (len(models) - 1) / 2) * width
            s, t = scratch[0], tuned[0]
            ax.bar(x, s, width * 0.92, color=COLORS.get(m), label=f"{MODEL_LABELS.get(m, m)}: from scratch" if j == 0 else None)
            if t >= s:
                ax.bar(x, t - s, width * 0.92, bottom=s, color=COLORS.get(m), alpha=0.35,
                       label=f"{MODEL_LABELS.get(m, m)}: gain from pretraining" if j == 0 else None)
            else:  # pretraining hurt: the part of the scratch bar above the pretrained accuracy is hatched
                lost = True
                ax.bar(x, s - t, width * 0.92, bottom=t, facecolor="white", alpha=0.7, edgecolor="black",
                       hatch="///", linewidth=0.5)
    ax.set_xticks(range(len(fines)))
    ax.set_xticklabels([str(n) for n in fines])
    ax.set_xlabel("n_fine (examples per class)")
    ax.set_ylabel("test accuracy, all classes (%)")
    name = DATASET_LABELS.get(results.get("dataset"), results.get("dataset"))
    ax.set_title(f"{name}: from scratch (solid) + gain from pretraining (translucent); "
                 f"mean of {results.get('splits')} split(s)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    ncol = len(models)
    if lost:
        from matplotlib.patches import Patch

        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///"))
        labels.append("loss from pretraining (hatched)")
        ncol += 1
    ax.legend(handles, labels, fontsize=8, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    top = max(stat[0] for pair in paired.values() for stat in pair)
    ax.set_ylim(0, min(100, top * 1.1 + 2))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: dict, out: str | Path) -> list[Path]:
    """Write ``tables.md`` and the PNGs into `out`; returns the paths written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    tables = out / "tables.md"
    write_text(tables, tables_markdown(results))
    written.append(tables)
    for fn, name in ((plot_accuracy, "accuracy_vs_nfine.png"), (plot_pretraining_gain, "pretraining_gain.png")):
        with atomic_write(out / name) as tmp_png:
            if fn(results, tmp_png):
                written.append(out / name)
    return written


def report_from_file(results_path: str | Path, out: str | Path | None = None) -> list[Path]:
    path = Path(results_path)
    results = json.loads(path.read_text(encoding="utf-8"))
    return write_report(results, out or path.parent)


__all__ = ["PAPER_TABLE2", "PAPER_TABLE3", "aggregate", "paired_pretraining_gain", "plot_accuracy", "plot_pretraining_gain",
           "report_from_file", "tables_markdown", "write_report"]
