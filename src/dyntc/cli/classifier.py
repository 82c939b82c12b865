"""``dyntc fit | labels | predict | evaluate``: a :class:`~dyntc.classifier.DynamicClassifier` on disk.

Data files are CSV (``.csv``, ``.tsv``) or JSON lines (``.jsonl``, ``.ndjson``), chosen by extension.
Example files for ``labels`` commands may also be plain text, one example per line. Every command
that changes a model does so under the model store's write lock and commits the change as one new
version (:mod:`dyntc.classifier.store`): concurrent commands wait for each other instead of losing
each other's changes, and a failed command leaves the model on disk as it was.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError

labels_app = typer.Typer(
    name="labels",
    help="Show or change the label set of a saved classifier (effective at once, no training).",
    no_args_is_help=True,
)

_CSV = (".csv", ".tsv")
_JSONL = (".jsonl", ".ndjson")

# A model's location: a directory, or a postgresql://host/db?model=NAME URL (docs/deployment.md).
# Taken as text: a Path would fold the URL's '//'.
ModelDir = Annotated[str, typer.Argument(help="Model directory written by `dyntc fit`, or a "
                                              "postgresql://[user@]host[:port]/db?model=NAME URL")]


def _err(msg: str) -> None:
    print(msg, file=sys.stderr)


# ---------------------------------------------------------------------------------------- reading


@contextmanager
def _readable(path: Path):
    """Turn a file that is not UTF-8 text or not well-formed CSV into a one-line error."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise DyntcError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from exc
    except csv.Error as exc:
        raise DyntcError(f"{path}: not a well-formed CSV/TSV file ({exc})") from exc


def _rows(path: Path) -> tuple[list[dict], list[str]]:
    """Records of a CSV/TSV or JSONL file, and the column names seen."""
    if not path.is_file():
        raise DyntcError(f"file {str(path)!r} does not exist")
    with _readable(path):
        return _parse_rows(path)


