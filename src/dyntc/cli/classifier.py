"""``dyntc fit | calibrate | predict | evaluate``: a :class:`~dyntc.classifier.DynamicClassifier` on disk.

``fit``'s model options are the constructor's parameters, same names and defaults (one option per
parameter, built from its signature); input files are read by :mod:`dyntc.cli.reading`, reports
measured and drawn by :mod:`dyntc.cli.report`. A command that changes a model commits the change as
one new version under the store's write lock (:mod:`dyntc.classifier.store`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from dyntc.classifier.calibration import OOS_WEIGHT
from dyntc.classifier.estimator import DynamicClassifier
from dyntc.cli.common import ModelDir, ProgressOpt, editing, load, note, progress_on, showing_progress
from dyntc.cli.options import options_from_signature
from dyntc.cli.reading import read_examples, read_labelled, read_texts
from dyntc.errors import DyntcError

TextCol = Annotated[str, typer.Option(help="Column with the texts")]
LabelCol = Annotated[str, typer.Option(help="Column with the labels")]

#: ``dyntc fit --help`` for each constructor parameter (what the option does; its default is the constructor's).
FIT_HELP = {
    "encoder": "minilm (all-MiniLM-L6-v2, English; the `pretrained` extra) | hashing (fast, no download) | "
               "sru (the paper's GloVe + SRU) | path of a local sentence-transformers model",
    "metric": "euclidean | hyperbolic",
    "train": "What to train: none (pretrained default: the backbone's own embeddings) | backbone (its top layers; "
             "set --time-budget-s) | head | encoder (SRU)",
    "hidden_size": "Output size of a trained head or of the SRU",
    "num_layers": "Layers of a trained head or of the SRU [default: SRU 4, head 1]",
    "dropout": "Dropout of a trained head or of the SRU [default: SRU 0.5, head 0.1]",
    "max_len": "Tokens kept per text",
    "embeddings": "SRU only: a GloVe text file [default: the packaged glove.6B.50d]",
    "encoder_options": "Encoder option KEY=VALUE (repeatable), e.g. runtime=onnx (ONNX Runtime on the CPU), "
                       "train_layers=4",
    "episodes": "Maximum training episodes",
    "lr": "Adam learning rate",
    "n_support": "Support examples per class in an episode",
    "n_query": "Query examples per episode, in total",
    "max_classes": "Classes per episode",
    "hard_fraction": "Share of each episode's labels (<= 0.5) drawn as confusable partners",
    "eval_every": "Episodes between dev evaluations (with --dev)",
    "patience": "Dev evaluations without improvement before stopping",
    "time_budget_s": "Stop training after this many seconds (the best weights are kept)",
    "extend_vocab": "SRU: let later examples add the GloVe words they bring",
    "debias": "Correct each label's distances for its support size (σ²/n)",
    "head": "Scorer: cosine (a cosine head over the stored points, retrained in the background after label "
            "operations) | none (nearest prototype)",
    "head_options": "Cosine-head option KEY=VALUE (repeatable), e.g. refresh_delay=2",
    "batch_size": "Texts per batch when embedding",
    "seed": "Random seed",
    "device": "cpu | cuda",
}


def _items(values: list[str] | None, option: str) -> dict[str, Any] | None:
    """``KEY=VALUE`` items as a dict; a VALUE that reads as JSON (a number, true, null) is that value."""
    if values is None:
        return None
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise DyntcError(f"--{option} {item!r}: expected KEY=VALUE")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out


def fit(
    data: Annotated[Path, typer.Option(help="Training data, .csv/.tsv or .jsonl")],
    out: Annotated[str, typer.Option(help="Model directory (or postgresql:// URL) to save to")],
    text_col: TextCol = "text",
    label_col: LabelCol = "label",
    dev: Annotated[Optional[Path], typer.Option(help="Dev data (same columns) for early stopping")] = None,
    replace: Annotated[bool, typer.Option(help="--out holds a model already: replace its labels by this fit's "
                                                "(saved as a new version; `dyntc labels restore` brings the old ones back)")] = False,
    progress: ProgressOpt = None,
    **params: Any,
) -> None:
    """Fit a classifier on a labelled file and save it (a new model directory, or with --replace a new version)."""
    from dyntc.classifier.store import is_store

    if is_store(out) and not replace:
        raise DyntcError(f"{out} holds a model already: fitting would replace all of its labels. Give --replace to "
                         "do that (the old ones stay restorable with `dyntc labels restore`), or choose another --out")
    texts, labels = read_labelled(data, text_col, label_col)
    dev_pair = read_labelled(dev, text_col, label_col) if dev is not None else None
    params["encoder_options"] = _items(params["encoder_options"], "encoder-options")
    params["head_options"] = _items(params["head_options"], "head-options")
    if isinstance(params["head"], str) and params["head"].strip().lower() == "none":
        params["head"] = None
    clf = DynamicClassifier(**params, progress=progress_on(progress))
    t0 = time.perf_counter()
    with showing_progress(progress):
        clf.fit(texts, labels, dev=dev_pair)
    seconds = time.perf_counter() - t0
    clf.set_params(device="cpu")
    clf.save(out)
    res = clf.train_result_
    episodes_run = 0 if res is None else res.steps
    summary = {"out": str(out), "n_train": len(texts), "n_classes": clf.n_classes_, "episodes": episodes_run,
               "best_dev_acc": None if res is None else res.best_dev_acc, "seconds": round(seconds, 2),
               "version": clf.version_}
    what = f"trained {episodes_run} episodes" if res is not None else "embedded the texts, nothing trained"
    note(f"fitted {clf.n_classes_} labels on {len(texts)} texts ({what}, {seconds:.1f}s); saved to {out}")
    print(json.dumps(summary))


FIT_PARAMETERS = options_from_signature(fit, DynamicClassifier.__init__, FIT_HELP, skip=("progress",))


def calibrate(
    model: ModelDir,
    data: Annotated[Path, typer.Option(help="Held-out labelled texts (not the support examples), .csv/.tsv or .jsonl")],
    oos: Annotated[Optional[Path], typer.Option(help="Out-of-scope examples (.txt one per line, or .csv/.jsonl with --text-col): kept, texts like them are rejected; the rejection is measured on them")] = None,
    text_col: TextCol = "text",
    label_col: LabelCol = "label",
    max_accuracy_drop: Annotated[float, typer.Option(help="Accuracy the out-of-scope threshold may cost on --data (0.02 = 2 points)")] = 0.02,
    threshold: Annotated[Optional[float], typer.Option(help="Set the out-of-scope distance threshold instead of choosing it")] = None,
    oos_weight: Annotated[float, typer.Option(help="How far the --oos examples push the texts like them from every label (0: they only measure the rejection)")] = OOS_WEIGHT,
    report_dir: Annotated[Optional[Path], typer.Option(help="Write reliability.png, distances.png and calibration.json here")] = None,
    progress: ProgressOpt = None,
) -> None:
    """Fit the probability temperature and the out-of-scope threshold on held-out data; saved as a new version."""
    texts, labels = read_labelled(data, text_col, label_col)
    oos_texts = read_examples(oos, text_col) if oos is not None else None
    with showing_progress(progress):
        with editing(model) as clf:
            clf.calibrate(texts, labels, oos_texts, max_accuracy_drop=max_accuracy_drop, threshold=threshold,
                          oos_weight=oos_weight)
        if report_dir is not None:
            _calibration_report(report_dir, clf, texts, labels, oos_texts)
    print(json.dumps(clf.calibration_.summary()))
    note(f"calibrated on {len(texts)} texts: temperature {clf.temperature_:.3g}, threshold {clf.calibration_.threshold:.4g}; "
         f"version {clf.version_}")


def _calibration_report(report_dir: Path, clf, texts: list[str], labels: list[str], oos_texts: list[str] | None) -> None:
    import numpy as np
    import torch

    from dyntc.cli import report

    report_dir.mkdir(parents=True, exist_ok=True)
    scores = torch.as_tensor(clf.label_scores(texts)).double()  # the texts' embeddings are cached by now
    index = {c: i for i, c in enumerate(clf.classes_)}
    y = np.array([index[label] for label in labels])
    before = torch.softmax(scores / clf.prior_temperature_, 1).numpy()
    cal = clf.calibration_
    bins_before, bins_after = report.reliability(before, y), report.reliability(clf.proba_from_scores(scores), y)
    report.reliability_png(report_dir / "reliability.png", bins_before, bins_after, cal.ece_before, cal.ece_after, len(texts))
    nearest = clf.squared_distances(scores).min(1).values.clamp_min(0).sqrt().numpy()
    oos_nearest = None
    if oos_texts:
        # each kept example left out of its own push, as calibrate measured it
        oos_scores = clf._scores(oos_texts, leave_one_out=True)
        oos_nearest = clf.squared_distances(oos_scores).min(1).values.clamp_min(0).sqrt().numpy()
    report.score_histogram_png(report_dir / "distances.png", nearest, oos_nearest, cal.threshold)
    report.write_json(report_dir / "calibration.json", {
        **cal.summary(), "reliability_before": bins_before, "reliability_after": bins_after,
        "auroc": None if oos_nearest is None else report.auroc(nearest, oos_nearest)})
    note(f"calibration report written to {report_dir}")


def predict(
    model: ModelDir,
    input: Annotated[str, typer.Option("--input", "-i", help="Texts: one per line, or .csv/.tsv (header line) / .jsonl "
                                                            "with --text-col; - = stdin")] = "-",
    text_col: Annotated[Optional[str], typer.Option(help="Column (CSV/TSV) or field (JSONL) with the texts "
                                                         "[default: text]; makes stdin a CSV with a header")] = None,
    top_k: Annotated[int, typer.Option(help="Also list the K nearest labels with their distances")] = 1,
    proba: Annotated[bool, typer.Option(help="Add the probability (softmax of the scores / T, T from calibrate) of the predicted label")] = False,
    reject: Annotated[bool, typer.Option(help="Label out-of-scope texts null (needs `dyntc calibrate` first)")] = False,
    ranking: Annotated[int, typer.Option(help="Add a `ranking` of the N most probable labels with their "
                                              "confidences (as the service's /predict; 0 = none)")] = 0,
    batch_size: Annotated[int, typer.Option(help="Texts per batch")] = 256,
    progress: ProgressOpt = None,
) -> None:
    """Predict labels; writes one JSON object per text to stdout."""
    if top_k < 1:
        raise DyntcError(f"--top-k must be >= 1, got {top_k}")
    if ranking < 0:
        raise DyntcError(f"--ranking must be >= 0 (0 = no ranking), got {ranking}")
    if batch_size < 1:
        raise DyntcError(f"--batch-size must be >= 1, got {batch_size}")
    texts = read_texts(input, text_col)
    clf = load(model).set_params(batch_size=batch_size)
    if not texts:
        note("no input texts")
        return
    if reject:
        clf.require_calibration("--reject")
    with showing_progress(progress):
        scores = clf.label_scores(texts)  # one embedding pass for all outputs
    out = sys.stdout
    for text, record in zip(texts, clf.prediction_records(scores, top_k=top_k, proba=proba, reject=reject,
                                                                   ranking=ranking)):
        out.write(json.dumps({"text": text, **record}, ensure_ascii=False) + "\n")


def evaluate(
    model: ModelDir,
    data: Annotated[Path, typer.Option(help="Labelled test data, .csv/.tsv or .jsonl")],
    text_col: TextCol = "text",
    label_col: LabelCol = "label",
    oos_label: Annotated[str, typer.Option(help="Label of the out-of-scope texts in --data (scored by the out-of-scope section)")] = "oos",
    reject: Annotated[bool, typer.Option(help="Reject out-of-scope texts at the calibrated threshold (needs `dyntc calibrate`)")] = False,
    report_dir: Annotated[Optional[Path], typer.Option(help="Write report.json, classification_report.txt, confusion_matrix.png, "
                                                            "misclassified.csv and confused_pairs.csv here")] = None,
    progress: ProgressOpt = None,
) -> None:
    """Accuracy, per-label precision/recall/F1 (macro average over the test file's labels), the most confused
    pairs and, with out-of-scope texts in --data, in-scope accuracy, out-of-scope recall and AUROC."""
    import numpy as np
    from sklearn.metrics import classification_report, confusion_matrix

    from dyntc.cli import report

    texts, labels = read_labelled(data, text_col, label_col)
    clf = load(model)
    if reject:
        clf.require_calibration("--reject")
    t0 = time.perf_counter()
    with showing_progress(progress):
        scores = clf.label_scores(texts)
    seconds = time.perf_counter() - t0
    pred = [r["label"] for r in clf.prediction_records(scores, reject=reject)]
    d2 = clf.squared_distances(scores)
    ranked = clf.nearest_labels(d2, 2)
    nearest = np.array([row[0][1] for row in ranked])
    oos = report.out_of_scope(labels, pred, nearest, oos_label, reject)
    keep = [i for i, y in enumerate(labels) if oos is None or y != oos_label]
    y_in, p_in = [labels[i] for i in keep], [pred[i] for i in keep]
    unknown = sorted(set(y_in) - set(clf.classes_))
    if unknown:
        note(f"warning: {len(unknown)} test labels are not in the model's label set and count as errors: {unknown[:5]}")
    present = sorted(set(y_in))  # the macro average is over the test file's labels (cli/report.py says why)
    p_named = ["(rejected)" if p is None else p for p in p_in]
    accuracy = float(np.mean([p == y for p, y in zip(p_in, y_in)])) if y_in else float("nan")
    text_report = classification_report(y_in, p_named, labels=present, zero_division=0, digits=4)
    per_label = classification_report(y_in, p_named, labels=present, zero_division=0, output_dict=True)
    pairs = report.confused_pairs(y_in, p_in)
    print(text_report)
    print(f"accuracy {accuracy:.4f} on {len(y_in)} in-scope texts ({len(texts) / max(seconds, 1e-9):.0f} texts/s)")
    if pairs:
        print("most confused (label -> predicted: count): "
              + "; ".join(f"{p['label']} -> {p['predicted']}: {p['count']}" for p in pairs))
    if oos is not None:
        print("\n".join(report.oos_lines(oos)))
    if report_dir is None:
        return
    report_dir.mkdir(parents=True, exist_ok=True)
    names = sorted(set(present) | {p for p in p_named})
    matrix = confusion_matrix(y_in, p_named, labels=names)
    (report_dir / "classification_report.txt").write_text(text_report + f"\naccuracy {accuracy:.4f}\n", encoding="utf-8")
    n_wrong = report.write_misclassified(report_dir / "misclassified.csv", texts, labels, pred, ranked)
    report.write_confused_pairs(report_dir / "confused_pairs.csv", pairs)
    report.write_json(report_dir / "report.json", {
        "accuracy": accuracy, "n": len(y_in), "labels": present, "unknown_labels": unknown,
        "per_class": {k: v for k, v in per_label.items() if k in present},
        "macro_avg": per_label.get("macro avg"), "weighted_avg": per_label.get("weighted avg"),
        "macro_avg_over": "the labels of the test file", "confusion_labels": names,
        "confusion_matrix": matrix.tolist(), "confused_pairs": pairs, "misclassified": n_wrong, "out_of_scope": oos,
    })
    report.confusion_png(report_dir / "confusion_matrix.png", matrix, names,
                         f"{data.name}: accuracy {accuracy:.3f} ({len(y_in)} texts)")
    note(f"report written to {report_dir}")
