"""Atomic file writes: a reader (or a run killed mid-write) sees the old file or the new one, never half.

Every writer goes through :func:`atomic_write`: the content goes to a temporary sibling (same
directory, so the final rename stays on one file system and is atomic), which replaces the target
only when the block ends without error; on error the temporary file is removed.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


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
