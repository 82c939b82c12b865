"""A classifier's versioned store: every kept version of it, in SQLite (a model directory) or in
PostgreSQL (a ``postgresql://`` URL), with one implementation for both.

Where a store lives (its *location*):

- a directory, ``MODEL_DIR/dyntc.sqlite`` (plus -wal / -shm files while a process has it open): the
  embedded default (:mod:`dyntc.classifier.store.sqlite`);
- ``postgresql://[user[:password]@]host[:port]/database[?model=NAME&...]``: one schema named ``NAME``
  (default ``dyntc``) of a PostgreSQL database, so several models share one database and several
  processes or machines share one model (:mod:`dyntc.classifier.store.postgres`; needs psycopg 3,
  the ``postgres`` extra). Other query parameters go to libpq (``sslmode``, ``connect_timeout``...).

The SQL below is written once; a small dialect object (:class:`Dialect`) supplies what differs:
placeholders (``?``; PostgreSQL's driver gets ``%s``), column types (BLOB / BYTEA), how a reader and
a writer open their transactions (``BEGIN IMMEDIATE``; ``BEGIN`` + ``pg_advisory_xact_lock`` on a
key of the model), the PRAGMAs or per-connection settings, error mapping, size on disk,
compaction, and how other processes learn of a new version (LISTEN/NOTIFY, or polling). Callers
never ask which backend they have. Statements both engines accept (``INSERT ... ON CONFLICT DO
NOTHING``, partial indexes, explicit ids) are used as they are, so nothing is translated but the
placeholders. Every id is chosen explicitly by the writer holding the lock (the largest + 1), so a
store can be copied row for row between backends (:func:`copy_store`, ``dyntc labels copy``).

Tables (store format 3):

- ``blobs(hash, data)``: content-addressed bytes (the weights as safetensors, the model document as
  JSON), keyed by their SHA-256. A version that does not change the weights, which is every label
  operation with a pretrained encoder, stores no new weights.
- ``versions(id, created, op, detail, model, weights, n_labels, n_examples)``: one row per commit.
- ``contents(id, hash, text, point)``: every distinct support example, a text and its point
  (float32, little-endian), keyed by the SHA-256 of both, so no text or point is ever stored twice:
  re-adding, renaming, merging, splitting or restoring refers to the existing row.
- ``labels(id, added)``: a stable label identity, independent of its name.
- ``names(id, label, name, added, removed)``: the name a label has from version ``added`` up to (not
  including) ``removed`` (NULL while current). A rename closes one row and opens one; the label's
  examples are not touched.
- ``members(id, label, content, part, pos, added, removed)``: a content being a support example of a
  label (in its merged-label ``part``, 0 otherwise) from ``added`` up to ``removed``. ``pos`` orders a
  label's examples: a new row gets its own id (so later examples come later); a row re-opened by a
  restore copies the position it had, so the restored label reads back in its old order.

The state of version v is the names alive at v (``added <= v < removed``) joined with the members
alive at v, each label's examples ordered by ``pos``: exactly the texts, points and parts the
classifier committed, in its order. A commit receives each changed label's full new support and
works out the delta itself: the members still there stay, the others are closed, the new ones are
appended; a new name whose support begins with (or equals: a rename) the whole support of a label
removed in the same commit takes over that label's identity. So a version costs bytes in proportion
to what changed (a rename or one added example: a few hundred bytes), and a restore in proportion to
the difference between the head and the restored version.

Reading verifies what it returns: every blob and every content row is re-hashed against its key and
every point must be finite, so a damaged store fails loudly (naming the version and the label or
blob) instead of silently predicting one label for every text. A commit refuses non-finite points.

:meth:`ModelStore.prune` deletes the versions older than the newest few, with every row, content and
blob only they used, and compacts the store (SQLite: VACUUM, so the file really shrinks;
PostgreSQL: VACUUM, so the space is reused). Format-2 stores (SQLite only: one ``examples`` table
holding a full copy of every changed label per version) are upgraded in place when opened.

Why a transactional database rather than rewriting a directory of files: a commit is one
transaction, so a process killed at any point (``kill -9``) leaves either the old or the new
version, never half of one, and an acknowledged commit is durable (SQLite ``synchronous=FULL``;
PostgreSQL's default ``synchronous_commit=on``). Writers take the store's write lock for their whole
read-modify-write (SQLite's ``BEGIN IMMEDIATE``; PostgreSQL's transaction-scoped advisory lock of the
model), so concurrent writers (CLI commands, a library ``save``, any number of HTTP services) are
serialised and none is lost; readers never block (WAL; MVCC). Any earlier kept version can be
restored as a new version.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dyntc._version import __version__
from dyntc.classifier.store.changes import Changes
from dyntc.classifier.store.common import (LOCK_TIMEOUT_S, POLL_S, STORE_FILE, StoreFullError,
                                           StoreUnavailableError, store_file)
from dyntc.errors import DyntcError, is_int

__all__ = ["Changes", "LOCK_TIMEOUT_S", "POLL_S", "STORE_FILE", "STORE_FORMAT", "ModelStore", "Snapshot", "StoreFullError",
           "StoreUnavailableError", "Transaction", "copy_store", "is_store", "is_url", "store_file"]

STORE_FORMAT = 3  # 1: a directory of config.json / support.json / model.safetensors; 2: one examples table
UPGRADABLE_FORMATS = (2,)  # upgraded in place by ModelStore.open

# {int} and {blob} are the dialect's column types
_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data {blob} NOT NULL)",
    """CREATE TABLE IF NOT EXISTS versions (
        id {int} PRIMARY KEY, created TEXT NOT NULL, op TEXT NOT NULL, detail TEXT NOT NULL,
        model TEXT NOT NULL REFERENCES blobs(hash), weights TEXT NOT NULL REFERENCES blobs(hash),
        n_labels {int} NOT NULL, n_examples {int} NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS contents (
        id {int} PRIMARY KEY, hash {blob} NOT NULL UNIQUE, text TEXT NOT NULL, point {blob} NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS labels (id {int} PRIMARY KEY, added {int} NOT NULL)",
    """CREATE TABLE IF NOT EXISTS names (
        id {int} PRIMARY KEY, label {int} NOT NULL REFERENCES labels(id), name TEXT NOT NULL,
        added {int} NOT NULL, removed {int})""",
    """CREATE TABLE IF NOT EXISTS members (
        id {int} PRIMARY KEY, label {int} NOT NULL REFERENCES labels(id),
        content {int} NOT NULL REFERENCES contents(id), part {int} NOT NULL, pos {int} NOT NULL,
        added {int} NOT NULL, removed {int})""",
    # one current label per name; the current names are what a commit starts from
    "CREATE UNIQUE INDEX IF NOT EXISTS names_alive ON names (name) WHERE removed IS NULL",
    # a commit diffs one label's current examples, in order, without touching its history
    "CREATE INDEX IF NOT EXISTS members_alive ON members (label, pos) WHERE removed IS NULL",
    # reading version v visits the rows alive now or removed after v (never the whole history);
    # prune finds the rows removed before the oldest kept version
    "CREATE INDEX IF NOT EXISTS members_removed ON members (removed)",
]

#: The tables in the order a copy fills them (each refers only to those before it), with their columns.
TABLES = {
    "blobs": "hash, data",
    "versions": "id, created, op, detail, model, weights, n_labels, n_examples",
    "contents": "id, hash, text, point",
    "labels": "id, added",
    "names": "id, label, name, added, removed",
    "members": "id, label, content, part, pos, added, removed",
}


class Dialect(Protocol):
    """What differs between the backends; one instance per :class:`ModelStore`."""

    backend: str  #: "sqlite" or "postgresql" (reported by ``/healthz``)
    where: str  #: the store as named in messages (a file, or a URL without its password)
    path: Any  #: the location as given back to callers (a directory, or the URL)
    types: dict[str, str]  #: column types for ``{int}`` and ``{blob}``
    driver_error: type[Exception]  #: the base class of the driver's errors, mapped by :meth:`error`

    def exists(self) -> bool: ...
    def check_openable(self) -> None: ...
    def prepare_create(self) -> None: ...
    def connect(self, *, create: bool = False) -> Any: ...  # context manager -> a connection with execute/executemany
    def begin_read(self, db: Any) -> None: ...
    def begin_write(self, db: Any) -> None: ...
    def commit(self, db: Any) -> None: ...
    def rollback(self, db: Any) -> None: ...
    def has_table(self, db: Any, name: str) -> bool: ...
    def columns(self, db: Any, table: str) -> list[str]: ...
    def not_a_store(self) -> DyntcError: ...
    def error(self, exc: Exception) -> DyntcError: ...
    def identity(self) -> object: ...
    def check(self) -> None: ...
    def size_bytes(self, db: Any) -> int: ...
    def compact(self, db: Any) -> None: ...
    def announce(self, db: Any, version: int) -> None: ...
    def follow(self, stop: threading.Event, on_change: Callable[[], None]) -> None: ...


def is_url(location: object) -> bool:
    return isinstance(location, str) and re.match(r"^postgres(ql)?://", location) is not None


def dialect_for(location: str | Path) -> Dialect:
    """The dialect of a location: a ``postgresql://`` URL, or else a model directory."""
    text = str(location)
    if not is_url(text) and re.match(r"^postgres(ql)?:/[^/]", text):
        # a URL that went through Path(), which folds '//' into '/'
        text = text.replace(":/", "://", 1)
    if is_url(text):
        from dyntc.classifier.store.postgres import PostgresDialect

        return PostgresDialect(text)
    from dyntc.classifier.store.sqlite import SQLiteDialect

    return SQLiteDialect(Path(location))


def location_of(location: str | Path) -> str | Path:
    """`location` as callers get it back: a URL as given, anything else a Path."""
    return location if is_url(str(location)) else Path(location)


@dataclass
class Snapshot:
    """One committed version as read back: what :class:`~dyntc.classifier.DynamicClassifier` rebuilds from."""

    store_id: str
    version: int
    document: dict  # model and encoder config, encoder files, classifier params, calibration
    weights: bytes  # safetensors
    weights_hash: str
    labels: dict[str, tuple[list[str], torch.Tensor, list[int]]]  # label -> (texts, points (n, dim) float32, parts)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _content_hash(text: str, point: bytes) -> bytes:
    """The key of a content row. The text's length comes first so that no (text, point) pair can be
    confused with another whose text ends where the other's point begins."""
    data = text.encode("utf-8")
    return hashlib.sha256(len(data).to_bytes(8, "little") + data + point).digest()


def document_bytes(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, ensure_ascii=False).encode("utf-8")


def _points_array(points: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(points.detach().cpu().numpy(), dtype="<f4")


def _points_tensor(blobs: Sequence[bytes], dim: int) -> torch.Tensor:
    if not blobs:
        return torch.zeros(0, dim)
    return torch.from_numpy(np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), -1).copy())


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
            fmt = store._format(db)
            if fmt > STORE_FORMAT:
                raise DyntcError(f"{store.where} is in store format {fmt}, written by a newer dyntc; this dyntc "
                                 f"{__version__} reads formats up to {STORE_FORMAT}: upgrade dyntc to open it")
            if fmt != STORE_FORMAT and fmt not in UPGRADABLE_FORMATS:
                raise DyntcError(f"{store.where} is in store format {fmt}; this dyntc {__version__} reads format "
                                 f"{STORE_FORMAT} (and upgrades {', '.join(map(str, UPGRADABLE_FORMATS))}): "
                                 "use the dyntc version that wrote it")
            if fmt in UPGRADABLE_FORMATS:
                store._upgrade(db)
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
                for statement in store._schema():
                    db.execute(statement)
                for key, value in (("format", str(STORE_FORMAT)), ("store_id", uuid.uuid4().hex), ("created", _now())):
                    db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING", (key, value))
                d.commit(db)
            except BaseException:
                d.rollback(db)
                raise
        return store

    def _schema(self) -> list[str]:
        return [statement.format(**self.dialect.types) for statement in _SCHEMA]

    def _format(self, db: Any) -> int:
        if not self.dialect.has_table(db, "meta"):
            raise self.dialect.not_a_store()
        fmt = self._meta(db, "format")
        if fmt is None or not fmt.isdigit():
            raise DyntcError(f"{self.where} is not a dyntc store (no store format recorded, got {fmt!r})")
        return int(fmt)

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

    @staticmethod
    def _meta(db: Any, key: str) -> str | None:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

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

    # ---------------------------------------------------------------- upgrading

    def _upgrade(self, db: Any) -> None:
        """Format 2 -> 3, in one transaction; every version stays readable with identical content.

        Format 2 kept one ``examples(id, label, text, point, added, removed[, part])`` row per example and
        version interval. Each row becomes a member (same id, and its id as position, so every version
        reads back in the same order), its text and point a shared content row, each label name one
        label identity whose name rows cover the versions in which the name had examples."""
        d = self.dialect
        d.begin_write(db)
        try:
            if self._format(db) == STORE_FORMAT:  # another process upgraded it while we waited
                d.commit(db)
                return
            for statement in self._schema():
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
                    key = _content_hash(text, bytes(point))
                    content = contents.get(key)
                    if content is None:
                        content = contents[key] = len(contents) + 1
                        new.append((content, key, text, point))
                    members.append((id_, label_ids[name], content, part, id_, added, removed))
                db.executemany("INSERT INTO contents (id, hash, text, point) VALUES (?, ?, ?, ?)", new)
                db.executemany("INSERT INTO members (id, label, content, part, pos, added, removed) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)", members)
            db.execute("DROP TABLE examples")
            db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(STORE_FORMAT),))
            db.execute("INSERT INTO meta VALUES ('upgraded', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       (f"2 -> {STORE_FORMAT} at {_now()}",))
            d.commit(db)
        except BaseException:
            d.rollback(db)
            raise
        try:  # give back the space of the duplicated rows; an optimisation, so a busy store just keeps it
            d.compact(db)
        except DyntcError:
            pass

    # ---------------------------------------------------------------- reading

    @staticmethod
    def head(db: Any) -> int:
        return db.execute("SELECT COALESCE(MAX(id), 0) FROM versions").fetchone()[0]

    def _missing(self, db: Any, version: object) -> DyntcError:
        head = self.head(db)
        first = db.execute("SELECT COALESCE(MIN(id), 1) FROM versions").fetchone()[0]
        if is_int(version) and 1 <= version < first:
            return DyntcError(f"version {version} of {self.path} was pruned; the store keeps versions {first}..{head}")
        return DyntcError(f"{self.path} has no version {version!r}; its versions are {first}..{head}")

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
        row = db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone()
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
        checked: set[int] = set()
        for label, _, _, part, content, key, text, point in rows:
            name = names.get(label)
            if name is None:
                raise DyntcError(f"the store is damaged: version {version} has examples of a label without a name; "
                                 "restore an earlier version")
            point = bytes(point)
            if content not in checked:
                if _content_hash(text, point) != bytes(key):
                    raise DyntcError(f"the store is damaged: an example of label {name!r} in version {version} does "
                                     f"not match its hash (content {content}); restore a version without it")
                checked.add(content)
            texts, points, parts = grouped.setdefault(name, ([], [], []))
            texts.append(text)
            points.append(point)
            parts.append(part)
        dim = document.get("dim", 0)
        labels = {}
        for name, (texts, points, parts) in sorted(grouped.items()):
            tensor = _points_tensor(points, dim)
            if not np.isfinite(tensor.numpy()).all():
                raise DyntcError(f"the store is damaged: label {name!r} of version {version} has non-finite points; "
                                 "restore an earlier version")
            labels[name] = (texts, tensor, parts)
        return Snapshot(self._meta(db, "store_id") or "", version, document, weights, row[1], labels)

    def changes_since(self, store_id: str, since: int) -> "Changes | None":
        """The newest version as its difference to version `since` of store `store_id`
        (:func:`~dyntc.classifier.store.changes.changes_since`); None when a full read is needed."""
        from dyntc.classifier.store.changes import changes_since

        with self._connect() as db:
            self.dialect.begin_read(db)
            try:
                return changes_since(db, store_id, since)
            finally:
                self.dialect.rollback(db)

    @staticmethod
    def _blob(db: Any, key: str, what: str) -> bytes:
        row = db.execute("SELECT data FROM blobs WHERE hash = ?", (key,)).fetchone()
        if row is None:
            raise DyntcError(f"the store is damaged: {what} (blob {key[:12]}) is missing; restore another version")
        data = bytes(row[0])
        if _digest(data) != key:
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
            return self._meta(db, "store_id") or ""

    # ---------------------------------------------------------------- writing

    @contextmanager
    def transaction(self) -> Iterator["Transaction"]:
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


def copy_store(source: str | Path, target: str | Path) -> dict:
    """Copy every kept version of the store at `source` to a new store at `target` (any two locations:
    directory to database, database to directory, database to database...). The copy has the same
    versions, ids, history and bytes and a store id of its own; it is one transaction, verified by
    reading its newest version back before it commits. `target` must not hold a model yet."""
    src = ModelStore.open(source)
    if is_store(target) and ModelStore(target).head_version() > 0:
        raise DyntcError(f"{ModelStore(target).where} already holds a model: copy into a new location")
    dst = ModelStore.create(target)
    counts = {}
    with src._connect() as sdb, dst._connect() as ddb:
        src.dialect.begin_read(sdb)
        dst.dialect.begin_write(ddb)
        try:
            if dst.head(ddb) != 0:
                raise DyntcError(f"{dst.where} was written to while the copy began: copy into a new location")
            for table, columns in TABLES.items():
                n = len(columns.split(","))
                insert = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['?'] * n)})"
                cursor = sdb.execute(f"SELECT {columns} FROM {table} ORDER BY 1")
                counts[table] = 0
                while batch := cursor.fetchmany(1000):
                    ddb.executemany(insert, [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                                             for row in batch])
                    counts[table] += len(batch)
            ddb.execute("INSERT INTO meta VALUES ('copied', ?) ON CONFLICT DO NOTHING",
                        (f"from {src.where} (store {ModelStore._meta(sdb, 'store_id')}) at {_now()}",))
            head = src.head(sdb)
            if head:
                a, b = src.read(head, sdb), dst.read(head, ddb)
                if (a.weights_hash, a.document, sorted(a.labels)) != (b.weights_hash, b.document, sorted(b.labels)) or \
                        any(a.labels[n][0] != b.labels[n][0] or not torch.equal(a.labels[n][1], b.labels[n][1])
                            for n in a.labels):
                    raise DyntcError(f"the copy of {src.where} does not read back equal: nothing was committed")
                dst.dialect.announce(ddb, head)
            dst.dialect.commit(ddb)
        except BaseException:
            dst.dialect.rollback(ddb)
            raise
        finally:
            src.dialect.rollback(sdb)
    first = min((v["version"] for v in dst.versions()), default=0)
    return {"source": src.where, "target": dst.where, "versions": [first, head], "rows": counts}