def _parse_rows(path: Path) -> tuple[list[dict], list[str]]:
    suffix = path.suffix.lower()
    if suffix in _CSV:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ",")
            rows = list(reader)
            return rows, list(reader.fieldnames or [])
    if suffix in _JSONL:
        rows, cols = [], {}
        with open(path, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DyntcError(f"{path}:{no}: not valid JSON ({exc.msg})") from exc
                if not isinstance(obj, dict):
                    raise DyntcError(f"{path}:{no}: expected a JSON object per line, got {type(obj).__name__}")
                rows.append(obj)
                cols.update(dict.fromkeys(obj))
        return rows, list(cols)
    raise DyntcError(f"{path}: unknown data format {suffix!r}; use .csv, .tsv or .jsonl")


def read_labelled(path: Path, text_col: str, label_col: str) -> tuple[list[str], list[str]]:
    """Texts and labels of a CSV/JSONL file, with a clear error for missing columns or bad cells."""
    rows, cols = _rows(path)
    missing = [c for c in (text_col, label_col) if c not in cols]
    if missing:
        raise DyntcError(
            f"{path} has no column {', '.join(map(repr, missing))}; its columns are {cols}: "
            "name the right ones with --text-col / --label-col"
        )
    texts, labels = [], []
    for i, row in enumerate(rows):
        text, label = row.get(text_col), row.get(label_col)
        if not isinstance(text, str) or not text.strip():
            raise DyntcError(f"{path}: record {i + 1} has an empty or non-text {text_col!r}")
        if label is None or (isinstance(label, str) and not label.strip()):
            raise DyntcError(f"{path}: record {i + 1} has an empty {label_col!r}")
        texts.append(text)
        labels.append(str(label))
    if not texts:
        raise DyntcError(f"{path} holds no records")
    return texts, labels


def read_examples(path: Path, text_col: str = "text") -> list[str]:
    """Example texts: from CSV/JSONL (column `text_col`) or a text file with one example per line."""
    if path.suffix.lower() in _CSV + _JSONL:
        rows, cols = _rows(path)
        if text_col not in cols:
            raise DyntcError(f"{path} has no column {text_col!r}; its columns are {cols}: use --text-col")
        texts = [row.get(text_col) for row in rows]
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise DyntcError(f"{path}: record {i + 1} has an empty or non-text {text_col!r}")
        return texts
    if not path.is_file():
        raise DyntcError(f"file {str(path)!r} does not exist")
    with _readable(path):
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _gather(examples: Optional[list[str]], files: Optional[list[Path]], text_col: str, what: str) -> list[str]:
    out = list(examples or [])
    for f in files or []:
        out.extend(read_examples(f, text_col))
    if not out:
        raise DyntcError(f"no examples for {what}: give --example TEXT (repeatable) and/or --examples-file FILE")
    return out


def _head_option(value: str) -> str | None:
    """``--head``: ``none`` is the nearest-prototype scorer (``head=None``)."""
    if value.strip().lower() == "none":
        return None
    if value != "cosine":
        raise DyntcError(f"--head must be cosine or none, got {value!r}")
    return value


def _load(model: str):
    from dyntc.classifier import DynamicClassifier

    return DynamicClassifier.load(model)


def _editing(model: str):
    """The saved classifier under its store's write lock; the change is committed as one version
    when the block ends (concurrent commands wait for each other, so none is lost)."""
    from dyntc.classifier import DynamicClassifier

    return DynamicClassifier.edit(model)


def _print_labels(clf) -> None:
    for name, n in clf.support_counts().items():
        print(f"{name}\t{n}")


# ---------------------------------------------------------------------------------------- fit


def fit(
    data: Annotated[Path, typer.Option(help="Training data, .csv/.tsv or .jsonl")],
    out: Annotated[str, typer.Option(help="Model directory (or postgresql:// URL) to save to, as a new version")],
    text_col: Annotated[str, typer.Option(help="Column with the texts")] = "text",
    label_col: Annotated[str, typer.Option(help="Column with the labels")] = "label",
    dev: Annotated[Optional[Path], typer.Option(help="Dev data (same columns) for early stopping")] = None,
    metric: Annotated[str, typer.Option(help="euclidean | hyperbolic")] = "euclidean",
    encoder: Annotated[str, typer.Option(help="minilm | sru | path to a sentence-transformers model")] = "minilm",
    train: Annotated[Optional[str], typer.Option(help="What to train: none (pretrained default: the backbone's own "
                                                 "embeddings) | backbone (its top layers) | head | encoder (SRU)")] = None,
    debias: Annotated[bool, typer.Option(help="Correct each label's distances for its support size (σ²/n)")] = True,
    head: Annotated[str, typer.Option(help="Scorer: cosine (a cosine head over the stored points, retrained in the "
                                      "background after label operations) | none (nearest prototype)")] = "cosine",
    runtime: Annotated[Optional[str], typer.Option(help="Frozen pretrained backbone: torch | onnx | onnx-int8 "
                                                   "(ONNX Runtime on the CPU: 1.4x / 2.3x faster; int8 moves embeddings, cosine 0.99)")] = None,
    hard_fraction: Annotated[float, typer.Option(help="Share of each episode's labels (<= 0.5) drawn as confusable partners")] = 0.0,
    episodes: Annotated[int, typer.Option(help="Maximum training episodes")] = 1000,
    lr: Annotated[float, typer.Option(help="Adam learning rate")] = 1e-3,
    n_support: Annotated[int, typer.Option(help="Support examples per class in an episode")] = 4,
    n_query: Annotated[int, typer.Option(help="Query examples per episode, in total")] = 64,
    hidden: Annotated[int, typer.Option(help="Encoder output size")] = 128,
    layers: Annotated[Optional[int], typer.Option(help="Encoder layers (default: SRU 4, pretrained head 1)")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="Dropout (default: SRU 0.5, pretrained head 0.1)")] = None,
    max_len: Annotated[int, typer.Option(help="Tokens kept per text")] = 64,
    eval_every: Annotated[int, typer.Option(help="Episodes between dev evaluations")] = 100,
    patience: Annotated[int, typer.Option(help="Dev evaluations without improvement before stopping")] = 10,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop training after this many seconds")] = None,
    seed: Annotated[int, typer.Option(help="Random seed")] = 0,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    progress: Annotated[bool, typer.Option(help="Show a progress bar")] = False,
) -> None:
    """Train a classifier on a labelled file and save it (weights, vocabulary, support sets)."""
    from dyntc.classifier import DynamicClassifier

    texts, labels = read_labelled(data, text_col, label_col)
    dev_pair = read_labelled(dev, text_col, label_col) if dev is not None else None
    clf = DynamicClassifier(
        encoder=encoder, metric=metric, train=train, debias=debias, head=_head_option(head), hard_fraction=hard_fraction,
        encoder_options=None if runtime is None else {"runtime": runtime}, hidden_size=hidden, num_layers=layers, dropout=dropout, max_len=max_len,
        episodes=episodes, lr=lr, n_support=n_support, n_query=n_query, eval_every=eval_every, patience=patience,
        time_budget_s=time_budget, seed=seed, device=device, progress=progress,
    )
    t0 = time.perf_counter()
    clf.fit(texts, labels, dev=dev_pair)
    seconds = time.perf_counter() - t0
    clf.set_params(device="cpu")
    clf.save(out)
    res = clf.train_result_
    episodes_run = 0 if res is None else res.steps
    summary = {"out": str(out), "n_train": len(texts), "n_classes": clf.n_classes_, "episodes": episodes_run,
               "best_dev_acc": None if res is None else res.best_dev_acc, "seconds": round(seconds, 2)}
    _err(f"{'trained' if res is not None else 'built'} {clf.n_classes_} labels on {len(texts)} texts "
         f"({episodes_run} episodes, {seconds:.1f}s); saved to {out}")
    print(json.dumps(summary))


