"""The labels a user gives a :class:`~dyntc.classifier.DynamicClassifier` and the names it stores.

A label set stores, saves and serves its labels by name (a string: the model directory, the
CLI and the HTTP service speak names). Users of scikit-learn label with anything hashable: ints
(Python or NumPy), tuples, strings. A :class:`LabelCodec` maps each label to its name and back:

- ``"str"``: strings; the name is the label (every model saved before the codec existed);
- ``"int"``: integers (``int`` or one NumPy integer type, kept in ``dtype``); the name is the decimal;
- ``"literal"``: anything else whose ``repr`` reads back with :func:`ast.literal_eval` (tuples,
  bools, integral floats, ...); the name is the ``repr``.

In memory the codec also keeps every label object it has seen, so ``predict`` returns the very
objects ``fit`` was given (a ``numpy.int64`` stays one). ``classes_`` lists the labels sorted the
way :func:`numpy.unique` sorts them (10 after 9, not after 1), so the public column order can differ
from the label set's name order: :meth:`LabelCodec.order` is the permutation between the two.
"""

from __future__ import annotations

import ast
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dyntc.errors import DyntcError

KINDS = ("str", "int", "literal")


def _is_int(y: Any) -> bool:
    return isinstance(y, (int, np.integer)) and not isinstance(y, (bool, np.bool_))


def _kind_of(y: Any) -> str:
    if isinstance(y, str):
        return "str"
    return "int" if _is_int(y) else "literal"


def flat_labels(labels: Any, arg: str = "labels") -> list:
    """`labels` as a list: a column vector ``(n, 1)`` is flattened (scikit-learn's behaviour, with its
    warning); any other array of more than one dimension is an error."""
    from sklearn.utils.validation import column_or_1d

    if hasattr(labels, "__array__") and not isinstance(labels, np.ndarray) and not hasattr(labels, "to_numpy"):
        labels = np.asarray(labels)  # an array-like that is not a sequence
    if isinstance(labels, str) or not isinstance(labels, Iterable):
        raise DyntcError(f"{arg} must be a list of labels, got {type(labels).__name__}")
    if hasattr(labels, "ndim") and labels.ndim != 1:
        if labels.ndim != 2 or labels.shape[1] != 1:
            raise DyntcError(f"{arg} must be one label per text (1-D), got an array of shape {labels.shape}: "
                             "multi-output targets are not supported")
        labels = column_or_1d(labels, warn=True)
    return list(labels.tolist() if isinstance(labels, np.ndarray) and labels.dtype.kind in "US" else labels)


