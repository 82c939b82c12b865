"""``dyntc labels ...``: show or change the label set of a saved classifier.

Every command that changes a model does so under the model store's write lock and commits the change
as one new version (:mod:`dyntc.classifier.store`): concurrent commands wait for each other instead
of losing each other's changes, and a failed command leaves the model on disk as it was. Commands
that embed no text (list, versions, remove, merge, rename, restore, prune, copy) never load the
backbone of a pretrained encoder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.cli.common import ModelDir, ProgressOpt, editing, load, note, showing_progress
from dyntc.cli.reading import gather, read_examples, read_labelled
from dyntc.errors import DyntcError

labels_app = typer.Typer(
    name="labels",
    help="Show or change the label set of a saved classifier (effective at once, no training).",
    no_args_is_help=True,
)

ExampleOpt = Annotated[Optional[list[str]], typer.Option("--example", "-e", help="An example text (repeatable)")]
ExamplesFileOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--examples-file", "-f", help="Examples: .txt one per line, or .csv/.tsv/.jsonl with --text-col (repeatable)"),
]
TextColOpt = Annotated[str, typer.Option(help="Text column of CSV/TSV/JSONL example files")]


@labels_app.command("list")
def labels_list(
    model: ModelDir,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of label<TAB>count lines")] = False,
) -> None:
    """Print every label and its number of support examples."""
    clf = load(model)
    # by stored name, as every other command takes labels (an int label's decimal, a tuple's repr)
    counts = {clf._targets.name(label): n for label, n in clf.support_counts().items()}
    if as_json:
        print(json.dumps(counts, ensure_ascii=False))
    else:
        for name, n in counts.items():
            print(f"{name}\t{n}")


@labels_app.command("add")
def labels_add(
    model: ModelDir,
    name: Annotated[str, typer.Argument(help="The new label")],
    example: ExampleOpt = None,
    examples_file: ExamplesFileOpt = None,
    text_col: TextColOpt = "text",
    progress: ProgressOpt = None,
) -> None:
    """Add a new label defined by its examples."""
    examples = gather(example, examples_file, text_col, f"label {name!r}")
    with showing_progress(progress), editing(model) as clf:
        clf.add_label(name, examples)
    note(f"added {name!r} ({len(clf.support(name))} examples); {clf.n_classes_} labels")


@labels_app.command("add-examples")
def labels_add_examples(
    model: ModelDir,
    name: Annotated[str, typer.Argument(help="An existing label")],
    example: ExampleOpt = None,
    examples_file: ExamplesFileOpt = None,
    text_col: TextColOpt = "text",
    progress: ProgressOpt = None,
) -> None:
    """Give an existing label more support examples."""
    examples = gather(example, examples_file, text_col, f"label {name!r}")
    with showing_progress(progress), editing(model) as clf:
        clf.add_examples(name, examples)
    note(f"{name!r} now has {len(clf.support(name))} examples")


@labels_app.command("remove")
def labels_remove(
    model: ModelDir,
    names: Annotated[list[str], typer.Argument(help="Labels to remove")],
) -> None:
    """Remove labels (they are no longer predicted; `dyntc labels restore` brings them back). At least one label must remain."""
    with editing(model) as clf:
        for name in names:
            clf.remove_label(name)
    note(f"removed {', '.join(map(repr, names))}; {clf.n_classes_} labels left")


def _split_parts(example: list[str] | None, examples_file: list[Path] | None, text_col: str, label_col: str) -> dict[str, list[str]]:
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
    return parts


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
    reassign: Annotated[bool, typer.Option(help="Move each stored example of the old label to the nearest new label "
                                                "(without it they are dropped; `dyntc labels restore` brings them back)")] = False,
    progress: ProgressOpt = None,
) -> None:
    """Replace a label by two or more new labels defined by their examples."""
    parts = _split_parts(example, examples_file, text_col, label_col)
    with showing_progress(progress), editing(model) as clf:
        base, before = clf.version_, (len(clf.support(name)) if name in clf.classes_ else 0)
        clf.split_label(name, parts, reassign=reassign)
    note(f"split {name!r} into {', '.join(f'{n!r} ({len(clf.support(n))})' for n in parts)}; version {clf.version_}")
    if not reassign and before:
        note(f"dropped the {before} stored examples of {name!r} (--reassign moves them to the nearest new label; "
             f"`dyntc labels restore {model} {base}` brings the old label back)")


@labels_app.command("merge")
def labels_merge(
    model: ModelDir,
    names: Annotated[list[str], typer.Argument(help="Labels to merge (two or more)")],
    into: Annotated[str, typer.Option(help="Name of the merged label (one of NAMES or a new one)")],
) -> None:
    """Merge labels into one whose support set is their union."""
    with editing(model) as clf:
        clf.merge_labels(names, into=into)
    note(f"merged {', '.join(map(repr, names))} into {into!r} ({len(clf.support(into))} examples)")


@labels_app.command("rename")
def labels_rename(
    model: ModelDir,
    old: Annotated[str, typer.Argument(help="Current name")],
    new: Annotated[str, typer.Argument(help="New name")],
) -> None:
    """Rename a label."""
    with editing(model) as clf:
        clf.rename_label(old, new)
    note(f"renamed {old!r} to {new!r}")


@labels_app.command("versions")
def labels_versions(
    model: ModelDir,
    limit: Annotated[int, typer.Option(help="Show at most this many, newest first")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON lines instead of a table")] = False,
) -> None:
    """List the committed versions of the label set (every label operation is one)."""
    from dyntc.classifier.saving import list_versions

    if limit < 1:
        raise DyntcError(f"--limit must be >= 1, got {limit}")
    for v in list_versions(model, limit):
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
    note(f"removed {result['versions_removed']} versions, kept {first}..{head}; "
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
    note(f"copied versions {first}..{head} of {result['source']} to {result['target']}")
    print(json.dumps(result))


@labels_app.command("restore")
def labels_restore(
    model: ModelDir,
    version: Annotated[int, typer.Argument(help="The version to bring back (see `dyntc labels versions`)")],
) -> None:
    """Make an earlier version the current one again (as a new version; nothing is deleted)."""
    from dyntc.classifier.saving import restore_version

    new = restore_version(model, version)
    note(f"restored version {version} as version {new}")
