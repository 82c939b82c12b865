"""The versioned store at one location (:class:`ModelStore`): opening and creating it, reading a
version back verified against its hashes, the write lock (:class:`~dyntc.classifier.store.transaction.Transaction`),
the versions kept, and pruning. The SQL is written once; the :class:`~dyntc.classifier.store.dialect.Dialect`
supplies what differs between SQLite and PostgreSQL, and callers never ask which backend they have."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dyntc._version import __version__
from dyntc.classifier.store.changes import Changes, changes_since
from dyntc.classifier.store.common import StoreFullError, StoreUnavailableError
from dyntc.classifier.store.dialect import dialect_for, location_of
from dyntc.classifier.store import state as states
from dyntc.classifier.store.schema import (STORE_FORMAT, UPGRADABLE_FORMATS, Snapshot, content_hash, digest, head,
                                           meta, now, points_tensor, read_format, schema_statements)
from dyntc.classifier.store.transaction import Transaction
from dyntc.classifier.store.upgrade import upgrade
from dyntc.errors import DyntcError, VersionNotFoundError, is_int


def is_store(location: str | Path) -> bool:
    """Whether `location` holds a store (a directory with its file; a database schema with its tables)."""
    return dialect_for(location).exists()


class ModelStore:
    """The versioned store at one location. Open with :meth:`open` or :meth:`create`."""

    def __init__(self, location: str | Path):
        if not isinstance(location, (str, Path)) or not str(location):
            raise DyntcError(f"a model location is a directory path or a postgresql:// URL, got {location!r}")
        self.dialect = dialect_for(location)
        self.location = location_of(location)
        self.path = self.dialect.path  # a directory, or the URL without its password
        self.file = getattr(self.dialect, "file", None)  # SQLite's database file (None elsewhere)
        self.where = self.dialect.where

    @property
    def backend(self) -> str:
        return self.dialect.backend

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, location: str | Path) -> "ModelStore":
        """The store at an existing location, with a clear error for anything else. A store of an
        older format is upgraded in place (one transaction: it is either fully upgraded or untouched)."""
        store = cls(location)
        store.dialect.check_openable()
        with store._connect() as db:
            fmt = read_format(store.dialect, db)
            if fmt > STORE_FORMAT:
                raise DyntcError(f"{store.where} is in store format {fmt}, written by a newer dyntc; this dyntc "
                                 f"{__version__} reads formats up to {STORE_FORMAT}: upgrade dyntc to open it")
            if fmt != STORE_FORMAT and fmt not in UPGRADABLE_FORMATS:
                raise DyntcError(f"{store.where} is in store format {fmt}; this dyntc {__version__} reads format "
                                 f"{STORE_FORMAT} (and upgrades {', '.join(map(str, UPGRADABLE_FORMATS))}): "
                                 "use the dyntc version that wrote it")
            if fmt in UPGRADABLE_FORMATS:
                upgrade(store.dialect, db)
            if store.head(db) == 0:
                raise DyntcError(f"{store.where} has no committed version (its first save was interrupted): save again")
        return store

    @classmethod
    def create(cls, location: str | Path) -> "ModelStore":
        """A new, empty store at `location` (a directory, created if needed, that must not hold
        anything else; or a database schema, created if needed)."""
        store = cls(location)
        store.dialect.prepare_create()
        d = store.dialect
        with store._connect(create=True) as db:
            d.begin_write(db)
            try:
                for statement in schema_statements(d):
                    db.execute(statement)
                for key, value in (("format", str(STORE_FORMAT)), ("store_id", uuid.uuid4().hex), ("created", now())):
                    db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING", (key, value))
                d.commit(db)
            except BaseException:
                d.rollback(db)
                raise
        return store

    @contextmanager
    def _connect(self, *, create: bool = False) -> Iterator[Any]:
        """A connection in autocommit mode (transactions are explicit); the driver's errors become
        dyntc's (:meth:`Dialect.error`)."""
        d = self.dialect
        try:
            with d.connect(create=create) as db:
                yield db
        except d.driver_error as exc:
            raise d.error(exc) from exc

    def head_version(self) -> int:
        """The newest committed version (one cheap query; never waits for a writer)."""
        with self._connect() as db:
            return self.head(db)

    def check(self) -> None:
        """Raise :class:`StoreUnavailableError` unless the store is there and readable; cheap, for
        health probes."""
        self.dialect.check()
        with self._connect() as db:
            db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()

    def size_bytes(self) -> int:
        """The store's size on disk (SQLite: the file and its log; PostgreSQL: the schema's tables,
        indexes and TOAST)."""
        with self._connect() as db:
            return self.dialect.size_bytes(db)

    def follow(self, stop: threading.Event, on_change: Callable[[], None]) -> None:
        """Call `on_change` whenever another process may have committed a version, until `stop` is
        set (run it in a thread): at once on a PostgreSQL notification (or every ``POLL_S`` while the
        listening connection is down), every ``POLL_S`` with SQLite. Errors of `on_change` are ignored
        (it is called again on the next change)."""
        self.dialect.follow(stop, on_change)

    # ---------------------------------------------------------------- reading

    head = staticmethod(head)  # the newest version, read through a connection the caller holds

    def _missing(self, db: Any, version: object) -> DyntcError:
        head = self.head(db)
        first = db.execute("SELECT COALESCE(MIN(id), 1) FROM versions").fetchone()[0]
        if is_int(version) and 1 <= version < first:
            return VersionNotFoundError(f"version {version} of {self.path} was pruned; the store keeps versions "
                                        f"{first}..{head}")
        return VersionNotFoundError(f"{self.path} has no version {version!r}; its versions are {first}..{head}")

    def read(self, version: int | None = None, db: Any = None) -> Snapshot:
        """The state of `version` (default: the newest), verified against its hashes."""
        if db is None:
            with self._connect() as db:
                self.dialect.begin_read(db)  # one consistent snapshot across the queries below
                try:
                    return self.read(version, db)
                finally:
                    self.dialect.rollback(db)
        head = self.head(db)
        version = head if version is None else version
        if not is_int(version):
            raise self._missing(db, version)
        row = db.execute("SELECT model, weights, state FROM versions WHERE id = ?", (version,)).fetchone()
        if row is None:
            raise self._missing(db, version)
        document = json.loads(self._blob(db, row[0], f"the model document of version {version}").decode("utf-8"))
        weights = self._blob(db, row[1], f"the weights of version {version}")
        names = dict(db.execute("SELECT label, name FROM names WHERE added <= ? AND (removed IS NULL OR removed > ?)",
                                (version, version)).fetchall())
        rows = db.execute(
            "SELECT m.label, m.pos, m.id, m.part, c.id, c.hash, c.text, c.point FROM members m "
            "JOIN contents c ON c.id = m.content WHERE m.removed IS NULL AND m.added <= ? "
            "UNION ALL SELECT m.label, m.pos, m.id, m.part, c.id, c.hash, c.text, c.point FROM members m "
            "JOIN contents c ON c.id = m.content WHERE m.removed > ? AND m.added <= ?",
            (version, version, version)).fetchall()
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        grouped: dict[str, tuple[list[str], list[bytes], list[int]]] = {}
        state: dict[str, list[tuple[bytes, int]]] = {}  # what the version's digest covers
        checked: set[int] = set()
        for label, _, _, part, content, key, text, point in rows:
            name = names.get(label)
            if name is None:
                raise DyntcError(f"the store is damaged: version {version} has examples of a label without a name; "
                                 "restore an earlier version")
            point = bytes(point)
            if content not in checked:
                if content_hash(text, point) != bytes(key):
                    raise DyntcError(f"the store is damaged: an example of label {name!r} in version {version} does "
                                     f"not match its hash (content {content}); restore a version without it")
                checked.add(content)
            texts, points, parts = grouped.setdefault(name, ([], [], []))
            texts.append(text)
            points.append(point)
            parts.append(part)
            state.setdefault(name, []).append((bytes(key), part))
        dim = document.get("dim", 0)
        labels = {}
        for name, (texts, points, parts) in sorted(grouped.items()):
            tensor = points_tensor(points, dim)
            if not np.isfinite(tensor.numpy()).all():
                raise DyntcError(f"the store is damaged: label {name!r} of version {version} has non-finite points; "
                                 "restore an earlier version")
            labels[name] = (texts, tensor, parts)
        states.check(row[2], states.state_of(state.items()), version)
        return Snapshot(meta(db, "store_id") or "", version, document, weights, row[1], labels)

    @staticmethod
    def _blob(db: Any, key: str, what: str) -> bytes:
        row = db.execute("SELECT data FROM blobs WHERE hash = ?", (key,)).fetchone()
        if row is None:
            raise DyntcError(f"the store is damaged: {what} (blob {key[:12]}) is missing; restore another version")
        data = bytes(row[0])
        if digest(data) != key:
            raise DyntcError(f"the store is damaged: {what} (blob {key[:12]}) does not match its hash; "
                             "restore another version")
        return data

    def versions(self, limit: int | None = None) -> list[dict]:
        """Committed versions still kept, newest first: id, time, operation, detail, label and example counts."""
        sql = "SELECT id, created, op, detail, n_labels, n_examples FROM versions ORDER BY id DESC"
        with self._connect() as db:
            rows = (db.execute(sql) if limit is None else db.execute(sql + " LIMIT ?", (int(limit),))).fetchall()
        return [{"version": v, "created": c, "op": op, "detail": json.loads(d), "n_labels": nl, "n_examples": ne}
                for v, c, op, d, nl, ne in rows]

    def store_id(self) -> str:
        with self._connect() as db:
            return meta(db, "store_id") or ""

    def changes_since(self, store_id: str, since: int) -> "Changes | None":
        """The newest version as its difference to version `since` of store `store_id`
        (:func:`~dyntc.classifier.store.changes.changes_since`); None when a full read is needed."""
        with self._connect() as db:
            self.dialect.begin_read(db)
            try:
                return changes_since(db, store_id, since, self._blob)
            finally:
                self.dialect.rollback(db)

    # ---------------------------------------------------------------- writing

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """The write lock for a read-modify-write: other writers wait (up to ``LOCK_TIMEOUT_S``);
        commits made through the transaction land when the block ends without error, and the other
        processes following the store are told (:meth:`follow`)."""
        d = self.dialect
        with self._connect() as db:
            opened = d.identity()
            d.begin_write(db)
            try:
                txn = Transaction(self, db)
                yield txn
                # SQLite keeps writing to a database file deleted or replaced under it (into the
                # orphaned write-ahead log), so a commit would be acknowledged and then lost.
                if d.identity() != opened:
                    raise StoreUnavailableError(f"the store {self.where} is gone or unreadable (it was deleted or "
                                                "replaced while this write was under way): nothing was committed")
                if txn.committed:
                    d.announce(db, txn.head)  # delivered when (and only if) the commit lands
                d.commit(db)
            except BaseException:
                d.rollback(db)
                raise

    def prune(self, keep: int) -> dict:
        """Delete every version older than the newest `keep`, with every row, content and blob only they
        use, then compact the store. Returns the versions removed, the range kept and the store's bytes
        on disk before and after."""
        if not is_int(keep) or keep < 1:
            raise DyntcError(f"keep must be an integer >= 1 (the newest version is always kept), got {keep!r}")
        d = self.dialect
        with self._connect() as db:
            before = d.size_bytes(db)
            d.begin_write(db)
            try:
                head = self.head(db)
                first = max(1, head - keep + 1)
                removed = db.execute("DELETE FROM versions WHERE id < ?", (first,)).rowcount
                # a row removed at or before the first kept version is alive in no kept version
                db.execute("DELETE FROM names WHERE removed <= ?", (first,))
                db.execute("DELETE FROM members WHERE removed <= ?", (first,))
                db.execute("DELETE FROM labels WHERE id NOT IN (SELECT label FROM names) "
                           "AND id NOT IN (SELECT label FROM members)")
                db.execute("DELETE FROM contents WHERE id NOT IN (SELECT content FROM members)")
                db.execute("DELETE FROM blobs WHERE hash NOT IN (SELECT model FROM versions UNION "
                           "SELECT weights FROM versions)")
                d.commit(db)
            except BaseException:
                d.rollback(db)
                raise
            # Deleted rows only become free pages; compaction (which cannot run inside a transaction)
            # gives them back (SQLite: to the file system; PostgreSQL: for reuse).
            try:
                d.compact(db)
            except StoreFullError as exc:
                raise StoreFullError(f"versions before {first} of {self.where} were deleted, but the file could not "
                                     f"be compacted ({exc.__cause__ or exc}): VACUUM needs free disk space about the "
                                     "size of the store; free some and run prune again") from exc
            after = d.size_bytes(db)
        return {"versions_removed": removed, "kept": [first, head], "bytes_before": before, "bytes_after": after}
