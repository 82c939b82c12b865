"""A classifier on disk: one SQLite database holding every committed version of it.

Layout of a model directory::

    MODEL_DIR/dyntc.sqlite    (plus -wal / -shm files while a process has it open)

Tables:

- ``blobs(hash, data)``: content-addressed bytes (the weights as safetensors, the model document as
  JSON). A version that does not change the weights, which is every label operation with a
  pretrained encoder, stores no new weights.
- ``versions(id, created, op, detail, model, weights, n_labels, n_examples)``: one row per commit.
- ``examples(id, label, text, point, added, removed, part)``: every support example ever stored, with
  the version that added it and the one that removed it (NULL while it is alive), and the part of
  its label it belongs to (a merged label keeps one prototype per merged label; 0 otherwise). A label operation
  closes the rows of the labels it changes and inserts their new rows, so it stores only what
  changed; the state of any version is the rows alive at it.

Why SQLite rather than rewriting a directory of files: a commit is one transaction, so a process
killed at any point (``kill -9``) leaves either the old or the new version, never half of one, and
an acknowledged commit is on disk (``synchronous=FULL``). Writers take the database's write lock
(``BEGIN IMMEDIATE``) for their whole read-modify-write, so concurrent writers (CLI commands, a
library ``save``, the HTTP service) are serialised and none is lost; readers never block (WAL).
Any earlier version can be restored as a new version.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from dyntc import __version__
from dyntc.errors import DyntcError

STORE_FORMAT = 2  # format 1 was a directory of config.json / support.json / model.safetensors
STORE_FILE = "dyntc.sqlite"
LOCK_TIMEOUT_S = 60.0  # how long a writer waits for another writer before failing loudly

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    id INTEGER PRIMARY KEY, created TEXT NOT NULL, op TEXT NOT NULL, detail TEXT NOT NULL,
    model TEXT NOT NULL REFERENCES blobs(hash), weights TEXT NOT NULL REFERENCES blobs(hash),
    n_labels INTEGER NOT NULL, n_examples INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS examples (
    id INTEGER PRIMARY KEY, label TEXT NOT NULL, text TEXT NOT NULL, point BLOB NOT NULL,
    added INTEGER NOT NULL, removed INTEGER, part INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS examples_alive ON examples (removed, label);
"""


class StoreFullError(DyntcError):
    """The disk (or the file system's quota) is full: nothing was committed."""


class StoreUnavailableError(DyntcError):
    """The store file is gone or cannot be read (removed, moved, permissions changed)."""


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


def document_bytes(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, ensure_ascii=False).encode("utf-8")


def _points_blob(points: torch.Tensor) -> list[bytes]:
    array = np.ascontiguousarray(points.detach().cpu().numpy(), dtype="<f4")
    return [row.tobytes() for row in array]


def _points_tensor(blobs: Sequence[bytes], dim: int) -> torch.Tensor:
    if not blobs:
        return torch.zeros(0, dim)
    return torch.from_numpy(np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), -1).copy())


def _add_part_column(db: sqlite3.Connection) -> None:
    """Stores written before labels had parts (one prototype per merged label) get the column, all 0."""
    if any(row[1] == "part" for row in db.execute("PRAGMA table_info(examples)")):
        return
    try:
        db.execute("ALTER TABLE examples ADD COLUMN part INTEGER NOT NULL DEFAULT 0")
    except sqlite3.OperationalError as exc:  # another process added it first
        if "duplicate column" not in str(exc):
            raise


def store_file(path: str | Path) -> Path:
    return Path(path) / STORE_FILE


def is_store(path: str | Path) -> bool:
    return store_file(path).is_file()


