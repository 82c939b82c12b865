"""A classifier's whole label set to and from the files intent data lives in: CSV (``text,label``),
JSON lines (``{"text": ..., "label": ...}``) and Rasa NLU (``nlu.yml``, format 3.1).

:func:`export_labels` writes every label's support examples (labels in order, each label's
examples in their stored order); :func:`import_labels` applies a file to a classifier, either
merging it (new labels added, new examples appended, examples already there skipped) or replacing
the label set with it (labels not in the file removed). Export then import round-trips exactly:
the same labels with the same examples in the same order.

Labels are written by their stored names (:mod:`~dyntc.classifier.targets`: an integer label 7 is
``"7"``) and read back through the classifier's label codec. Rasa's format cannot hold every text:
a text with a line break, or with white space at either end, or that looks like an entity annotation
(``[Paris](city)``, which Rasa reads as the text "Paris") is refused on export with an error naming
it (use CSV or JSON lines for such data); on import, entity annotations are reduced to their text
and the NLU file's other entries (synonyms, regexes, lookup tables) are skipped with a warning.
"""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dyntc.errors import DyntcError, DyntcWarning

FORMATS = ("csv", "jsonl", "rasa")
_SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".yml": "rasa", ".yaml": "rasa"}
RASA_VERSION = "3.1"
# Rasa's entity annotations: [text](entity), [text](entity:value), [text]{"entity": ...}, [text][{...}]
_ENTITY = re.compile(r"\[([^\[\]]+)\](?:\([^()]*\)|\{[^{}]*\}|\[\{.*?\}\])")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-./]*")
_BREAK = re.compile("[\n\r\x85\u2028\u2029]")  # YAML's line breaks
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ufeff\ufffe\uffff]")

Rows = list[tuple[str, str]]  # (text, label name)