class Transaction:
    """What a writer holding the lock can do: read the head, commit new versions, restore old ones."""

    def __init__(self, store: ModelStore, db: Any):
        self.store, self.db = store, db
        self.committed = False  # whether a version was written (the others are told when it lands)
        self._next: dict[str, int] = {}

    def _new_id(self, table: str) -> int:
        """The next id of `table` (ids are chosen here, under the lock, the same way on every backend)."""
        if table not in self._next:
            self._next[table] = self.db.execute(f"SELECT COALESCE(MAX(id), 0) + 1 FROM {table}").fetchone()[0]
        self._next[table] += 1
        return self._next[table] - 1

    @property
    def head(self) -> int:
        return ModelStore.head(self.db)

    @property
    def store_id(self) -> str:
        return ModelStore._meta(self.db, "store_id") or ""

    def read(self, version: int | None = None) -> Snapshot:
        return self.store.read(version, self.db)

    def _put(self, data: bytes, known: str | None = None) -> str:
        key = known or _digest(data)
        self.db.execute("INSERT INTO blobs VALUES (?, ?) ON CONFLICT DO NOTHING", (key, data))
        return key

    def has_blob(self, key: str) -> bool:
        return self.db.execute("SELECT 1 FROM blobs WHERE hash = ?", (key,)).fetchone() is not None

    # ------------------------------------------------------------ helpers

    def _alive_members(self, label: int) -> list[tuple[int, int, int]]:
        """``(member id, content id, part)`` of a label's current examples, in order."""
        return self.db.execute("SELECT id, content, part FROM members WHERE label = ? AND removed IS NULL "
                               "ORDER BY pos, id", (label,)).fetchall()

    def _content_ids(self, name: str, support: tuple[Sequence[str], torch.Tensor, Sequence[int]],
                     cache: dict[bytes, int]) -> list[tuple[int, int]]:
        """``(content id, part)`` per example of a support, adding the contents not stored yet."""
        texts, points, parts = support
        array = _points_array(points)
        if array.ndim != 2 or len(array) != len(texts) or len(parts) != len(texts):
            raise DyntcError(f"label {name!r}: {len(texts)} texts, points of shape {tuple(array.shape)} and "
                             f"{len(parts)} parts do not match; nothing was committed")
        out = []
        for text, point, part in zip(texts, array, parts):
            blob = point.tobytes()
            key = _content_hash(text, blob)
            content = cache.get(key)
            if content is None:
                row = self.db.execute("SELECT id FROM contents WHERE hash = ?", (key,)).fetchone()
                if row:
                    content = row[0]
                else:
                    content = self._new_id("contents")
                    self.db.execute("INSERT INTO contents (id, hash, text, point) VALUES (?, ?, ?, ?)",
                                    (content, key, text, blob))
                cache[key] = content
            out.append((content, int(part)))
        return out

    def _finish(self, version: int, op: str, detail: object, model_key: str, weights_key: str) -> int:
        n_labels = self.db.execute("SELECT COUNT(*) FROM names WHERE removed IS NULL").fetchone()[0]
        n_examples = self.db.execute("SELECT COUNT(*) FROM members WHERE removed IS NULL").fetchone()[0]
        self.db.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (version, _now(), op, json.dumps(detail, ensure_ascii=False), model_key, weights_key,
                         n_labels, n_examples))
        self.committed = True
        return version

    # ------------------------------------------------------------ commit

    def commit(
        self,
        *,
        op: str,
        detail: object,
        document: dict,
        weights: bytes | str,
        labels: Mapping[str, tuple[Sequence[str], torch.Tensor, Sequence[int]] | None],
        replace_all: bool,
    ) -> int:
        """Write a new version; returns its id.

        `labels` maps each changed label to its full new support ``(texts, points, parts)``, or to None if
        it no longer exists; with `replace_all` every other label is removed too. `weights` is the
        safetensors bytes, or the hash of weights already in the store. Only the difference to the
        head is written (see the module docstring)."""
        for name, support in labels.items():  # refuse before anything is written
            if support is not None and not np.isfinite(_points_array(support[1])).all():
                raise DyntcError(f"label {name!r} has non-finite points (inf or nan): nothing was committed")
        db = self.db
        version = self.head + 1
        model_key = self._put(document_bytes(document))
        if isinstance(weights, str):
            if not self.has_blob(weights):
                raise DyntcError(f"weights {weights[:12]} are not in the store")
            weights_key = weights
        else:
            weights_key = self._put(weights)

        alive: dict[str, int] = dict(db.execute("SELECT name, label FROM names WHERE removed IS NULL").fetchall())
        cache: dict[bytes, int] = {}
        # an empty support is no label (as it reads back): treat it as removed
        targets = {name: self._content_ids(name, support, cache)
                   for name, support in labels.items() if support is not None and len(support[0])}
        gone = [name for name in alive if name not in targets and (replace_all or name in labels)]

        # A new name that begins with the whole current support of a label removed in this commit
        # takes over that label (a rename: equal supports; rename + add, or a merge: a prefix).
        reuse: dict[str, int] = {}
        gone_members = {name: self._alive_members(alive[name]) for name in gone} if set(targets) - set(alive) else {}
        for name, seq in targets.items():
            if name in alive:
                continue
            best = None
            for old, members in gone_members.items():
                if alive[old] in reuse.values() or len(members) > len(seq):
                    continue
                if [(c, p) for _, c, p in members] == seq[:len(members)] and (
                        best is None or len(members) > len(gone_members[best])):
                    best = old
            if best is not None:
                reuse[name] = alive[best]

        closed_names = [(version, alive[name]) for name in gone]
        db.executemany("UPDATE names SET removed = ? WHERE label = ? AND removed IS NULL", closed_names)
        reused = set(reuse.values())
        db.executemany("UPDATE members SET removed = ? WHERE label = ? AND removed IS NULL",
                       [(version, alive[name]) for name in gone if alive[name] not in reused])

        closed, added = [], []
        for name, seq in targets.items():
            if name in alive or name in reuse:
                label = alive.get(name) or reuse[name]
                members = self._alive_members(label)
                # keep the longest prefix of the new support found in order among the current
                # examples; close the rest; append what follows (the order is the classifier's)
                k = j = 0
                kept = set()
                while k < len(seq):
                    i = j
                    while i < len(members) and (members[i][1], members[i][2]) != seq[k]:
                        i += 1
                    if i == len(members):
                        break
                    kept.add(members[i][0])
                    j, k = i + 1, k + 1
                closed += [(version, m[0]) for m in members if m[0] not in kept]
                if name in reuse:
                    db.execute("INSERT INTO names (id, label, name, added) VALUES (?, ?, ?, ?)",
                               (self._new_id("names"), label, name, version))
            else:
                label = self._new_id("labels")
                db.execute("INSERT INTO labels (id, added) VALUES (?, ?)", (label, version))
                db.execute("INSERT INTO names (id, label, name, added) VALUES (?, ?, ?, ?)",
                           (self._new_id("names"), label, name, version))
                k = 0
            for content, part in seq[k:]:
                member = self._new_id("members")
                added.append((member, label, content, part, member, version))
        db.executemany("UPDATE members SET removed = ? WHERE id = ?", closed)
        db.executemany("INSERT INTO members (id, label, content, part, pos, added) VALUES (?, ?, ?, ?, ?, ?)", added)
        return self._finish(version, op, detail, model_key, weights_key)

    # ------------------------------------------------------------ restore

    def restore(self, version: int) -> int:
        """Make the state of an earlier `version` the newest, as a new version; returns its id.

        Writes only the difference: names and members alive at `version` but not now are re-opened
        (a member as a copy keeping its position, so the order is the old one), those alive now but not
        then are closed; contents are shared, never copied."""
        db = self.db
        row = db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone() \
            if is_int(version) else None
        if row is None:
            raise self.store._missing(db, version)
        new = self.head + 1
        then = dict(db.execute("SELECT label, name FROM names WHERE added <= ? AND (removed IS NULL OR removed > ?)",
                               (version, version)).fetchall())
        now = dict(db.execute("SELECT label, name FROM names WHERE removed IS NULL").fetchall())
        db.executemany("UPDATE names SET removed = ? WHERE label = ? AND removed IS NULL",
                       [(new, label) for label, name in now.items() if then.get(label) != name])
        db.executemany("INSERT INTO names (id, label, name, added) VALUES (?, ?, ?, ?)",
                       [(self._new_id("names"), label, name, new) for label, name in then.items()
                        if now.get(label) != name])
        was = {r[0]: r[1:] for r in db.execute(
            "SELECT id, label, content, part, pos FROM members WHERE removed IS NULL AND added <= ? UNION ALL "
            "SELECT id, label, content, part, pos FROM members WHERE removed > ? AND added <= ?",
            (version, version, version))}
        current = {r[0] for r in db.execute("SELECT id FROM members WHERE removed IS NULL")}
        db.executemany("UPDATE members SET removed = ? WHERE id = ?", [(new, m) for m in current if m not in was])
        db.executemany("INSERT INTO members (id, label, content, part, pos, added) VALUES (?, ?, ?, ?, ?, ?)",
                       [(self._new_id("members"), *was[m], new) for m in sorted(was) if m not in current])
        return self._finish(new, "restore", {"version": version}, row[0], row[1])
