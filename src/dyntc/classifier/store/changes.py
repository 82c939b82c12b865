"""A version read as its difference to an earlier one: the labels changed in between, in full, and the
names gone. What a process serving version ``since`` reads to serve the newest (``dyntc serve`` following
another writer): its cost grows with the labels changed, not with the model.

A label changed when one of its name or member rows was opened or closed after ``since``; the rest is
the same in both versions. Only when the model document and the weights are the same blobs in both
versions (label operations never change them; ``calibrate``, ``set_params`` or ``fine_tune`` do) is
the difference all there is to read."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dyntc.classifier.store import state as states
from dyntc.classifier.store.schema import content_hash, meta, points_tensor
from dyntc.classifier.store.schema import head as read_head
from dyntc.errors import DyntcError

_CHUNK = 500  # ids per IN (...) list


@dataclass
class Changes:
    """A version read as its difference to an earlier one (:func:`changes_since`)."""

    store_id: str
    version: int
    labels: dict[str, tuple[list[str], torch.Tensor, list[int]]]  # every label changed: its full support
    removed: list[str]  # names alive at the earlier version and not now (removed or renamed)


def changes_since(db: Any, store_id: str, since: int, blob: Callable[[Any, str, str], bytes]) -> Changes | None:
    """The head as its difference to version `since` of store `store_id`, read in `db`'s transaction
    and verified as a full read is (`blob` reads a verified blob); None when that is not what differs:
    another store, `since` no longer kept, or the model document or weights changed."""
    if (meta(db, "store_id") or "") != store_id:
        return None
    head = read_head(db)
    rows = {r[0]: tuple(r[1:]) for r in db.execute("SELECT id, model, weights FROM versions WHERE id IN (?, ?)",
                                                    (since, head)).fetchall()}
    if head < since or since not in rows or rows[since] != rows[head]:
        return None
    changed = states.touched(db, since, head)
    then, now = _names_at(db, since, changed), _names_at(db, head, changed)
    removed = sorted({name for label, name in then.items() if now.get(label) != name})
    document = json.loads(blob(db, rows[head][0], f"the model document of version {head}").decode("utf-8"))
    grouped: dict[str, tuple[list[str], list[bytes], list[int]]] = {}
    for label, _, _, part, content, key, text, point in _members_at(db, head, sorted(now)):
        name, point = now[label], bytes(point)
        if content_hash(text, point) != bytes(key):
            raise DyntcError(f"the store is damaged: an example of label {name!r} in version {head} does not match "
                             f"its hash (content {content}); restore a version without it")
        texts, points, parts = grouped.setdefault(name, ([], [], []))
        texts.append(text)
        points.append(point)
        parts.append(part)
    labels = {}
    for name, (texts, points, parts) in sorted(grouped.items()):
        tensor = points_tensor(points, document.get("dim", 0))
        if not np.isfinite(tensor.numpy()).all():
            raise DyntcError(f"the store is damaged: label {name!r} of version {head} has non-finite points; "
                             "restore an earlier version")
        labels[name] = (texts, tensor, parts)
    # the labels not read are served already (read and verified at `since`): the head's digest is
    # since's with the changed labels' terms exchanged
    before, expected = states.recorded(db, since), states.recorded(db, head)
    if expected is not None:
        actual = states.state_of(states.label_rows(db, head).values()) if before is None else states.shifted(
            before, states.label_rows(db, since, changed).values(), states.label_rows(db, head, changed).values())
        states.check(expected, actual, head)
    return Changes(store_id, head, labels, removed)


def _chunks(ids: Sequence[int]):
    for i in range(0, len(ids), _CHUNK):
        chunk = ids[i:i + _CHUNK]
        yield chunk, ", ".join("?" * len(chunk))


def _names_at(db: Any, version: int, labels: Sequence[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk, marks in _chunks(labels):
        out.update(db.execute(f"SELECT label, name FROM names WHERE label IN ({marks}) AND added <= ? AND "
                              "(removed IS NULL OR removed > ?)", (*chunk, version, version)).fetchall())
    return out


def _members_at(db: Any, version: int, labels: Sequence[int]) -> list[tuple]:
    """The member rows of `labels` alive at `version` with their contents, in the order a read gives."""
    rows: list[tuple] = []
    for chunk, marks in _chunks(labels):
        rows += db.execute(
            f"SELECT m.label, m.pos, m.id, m.part, c.id, c.hash, c.text, c.point FROM members m "
            f"JOIN contents c ON c.id = m.content WHERE m.label IN ({marks}) AND m.added <= ? AND "
            "(m.removed IS NULL OR m.removed > ?)", (*chunk, version, version)).fetchall()
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return rows