def file_format(path: str | Path, fmt: str | None = None) -> str:
    """`fmt` checked, or the format of `path`'s extension."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise DyntcError(f"unknown format {fmt!r}: use {', '.join(FORMATS)}")
        return fmt
    suffix = Path(path).suffix.lower()
    if suffix not in _SUFFIXES:
        raise DyntcError(f"cannot tell the format of {str(path)!r} from its extension: name it .csv, .jsonl or "
                         ".yml, or give the format (csv, jsonl, rasa)")
    return _SUFFIXES[suffix]


# ---------------------------------------------------------------------------------------- writing


def write_rows(rows: Rows, fmt: str) -> str:
    """The file content of `rows` in format `fmt`."""
    fmt = file_format("", fmt)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["text", "label"])
        writer.writerows(rows)
        return out.getvalue()
    if fmt == "jsonl":
        return "".join(json.dumps({"text": t, "label": y}, ensure_ascii=False) + "\n" for t, y in rows)
    return _rasa(rows)


def _rasa(rows: Rows) -> str:
    bad = [(t, why) for t, _ in rows for why in [_rasa_problem(t)] if why]
    if bad:
        text, why = bad[0]
        raise DyntcError(f"{len(bad)} texts cannot be written to a Rasa NLU file, e.g. {text[:60]!r} ({why}): "
                         "export to csv or jsonl instead, or clean those texts")
    groups: dict[str, list[str]] = {}
    for text, label in rows:
        groups.setdefault(label, []).append(text)
    import yaml

    lines = [f'version: "{RASA_VERSION}"', "nlu:"]
    for label, texts in groups.items():
        plain = _PLAIN_NAME.fullmatch(label) and yaml.safe_load(label) == label  # not 7, yes, null: quoted
        name = label if plain else json.dumps(label, ensure_ascii=False)
        lines += [f"- intent: {name}", "  examples: |"] + [f"    - {t}" for t in texts]
    return "\n".join(lines) + "\n"


def _rasa_problem(text: str) -> str | None:
    if _BREAK.search(text):
        return "it holds a line break"
    if _CONTROL.search(text):
        return "it holds a control character that YAML cannot carry"
    if text != text.strip():
        return "it starts or ends with white space, which Rasa drops"
    if _ENTITY.search(text):
        return "it holds what Rasa reads as an entity annotation"
    return None


def export_labels(clf: Any, path: str | Path, fmt: str | None = None) -> dict:
    """Write every label of `clf` (a fitted DynamicClassifier) with its support examples to `path`;
    returns ``{"labels", "examples", "format", "path"}``."""
    fmt = file_format(path, fmt)
    rows = [(text, name) for name, support in clf.labels_.items() for text in support.texts]
    content = write_rows(rows, fmt)
    Path(path).write_text(content, encoding="utf-8", newline="")
    return {"labels": len(clf.labels_), "examples": len(rows), "format": fmt, "path": str(path)}


# ---------------------------------------------------------------------------------------- reading


def read_rows(path: str | Path, fmt: str | None = None) -> Rows:
    """The (text, label) pairs of a CSV (``text`` and ``label`` columns), JSON lines or Rasa NLU file."""
    fmt = file_format(path, fmt)
    path = Path(path)
    if not path.is_file():
        raise DyntcError(f"file {str(path)!r} does not exist")
    try:
        with open(path, encoding="utf-8-sig", newline="") as fh:  # newline="": a CSV field's \r\n stays
            content = fh.read()
    except UnicodeDecodeError as exc:
        raise DyntcError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): save it as UTF-8") from None
    rows = {"csv": _read_csv, "jsonl": _read_jsonl, "rasa": _read_rasa}[fmt](content, path)
    if not rows:
        raise DyntcError(f"{path} holds no examples")
    return rows


def _read_csv(content: str, path: Path) -> Rows:
    try:
        reader = csv.DictReader(io.StringIO(content, newline=""))
        missing = {"text", "label"} - set(reader.fieldnames or [])
        if missing:
            raise DyntcError(f"{path}: no {' or '.join(sorted(missing))} column (columns: {reader.fieldnames}); "
                             "the first line must be the header text,label")
        rows = []
        for no, row in enumerate(reader, 2):
            text, label = row.get("text"), row.get("label")
            if not text or not label or None in row:
                raise DyntcError(f"{path}, record {no}: expected a non-empty text and label (and no extra fields), "
                                 f"got {dict(row)!r}")
            rows.append((text, label))
        return rows
    except csv.Error as exc:
        raise DyntcError(f"{path}: not a well-formed CSV file ({exc})") from None


def _read_jsonl(content: str, path: Path) -> Rows:
    rows = []
    for no, line in enumerate(content.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DyntcError(f"{path}, line {no}: not JSON ({exc.msg})") from None
        if not (isinstance(obj, dict) and isinstance(obj.get("text"), str) and isinstance(obj.get("label"), str)):
            raise DyntcError(f'{path}, line {no}: expected {{"text": "...", "label": "..."}} with string values, '
                             f"got {line[:80]!r}")
        rows.append((obj["text"], obj["label"]))
    return rows


def _read_rasa(content: str, path: Path) -> Rows:
    import yaml

    try:
        doc = yaml.safe_load(content)
    except yaml.YAMLError as exc:
        raise DyntcError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("nlu"), list):
        raise DyntcError(f"{path}: not a Rasa NLU file (expected a top-level 'nlu:' list)")
    version = str(doc.get("version", RASA_VERSION))
    if not version.startswith("3."):
        warnings.warn(f"{path}: Rasa format version {version!r}; this reader follows {RASA_VERSION}",
                      DyntcWarning, stacklevel=4)
    rows, skipped = [], []
    for i, entry in enumerate(doc["nlu"]):
        if not isinstance(entry, dict) or "intent" not in entry:
            skipped.append(next(iter(entry), "?") if isinstance(entry, dict) else type(entry).__name__)
            continue
        intent, examples = entry["intent"], entry.get("examples")
        if not isinstance(intent, str) or not intent.strip():
            raise DyntcError(f"{path}: nlu entry {i + 1} has intent {intent!r}; intent names are non-empty strings "
                             "(quote a name that YAML reads as a number or boolean: intent: \"7\")")
        if not isinstance(examples, str):
            raise DyntcError(f"{path}: intent {intent!r} has no 'examples: |' block of '- text' lines")
        for line in examples.split("\n"):
            if not line.strip():
                continue
            item = line.lstrip()
            if not item.startswith("- "):
                raise DyntcError(f"{path}: intent {intent!r}: example line {line[:60]!r} does not start with '- '")
            text = _ENTITY.sub(r"\1", item[2:]).strip()
            if text:
                rows.append((text, intent))
    if skipped:
        warnings.warn(f"{path}: skipped {len(skipped)} nlu entries that are not intents ({', '.join(map(str, skipped[:5]))})",
                      DyntcWarning, stacklevel=4)
    return rows


# ---------------------------------------------------------------------------------------- importing


def import_labels(clf: Any, path: str | Path, fmt: str | None = None, *, replace: bool = False) -> dict:
    """Apply the labels of the file `path` to `clf` (a fitted DynamicClassifier) with its label
    operations. Merge (default): a new label is added, an existing one gets the file's examples it does
    not have yet (exact text match). `replace`: afterwards the label set is exactly the file's (labels
    not in the file removed, a label whose examples differ redefined by the file's). Returns what
    changed: ``{"added", "extended", "redefined", "removed", "unchanged"}`` (label names; ``extended``
    maps a label to its number of new examples)."""
    rows = read_rows(path, fmt)
    return apply_rows(clf, rows, replace=replace)


def apply_rows(clf: Any, rows: Rows, *, replace: bool = False) -> dict:
    """:func:`import_labels` from rows already read."""
    codec = clf._targets
    groups: dict[str, list[str]] = {}
    for text, label in rows:
        groups.setdefault(codec.name(label, "label"), []).append(text)
    current = {name: list(support.texts) for name, support in clf.labels_.items()}
    done: dict[str, Any] = {"added": [], "extended": {}, "redefined": [], "removed": [], "unchanged": []}
    for name, texts in groups.items():
        label = codec.label(name)
        if name not in current:
            clf.add_label(label, texts)
            done["added"].append(name)
        elif replace and texts != current[name]:
            _redefine(clf, label, name, texts, set(current) | set(groups))
            done["redefined"].append(name)
        elif not replace and (new := _missing(texts, current[name])):
            clf.add_examples(label, new)
            done["extended"][name] = len(new)
        else:
            done["unchanged"].append(name)
    if replace:
        for name in current:
            if name not in groups:
                clf.remove_label(codec.label(name))
                done["removed"].append(name)
    return done


def _missing(texts: Sequence[str], have: Sequence[str]) -> list[str]:
    known = set(have)
    return [t for t in dict.fromkeys(texts) if t not in known]


def _redefine(clf: Any, label: Any, name: str, texts: list[str], taken: set[str]) -> None:
    """Give `label` exactly `texts` (in order): removed and added again; the only label left is first
    renamed aside and removed after (a classifier never runs out of labels)."""
    if clf.n_classes_ > 1:
        clf.remove_label(label)
        clf.add_label(label, texts)
        return
    codec = clf._targets
    aside = next(f"{name} (replaced {i})" for i in range(len(taken) + 1) if f"{name} (replaced {i})" not in taken)
    if codec.kind != "str":  # an aside name must be a label of the codec's kind: take an unused one
        aside = _unused(codec, taken)
    clf.rename_label(label, aside)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)  # the old examples, set aside, are no conflict
        clf.add_label(label, texts)
    clf.remove_label(aside)


def _unused(codec: Any, taken: set[str]) -> Any:
    if codec.kind == "int":
        return max((int(n) for n in taken), default=0) + 1
    return ("dyntc-replaced", len(taken))
