"""What differs between the store's backends: the :class:`Dialect` a location gets (``sqlite.py``: a
model directory; ``postgres.py``: a ``postgresql://`` URL). What they share (the file name, the
timeouts, the error types) is in ``common.py``, which the backends import instead of this module."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from dyntc.errors import DyntcError


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

