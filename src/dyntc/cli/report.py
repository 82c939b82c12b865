"""What ``dyntc evaluate`` and ``dyntc calibrate --report-dir`` measure and draw.

Evaluation: accuracy and per-label precision/recall/F1 over the test file's in-scope texts, the
misclassified texts, the most confused label pairs and, when the file has out-of-scope texts (those
labelled with the out-of-scope label, ``oos`` by default), an out-of-scope section: in-scope accuracy,
the share of out-of-scope texts rejected, and the AUROC of the distance to the nearest label as an
out-of-scope score. The macro average is over the labels of the test file only: a label of the model
that the file never mentions has no recall to average, and counting it as 0 would punish a test file
for covering part of the label set.

Calibration: a reliability diagram (accuracy against confidence in equal-width bins, before and
after the temperature) and the distances to the nearest label of in-scope and out-of-scope texts
with the rejection threshold.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np

from dyntc.classifier.calibration import ECE_BINS

TOP_PAIRS = 10  # confused pairs printed and written


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def confusion_png(path: Path, matrix: np.ndarray, labels: list[str], title: str) -> None:
    plt = _pyplot()
    n = len(labels)
    size = min(max(4.0, 0.28 * n + 2.5), 40.0)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    image = ax.imshow(matrix, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="count")
    if n <= 60:
        ax.set_xticks(range(n), labels, rotation=90, fontsize=8 if n > 20 else 10)
        ax.set_yticks(range(n), labels, fontsize=8 if n > 20 else 10)
    if n <= 25:
        top = matrix.max() if matrix.size else 0
        for i in range(n):
            for j in range(n):
                if matrix[i, j]:
                    ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=8,
                            color="white" if matrix[i, j] > top / 2 else "black")
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def confused_pairs(labels: list[str], pred: list[str | None], top: int = TOP_PAIRS) -> list[dict]:
    """The (true, predicted) pairs of the errors, most frequent first (ties by name)."""
    counts = Counter((y, p) for y, p in zip(labels, pred) if p != y and p is not None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"label": y, "predicted": p, "count": n} for (y, p), n in ranked[:top]]


def auroc(scores_in: np.ndarray, scores_out: np.ndarray) -> float | None:
    """P(an out-of-scope text scores above an in-scope one), ties half: the area under the ROC curve
    of `scores` as an out-of-scope detector. None without both kinds of texts."""
    if not len(scores_in) or not len(scores_out):
        return None
    both = np.concatenate([scores_in, scores_out])
    ranks = _average_ranks(both)
    n_in, n_out = len(scores_in), len(scores_out)
    return float((ranks[n_in:].sum() - n_out * (n_out + 1) / 2) / (n_in * n_out))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(1, len(x) + 1)
    values = x[order]
    start = 0
    for end in range(1, len(x) + 1):  # ties share their mean rank
        if end == len(x) or values[end] != values[start]:
            ranks[order[start:end]] = (start + 1 + end) / 2
            start = end
    return ranks


def out_of_scope(labels: list[str], pred: list[str | None], nearest: np.ndarray, oos_label: str,
                 rejecting: bool) -> dict | None:
    """The out-of-scope section: None when no text of the file is labelled `oos_label`."""
    is_oos = np.array([y == oos_label for y in labels])
    if not is_oos.any():
        return None
    inside = [(y, p) for y, p, o in zip(labels, pred, is_oos) if not o]
    section = {
        "oos_label": oos_label, "n_in_scope": int((~is_oos).sum()), "n_oos": int(is_oos.sum()),
        "in_scope_accuracy": float(np.mean([p == y for y, p in inside])) if inside else None,
        "auroc": auroc(nearest[~is_oos], nearest[is_oos]),
        "rejecting": rejecting,
    }
    if rejecting:
        section["oos_recall"] = float(np.mean([p is None for p, o in zip(pred, is_oos) if o]))
        section["in_scope_rejected"] = float(np.mean([p is None for _, p in inside])) if inside else None
    return section


def write_misclassified(path: Path, texts: list[str], labels: list[str], pred: list[str | None],
                        ranked: list[list[tuple[str, float]]]) -> int:
    """The errors as CSV: text, label, predicted (empty = rejected), distance, runner-up; returns how many."""
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label", "predicted", "distance", "runner_up", "runner_up_distance"])
        for text, y, p, row in zip(texts, labels, pred, ranked):
            if p != y:
                second = row[1] if len(row) > 1 else ("", float("nan"))
                w.writerow([text, y, "" if p is None else p, f"{row[0][1]:.4f}", second[0], f"{second[1]:.4f}"])
                n += 1
    return n


def write_confused_pairs(path: Path, pairs: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["label", "predicted", "count"])
        w.writeheader()
        w.writerows(pairs)


def oos_lines(section: dict) -> list[str]:
    """The out-of-scope section as printed."""
    lines = [f"out of scope ({section['n_oos']} texts labelled {section['oos_label']!r}, {section['n_in_scope']} in scope):"]
    acc = section["in_scope_accuracy"]
    lines.append(f"  in-scope accuracy {acc:.4f}" + (" (rejected texts count as errors)" if section["rejecting"] else ""))
    if section["rejecting"]:
        lines.append(f"  out-of-scope recall {section['oos_recall']:.4f} (share rejected); "
                     f"in-scope texts rejected {section['in_scope_rejected']:.4f}")
    else:
        lines.append("  out-of-scope recall: give --reject (after `dyntc calibrate`) to reject out-of-scope texts")
    if section["auroc"] is not None:
        lines.append(f"  AUROC {section['auroc']:.4f} (distance to the nearest label as the out-of-scope score)")
    return lines


def write_json(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")


# ---------------------------------------------------------------------------------------- calibration


def reliability(proba: np.ndarray, y: np.ndarray, bins: int = ECE_BINS) -> list[dict]:
    """Per equal-width bin of the top-label confidence: its range, texts, mean confidence, accuracy."""
    conf, pred = proba.max(1), proba.argmax(1)
    edges = np.linspace(0, 1, bins + 1)
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            out.append({"low": float(lo), "high": float(hi), "n": int(inside.sum()),
                        "confidence": float(conf[inside].mean()), "accuracy": float((pred[inside] == y[inside]).mean())})
    return out


def reliability_png(path: Path, before: list[dict], after: list[dict], ece_before: float, ece_after: float, n: int) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect calibration")
    for bins, name, ece, marker in ((before, "before", ece_before, "s"), (after, "after", ece_after, "o")):
        ax.plot([b["confidence"] for b in bins], [b["accuracy"] for b in bins], marker=marker,
                label=f"{name} (ECE {ece:.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("confidence (probability of the predicted label)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"reliability on {n} held-out texts")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def score_histogram_png(path: Path, in_scope: np.ndarray, oos: np.ndarray | None, threshold: float) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    both = np.concatenate([in_scope, oos if oos is not None else []])
    edges = np.linspace(float(both.min()), float(max(both.max(), threshold)) + 1e-9, 41)
    ax.hist(in_scope, bins=edges, alpha=0.6, density=True, label=f"in scope ({len(in_scope)})")
    if oos is not None and len(oos):
        ax.hist(oos, bins=edges, alpha=0.6, density=True, label=f"out of scope ({len(oos)})")
    ax.axvline(threshold, color="black", linestyle="--", label=f"threshold {threshold:.4g}")
    ax.set_xlabel("distance to the nearest label (beyond the threshold: rejected)")
    ax.set_ylabel("density")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
