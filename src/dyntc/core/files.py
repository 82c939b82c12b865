"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half;
atomic directories, a lock file for read-modify-write of a shared JSON file.

Every writer goes through :func:`atomic_write`: the content goes to a temporary sibling (same
directory, so the final rename stays on one file system and is atomic), which replaces the target
only when the block ends without error; on error the temporary file is removed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dyntc.errors import DyntcError


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; write it in the block; it then replaces `path`.

    A block that creates nothing at the temporary path leaves `path` as it was. The temporary name is unique per process and thread, so concurrent writers of one file never
    write into each other's temporary file (the last rename wins). Parent folders are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}-{uuid.uuid4().hex[:6]}{path.suffix}")
    try:
        yield tmp
        if tmp.exists():
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj) -> None:
    """JSON, indented, UTF-8 as is (labels in any script stay readable)."""
    write_text(path, json.dumps(obj, indent=2, ensure_ascii=False))


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces `path` when the block ends without error."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DyntcError(f"{path} exists and is not a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        old = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock (``fcntl.flock``) on a side file ``.NAME.lock`` beside `path`, held for the block.

    The side file is never deleted: removing a lock file while another process waits on it would let
    two writers in at once. Where there is no ``fcntl`` (Windows) the block runs unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def update_json(path: Path, merge) -> dict:
    """Read `path` (None if absent), write ``merge(current)`` back atomically, all under :func:`file_lock`;
    returns what was written. Concurrent writers (``dyntc reproduce --jobs N``) each see the others' rows."""
    with file_lock(path):
        current = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        merged = merge(current)
        write_json(path, merged)
    return merged
