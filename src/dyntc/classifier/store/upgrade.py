"""Stores of an older format upgraded in place, in one transaction: fully upgraded or untouched.
Format 2 (SQLite only): one ``examples`` table holding a full copy of every changed label per
version. Format 3: no digest of each version's label names and memberships."""

from __future__ import annotations

from typing import Any

from dyntc.classifier.store.dialect import Dialect
from dyntc.classifier.store.schema import STORE_FORMAT, content_hash, now, read_format, schema_statements
from dyntc.errors import DyntcError


def upgrade(dialect: Dialect, db: Any) -> None:
    """Format 2 or 3 -> 4, in one transaction; every version stays readable with identical content."""
    d = dialect
    d.begin_write(db)
    try:
        fmt = read_format(d, db)
        if fmt == STORE_FORMAT:  # another process upgraded it while we waited
            d.commit(db)
            return
        if fmt == 2:
            _from_2(d, db)
        _from_3(d, db)
        db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(STORE_FORMAT),))
        db.execute("INSERT INTO meta VALUES ('upgraded', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                   (f"{fmt} -> {STORE_FORMAT} at {now()}",))
        d.commit(db)
    except BaseException:
        d.rollback(db)
        raise
    if fmt == 2:  # give back the space of the duplicated rows; an optimisation, so a busy store just keeps it
        try:
            d.compact(db)
        except DyntcError:
            pass


def _from_3(d: Dialect, db: Any) -> None:
    """Format 3 -> 4: the versions get a ``state`` column, the digest of their label names and
    memberships. Versions committed before keep it empty and are verified as they were (every blob
    and example against its hash); every version committed from now on is covered. The upgrade does
    not compute digests for the old versions: it cannot tell their rows from rows edited since."""
    if "state" not in d.columns(db, "versions"):
        db.execute("ALTER TABLE versions ADD COLUMN state TEXT")


def _from_2(d: Dialect, db: Any) -> None:
    """Format 2 -> 3.

    Format 2 kept one ``examples(id, label, text, point, added, removed[, part])`` row per example and
    version interval. Each row becomes a member (same id, and its id as position, so every version
    reads back in the same order), its text and point a shared content row, each label name one
    label identity whose name rows cover the versions in which the name had examples."""
    for statement in schema_statements(d):
        db.execute(statement)
    has_part = "part" in d.columns(db, "examples")
    label_ids: dict[str, int] = {}
    for (name,) in db.execute("SELECT DISTINCT label FROM examples ORDER BY label").fetchall():
        first = db.execute("SELECT MIN(added) FROM examples WHERE label = ?", (name,)).fetchone()[0]
        label_ids[name] = len(label_ids) + 1
        db.execute("INSERT INTO labels (id, added) VALUES (?, ?)", (label_ids[name], first))
    # each name is alive wherever it had an example: merge its rows' intervals
    intervals = db.execute("SELECT label, added, removed FROM examples GROUP BY label, added, removed "
                           "ORDER BY label, added").fetchall()
    rows, current = [], None
    for name, added, removed in intervals:
        if current and current[0] == name and (current[2] is None or added <= current[2]):
            current[2] = None if current[2] is None or removed is None else max(current[2], removed)
            continue
        if current:
            rows.append(tuple(current))
        current = [name, added, removed]
    if current:
        rows.append(tuple(current))
    db.executemany("INSERT INTO names (id, label, name, added, removed) VALUES (?, ?, ?, ?, ?)",
                   [(i, label_ids[name], name, added, removed)
                    for i, (name, added, removed) in enumerate(rows, 1)])
    contents: dict[bytes, int] = {}
    reader = db.execute(f"SELECT id, label, text, point, added, removed, {'part' if has_part else '0'} "
                        "FROM examples ORDER BY id")
    while batch := reader.fetchmany(2000):
        members, new = [], []
        for id_, name, text, point, added, removed, part in batch:
            key = content_hash(text, bytes(point))
            content = contents.get(key)
            if content is None:
                content = contents[key] = len(contents) + 1
                new.append((content, key, text, point))
            members.append((id_, label_ids[name], content, part, id_, added, removed))
        db.executemany("INSERT INTO contents (id, hash, text, point) VALUES (?, ?, ?, ?)", new)
        db.executemany("INSERT INTO members (id, label, content, part, pos, added, removed) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", members)
    db.execute("DROP TABLE examples")