# ---------------------------------------------------------------------------------------- labels

ExampleOpt = Annotated[Optional[list[str]], typer.Option("--example", "-e", help="An example text (repeatable)")]
ExamplesFileOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--examples-file", "-f", help="Examples: .txt one per line, or .csv/.jsonl with --text-col (repeatable)"),
]
TextColOpt = Annotated[str, typer.Option(help="Text column of CSV/JSONL example files")]


@labels_app.command("list")
def labels_list(
    model: ModelDir,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of label<TAB>count lines")] = False,
) -> None:
    """Print every label and its number of support examples."""
    clf = _load(model)
    if as_json:
        print(json.dumps(clf.support_counts(), ensure_ascii=False))
    else:
        _print_labels(clf)


@labels_app.command("add")
def labels_add(
    model: ModelDir,
    name: Annotated[str, typer.Argument(help="The new label")],
    example: ExampleOpt = None,
    examples_file: ExamplesFileOpt = None,
    text_col: TextColOpt = "text",
) -> None:
    """Add a new label defined by its examples."""
    with _editing(model) as clf:
        clf.add_label(name, _gather(example, examples_file, text_col, f"label {name!r}"))
    _err(f"added {name!r} ({len(clf.support(name))} examples); {clf.n_classes_} labels")


@labels_app.command("add-examples")
def labels_add_examples(
    model: ModelDir,
    name: Annotated[str, typer.Argument(help="An existing label")],
    example: ExampleOpt = None,
    examples_file: ExamplesFileOpt = None,
    text_col: TextColOpt = "text",
) -> None:
    """Give an existing label more support examples."""
    with _editing(model) as clf:
        clf.add_examples(name, _gather(example, examples_file, text_col, f"label {name!r}"))
    _err(f"{name!r} now has {len(clf.support(name))} examples")


