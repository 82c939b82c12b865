"""The store's tables (format 4), the bytes of its rows, and what a version reads back as.

- ``blobs(hash, data)``: content-addressed bytes (the weights as safetensors, the model document as
  JSON), keyed by their SHA-256; a version that keeps the weights stores none.
- ``versions(id, created, op, detail, model, weights, n_labels, n_examples, state)``: one row per
  commit; ``state`` is the digest of its label names and of which example belongs to which label, in
  which order and part (:mod:`~dyntc.classifier.store.state`; NULL for versions committed before format 4).
- ``contents(id, hash, text, point)``: every distinct support example (its point float32,
  little-endian), keyed by the SHA-256 of both, so no text or point is stored twice.
- ``labels(id, added)``: a stable label identity, independent of its name.
- ``names(id, label, name, added, removed)``: the name a label has from version ``added`` up to (not
  including) ``removed`` (NULL while current).
- ``members(id, label, content, part, pos, added, removed)``: a content being a support example of a
  label (in its merged-label ``part``) from ``added`` up to ``removed``; ``pos`` orders a label's examples.
- ``captures(hash, text, reason, label, margin, seen, first_seen, last_seen)``: the texts a service
  could not place (``dyntc serve --capture``; :mod:`~dyntc.classifier.store.captures`), one row per
  distinct text. Not part of any version: restore, prune and copy leave it alone. Stores made before it
  get it from the first service that captures.

The state of version v is the names alive at v (``added <= v < removed``) joined with the members
alive at v, each label's examples ordered by ``pos``. Every id is chosen by the writer holding the
lock (the largest + 1), so a store copies row for row between backends. The SQL is written once:
``?`` placeholders, and ``{int}`` / ``{blob}`` column types that the dialect fills in.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from dyntc.classifier.store.dialect import Dialect
from dyntc.errors import DyntcError

STORE_FORMAT = 4  # 1: a directory of config.json / support.json / model.safetensors; 2: one examples table;
# 3: labels, names and members without a digest of a version's state
UPGRADABLE_FORMATS = (2, 3)  # upgraded in place by ModelStore.open

#: The inbox of texts a service could not place (kept out of the versions).
CAPTURES_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS captures (
        hash TEXT PRIMARY KEY, text TEXT NOT NULL, reason TEXT NOT NULL, label TEXT, margin DOUBLE PRECISION,
        seen {int} NOT NULL, first_seen DOUBLE PRECISION NOT NULL, last_seen DOUBLE PRECISION NOT NULL)""",
    # the oldest sightings are the ones a bounded inbox forgets
    "CREATE INDEX IF NOT EXISTS captures_seen ON captures (last_seen)",
]

# {int} and {blob} are the dialect's column types
_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS blobs (hash TEXT PRIMARY KEY, data {blob} NOT NULL)",
    """CREATE TABLE IF NOT EXISTS versions (
        id {int} PRIMARY KEY, created TEXT NOT NULL, op TEXT NOT NULL, detail TEXT NOT NULL,
        model TEXT NOT NULL REFERENCES blobs(hash), weights TEXT NOT NULL REFERENCES blobs(hash),
        n_labels {int} NOT NULL, n_examples {int} NOT NULL, state TEXT)""",
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
    *CAPTURES_SCHEMA,
]

#: The tables in the order a copy fills them (each refers only to those before it), with their columns.
TABLES = {
    "blobs": "hash, data",
    "versions": "id, created, op, detail, model, weights, n_labels, n_examples, state",
    "contents": "id, hash, text, point",
    "labels": "id, added",
    "names": "id, label, name, added, removed",
    "members": "id, label, content, part, pos, added, removed",
}


@dataclass
class Snapshot:
    """One committed version as read back: what :class:`~dyntc.classifier.DynamicClassifier` rebuilds from."""

    store_id: str
    version: int
    document: dict  # model and encoder config, encoder files, classifier params, calibration
    weights: bytes  # safetensors
    weights_hash: str
    labels: dict[str, tuple[list[str], torch.Tensor, list[int]]]  # label -> (texts, points (n, dim) float32, parts)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def content_hash(text: str, point: bytes) -> bytes:
    """The key of a content row. The text's length comes first so that no (text, point) pair can be
    confused with another whose text ends where the other's point begins."""
    data = text.encode("utf-8")
    return hashlib.sha256(len(data).to_bytes(8, "little") + data + point).digest()


def document_bytes(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, ensure_ascii=False).encode("utf-8")


def points_array(points: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(points.detach().cpu().numpy(), dtype="<f4")


def points_tensor(blobs: Sequence[bytes], dim: int) -> torch.Tensor:
    if not blobs:
        return torch.zeros(0, dim)
    return torch.from_numpy(np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), -1).copy())


def schema_statements(dialect: Dialect) -> list[str]:
    return [statement.format(**dialect.types) for statement in _SCHEMA]


def head(db: Any) -> int:
    """The newest committed version (0 before the first commit)."""
    return db.execute("SELECT COALESCE(MAX(id), 0) FROM versions").fetchone()[0]


def meta(db: Any, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def read_format(dialect: Dialect, db: Any) -> int:
    """The store format recorded in the store; a clear error if it is no store."""
    if not dialect.has_table(db, "meta"):
        raise dialect.not_a_store()
    fmt = meta(db, "format")
    if fmt is None or not fmt.isdigit():
        raise DyntcError(f"{dialect.where} is not a dyntc store (no store format recorded, got {fmt!r})")
    return int(fmt)
