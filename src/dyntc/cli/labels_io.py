"""``dyntc labels export | import``: a saved classifier's whole label set to and from a CSV, JSON lines
or Rasa NLU (``nlu.yml``) file (:mod:`dyntc.classifier.io`), so that intent data can live in git."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.errors import DyntcError

FormatOpt = Annotated[Optional[str], typer.Option(
    "--format", help="csv (text,label), jsonl ({\"text\", \"label\"}) or rasa (nlu.yml 3.1); default: from the "
                     "file's extension (.csv, .jsonl, .yml)")]
ModelArg = Annotated[str, typer.Argument(help="Model directory written by `dyntc fit`, or a "
                                              "postgresql://[user@]host[:port]/db?model=NAME URL")]


def labels_export(
    model: ModelArg,
    out: Annotated[Path, typer.Option("--out", help="File to write (replaced if it exists)")],
    fmt: FormatOpt = None,
) -> None:
    """Write every label and its examples to a file (round-trips exactly through `labels import --replace`)."""
    from dyntc.classifier import DynamicClassifier
    from dyntc.classifier.io import export_labels, file_format

    file_format(out, fmt)  # a bad format fails before the model loads
    summary = export_labels(DynamicClassifier.load(model), out, fmt)
    print(f"wrote {summary['labels']} labels, {summary['examples']} examples to {out} ({summary['format']})",
          file=sys.stderr)


def labels_import(
    model: ModelArg,
    file: Annotated[Path, typer.Argument(help="A .csv (text,label), .jsonl or Rasa .yml file")],
    fmt: FormatOpt = None,
    replace: Annotated[bool, typer.Option("--replace", help="Make the label set exactly the file's: labels not "
                                                            "in it are removed, labels whose examples differ "
                                                            "are redefined")] = False,
    merge: Annotated[bool, typer.Option("--merge", help="Add the file's new labels and new examples, keep the "
                                                        "rest (the default)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print what changed as one JSON object")] = False,
) -> None:
    """Apply a file of labelled examples to the model, committed as one version (undo: `labels restore`)."""
    from dyntc.classifier import DynamicClassifier
    from dyntc.classifier.io import apply_rows, read_rows

    if replace and merge:
        raise DyntcError("--replace and --merge exclude each other: pick one (--merge is the default)")
    rows = read_rows(file, fmt)  # a bad file fails before the model loads
    with DynamicClassifier.edit(model, op="import") as clf:
        done = apply_rows(clf, rows, replace=replace)
    if as_json:
        print(json.dumps(done, ensure_ascii=False))
    parts = [f"{len(done['added'])} added", f"{len(done['extended'])} extended "
             f"({sum(done['extended'].values())} examples)", f"{len(done['redefined'])} redefined",
             f"{len(done['removed'])} removed", f"{len(done['unchanged'])} unchanged"]
    print(f"imported {len(rows)} examples from {file}: labels {', '.join(parts)}; {clf.n_classes_} labels "
          f"(version {clf.version_})", file=sys.stderr)


def register(labels_app: typer.Typer) -> None:
    """Add ``export`` and ``import`` to the ``dyntc labels`` group."""
    labels_app.command("export")(labels_export)
    labels_app.command("import")(labels_import)
