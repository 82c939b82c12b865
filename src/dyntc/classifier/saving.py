"""Saving and loading a :class:`~dyntc.classifier.DynamicClassifier` through its versioned store.

A classifier remembers ``(store id, version)`` it was loaded from or last committed as. Committing
to that store at that version writes only the labels changed since (``LabelSet.changed``); committing
anywhere else writes the whole label set. :func:`save_classifier` refuses to commit over a newer version (its
changes would be lost); :func:`edit_classifier` prepares its change without the lock and replays it on the
newest version if one appeared (:func:`commit_changes`), so it never has to refuse.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ContextManager, Self

from dyntc.classifier import replay
from dyntc.classifier.calibration import Calibration
from dyntc.classifier.labels import LabelSet
from dyntc.classifier.model import MetricSpace
from dyntc.classifier.params import space_options
from dyntc.classifier.store import ModelStore, Snapshot, Transaction, copy_store, is_store
from dyntc.errors import DyntcError, is_int


#: Version of the classifier's stored description (params, calibration); the store has its own.
CLASSIFIER_FORMAT = 2


def save_classifier(clf: Any, path: str | Path) -> str | Path:
    store = ModelStore.open(path) if is_store(path) else ModelStore.create(path)
    with store.transaction() as txn:
        version = commit(clf, txn, "save", check_base=True)
        store_id = txn.store_id
    mark_committed(clf, store_id, version)
    return store.location


@contextmanager
def edit_classifier(cls: type, path: str | Path) -> Iterator[Any]:
    store = ModelStore.open(path)
    clf = from_snapshot(cls, store.read())  # without the write lock: loading and embedding block no one
    log = replay.start(clf)
    try:
        yield clf
    finally:
        replay.stop(clf)
    commit_changes(store, clf, log, "edit")


def commit_changes(store: ModelStore, clf: Any, log: list, op: str) -> int | None:
    """Commit `clf`, changed by the recorded calls `log` since it was read from `store`, as one
    version; returns its id (None if nothing changed).

    The write lock is held only for the commit. If another writer committed since `clf` was read,
    `log` is replayed on the newest version under the lock (replay.py) and `clf` becomes that
    result, so no writer's change is lost and none waits while another embeds."""
    if not _has_changes(clf):
        return None
    with store.transaction() as txn:
        if clf._source is None or txn.head != clf._source[1] or clf._source[0] != txn.store_id:
            fresh = from_snapshot(type(clf), txn.read())
            replay.replay(fresh, log)
            clf.__dict__.update(fresh.__dict__)
        version, store_id = commit(clf, txn, op), txn.store_id
    mark_committed(clf, store_id, version)
    return version


def _has_changes(clf: Any) -> bool:
    return bool(clf._labels.changed or clf._labels.log or clf.space_.weights_dirty)


def commit(clf: Any, txn: Transaction, op: str, *, check_base: bool = False) -> int:
    """Write `clf`'s state through `txn`; returns the new version's id."""
    source = clf._source
    same_store = source is not None and source[0] == txn.store_id
    if same_store and check_base and txn.head != source[1]:
        raise DyntcError(
            f"{txn.store.path} changed since this classifier was loaded (version {source[1]}, now "
            f"{txn.head}): saving would undo those changes. Load it again and repeat your change, use "
            "DynamicClassifier.edit(path), or save to another path")
    incremental = same_store and txn.head == source[1]
    data, key = clf.space_.weights()
    if data is None and not txn.has_blob(key):  # weights known elsewhere, new to this store
        clf.space_.weights_changed()
        data, key = clf.space_.weights()
    document = {**clf.space_.document(), "format": CLASSIFIER_FORMAT, "params": clf.get_params(),
                "calibration": None if clf.calibration_ is None else clf.calibration_.to_dict()}
    labels = clf._labels
    names = labels.changed if incremental else labels.classes
    changes = {n: ((s.texts, s.points, s.stored_parts()) if n in labels else None)
               for n in names for s in [labels._support.get(n)]}
    log = labels.log or [{"op": op}]
    return txn.commit(op=", ".join(dict.fromkeys(entry["op"] for entry in log)), detail=log, document=document,
                      weights=data if data is not None else key, labels=changes, replace_all=not incremental)


def mark_committed(clf: Any, store_id: str, version: int) -> None:
    clf._labels.changed.clear()
    clf._labels.log.clear()
    clf._source = (store_id, version)


def load_classifier(cls: type, path: str | Path, version: int | None = None) -> Any:
    return from_snapshot(cls, ModelStore.open(path).read(version))


