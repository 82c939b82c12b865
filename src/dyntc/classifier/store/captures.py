"""Texts a service could not place, kept in the model's store so that every replica of a model adds
to, and reads, one inbox.

One table of the store's schema (:mod:`~dyntc.classifier.store.schema`; a store made before it gets it
from the first service that captures):
``captures(hash, text, reason, label, margin, seen, first_seen, last_seen)``: one row per distinct
text (keyed by its SHA-256), how many times it was seen, why it was captured (``rejected``: farther
than the calibrated threshold from every label; ``low-margin``: the two best labels nearly tied),
the label the service answered and the probability margin between its two best labels. Times are
seconds since the epoch. The table is bounded: rows older than ``max_age_s`` (by their last
sighting) and all but the ``max_count`` most recently seen are deleted on every write. It is not
part of a version: restoring a version or copying a store leaves it alone, and ``prune`` does not
touch it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from dyntc.classifier.store import ModelStore
from dyntc.classifier.store.schema import CAPTURES_SCHEMA
from dyntc.errors import DyntcError, is_int, is_number

_COLUMNS = "text, reason, label, margin, seen, first_seen, last_seen"


@dataclass(frozen=True)
class Captured:
    """One sighting of a text the service could not place."""

    text: str
    reason: str  # "rejected" or "low-margin"
    label: str | None
    margin: float


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class CaptureLog:
    """The captured texts of the model in `store`, at most `max_count` of them, none older than
    `max_age_s` seconds."""

    def __init__(self, store: ModelStore, max_count: int, max_age_s: float):
        if not (is_int(max_count) and max_count >= 1):
            raise DyntcError(f"the capture count must be an integer >= 1, got {max_count!r} (option --capture)")
        if not (is_number(max_age_s) and max_age_s > 0):
            raise DyntcError(f"the capture age must be a number of days > 0, got {max_age_s!r} (option --capture-days)")
        self.store, self.max_count, self.max_age_s = store, max_count, float(max_age_s)

    def _exists(self, db) -> bool:
        return self.store.dialect.has_table(db, "captures")

    def _write(self, statements: Sequence[tuple[str, Sequence]]) -> None:
        """Run `statements` in one transaction, creating the table first if needed, then bound it."""
        d = self.store.dialect
        now = time.time()
        with self.store._connect() as db:
            if not self._exists(db):
                for statement in CAPTURES_SCHEMA:
                    db.execute(statement.format(**d.types))
            d.begin_write(db)
            try:
                for sql, params in statements:
                    if params and isinstance(params[0], tuple):
                        db.executemany(sql, params)
                    else:
                        db.execute(sql, params)
                db.execute("DELETE FROM captures WHERE last_seen < ?", (now - self.max_age_s,))
                db.execute("DELETE FROM captures WHERE hash NOT IN (SELECT hash FROM captures "
                           "ORDER BY last_seen DESC, hash LIMIT ?)", (self.max_count,))
                d.commit(db)
            except BaseException:
                d.rollback(db)
                raise

    def add(self, sightings: Sequence[Captured]) -> None:
        """Record `sightings` (a text seen again counts once more and moves to the front)."""
        if not sightings:
            return
        now = time.time()
        rows = tuple((_key(s.text), s.text, s.reason, s.label, s.margin, now, now) for s in sightings)
        self._write([(
            "INSERT INTO captures (hash, text, reason, label, margin, seen, first_seen, last_seen) "
            "VALUES (?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT (hash) DO UPDATE SET seen = captures.seen + 1, "
            "reason = excluded.reason, label = excluded.label, margin = excluded.margin, "
            "last_seen = excluded.last_seen", rows)])

    def read(self, offset: int = 0, limit: int = 100) -> tuple[list[dict], int]:
        """Captured texts, most recently seen first, from `offset` (at most `limit`), and how many in all."""
        cutoff = time.time() - self.max_age_s
        with self.store._connect() as db:
            if not self._exists(db):
                return [], 0
            total = db.execute("SELECT COUNT(*) FROM captures WHERE last_seen >= ?", (cutoff,)).fetchone()[0]
            rows = db.execute(f"SELECT {_COLUMNS} FROM captures WHERE last_seen >= ? ORDER BY last_seen DESC, hash "
                              "LIMIT ? OFFSET ?", (cutoff, min(int(limit), self.max_count), int(offset))).fetchall()
        return [dict(zip(_COLUMNS.split(", "), row)) for row in rows], total

    def texts(self) -> list[str]:
        """Every captured text, most seen first."""
        cutoff = time.time() - self.max_age_s
        with self.store._connect() as db:
            if not self._exists(db):
                return []
            return [t for (t,) in db.execute("SELECT text FROM captures WHERE last_seen >= ? ORDER BY seen DESC, "
                                             "last_seen DESC LIMIT ?", (cutoff, self.max_count)).fetchall()]

    def remove(self, texts: Sequence[str] | None = None) -> None:
        """Forget `texts` (all captured texts when None)."""
        if texts is None:
            self._write([("DELETE FROM captures", ())])
        elif texts:
            self._write([("DELETE FROM captures WHERE hash = ?", tuple((_key(t),) for t in texts))])
