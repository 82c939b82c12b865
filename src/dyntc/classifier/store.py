"""A classifier on disk: one SQLite database holding every kept version of it.

Layout of a model directory::

    MODEL_DIR/dyntc.sqlite    (plus -wal / -shm files while a process has it open)

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
blob only they used, and VACUUMs, so the file really shrinks. Format-2 stores (one ``examples`` table
holding a full copy of every changed label per version) are upgraded in place when opened.

Why SQLite rather than rewriting a directory of files: a commit is one transaction, so a process
killed at any point (``kill -9``) leaves either the old or the new version, never half of one, and
an acknowledged commit is on disk (``synchronous=FULL``). Writers take the database's write lock
(``BEGIN IMMEDIATE``) for their whole read-modify-write, so concurrent writers (CLI commands, a
library ``save``, the HTTP service) are serialised and none is lost; readers never block (WAL).
Any earlier kept version can be restored as a new version.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import numpy as np
import torch

from dyntc import __version__
from dyntc.errors import DyntcError, is_int

STORE_FORMAT = 3  # 1: a directory of config.json / support.json / model.safetensors; 2: one examples table
UPGRADABLE_FORMATS = (2,)  # upgraded in place by ModelStore.open
STORE_FILE = "dyntc.sqlite"
LOCK_TIMEOUT_S = 60.0  # how long a writer waits for another writer before failing loudly
_SQLITE_HEADER = b"SQLite format 3\x00"

_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL)",
    """CREATE TABLE IF NOT EXISTS versions (
        id INTEGER PRIMARY KEY, created TEXT NOT NULL, op TEXT NOT NULL, detail TEXT NOT NULL,
        model TEXT NOT NULL REFERENCES blobs(hash), weights TEXT NOT NULL REFERENCES blobs(hash),
        n_labels INTEGER NOT NULL, n_examples INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS contents (
        id INTEGER PRIMARY KEY, hash BLOB NOT NULL UNIQUE, text TEXT NOT NULL, point BLOB NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS labels (id INTEGER PRIMARY KEY, added INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS names (
        id INTEGER PRIMARY KEY, label INTEGER NOT NULL REFERENCES labels(id), name TEXT NOT NULL,
        added INTEGER NOT NULL, removed INTEGER)""",
    """CREATE TABLE IF NOT EXISTS members (
        id INTEGER PRIMARY KEY, label INTEGER NOT NULL REFERENCES labels(id),
        content INTEGER NOT NULL REFERENCES contents(id), part INTEGER NOT NULL, pos INTEGER NOT NULL,
        added INTEGER NOT NULL, removed INTEGER)""",
    # one current label per name; the current names are what a commit starts from
    "CREATE UNIQUE INDEX IF NOT EXISTS names_alive ON names (name) WHERE removed IS NULL",
    # a commit diffs one label's current examples, in order, without touching its history
    "CREATE INDEX IF NOT EXISTS members_alive ON members (label, pos) WHERE removed IS NULL",
    # reading version v visits the rows alive now or removed after v (never the whole history);
    # prune finds the rows removed before the oldest kept version
    "CREATE INDEX IF NOT EXISTS members_removed ON members (removed)",
]


class StoreFullError(DyntcError):
    """The disk (or the store's size limit) is full: the write was rolled back, nothing was committed."""


class StoreUnavailableError(DyntcError):
    """The store file is gone or cannot be read (deleted, moved, unmounted, permissions)."""


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


def store_file(path: str | Path) -> Path:
    return Path(path) / STORE_FILE


def is_store(path: str | Path) -> bool:
    return store_file(path).is_file()


def _file_bytes(file: Path) -> int:
    """The store's size on disk: the database file and its write-ahead log."""
    return sum(p.stat().st_size for p in (file, file.with_name(file.name + "-wal")) if p.exists())


def _rollback(db: sqlite3.Connection) -> None:
    # After some errors (SQLITE_FULL, I/O errors) SQLite has already rolled the transaction back, and a
    # second ROLLBACK would raise and hide the error that matters.
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # closing the connection rolls back whatever is left


class ModelStore:
    """The versioned store of one model directory. Open with :meth:`open` or :meth:`create`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = store_file(path)

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | Path) -> "ModelStore":
        """The store of an existing model directory, with a clear error for anything else. A store of
        an older format is upgraded in place (one transaction: it is either fully upgraded or untouched)."""
        path = Path(path)
        if not path.is_dir():
            raise DyntcError(f"model directory {str(path)!r} does not exist: create one with `dyntc fit` "
                             "or DynamicClassifier.save")
        if not store_file(path).is_file():
            if (path / "config.json").is_file() and (path / "support.json").is_file():
                raise DyntcError(f"{path} holds a classifier in the old directory format (format 1, before versioned "
                                 "stores and calibration): fit it again with this dyntc and save it")
            if (path / "config.json").is_file():
                raise DyntcError(f"{path} holds a model saved by `dyntc train`, not a DynamicClassifier: "
                                 "train one with `dyntc fit` or DynamicClassifier.fit")
            raise DyntcError(f"{path} is not a dyntc model directory (no {STORE_FILE}): "
                             "create one with `dyntc fit` or DynamicClassifier.save")
        store = cls(path)
        store._check_header()
        with store._connect() as db:
            fmt = store._format(db)
            if fmt > STORE_FORMAT:
                raise DyntcError(f"{store.file} is in store format {fmt}, written by a newer dyntc; this dyntc "
                                 f"{__version__} reads formats up to {STORE_FORMAT}: upgrade dyntc to open it")
            if fmt != STORE_FORMAT and fmt not in UPGRADABLE_FORMATS:
                raise DyntcError(f"{store.file} is in store format {fmt}; this dyntc {__version__} reads format "
                                 f"{STORE_FORMAT} (and upgrades {', '.join(map(str, UPGRADABLE_FORMATS))}): "
                                 "use the dyntc version that wrote it")
            if fmt in UPGRADABLE_FORMATS:
                store._upgrade(db)
            if store.head(db) == 0:
                raise DyntcError(f"{store.file} has no committed version (its first save was interrupted): save again")
        return store

    @classmethod
    def create(cls, path: str | Path) -> "ModelStore":
        """A new, empty store in directory `path` (created if needed; must not hold another model)."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise DyntcError(f"{path} exists and is not a directory: choose another model path")
        if path.is_dir() and not is_store(path) and any(path.iterdir()):
            raise DyntcError(f"{path} exists and is not an empty directory or a dyntc model: "
                             "choose another path or empty it")
        path.mkdir(parents=True, exist_ok=True)
        store = cls(path)
        with store._connect(create=True) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(STORE_FORMAT),))
                db.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,))
                db.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (_now(),))
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
        return store

    def _check_header(self) -> None:
        """Refuse files SQLite would take for an empty database (a 0-byte file) or misread."""
        try:
            with open(self.file, "rb") as f:
                header = f.read(len(_SQLITE_HEADER))
        except FileNotFoundError as exc:
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable ({exc.strerror})") from exc
        except OSError as exc:
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable ({exc})") from exc
        if not header:
            raise DyntcError(f"{self.file} is not a dyntc store (the file is empty, maybe from an interrupted "
                             "first save): delete it and save again")
        if header != _SQLITE_HEADER:
            raise DyntcError(f"{self.file} is damaged or not a dyntc store (not an SQLite database)")

    def _format(self, db: sqlite3.Connection) -> int:
        if db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
            raise DyntcError(f"{self.file} is not a dyntc store (an SQLite database without dyntc's tables)")
        fmt = self._meta(db, "format")
        if fmt is None or not fmt.isdigit():
            raise DyntcError(f"{self.file} is not a dyntc store (no store format recorded, got {fmt!r})")
        return int(fmt)

    @contextmanager
    def _connect(self, *, create: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode (transactions are explicit), closed afterwards.

        One connection per operation: cheap with SQLite, and safe across threads and processes. The
        file is opened without ``create`` (except by :meth:`create`): a store deleted while a process
        uses it must fail as gone, not silently come back as an empty database."""
        if not create and not self.file.is_file():
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable (it no longer exists): "
                                        "nothing was read or written")
        uri = f"file:{quote(str(self.file.absolute()))}?mode={'rwc' if create else 'rw'}"
        try:
            db = sqlite3.connect(uri, uri=True, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._error(exc) from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # an acknowledged commit survives power loss too
            yield db
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from exc
        finally:
            db.close()

    def _error(self, exc: sqlite3.Error) -> DyntcError:
        """The user-facing error for an SQLite failure: what happened and what to do."""
        code = getattr(exc, "sqlite_errorcode", None)
        primary = None if code is None else code & 0xFF
        if primary == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc):
            return StoreFullError(f"the disk holding {self.file} is full ({exc}): nothing was committed, the store "
                                  "still holds its previous version; free some space (or prune old versions with "
                                  "`dyntc labels prune`) and try again")
        if primary == sqlite3.SQLITE_BUSY or (isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)):
            return DyntcError(f"{self.file} stayed locked by another writer for {LOCK_TIMEOUT_S:.0f}s; "
                              "try again when it is done")
        if (primary in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH)
                or code == getattr(sqlite3, "SQLITE_READONLY_DBMOVED", 1032) or not self.file.is_file()):
            return StoreUnavailableError(f"the store {self.file} is gone or unreadable ({exc}): nothing was "
                                         "committed; check that the model directory is still there and readable")
        if primary == sqlite3.SQLITE_READONLY:
            return DyntcError(f"{self.file} is read-only ({exc}): nothing was committed; make it writable to change it")
        return DyntcError(f"{self.file} is damaged or not a dyntc store ({exc})")

    def _identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.file)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    @staticmethod
    def _meta(db: sqlite3.Connection, key: str) -> str | None:
        try:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    def head_version(self) -> int:
        """The newest committed version (one cheap query; never waits for a writer)."""
        with self._connect() as db:
            return self.head(db)

    def check(self) -> None:
        """Raise :class:`StoreUnavailableError` unless the store file is there and readable; cheap (a
        stat and one indexed query), for health probes."""
        if not self.file.is_file() or not os.access(self.file, os.R_OK):
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable")
        with self._connect() as db:
            db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()

    # ---------------------------------------------------------------- upgrading

    def _upgrade(self, db: sqlite3.Connection) -> None:
        """Format 2 -> 3, in one transaction; every version stays readable with identical content.

        Format 2 kept one ``examples(id, label, text, point, added, removed[, part])`` row per example and
        version interval. Each row becomes a member (same id, and its id as position, so every version
        reads back in the same order), its text and point a shared content row, each label name one
        label identity whose name rows cover the versions in which the name had examples."""
        db.execute("BEGIN IMMEDIATE")
        try:
            if self._format(db) == STORE_FORMAT:  # another process upgraded it while we waited
                db.execute("COMMIT")
                return
            for statement in _SCHEMA:
                db.execute(statement)
            has_part = any(row[1] == "part" for row in db.execute("PRAGMA table_info(examples)"))
            label_ids: dict[str, int] = {}
            for (name,) in db.execute("SELECT DISTINCT label FROM examples ORDER BY label").fetchall():
                first = db.execute("SELECT MIN(added) FROM examples WHERE label = ?", (name,)).fetchone()[0]
                label_ids[name] = db.execute("INSERT INTO labels (added) VALUES (?)", (first,)).lastrowid
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
            db.executemany("INSERT INTO names (label, name, added, removed) VALUES (?, ?, ?, ?)",
                           [(label_ids[name], name, added, removed) for name, added, removed in rows])
            contents: dict[bytes, int] = {}
            reader = db.execute(f"SELECT id, label, text, point, added, removed, {'part' if has_part else '0'} "
                                "FROM examples ORDER BY id")
            while batch := reader.fetchmany(2000):
                members = []
                for id_, name, text, point, added, removed, part in batch:
                    key = _content_hash(text, bytes(point))
                    content = contents.get(key)
                    if content is None:
                        content = contents[key] = db.execute(
                            "INSERT INTO contents (hash, text, point) VALUES (?, ?, ?)", (key, text, point)).lastrowid
                    members.append((id_, label_ids[name], content, part, id_, added, removed))
                db.executemany("INSERT INTO members (id, label, content, part, pos, added, removed) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)", members)
            db.execute("DROP TABLE examples")
            db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(STORE_FORMAT),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('upgraded', ?)", (f"2 -> {STORE_FORMAT} at {_now()}",))
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        try:  # give back the space of the duplicated rows; an optimisation, so a busy store just keeps it
            db.execute("VACUUM")
        except sqlite3.OperationalError:
            pass

    # ---------------------------------------------------------------- reading

    @staticmethod
    def head(db: sqlite3.Connection) -> int:
        return db.execute("SELECT COALESCE(MAX(id), 0) FROM versions").fetchone()[0]

    def _missing(self, db: sqlite3.Connection, version: object) -> DyntcError:
        head = self.head(db)
        first = db.execute("SELECT COALESCE(MIN(id), 1) FROM versions").fetchone()[0]
        if is_int(version) and 1 <= version < first:
            return DyntcError(f"version {version} of {self.path} was pruned; the store keeps versions {first}..{head}")
        return DyntcError(f"{self.path} has no version {version!r}; its versions are {first}..{head}")

    def read(self, version: int | None = None, db: sqlite3.Connection | None = None) -> Snapshot:
        """The state of `version` (default: the newest), verified against its hashes."""
        if db is None:
            with self._connect() as db:
                db.execute("BEGIN")  # one consistent snapshot across the queries below
                try:
                    return self.read(version, db)
                finally:
                    _rollback(db)
        head = self.head(db)
        version = head if version is None else version
        row = db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone()
        if row is None:
            raise self._missing(db, version)
        document = json.loads(self._blob(db, row[0], f"the model document of version {version}").decode("utf-8"))
        weights = self._blob(db, row[1], f"the weights of version {version}")
        names = dict(db.execute("SELECT label, name FROM names WHERE added <= ?1 AND (removed IS NULL OR removed > ?1)",
                                (version,)).fetchall())
        rows = db.execute(
            "SELECT m.label, m.pos, m.id, m.part, c.id, c.hash, c.text, c.point FROM members m "
            "JOIN contents c ON c.id = m.content WHERE m.removed IS NULL AND m.added <= ?1 "
            "UNION ALL SELECT m.label, m.pos, m.id, m.part, c.id, c.hash, c.text, c.point FROM members m "
            "JOIN contents c ON c.id = m.content WHERE m.removed > ?1 AND m.added <= ?1", (version,)).fetchall()
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

    @staticmethod
    def _blob(db: sqlite3.Connection, key: str, what: str) -> bytes:
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
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, created, op, detail, n_labels, n_examples FROM versions ORDER BY id DESC LIMIT ?",
                (-1 if limit is None else int(limit),),
            ).fetchall()
        return [{"version": v, "created": c, "op": op, "detail": json.loads(d), "n_labels": nl, "n_examples": ne}
                for v, c, op, d, nl, ne in rows]

    def store_id(self) -> str:
        with self._connect() as db:
            return self._meta(db, "store_id") or ""

    # ---------------------------------------------------------------- writing

    @contextmanager
    def transaction(self) -> Iterator["Transaction"]:
        """The write lock for a read-modify-write: other writers wait (up to ``LOCK_TIMEOUT_S``);
        commits made through the transaction land when the block ends without error."""
        with self._connect() as db:
            opened = self._identity()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self, db)
                # SQLite keeps writing to a database file deleted or replaced under it (into the
                # orphaned write-ahead log), so a commit would be acknowledged and then lost.
                if self._identity() != opened:
                    raise StoreUnavailableError(f"the store {self.file} is gone or unreadable (it was deleted or "
                                                "replaced while this write was under way): nothing was committed")
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

    def prune(self, keep: int) -> dict:
        """Delete every version older than the newest `keep`, with every row, content and blob only they
        use, then VACUUM so the file shrinks. Returns the versions removed, the range kept and the
        store's bytes on disk before and after."""
        if not is_int(keep) or keep < 1:
            raise DyntcError(f"keep must be an integer >= 1 (the newest version is always kept), got {keep!r}")
        before = _file_bytes(self.file)
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                head = self.head(db)
                first = max(1, head - keep + 1)
                removed = db.execute("DELETE FROM versions WHERE id < ?", (first,)).rowcount
                # a row removed at or before the first kept version is alive in no kept version
                db.execute("DELETE FROM names WHERE removed <= ?", (first,))
                db.execute("DELETE FROM members WHERE removed <= ?", (first,))
                db.execute("DELETE FROM labels WHERE id NOT IN (SELECT label FROM names)")
                db.execute("DELETE FROM contents WHERE id NOT IN (SELECT content FROM members)")
                db.execute("DELETE FROM blobs WHERE hash NOT IN (SELECT model FROM versions UNION "
                           "SELECT weights FROM versions)")
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise
            # Deleted rows only become free pages; VACUUM (which cannot run inside a transaction)
            # rewrites the file without them, and the checkpoint moves that into the file and empties
            # the write-ahead log.
            try:
                db.execute("VACUUM")
            except sqlite3.DatabaseError as exc:
                if self._error(exc).__class__ is not StoreFullError:
                    raise
                raise StoreFullError(f"versions before {first} of {self.file} were deleted, but the file could not "
                                     f"be compacted ({exc}): VACUUM needs free disk space about the size of the "
                                     "store; free some and run prune again") from exc
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {"versions_removed": removed, "kept": [first, head], "bytes_before": before,
                "bytes_after": _file_bytes(self.file)}


class Transaction:
    """What a writer holding the lock can do: read the head, commit new versions, restore old ones."""

    def __init__(self, store: ModelStore, db: sqlite3.Connection):
        self.store, self.db = store, db

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
        self.db.execute("INSERT OR IGNORE INTO blobs VALUES (?, ?)", (key, data))
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
                content = row[0] if row else self.db.execute(
                    "INSERT INTO contents (hash, text, point) VALUES (?, ?, ?)", (key, text, blob)).lastrowid
                cache[key] = content
            out.append((content, int(part)))
        return out

    def _finish(self, version: int, op: str, detail: object, model_key: str, weights_key: str) -> int:
        n_labels = self.db.execute("SELECT COUNT(*) FROM names WHERE removed IS NULL").fetchone()[0]
        n_examples = self.db.execute("SELECT COUNT(*) FROM members WHERE removed IS NULL").fetchone()[0]
        self.db.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (version, _now(), op, json.dumps(detail, ensure_ascii=False), model_key, weights_key,
                         n_labels, n_examples))
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

        next_id = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM members").fetchone()[0]
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
                    db.execute("INSERT INTO names (label, name, added) VALUES (?, ?, ?)", (label, name, version))
            else:
                label = db.execute("INSERT INTO labels (added) VALUES (?)", (version,)).lastrowid
                db.execute("INSERT INTO names (label, name, added) VALUES (?, ?, ?)", (label, name, version))
                k = 0
            for content, part in seq[k:]:
                added.append((next_id, label, content, part, next_id, version))
                next_id += 1
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
        row = db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone()
        if row is None:
            raise self.store._missing(db, version)
        new = self.head + 1
        then = dict(db.execute("SELECT label, name FROM names WHERE added <= ?1 AND (removed IS NULL OR removed > ?1)",
                               (version,)).fetchall())
        now = dict(db.execute("SELECT label, name FROM names WHERE removed IS NULL").fetchall())
        db.executemany("UPDATE names SET removed = ? WHERE label = ? AND removed IS NULL",
                       [(new, label) for label, name in now.items() if then.get(label) != name])
        db.executemany("INSERT INTO names (label, name, added) VALUES (?, ?, ?)",
                       [(label, name, new) for label, name in then.items() if now.get(label) != name])
        was = {r[0]: r[1:] for r in db.execute(
            "SELECT id, label, content, part, pos FROM members WHERE removed IS NULL AND added <= ?1 UNION ALL "
            "SELECT id, label, content, part, pos FROM members WHERE removed > ?1 AND added <= ?1", (version,))}
        current = {r[0] for r in db.execute("SELECT id FROM members WHERE removed IS NULL")}
        db.executemany("UPDATE members SET removed = ? WHERE id = ?", [(new, m) for m in current if m not in was])
        db.executemany("INSERT INTO members (label, content, part, pos, added) VALUES (?, ?, ?, ?, ?)",
                       [(*was[m], new) for m in sorted(was) if m not in current])
        return self._finish(new, "restore", {"version": version}, row[0], row[1])
