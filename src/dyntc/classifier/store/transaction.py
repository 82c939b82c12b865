"""What a writer holding the store's lock does: commit a version as the difference to the head, and
restore an earlier version as a new one. A commit receives each changed label's full new support and
works out the delta itself (the members still there stay, the others are closed, the new ones are
appended; a new name whose support begins with the whole support of a label removed in the same commit
takes over its identity), so a version costs bytes in proportion to what changed."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dyntc.classifier.store.schema import Snapshot, content_hash, digest, document_bytes, head, meta, now, points_array
from dyntc.classifier.store.state import new_state
from dyntc.errors import DyntcError, is_int


class Transaction:
    """What a writer holding the lock can do: read the head, commit new versions, restore old ones."""

    def __init__(self, store: Any, db: Any):  # store: the ModelStore that opened `db`
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
        return head(self.db)

    @property
    def store_id(self) -> str:
        return meta(self.db, "store_id") or ""

    def read(self, version: int | None = None) -> Snapshot:
        return self.store.read(version, self.db)

    def _put(self, data: bytes, known: str | None = None) -> str:
        key = known or digest(data)
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
        array = points_array(points)
        if array.ndim != 2 or len(array) != len(texts) or len(parts) != len(texts):
            raise DyntcError(f"label {name!r}: {len(texts)} texts, points of shape {tuple(array.shape)} and "
                             f"{len(parts)} parts do not match; nothing was committed")
        out = []
        for text, point, part in zip(texts, array, parts):
            blob = point.tobytes()
            key = content_hash(text, blob)
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
        state = new_state(self.db, version)  # from the rows as they will be read back
        self.db.execute("INSERT INTO versions (id, created, op, detail, model, weights, n_labels, n_examples, state) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (version, now(), op, json.dumps(detail, ensure_ascii=False), model_key, weights_key,
                         n_labels, n_examples, state))
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
            if support is not None and not np.isfinite(points_array(support[1])).all():
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
