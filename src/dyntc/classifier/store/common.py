"""What the store package and its backends share: the file name, the timeouts, the error types.

Kept apart so that the backends (``sqlite.py``, ``postgres.py``) and the package import it, never each
other in a circle."""

from __future__ import annotations

from pathlib import Path

from dyntc.errors import DyntcError

STORE_FILE = "dyntc.sqlite"
LOCK_TIMEOUT_S = 60.0  # how long a writer waits for another writer before failing loudly
POLL_S = 0.5  # how often a follower asks for the head when it cannot be told (SQLite; a lost listener)


class StoreFullError(DyntcError):
    """The disk (or the store's size limit) is full: the write was rolled back, nothing was committed."""


class StoreUnavailableError(DyntcError):
    """The store cannot be reached or read (a file deleted, moved, unmounted or unreadable; a database
    server down or unreachable; a model's tables dropped)."""


def store_file(path: str | Path) -> Path:
    return Path(path) / STORE_FILE