def from_snapshot(cls: type, snap: Snapshot) -> Any:
    doc = snap.document
    if doc.get("format") != CLASSIFIER_FORMAT:
        raise DyntcError(f"the stored classifier is in format {doc.get('format')!r}; this dyntc reads format "
                         f"{CLASSIFIER_FORMAT}: refit it or use the dyntc version that wrote it")
    params = {k: v for k, v in (doc.get("params") or {}).items() if k in cls._param_names()}
    params["device"] = "cpu"
    params.setdefault("debias", False)  # saved before the support-size correction existed: predict as then
    clf = cls(**params)
    clf.space_ = MetricSpace.from_document(doc, snap.weights, snap.weights_hash, **space_options(clf))
    if any(group[1].shape[1] != clf.space_.dim for group in snap.labels.values()):
        raise DyntcError(f"the stored points do not have the model's {clf.space_.dim} coordinates: the store is damaged")
    clf._labels = LabelSet.from_groups(clf.space_, snap.labels, debias=clf.debias)
    stored = doc.get("calibration")
    clf.calibration_ = None if stored is None else Calibration.from_dict(stored)
    clf._source = (snap.store_id, snap.version)
    return clf


def list_versions(path: str | Path, limit: int | None = None) -> list[dict]:
    return ModelStore.open(path).versions(limit)


def prune_versions(path: str | Path, keep: int) -> dict:
    return ModelStore.open(path).prune(keep)


def copy_model(source: str | Path, target: str | Path) -> dict:
    """Every kept version of the classifier at `source` copied to the new location `target` (a model
    directory or a ``postgresql://`` URL, either way); returns a summary."""
    return copy_store(source, target)


def restore_version(path: str | Path, version: int) -> int:
    if not (is_int(version) and version >= 1):
        raise DyntcError(f"version must be an integer >= 1, got {version!r}")
    store = ModelStore.open(path)
    with store.transaction() as txn:
        return txn.restore(version)


class PersistenceMixin:
    """:class:`~dyntc.classifier.DynamicClassifier`'s methods over its versioned model directory."""

    def save(self, path: str | Path) -> str | Path:
        """Commit the classifier to the model directory `path` (or a ``postgresql://`` URL) as a new
        version; returns the location (a Path, or the URL).

        The location holds a versioned store (:mod:`dyntc.classifier.store`): saving a classifier
        loaded from `path` stores only the labels changed since, and fails with a clear error if
        another writer committed in between (its changes would be lost); saving any other classifier
        replaces the content, keeping the older versions restorable. A crash never leaves half a
        version on disk.
        """
        self._check_fitted()
        return save_classifier(self, path)

    @classmethod
    def edit(cls, path: str | Path) -> ContextManager[Self]:
        """Read-modify-write of a saved classifier under the store's write lock::

            with DynamicClassifier.edit("model/") as clf:
                clf.add_label("refund", ["I want my money back", ...])

        The block runs without the store's write lock (readers and other writers never wait for
        its embedding); the lock is taken only to commit, as one version, when the block ends
        without error (nothing is committed otherwise). If another writer committed meanwhile, the
        block's label operations, ``calibrate``, ``set_params`` and ``fine_tune`` calls are applied
        again to the newest version, so no change is lost. Changes made by assigning attributes
        directly are not replayed."""
        return edit_classifier(cls, path)

    @classmethod
    def load(cls, path: str | Path, version: int | None = None) -> Self:
        """Load a saved classifier (its newest version, or `version`) from a model directory or a
        ``postgresql://`` URL, on the CPU (set ``device`` afterwards to move it)."""
        return load_classifier(cls, path, version)

    @property
    def version_(self) -> int | None:
        """The store version this classifier was loaded from or last committed as (None if never)."""
        self._check_fitted()
        return self._source[1] if self._source else None

    @staticmethod
    def versions(path: str | Path, limit: int | None = None) -> list[dict]:
        """The committed versions of the classifier saved at `path`, newest first."""
        return list_versions(path, limit)

    @staticmethod
    def restore(path: str | Path, version: int) -> int:
        """Make `version` of the classifier at `path` its newest version again (a new version; nothing
        is deleted). Returns the new version's id."""
        return restore_version(path, version)

    @staticmethod
    def prune(path: str | Path, keep: int) -> dict:
        """Delete the versions of the classifier at `path` older than the newest `keep` (they can no
        longer be loaded or restored) and compact its store. Returns a summary (versions removed, the
        range kept, bytes before and after)."""
        return prune_versions(path, keep)