class ModelStore:
    """The versioned store of one model directory. Open with :meth:`open` or :meth:`create`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = store_file(path)

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | Path) -> "ModelStore":
        """The store of an existing model directory, with a clear error for anything else."""
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
        with store._connect() as db:
            fmt = store._meta(db, "format")
            if fmt != str(STORE_FORMAT):
                raise DyntcError(f"{store.file} is in store format {fmt!r}; this dyntc {__version__} reads format "
                                 f"{STORE_FORMAT}: use the dyntc version that wrote it")
            if store.head(db) == 0:
                raise DyntcError(f"{store.file} has no committed version (its first save was interrupted): save again")
            _add_part_column(db)
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
            db.executescript(_SCHEMA)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(STORE_FORMAT),))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('store_id', ?)", (uuid.uuid4().hex,))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (_now(),))
        return store

    @contextmanager
    def _connect(self, create: bool = False) -> Iterator[sqlite3.Connection]:
        """A connection in autocommit mode (transactions are explicit), closed afterwards.

        One connection per operation: cheap with SQLite, and safe across threads and processes."""
        if not create and not self.file.is_file():  # sqlite3 would create an empty one
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable: was the model directory "
                                        "moved or deleted?")
        try:
            db = sqlite3.connect(self.file, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreUnavailableError(f"cannot open {self.file}: {exc}") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # an acknowledged commit survives power loss too
            yield db
        except sqlite3.DatabaseError as exc:
            if "full" in str(exc) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                raise StoreFullError(f"the disk holding {self.file} is full: nothing was committed; free some "
                                     "space (or prune old versions) and try again") from exc
            if (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_IOERR:
                raise StoreUnavailableError(f"the store {self.file} could not be read or written ({exc}); nothing "
                                            "was committed") from exc
            if isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc):
                raise StoreUnavailableError(f"the store {self.file} is gone or unreadable ({exc})") from exc
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise DyntcError(f"{self.file} stayed locked by another writer for {LOCK_TIMEOUT_S:.0f}s; "
                                 "try again when it is done") from exc
            raise DyntcError(f"{self.file} is damaged or not a dyntc store ({exc})") from exc
        finally:
            db.close()

    @staticmethod
    def _meta(db: sqlite3.Connection, key: str) -> str | None:
        try:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    # ---------------------------------------------------------------- reading

    @staticmethod
    def head(db: sqlite3.Connection) -> int:
        return db.execute("SELECT COALESCE(MAX(id), 0) FROM versions").fetchone()[0]

    def read(self, version: int | None = None, db: sqlite3.Connection | None = None) -> Snapshot:
        """The state of `version` (default: the newest)."""
        if db is None:
            with self._connect() as db:
                db.execute("BEGIN")  # one consistent snapshot across the queries below
                try:
                    return self.read(version, db)
                finally:
                    db.execute("COMMIT")
        head = self.head(db)
        version = head if version is None else version
        row = db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone()
        if row is None:
            raise DyntcError(f"{self.path} has no version {version!r}; its versions are 1..{head}")
        document = json.loads(self._blob(db, row[0]).decode("utf-8"))
        weights = self._blob(db, row[1])
        rows = db.execute(
            "SELECT label, text, point, part FROM examples WHERE added <= ?1 AND (removed IS NULL OR removed > ?1) "
            "ORDER BY id", (version,),
        ).fetchall()
        grouped: dict[str, tuple[list[str], list[bytes], list[int]]] = {}
        for label, text, point, part in rows:
            texts, points, parts = grouped.setdefault(label, ([], [], []))
            texts.append(text)
            points.append(point)
            parts.append(part)
        dim = document.get("dim", 0)
        labels = {name: (texts, _points_tensor(points, dim), parts) for name, (texts, points, parts) in sorted(grouped.items())}
        return Snapshot(self._meta(db, "store_id") or "", version, document, weights, row[1], labels)

    @staticmethod
    def _blob(db: sqlite3.Connection, key: str) -> bytes:
        row = db.execute("SELECT data FROM blobs WHERE hash = ?", (key,)).fetchone()
        if row is None:
            raise DyntcError(f"the store is damaged: blob {key[:12]} is missing")
        return bytes(row[0])

    def versions(self, limit: int | None = None) -> list[dict]:
        """Committed versions, newest first: id, time, operation, detail, label and example counts."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT id, created, op, detail, n_labels, n_examples FROM versions ORDER BY id DESC LIMIT ?",
                (-1 if limit is None else int(limit),),
            ).fetchall()
        return [{"version": v, "created": c, "op": op, "detail": json.loads(d), "n_labels": nl, "n_examples": ne}
                for v, c, op, d, nl, ne in rows]

    def head_version(self) -> int:
        """The newest committed version (one cheap query; never waits for a writer)."""
        with self._connect() as db:
            return self.head(db)

    def check(self) -> None:
        """Raise :class:`StoreUnavailableError` if the store file is gone or unreadable (a health probe)."""
        try:
            with self._connect() as db:
                db.execute("SELECT COUNT(*) FROM versions").fetchone()
        except StoreUnavailableError:
            raise
        except DyntcError as exc:
            raise StoreUnavailableError(str(exc)) from exc

    def store_id(self) -> str:
        with self._connect() as db:
            return self._meta(db, "store_id") or ""

    # ---------------------------------------------------------------- writing

    @contextmanager
    def transaction(self) -> Iterator["Transaction"]:
        """The write lock for a read-modify-write: other writers wait (up to ``LOCK_TIMEOUT_S``);
        commits made through the transaction land when the block ends without error."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield Transaction(self, db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


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
        safetensors bytes, or the hash of weights already in the store."""
        version = self.head + 1
        model_key = self._put(document_bytes(document))
        if isinstance(weights, str):
            if not self.has_blob(weights):
                raise DyntcError(f"weights {weights[:12]} are not in the store")
            weights_key = weights
        else:
            weights_key = self._put(weights)
        if replace_all:
            self.db.execute("UPDATE examples SET removed = ? WHERE removed IS NULL", (version,))
        else:
            self.db.executemany("UPDATE examples SET removed = ? WHERE removed IS NULL AND label = ?",
                                [(version, name) for name in labels])
        rows = []
        for name, support in labels.items():
            if support is None:
                continue
            texts, points, parts = support
            rows.extend((name, text, blob, version, part)
                        for text, blob, part in zip(texts, _points_blob(points), parts, strict=True))
        self.db.executemany("INSERT INTO examples (label, text, point, added, part) VALUES (?, ?, ?, ?, ?)", rows)
        n_labels, n_examples = self.db.execute(
            "SELECT COUNT(DISTINCT label), COUNT(*) FROM examples WHERE removed IS NULL").fetchone()
        self.db.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (version, _now(), op, json.dumps(detail, ensure_ascii=False), model_key, weights_key,
                         n_labels, n_examples))
        return version

    def restore(self, version: int) -> int:
        """Make the state of an earlier `version` the newest, as a new version; returns its id."""
        head = self.head
        row = self.db.execute("SELECT model, weights FROM versions WHERE id = ?", (version,)).fetchone()
        if row is None:
            raise DyntcError(f"{self.store.path} has no version {version!r}; its versions are 1..{head}")
        new = head + 1
        self.db.execute("UPDATE examples SET removed = ? WHERE removed IS NULL", (new,))
        self.db.execute(
            "INSERT INTO examples (label, text, point, added, part) SELECT label, text, point, ?1, part FROM examples "
            "WHERE added <= ?2 AND (removed IS NULL OR removed > ?2) ORDER BY id", (new, version))
        n_labels, n_examples = self.db.execute(
            "SELECT COUNT(DISTINCT label), COUNT(*) FROM examples WHERE removed IS NULL").fetchone()
        self.db.execute("INSERT INTO versions VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (new, _now(), "restore", json.dumps({"version": version}), row[0], row[1], n_labels, n_examples))
        return new

