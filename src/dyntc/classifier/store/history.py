"""What the console shows of a store's history, read with a few queries and never by loading a version:
when each current label last changed, a page of the version timeline, and the difference between two
versions (labels added, removed and renamed; examples added and removed per label).

A label is followed by its identity (the ``labels`` table), not its name, so a rename is a rename and
not a removal plus an addition; the difference reads only the member rows opened or closed between
the two versions, so its cost follows what changed, not the size of the model."""

from __future__ import annotations

from collections import Counter

from dyntc.classifier.store import ModelStore
from dyntc.errors import DyntcError, is_int


def label_changes(store: ModelStore) -> dict[str, dict]:
    """``{current label name: {"version": v, "created": time or None}}``: the newest version that
    named the label, or added or removed one of its examples (None for the time of a pruned version)."""
    with store._connect() as db:
        names = db.execute("SELECT label, name, added FROM names WHERE removed IS NULL").fetchall()
        members = {label: max(a, r or 0) for label, a, r in db.execute(
            "SELECT label, MAX(added), MAX(removed) FROM members GROUP BY label").fetchall()}
        times = dict(db.execute("SELECT id, created FROM versions").fetchall())
    out = {}
    for label, name, added in names:
        version = max(added, members.get(label, 0))
        out[name] = {"version": version, "created": times.get(version)}
    return out


def version_page(store: ModelStore, offset: int, limit: int) -> tuple[list[dict], int]:
    """Versions newest first from `offset`, at most `limit`, and how many are kept in all."""
    import json

    with store._connect() as db:
        total = db.execute("SELECT COUNT(*) FROM versions").fetchone()[0]
        rows = db.execute("SELECT id, created, op, detail, n_labels, n_examples FROM versions ORDER BY id DESC "
                          "LIMIT ? OFFSET ?", (int(limit), int(offset))).fetchall()
    return [{"version": v, "created": c, "op": op, "detail": json.loads(d), "n_labels": nl, "n_examples": ne}
            for v, c, op, d, nl, ne in rows], total


def _alive(added: int, removed: int | None, version: int) -> bool:
    return added <= version and (removed is None or removed > version)


def diff(store: ModelStore, a: int, b: int) -> dict:
    """What changed from version `a` to version `b` (either may be the older): ``labels_added`` and
    ``labels_removed`` (names with their example counts), ``renamed`` (``{"from", "to"}``) and
    ``examples``: per label present in both, the texts added and removed (``{"label", "added",
    "removed"}``, label by its name at `b`). Versions that do not exist or were pruned are an error."""
    with store._connect() as db:
        kept = {v for (v,) in db.execute("SELECT id FROM versions WHERE id IN (?, ?)", (a, b)).fetchall()}
        for v in (a, b):
            if not is_int(v) or v not in kept:
                first, head = db.execute("SELECT COALESCE(MIN(id), 0), COALESCE(MAX(id), 0) FROM versions").fetchone()
                raise DyntcError(f"no version {v!r} in this store; the versions kept are {first}..{head}")
        lo, hi = min(a, b), max(a, b)
        names = db.execute("SELECT label, name, added, removed FROM names WHERE added <= ? AND "
                           "(removed IS NULL OR removed > ?)", (hi, lo)).fetchall()
        rows = db.execute(
            "SELECT m.label, c.text, m.added, m.removed FROM members m JOIN contents c ON c.id = m.content "
            "WHERE (m.added > ? AND m.added <= ?) OR (m.removed > ? AND m.removed <= ?)", (lo, hi, lo, hi)).fetchall()
        counts = {}
        for v in (a, b):
            counts[v] = dict(db.execute(
                "SELECT label, COUNT(*) FROM members WHERE added <= ? AND (removed IS NULL OR removed > ?) "
                "GROUP BY label", (v, v)).fetchall())
    at_a = {label: name for label, name, added, removed in names if _alive(added, removed, a)}
    at_b = {label: name for label, name, added, removed in names if _alive(added, removed, b)}
    change: dict[int, Counter] = {}
    for label, text, added, removed in rows:
        delta = int(_alive(added, removed, b)) - int(_alive(added, removed, a))
        if delta:
            change.setdefault(label, Counter())[text] += delta
    examples = []
    for label in sorted(set(at_a) & set(at_b), key=lambda i: at_b[i]):
        texts = change.get(label, Counter())
        added = sorted(t for t, n in texts.items() if n > 0)
        removed = sorted(t for t, n in texts.items() if n < 0)
        if added or removed:
            examples.append({"label": at_b[label], "added": added, "removed": removed})
    return {
        "from": a, "to": b,
        "labels_added": sorted(({"label": at_b[i], "examples": counts[b].get(i, 0)} for i in set(at_b) - set(at_a)),
                               key=lambda d: d["label"]),
        "labels_removed": sorted(({"label": at_a[i], "examples": counts[a].get(i, 0)} for i in set(at_a) - set(at_b)),
                                 key=lambda d: d["label"]),
        "renamed": sorted(({"from": at_a[i], "to": at_b[i]} for i in set(at_a) & set(at_b) if at_a[i] != at_b[i]),
                          key=lambda d: d["to"]),
        "examples": examples,
    }