@labels_app.command("remove")
def labels_remove(
    model: ModelDir,
    names: Annotated[list[str], typer.Argument(help="Labels to remove")],
) -> None:
    """Remove labels (they are no longer predicted). At least one label must remain."""
    with _editing(model) as clf:
        for name in names:
            clf.remove_label(name)
    _err(f"removed {', '.join(map(repr, names))}; {clf.n_classes_} labels left")


@labels_app.command("split")
def labels_split(
    model: ModelDir,
    name: Annotated[str, typer.Argument(help="The label to split")],
    example: Annotated[
        Optional[list[str]], typer.Option("--example", "-e", help="NEW_LABEL=TEXT, an example of a new label (repeatable)")
    ] = None,
    examples_file: Annotated[
        Optional[list[Path]],
        typer.Option("--examples-file", "-f", help="NEW_LABEL=FILE (.txt one per line, .csv/.jsonl with --text-col), "
                                                   "or a CSV/JSONL file with --text-col and --label-col (repeatable)"),
    ] = None,
    text_col: TextColOpt = "text",
    label_col: Annotated[str, typer.Option(help="New-label column of a CSV/JSONL file given without NEW_LABEL=")] = "label",
    reassign: Annotated[bool, typer.Option(help="Also move each old support example to the nearest new label")] = False,
) -> None:
    """Replace a label by two or more new labels defined by their examples."""
    parts: dict[str, list[str]] = {}
    for item in example or []:
        new, sep, text = item.partition("=")
        if not sep or not new.strip():
            raise DyntcError(f"--example {item!r}: expected NEW_LABEL=TEXT")
        parts.setdefault(new, []).append(text)
    for item in examples_file or []:
        new, sep, file = str(item).partition("=")
        if sep:
            parts.setdefault(new, []).extend(read_examples(Path(file), text_col))
        else:
            for text, lab in zip(*read_labelled(Path(item), text_col, label_col)):
                parts.setdefault(lab, []).append(text)
    with _editing(model) as clf:
        clf.split_label(name, parts, reassign=reassign)
    _err(f"split {name!r} into {', '.join(f'{n!r} ({len(clf.support(n))})' for n in parts)}")


@labels_app.command("merge")
def labels_merge(
    model: ModelDir,
    names: Annotated[list[str], typer.Argument(help="Labels to merge (two or more)")],
    into: Annotated[str, typer.Option(help="Name of the merged label (one of NAMES or a new one)")],
) -> None:
    """Merge labels into one whose support set is their union."""
    with _editing(model) as clf:
        clf.merge_labels(names, into=into)
    _err(f"merged {', '.join(map(repr, names))} into {into!r} ({len(clf.support(into))} examples)")


@labels_app.command("rename")
def labels_rename(
    model: ModelDir,
    old: Annotated[str, typer.Argument(help="Current name")],
    new: Annotated[str, typer.Argument(help="New name")],
) -> None:
    """Rename a label."""
    with _editing(model) as clf:
        clf.rename_label(old, new)
    _err(f"renamed {old!r} to {new!r}")


