"""The digest of a version's state: its label names and which examples each label holds, in which
order and part (``versions.state``). Blobs and examples carry digests of their own; this one covers
the rows of ``names`` and ``members`` that join them, so a name or a membership row changed outside
dyntc is refused as damage instead of loading as if it had been committed.

A version's digest is the sum, modulo 2**256, of one SHA-256 per label, so a commit or a follower
computes it from the labels that changed alone (their digests at the version before are taken out,
their new ones added): its cost grows with what changed, not with the model. It guards against
accidents and hand edits, not against someone who can write the database (and so the digests)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from dyntc.errors import DyntcError

_MOD = 1 << 256
_CHUNK = 500  # ids per IN (...) list

Members = Sequence[tuple[bytes, int]]  # (content hash, part) of each example of a label, in order


def label_digest(name: str, members: Members) -> int:
    """One label's term: its name, then each example's content hash and part, in order. Every length is
    written before what it measures, so no label can be confused with another whose bytes run on."""
    data = name.encode("utf-8")
    h = hashlib.sha256(len(data).to_bytes(8, "little") + data + len(members).to_bytes(8, "little"))
    for key, part in members:
        h.update(bytes(key) + int(part).to_bytes(8, "little", signed=True))
    return int.from_bytes(h.digest(), "big")


def state_of(labels: Iterable[tuple[str, Members]]) -> str:
    """The digest of a whole state, ``(name, members)`` per label."""
    return format(sum(label_digest(n, m) for n, m in labels) % _MOD, "064x")


def shifted(state: str, before: Iterable[tuple[str, Members]], after: Iterable[tuple[str, Members]]) -> str:
    """`state` with the labels `before` taken out and the labels `after` put in."""
    total = int(state, 16) - sum(label_digest(n, m) for n, m in before) + sum(label_digest(n, m) for n, m in after)
    return format(total % _MOD, "064x")


def label_rows(db: Any, version: int, labels: Sequence[int] | None = None) -> dict[int, tuple[str, list]]:
    """``{label id: (name, [(content hash, part), ...])}`` at `version` as the rows say, for every label
    with examples, or only for the label ids `labels`."""
    if labels is None:
        chunks = [((), "")]
    else:
        labels = sorted(labels)
        chunks = [(labels[i:i + _CHUNK], ", ".join("?" * len(labels[i:i + _CHUNK])))
                  for i in range(0, len(labels), _CHUNK)]
    names, rows = {}, []
    for chunk, marks in chunks:
        only = f" AND label IN ({marks})" if labels is not None else ""
        names.update(db.execute(f"SELECT label, name FROM names WHERE added <= ? AND (removed IS NULL OR removed > ?)"
                                f"{only}", (version, version, *chunk)).fetchall())
        only = f" AND m.label IN ({marks})" if labels is not None else ""
        rows += db.execute(  # the rows alive now or removed after `version` (as a read visits them: indexed)
            f"SELECT m.label, m.pos, m.id, c.hash, m.part FROM members m JOIN contents c ON c.id = m.content "
            f"WHERE m.removed IS NULL AND m.added <= ?{only} UNION ALL SELECT m.label, m.pos, m.id, c.hash, m.part "
            f"FROM members m JOIN contents c ON c.id = m.content WHERE m.removed > ? AND m.added <= ?{only}",
            (version, *chunk, version, version, *chunk)).fetchall()
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    out: dict[int, tuple[str, list]] = {}
    for label, _, _, key, part in rows:
        if label not in names:
            raise DyntcError(f"the store is damaged: version {version} has examples of a label without a name; "
                             "restore an earlier version")
        out.setdefault(label, (names[label], []))[1].append((bytes(key), part))
    return out


def touched(db: Any, after: int, upto: int) -> list[int]:
    """The labels one of whose name or member rows was opened or closed in versions ``after+1..upto``."""
    return sorted(r[0] for r in db.execute(
        "SELECT label FROM names WHERE (added > ? AND added <= ?) OR (removed > ? AND removed <= ?) "
        "UNION SELECT label FROM members WHERE (added > ? AND added <= ?) OR (removed > ? AND removed <= ?)",
        (after, upto) * 4).fetchall())


def recorded(db: Any, version: int) -> str | None:
    row = db.execute("SELECT state FROM versions WHERE id = ?", (version,)).fetchone()
    return row[0] if row else None


def new_state(db: Any, version: int) -> str:
    """The digest of `version` (being committed: its rows written, its versions row not yet), from the
    version before's digest and the labels this commit touched; in full when there is none to start from."""
    before = recorded(db, version - 1)
    if before is None:
        return state_of(label_rows(db, version).values())
    changed = touched(db, version - 1, version)
    return shifted(before, label_rows(db, version - 1, changed).values(), label_rows(db, version, changed).values())


def check(expected: str | None, actual: str, version: int) -> None:
    """Raise the store's "damaged" error unless `actual` is the digest `version` recorded (versions
    committed before format 4 recorded none: `expected` None)."""
    if expected is not None and actual != expected:
        raise DyntcError(f"the store is damaged: the label names or the examples each label holds in version "
                         f"{version} do not match its digest (a row of the names or members table was changed "
                         "outside dyntc); restore another version")
