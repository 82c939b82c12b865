"""A :class:`~dyntc.classifier.DynamicClassifier`'s state as a version of its versioned store.

A classifier remembers ``(store id, version)`` it was loaded from or last committed as. Committing
to that store at that version writes only the labels changed since (``LabelSet.changed``); committing
anywhere else writes the whole label set (:func:`write_version`; :func:`read_version` the other way).
The classifier's ``save`` refuses to commit over a newer version (its changes would be lost); its
``edit`` prepares a change without the store's lock and replays it on the newest version if one
appeared (:func:`commit_edit`), so it never has to refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dyntc.classifier import replay
from dyntc.classifier.calibration import Calibration
from dyntc.classifier.labels import LabelSet
from dyntc.classifier.space import MetricSpace
from dyntc.classifier.params import space_options
from dyntc.classifier.store import ModelStore, Snapshot, Transaction, copy_store, is_store
from dyntc.errors import DyntcError, is_int


#: Version of the classifier's stored description (params, calibration); the store has its own.
#: 3: a pretrained backbone's weights hold only its trained layers (the frozen ones come from its files).
CLASSIFIER_FORMAT = 3
READABLE_FORMATS = (2, 3)  # format 2 stored the whole backbone, which format 3 reads as well


def write_version(txn: Transaction, space: MetricSpace, labels: LabelSet, params: dict, calibration: Calibration | None,
                  source: tuple[str, int] | None, op: str, *, check_base: bool = False,
                  label_type: dict | None = None) -> int:
    """Write a classifier's state (its metric space, label set, parameters and calibration) through
    `txn` as a new version; returns its id. `source`: the ``(store id, version)`` the state was read
    from or last committed as; at the head of this very store only the labels changed since are
    written. `check_base`: refuse if the store moved past `source` (the commit would undo that).
    `label_type`: the classifier's label codec (:mod:`~dyntc.classifier.targets`; None = strings)."""
    same_store = source is not None and source[0] == txn.store_id
    if same_store and check_base and txn.head != source[1]:
        raise DyntcError(
            f"{txn.store.path} changed since this classifier was loaded (version {source[1]}, now "
            f"{txn.head}): saving would undo those changes. Load it again and repeat your change, use "
            "DynamicClassifier.edit(path), or save to another path")
    incremental = same_store and txn.head == source[1]
    data, key = space.weights()
    if data is None and not txn.has_blob(key):  # weights known elsewhere, new to this store
        space.weights_changed()
        data, key = space.weights()
    document = {**space.document(), "format": CLASSIFIER_FORMAT, "params": params,
                "calibration": None if calibration is None else calibration.to_dict(),
                "label_type": label_type or {"kind": "str", "dtype": None}}
    names = labels.changed if incremental else labels.classes
    changes = {n: ((s.texts, s.points, s.stored_parts()) if n in labels else None)
               for n in names for s in [labels._support.get(n)]}
    for name, change in changes.items():  # PostgreSQL cannot store NUL: refused on every backend alike
        if change is not None and any("\x00" in text for text in change[0]):
            raise DyntcError(f"label {name!r} has an example containing a NUL character (\\x00), which a model "
                             "store cannot keep: remove it (nothing was committed)")
    log = labels.log or [{"op": op}]
    return txn.commit(op=", ".join(dict.fromkeys(entry["op"] for entry in log)), detail=log, document=document,
                      weights=data if data is not None else key, labels=changes, replace_all=not incremental)


def read_changes(store: ModelStore, base: Any) -> Any:
    """The newest version of `store` as a copy of `base` (a classifier loaded from or committed to an
    earlier version of it) with the labels changed since replaced, or None when it cannot be read that
    way (another store, `base`'s version pruned, or the network, parameters or calibration changed)."""
    if not hasattr(base, "_source"):
        raise DyntcError(f"base must be a DynamicClassifier loaded from {store.where}, got {type(base).__name__}")
    source = base._source
    if source is None:
        return None
    changes = store.changes_since(*source)
    if changes is None:
        return None
    clf = base.copy()
    clf._labels = base._labels.with_changes(changes.labels, changes.removed)
    clf._source = (changes.store_id, changes.version)
    return clf