@dataclass
class LabelCodec:
    """Label objects <-> stored names (module docstring)."""

    kind: str = "str"
    dtype: str | None = None  # "int": the NumPy integer type of the labels (None: Python int)
    seen: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, labels: Sequence[Any], arg: str = "labels") -> "LabelCodec":
        """The codec of `labels` (all of one kind; a list of strings gives the plain ``"str"`` codec)."""
        missing = next((i for i, y in enumerate(labels) if y is None), None)
        if missing is not None:
            raise DyntcError(f"{arg}[{missing}] is None: every text needs a label (None means out of scope in predict)")
        kinds = {_kind_of(y) for y in labels}
        if len(kinds) > 1:
            raise DyntcError(f"{arg} mix {' and '.join(sorted(kinds))} labels, which cannot be ordered: "
                             "give every label the same type (e.g. str() them all)")
        kind = kinds.pop() if kinds else "str"
        dtype = None
        if kind == "int":
            types = {type(y) for y in labels}
            dtype = np.dtype(types.pop()).name if len(types) == 1 and not types & {int} else None
        if kind == "literal":
            _check_targets(labels, arg)
        codec = cls(kind, dtype)
        for y in labels:
            codec.name(y, arg)
        return codec

    @classmethod
    def from_document(cls, doc: dict | None) -> "LabelCodec":
        doc = doc or {"kind": "str"}
        if doc.get("kind") not in KINDS:
            raise DyntcError(f"the stored label type {doc!r} is unknown to this dyntc: use the version that wrote it")
        return cls(doc["kind"], doc.get("dtype"))

    def document(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype}

    def name(self, label: Any, arg: str = "label") -> str:
        """The stored name of `label`, checked against the codec's kind."""
        if self.kind == "str":
            if not isinstance(label, str):
                raise DyntcError(f"{arg} is {label!r} ({type(label).__name__}) but this classifier's labels are "
                                 "strings: pass a str")
            return label
        if isinstance(label, str):  # a stored name, as the CLI and the HTTP service pass labels
            value = _from_name(self.kind, label)
            if value is _UNREADABLE:
                raise DyntcError(f"{arg} {label!r} is not a label of this classifier, whose labels are "
                                 f"{'integers' if self.kind == 'int' else 'Python literals such as tuples'}")
            return self.name(value, arg)
        if _kind_of(label) != self.kind:
            raise DyntcError(f"{arg} is {label!r} ({type(label).__name__}) but this classifier's labels are "
                             f"{'integers' if self.kind == 'int' else 'Python literals such as tuples'}: "
                             "pass a label of that type")
        if not isinstance(label, Hashable):
            raise DyntcError(f"{arg} {label!r} is not hashable: labels must be hashable")
        name = str(int(label)) if self.kind == "int" else repr(_plain(label))
        if self.kind == "literal" and _literal(name) != label:
            raise DyntcError(f"{arg} {label!r} ({type(label).__name__}) cannot be stored by name: use str, int or a "
                             "tuple/bool/float of literals as labels")
        self.seen.setdefault(name, label)
        return name

    def names(self, labels: Iterable[Any], arg: str = "labels", *, lenient: bool = False) -> Any:
        """The names of `labels`; `lenient`: a str, mapping or non-iterable passes through as it is (for
        the label operation to refuse with its own message)."""
        if lenient and (isinstance(labels, (str, Mapping)) or not isinstance(labels, Iterable)):
            return labels
        return [self.name(y, f"{arg}[{i}]") for i, y in enumerate(labels)]

    def encoded(self, texts: Any, labels: Any, arg: str = "labels", *, optional: bool = False) -> tuple[Any, Any]:
        """(`texts`, `labels`) with the texts as a list (:func:`as_texts`) and the labels as their names;
        the texts are checked by the caller. `optional`: a None among the two passes through as it is."""
        if optional and (texts is None or labels is None):
            return texts, labels
        return as_texts(texts), self.names(flat_labels(labels, arg), arg)

    def keyed(self, parts: Any, arg: str) -> Any:
        """A ``{label: value}`` mapping keyed by names instead; anything else unchanged (the caller refuses it)."""
        if not isinstance(parts, Mapping):
            return parts
        return {self.name(key, arg): value for key, value in parts.items()}

    def public(self, matrix: Any, names: Sequence[str]) -> Any:
        """The columns of `matrix`, in label-set `names` order, in ``classes_`` order (:meth:`order`)."""
        order = self.order(names)
        return matrix if order is None else matrix[:, order]

    def encoded_dev(self, dev: Any) -> Any:
        """A ``(texts, labels)`` dev pair encoded as :meth:`encoded`; anything else unchanged (None, or a
        mistake that the caller's check names)."""
        if isinstance(dev, (tuple, list)) and len(dev) == 2:
            return self.encoded(dev[0], dev[1], "dev labels")
        return dev

    def label(self, name: str) -> Any:
        """The label object of a stored name (the one seen at fit or in a label operation, if any)."""
        if name is None or self.kind == "str":
            return name
        if name in self.seen:
            return self.seen[name]
        if self.kind == "int":
            value = int(name)
            return value if self.dtype is None else np.dtype(self.dtype).type(value)
        return _literal(name)

    def labels(self, names: Iterable[str]) -> list:
        return [self.label(n) for n in names]

    def order(self, names: Sequence[str]) -> list[int] | None:
        """The permutation that sorts label-set columns (in `names` order) the way ``np.unique`` sorts
        the labels; None when it is the identity (strings)."""
        if self.kind == "str":
            return None
        objects = self.labels(names)
        try:
            order = sorted(range(len(names)), key=lambda i: objects[i])
        except TypeError as exc:
            raise DyntcError(f"the labels cannot be ordered ({exc}): give every label the same type") from None
        return None if order == list(range(len(names))) else order

    def array(self, names: Sequence[str]) -> np.ndarray:
        """``classes_``: the labels of `names`, in :meth:`order`, as NumPy would hold ``np.unique(y)``."""
        order = self.order(names)
        objects = self.labels(names if order is None else [names[i] for i in order])
        if self.kind == "literal":
            plain = np.asarray(objects) if objects else None
            if plain is not None and plain.ndim == 1 and plain.dtype != object:
                return plain  # bools, floats: as np.unique would hold them
            out = np.empty(len(objects), dtype=object)
            out[:] = objects
            return out
        return np.asarray(objects) if objects else np.asarray([], dtype=object)


def _plain(label: Any) -> Any:
    """NumPy scalars as Python ones (their repr, ``np.float64(1.0)``, would not read back)."""
    if isinstance(label, np.generic):
        return label.item()
    if isinstance(label, tuple):
        return tuple(_plain(v) for v in label)
    return label


def _from_name(kind: str, name: str) -> Any:
    if kind == "int":
        try:
            return int(name)
        except ValueError:
            return _UNREADABLE
    value = _literal(name)
    return _UNREADABLE if isinstance(value, str) or _kind_of(value) != kind else value


def _literal(name: str) -> Any:
    try:
        return ast.literal_eval(name)
    except (ValueError, SyntaxError):
        return _UNREADABLE


_UNREADABLE = object()


def _check_targets(labels: Sequence[Any], arg: str) -> None:
    """Number labels must be classes (scikit-learn's rule): continuous values are an error."""
    if labels and all(isinstance(y, (float, np.floating)) for y in labels):
        from sklearn.utils.multiclass import check_classification_targets

        try:
            check_classification_targets(np.asarray(labels, dtype=float))
        except ValueError as exc:
            raise DyntcError(f"{arg}: {exc} (a classifier needs a few discrete labels, not continuous values)") from None


def json_label(label: Any) -> Any:
    """A label as JSON can hold it (NumPy scalars as Python numbers; tuples become lists)."""
    return _plain(label)


def as_texts(texts: Any) -> Any:
    """Texts as a list of Python strings when they come as a NumPy array (1-D, or one column) or a
    pandas Series; anything else unchanged (:func:`~dyntc.classifier.labels.check_examples` checks it)."""
    if hasattr(texts, "columns") and hasattr(texts, "to_numpy"):  # a pandas DataFrame
        if len(texts.columns) != 1:
            raise DyntcError(f"texts is a table of {len(texts.columns)} columns: pass its text column (df['text'])")
        texts = texts.to_numpy()
    elif hasattr(texts, "to_numpy"):  # a pandas Series
        texts = texts.to_numpy()
    if isinstance(texts, np.ndarray):
        if texts.ndim == 2 and texts.shape[1] == 1:
            texts = texts[:, 0]
        if texts.ndim != 1:
            raise DyntcError(f"texts must be one text per sample (a list or 1-D array), got an array of shape "
                             f"{texts.shape}: select the text column")
        return texts.tolist()
    return texts