@labels_app.command("versions")
def labels_versions(
    model: ModelDir,
    limit: Annotated[int, typer.Option(help="Show at most this many, newest first")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table")] = False,
) -> None:
    """List the committed versions of the label set (every label operation is one)."""
    from dyntc.classifier import DynamicClassifier

    if limit < 1:
        raise DyntcError(f"--limit must be >= 1, got {limit}")
    for v in DynamicClassifier.versions(model, limit):
        if as_json:
            print(json.dumps(v, ensure_ascii=False))
        else:
            print(f"{v['version']}\t{v['created']}\t{v['op']}\t{v['n_labels']} labels, {v['n_examples']} examples")


@labels_app.command("prune")
def labels_prune(
    model: ModelDir,
    keep: Annotated[int, typer.Option("--keep", help="How many of the newest versions to keep (>= 1)")],
) -> None:
    """Delete versions older than the newest KEEP and give their disk space back (they can no longer be
    restored). Prints a JSON summary: versions removed, the range kept, bytes before and after."""
    from dyntc.classifier.saving import prune_versions

    result = prune_versions(model, keep)
    first, head = result["kept"]
    _err(f"removed {result['versions_removed']} versions, kept {first}..{head}; "
         f"{result['bytes_before']:,} -> {result['bytes_after']:,} bytes")
    print(json.dumps(result))


@labels_app.command("copy")
def labels_copy(
    source: Annotated[str, typer.Argument(help="The model to copy: a model directory or a postgresql:// URL")],
    target: Annotated[str, typer.Argument(help="Where to copy it: a new model directory or postgresql:// URL "
                                               "(?model=NAME picks the model of the database)")],
) -> None:
    """Copy a model with every kept version (history, ids and bytes identical) to another location, e.g.
    from a model directory into PostgreSQL or back. One transaction, verified before it commits; the
    target must not hold a model. Prints a JSON summary."""
    from dyntc.classifier.saving import copy_model

    result = copy_model(source, target)
    first, head = result["versions"]
    _err(f"copied versions {first}..{head} of {result['source']} to {result['target']}")
    print(json.dumps(result))


@labels_app.command("restore")
def labels_restore(
    model: ModelDir,
    version: Annotated[int, typer.Argument(help="The version to bring back (see `dyntc labels versions`)")],
) -> None:
    """Make an earlier version the current one again (as a new version; nothing is deleted)."""
    from dyntc.classifier import DynamicClassifier

    new = DynamicClassifier.restore(model, version)
    _err(f"restored version {version} as version {new}")


def calibrate(
    model: ModelDir,
    data: Annotated[Path, typer.Option(help="Held-out labelled texts (not the support examples), .csv/.tsv or .jsonl")],
    oos: Annotated[Optional[Path], typer.Option(help="Out-of-scope examples (.txt one per line, or .csv/.jsonl with --text-col) to measure the rejection")] = None,
    text_col: Annotated[str, typer.Option(help="Column with the texts")] = "text",
    label_col: Annotated[str, typer.Option(help="Column with the labels")] = "label",
    max_accuracy_drop: Annotated[float, typer.Option(help="Accuracy the out-of-scope threshold may cost on --data (0.02 = 2 points)")] = 0.02,
    threshold: Annotated[Optional[float], typer.Option(help="Set the out-of-scope distance threshold instead of choosing it")] = None,
) -> None:
    """Fit the probability temperature and the out-of-scope threshold on held-out data; saved as a new version."""
    texts, labels = read_labelled(data, text_col, label_col)
    oos_texts = read_examples(oos, text_col) if oos is not None else None
    with _editing(model) as clf:
        clf.calibrate(texts, labels, oos_texts, max_accuracy_drop=max_accuracy_drop, threshold=threshold)
    print(json.dumps(clf.calibration_.to_dict()))
    _err(f"calibrated on {len(texts)} texts: temperature {clf.temperature_:.3g}, threshold {clf.calibration_.threshold:.4g}; "
         f"version {clf.version_}")


# ---------------------------------------------------------------------------------------- predict


def _read_inputs(source: str) -> list[str]:
    """Texts from a file or stdin (``-``): one per line, or JSON lines with a "text" field.
    Blank lines are skipped; JSONL is recognised by a ``.jsonl`` name or a first line starting with ``{``."""
    if source == "-":
        lines = sys.stdin.read().splitlines()
        jsonl = False
    else:
        path = Path(source)
        if not path.exists() or path.is_dir():
            raise DyntcError(f"input file {source!r} does not exist (or is a directory); use - for stdin")
        with _readable(path):
            lines = path.read_text(encoding="utf-8").splitlines()
        jsonl = path.suffix.lower() in _JSONL
    lines = [(no, line) for no, line in enumerate(lines, 1) if line.strip()]
    jsonl = jsonl or (bool(lines) and lines[0][1].lstrip().startswith("{"))
    if not jsonl:
        return [line.strip() for _, line in lines]
    texts = []
    for no, line in lines:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DyntcError(f"input line {no}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise DyntcError(f'input line {no}: expected a JSON object with a non-empty "text" field')
        texts.append(obj["text"])
    return texts


def predict(
    model: ModelDir,
    input: Annotated[str, typer.Option("--input", "-i", help="File of texts (one per line, or JSONL with \"text\"); - = stdin")] = "-",
    top_k: Annotated[int, typer.Option(help="Also list the K nearest labels with their distances")] = 1,
    proba: Annotated[bool, typer.Option(help="Add the probability (softmax over -d² / T, T from calibrate) of the predicted label")] = False,
    reject: Annotated[bool, typer.Option(help="Label out-of-scope texts null (needs `dyntc calibrate` first)")] = False,
    batch_size: Annotated[int, typer.Option(help="Texts per batch")] = 256,
) -> None:
    """Predict labels; writes one JSON object per text to stdout."""
    if top_k < 1:
        raise DyntcError(f"--top-k must be >= 1, got {top_k}")
    texts = _read_inputs(input)
    clf = _load(model).set_params(batch_size=batch_size)
    if not texts:
        _err("no input texts")
        return
    if reject:
        clf.require_calibration("--reject")
    scores = clf.label_scores(texts)  # one embedding pass for all outputs
    out = sys.stdout
    for text, record in zip(texts, clf.prediction_records(scores, top_k=top_k, proba=proba, reject=reject)):
        out.write(json.dumps({"text": text, **record}, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------- evaluate


def _confusion_png(path: Path, matrix, labels: list[str], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def evaluate(
    model: ModelDir,
    data: Annotated[Path, typer.Option(help="Labelled test data, .csv/.tsv or .jsonl")],
    text_col: Annotated[str, typer.Option(help="Column with the texts")] = "text",
    label_col: Annotated[str, typer.Option(help="Column with the labels")] = "label",
    report_dir: Annotated[Optional[Path], typer.Option(help="Write report.json, classification_report.txt and confusion_matrix.png here")] = None,
) -> None:
    """Accuracy, per-label precision/recall/F1 and a confusion matrix on labelled data."""
    import numpy as np
    from sklearn.metrics import classification_report, confusion_matrix

    texts, labels = read_labelled(data, text_col, label_col)
    clf = _load(model)
    t0 = time.perf_counter()
    pred = clf.predict(texts)
    seconds = time.perf_counter() - t0
    unknown = sorted(set(labels) - set(clf.classes_))
    if unknown:
        _err(f"warning: {len(unknown)} test labels are not in the model's label set and count as errors: {unknown[:5]}")
    names = sorted(set(clf.classes_) | set(labels))
    accuracy = float(np.mean([p == y for p, y in zip(pred, labels)]))
    text_report = classification_report(labels, pred, labels=names, zero_division=0, digits=4)
    report = classification_report(labels, pred, labels=names, zero_division=0, output_dict=True)
    print(text_report)
    print(f"accuracy {accuracy:.4f} on {len(texts)} texts ({len(texts) / max(seconds, 1e-9):.0f} texts/s)")
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        matrix = confusion_matrix(labels, pred, labels=names)
        (report_dir / "classification_report.txt").write_text(text_report + f"\naccuracy {accuracy:.4f}\n", encoding="utf-8")
        (report_dir / "report.json").write_text(json.dumps({
            "accuracy": accuracy, "n": len(texts), "labels": names, "unknown_labels": unknown,
            "per_class": {k: v for k, v in report.items() if k in names},
            "macro_avg": report.get("macro avg"), "weighted_avg": report.get("weighted avg"),
            "confusion_matrix": matrix.tolist(),
        }, indent=2, ensure_ascii=False), encoding="utf-8")
        _confusion_png(report_dir / "confusion_matrix.png", matrix, names,
                       f"{data.name}: accuracy {accuracy:.3f} ({len(texts)} texts)")
        _err(f"report written to {report_dir}")