def commit_edit(store: ModelStore, clf: Any, log: list, op: str) -> tuple[str, int]:
    """Commit an edited classifier `clf` to `store` as one version, under the store's write lock;
    returns ``(store id, version)``. If another writer committed since `clf` was read, the calls
    recorded in `log` (:mod:`~dyntc.classifier.replay`) are applied again to the newest version, which
    `clf` then becomes, so neither change is lost (the embeddings they need are cached by then); a call
    that no longer applies raises, `clf` unchanged and nothing committed."""
    with store.transaction() as txn:
        if clf._source != (txn.store_id, txn.head):
            newest = type(clf)._from_snapshot(txn.read())
            replay.replay(newest, log)
            clf._become(newest)
        version = write_version(txn, clf.space_, clf._labels, clf.get_params(), clf.calibration_, clf._source, op,
                                label_type=clf._targets.document())
        store_id = txn.store_id
    return store_id, version


def stored_params(snap: Snapshot, param_names: Sequence[str]) -> dict:
    """The constructor parameters a stored version was saved with (those among `param_names`), on the CPU."""
    doc = snap.document
    if doc.get("format") not in READABLE_FORMATS:
        raise DyntcError(f"the stored classifier is in format {doc.get('format')!r}; this dyntc reads formats "
                         f"{', '.join(map(str, READABLE_FORMATS))}: refit it or use the dyntc version that wrote it")
    params = {k: v for k, v in (doc.get("params") or {}).items() if k in param_names}
    params["device"] = "cpu"
    params.setdefault("debias", False)  # saved before the support-size correction existed: predict as then
    return params


def read_version(snap: Snapshot, params: Mapping[str, Any]) -> tuple[MetricSpace, LabelSet, Calibration | None]:
    """A stored version's metric space, label set and calibration, for a classifier with `params`
    (all of them: :func:`stored_params` completed by the constructor's defaults)."""
    doc = snap.document
    space = MetricSpace.from_document(doc, snap.weights, snap.weights_hash, **space_options(params))
    if any(group[1].shape[1] != space.dim for group in snap.labels.values()):
        raise DyntcError(f"the stored points do not have the model's {space.dim} coordinates: the store is damaged")
    labels = LabelSet.from_groups(space, snap.labels, debias=params["debias"])
    stored = doc.get("calibration")
    return space, labels, None if stored is None else Calibration.from_dict(stored)


def open_store(location: str | Path | ModelStore) -> ModelStore:
    return location if isinstance(location, ModelStore) else ModelStore.open(location)


def target_store(location: str | Path | ModelStore) -> ModelStore:
    """The store a save writes to: the one at `location`, or a new one created there."""
    if isinstance(location, ModelStore):
        return location
    if not isinstance(location, (str, Path)) or not str(location):
        raise DyntcError(f"a model location is a directory path or a postgresql:// URL, got {location!r}")
    return ModelStore.open(location) if is_store(location) else ModelStore.create(location)


def list_versions(path: str | Path, limit: int | None = None) -> list[dict]:
    if limit is not None and not (is_int(limit) and limit >= 1):
        raise DyntcError(f"limit must be None (every version) or an integer >= 1, got {limit!r}")
    return open_store(path).versions(limit)


def prune_versions(path: str | Path, keep: int) -> dict:
    return open_store(path).prune(keep)


def copy_model(source: str | Path, target: str | Path) -> dict:
    """Every kept version of the classifier at `source` copied to the new location `target` (a model
    directory or a ``postgresql://`` URL, either way); returns a summary."""
    return copy_store(source, target)


def restore_version(path: str | Path, version: int) -> int:
    if not (is_int(version) and version >= 1):
        raise DyntcError(f"version must be an integer >= 1, got {version!r}")
    with open_store(path).transaction() as txn:
        return txn.restore(version)
