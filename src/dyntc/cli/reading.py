"""The command line's input files: labelled data, example texts and texts to predict.

Data files are CSV (``.csv``), TSV (``.tsv``) or JSON lines (``.jsonl``, ``.ndjson``), chosen by
extension; a CSV/TSV file's first line names its columns. Example files and prediction input may
also be plain text, one text per line. Every malformed file is a :class:`DyntcError` naming the file,
the record and the fix.
"""

from __future__ import annotations

import csv
import json
import sys
from contextlib import contextmanager
from pathlib import Path

from dyntc.errors import DyntcError

TABLES = (".csv", ".tsv")
JSONL = (".jsonl", ".ndjson")


@contextmanager
def readable(path: Path | str):
    """Turn a file that is not UTF-8 text or not well-formed CSV into a one-line error."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise DyntcError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from exc
    except csv.Error as exc:
        raise DyntcError(f"{path}: not a well-formed CSV/TSV file ({exc})") from exc


def _table(lines: list[str], delimiter: str) -> tuple[list[dict], list[str]]:
    reader = csv.DictReader(lines, delimiter=delimiter)
    rows = list(reader)
    return rows, list(reader.fieldnames or [])


def _jsonl(lines: list[str], name: str) -> tuple[list[dict], list[str]]:
    rows, cols = [], {}
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DyntcError(f"{name}:{no}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise DyntcError(f"{name}:{no}: expected a JSON object per line, got {type(obj).__name__}")
        rows.append(obj)
        cols.update(dict.fromkeys(obj))
    return rows, list(cols)


def _lines(path: Path) -> list[str]:
    if not path.exists():
        raise DyntcError(f"file {str(path)!r} does not exist")
    if path.is_dir():
        raise DyntcError(f"{str(path)!r} is a directory, not a file")
    with readable(path):
        return path.read_text(encoding="utf-8-sig").splitlines()


def rows(path: Path) -> tuple[list[dict], list[str]]:
    """Records of a CSV/TSV or JSONL file, and the column names seen."""
    suffix = path.suffix.lower()
    if suffix not in TABLES + JSONL:
        raise DyntcError(f"{path}: unknown data format {suffix!r}; use .csv, .tsv or .jsonl")
    lines = _lines(path)
    with readable(path):
        if suffix in TABLES:
            return _table(lines, "\t" if suffix == ".tsv" else ",")
        return _jsonl(lines, str(path))


def _column(name: str, cols: list[str], path: Path | str, option: str) -> None:
    if name not in cols:
        raise DyntcError(f"{path} has no column {name!r}; its columns are {cols}: name the right one with {option}")


def _texts_of(records: list[dict], text_col: str, path: Path | str) -> list[str]:
    texts = [row.get(text_col) for row in records]
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise DyntcError(f"{path}: record {i + 1} has an empty or non-text {text_col!r}")
    return texts


def read_labelled(path: Path, text_col: str, label_col: str) -> tuple[list[str], list[str]]:
    """Texts and labels of a CSV/TSV/JSONL file, with a clear error for missing columns or bad cells."""
    records, cols = rows(path)
    missing = [c for c in (text_col, label_col) if c not in cols]
    if missing:
        raise DyntcError(
            f"{path} has no column {', '.join(map(repr, missing))}; its columns are {cols}: "
            "name the right ones with --text-col / --label-col"
        )
    texts = _texts_of(records, text_col, path)
    labels = []
    for i, row in enumerate(records):
        label = row.get(label_col)
        if label is None or (isinstance(label, str) and not label.strip()):
            raise DyntcError(f"{path}: record {i + 1} has an empty {label_col!r}")
        labels.append(str(label))
    if not texts:
        raise DyntcError(f"{path} holds no records")
    return texts, labels


def read_examples(path: Path, text_col: str = "text") -> list[str]:
    """Example texts: from CSV/TSV/JSONL (column `text_col`) or a text file with one example per line."""
    if path.suffix.lower() in TABLES + JSONL:
        records, cols = rows(path)
        _column(text_col, cols, path, "--text-col")
        return _texts_of(records, text_col, path)
    return [line.strip() for line in _lines(path) if line.strip()]


def gather(examples: list[str] | None, files: list[Path] | None, text_col: str, what: str) -> list[str]:
    """The examples of a label command: its ``--example`` texts, then its ``--examples-file`` files' texts."""
    out = list(examples or [])
    for f in files or []:
        out.extend(read_examples(f, text_col))
    if not out:
        raise DyntcError(f"no examples for {what}: give --example TEXT (repeatable) and/or --examples-file FILE")
    return out


def read_texts(source: str, text_col: str | None = None) -> list[str]:
    """Texts to predict, from a file or stdin (``-``).

    A ``.csv``/``.tsv`` file is a table: its header names the columns, `text_col` (default ``text``)
    is predicted and the other columns (a label, an id) are ignored. A ``.jsonl`` file, or input whose
    first line starts with ``{``, is JSON lines with `text_col` in each object. Anything else (stdin
    included, unless `text_col` is given) is plain text, one text per line. Blank lines are skipped."""
    if source == "-":
        name, suffix = "stdin", ""
        with readable(name):
            lines = sys.stdin.read().splitlines()
    else:
        path = Path(source)
        name, suffix = source, path.suffix.lower()
        if not path.exists() or path.is_dir():
            raise DyntcError(f"input file {source!r} does not exist (or is a directory); use - for stdin")
        lines = _lines(path)
    first = next((line for line in lines if line.strip()), "")
    if suffix in JSONL or first.lstrip().startswith("{"):
        records, cols = _jsonl(lines, name)
        column = text_col or "text"
        if records:
            _column(column, cols, name, "--text-col")
        return _texts_of(records, column, name)
    if suffix in TABLES or text_col is not None:
        delimiter = "\t" if suffix == ".tsv" or (not suffix and "\t" in first) else ","
        with readable(name):
            records, cols = _table([line for line in lines if line.strip()], delimiter)
        column = text_col or "text"
        _column(column, cols, name, "--text-col")
        return _texts_of(records, column, name)
    return [line.strip() for line in lines if line.strip()]


__all__ = ["gather", "read_examples", "read_labelled", "read_texts", "readable", "rows"]
