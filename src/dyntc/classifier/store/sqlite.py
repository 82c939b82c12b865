"""The SQLite dialect of the model store: a model directory holding ``dyntc.sqlite``.

One connection per operation (cheap with SQLite, and safe across threads and processes), in WAL mode
with ``synchronous=FULL``; a writer takes the database's write lock with ``BEGIN IMMEDIATE``. Other
processes learn of a new version by asking for the head (every ``POLL_S`` when following)."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from dyntc.classifier.store.common import (LOCK_TIMEOUT_S, POLL_S, STORE_FILE, StoreFullError, StoreUnavailableError,
                                           store_file)
from dyntc.errors import DyntcError

_SQLITE_HEADER = b"SQLite format 3\x00"


def _file_bytes(file: Path) -> int:
    """The store's size on disk: the database file and its write-ahead log."""
    return sum(p.stat().st_size for p in (file, file.with_name(file.name + "-wal")) if p.exists())


class SQLiteDialect:
    backend = "sqlite"
    types = {"int": "INTEGER", "blob": "BLOB"}
    driver_error = sqlite3.Error

    def __init__(self, path: Path):
        self.path = Path(path)
        self.file = store_file(path)
        self.where = str(self.file)

    # ---------------------------------------------------------------- locations

    def exists(self) -> bool:
        return self.file.is_file()

    def check_openable(self) -> None:
        path = self.path
        if not path.is_dir():
            raise DyntcError(f"model directory {str(path)!r} does not exist: create one with `dyntc fit` "
                             "or DynamicClassifier.save")
        if not self.file.is_file():
            if (path / "config.json").is_file() and (path / "support.json").is_file():
                raise DyntcError(f"{path} holds a classifier in the old directory format (format 1, before versioned "
                                 "stores and calibration): fit it again with this dyntc and save it")
            if (path / "config.json").is_file():
                raise DyntcError(f"{path} holds a checkpoint of an earlier `dyntc train`, not a classifier model: "
                                 "train one with `dyntc fit` or `dyntc train --model hyp|euc`")
            raise DyntcError(f"{path} is not a dyntc model directory (no {STORE_FILE}): "
                             "create one with `dyntc fit` or DynamicClassifier.save")
        # refuse files SQLite would take for an empty database (a 0-byte file) or misread
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

    def prepare_create(self) -> None:
        path = self.path
        if path.exists() and not path.is_dir():
            raise DyntcError(f"{path} exists and is not a directory: choose another model path")
        if path.is_dir() and not self.exists() and any(path.iterdir()):
            raise DyntcError(f"{path} exists and is not an empty directory or a dyntc model: "
                             "choose another path or empty it")
        path.mkdir(parents=True, exist_ok=True)

    def not_a_store(self) -> DyntcError:
        return DyntcError(f"{self.file} is not a dyntc store (an SQLite database without dyntc's tables)")

    # ---------------------------------------------------------------- connections and transactions

    @contextmanager
    def connect(self, *, create: bool = False) -> Iterator[sqlite3.Connection]:
        """The file is opened without ``create`` (except by ModelStore.create): a store deleted while a
        process uses it must fail as gone, not silently come back as an empty database."""
        if not create and not self.file.is_file():
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable (it no longer exists): "
                                        "nothing was read or written")
        uri = f"file:{quote(str(self.file.absolute()))}?mode={'rwc' if create else 'rw'}"
        db = sqlite3.connect(uri, uri=True, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")  # an acknowledged commit survives power loss too
            yield db
        finally:
            db.close()

    def begin_read(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN")

    def begin_write(self, db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")

    def commit(self, db: sqlite3.Connection) -> None:
        db.execute("COMMIT")

    def rollback(self, db: sqlite3.Connection) -> None:
        # After some errors (SQLITE_FULL, I/O errors) SQLite has already rolled the transaction back, and a
        # second ROLLBACK would raise and hide the error that matters.
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # closing the connection rolls back whatever is left

    def has_table(self, db: sqlite3.Connection, name: str) -> bool:
        return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None

    def columns(self, db: sqlite3.Connection, table: str) -> list[str]:
        return [row[1] for row in db.execute(f"PRAGMA table_info({table})")]

    # ---------------------------------------------------------------- errors, health, size

    def error(self, exc: Exception) -> DyntcError:
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

    def identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.file)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def check(self) -> None:
        if not self.file.is_file() or not os.access(self.file, os.R_OK):
            raise StoreUnavailableError(f"the store {self.file} is gone or unreadable")

    def size_bytes(self, db: sqlite3.Connection) -> int:
        return _file_bytes(self.file)

    def compact(self, db: sqlite3.Connection) -> None:
        """VACUUM rewrites the file without its free pages; the checkpoint moves that into the file and
        empties the write-ahead log."""
        try:
            db.execute("VACUUM")
        except sqlite3.DatabaseError as exc:
            raise self.error(exc) from exc
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # ---------------------------------------------------------------- telling the others

    def announce(self, db: sqlite3.Connection, version: int) -> None:
        """Nothing to send: followers ask for the head."""

    def follow(self, stop: threading.Event, on_change: Callable[[], None]) -> None:
        while not stop.wait(POLL_S):
            try:
                on_change()
            except Exception:  # a store gone for a moment: the next poll tries again
                pass
