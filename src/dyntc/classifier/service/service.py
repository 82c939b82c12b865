"""The :class:`Service`: the classifier ``dyntc serve`` answers from, and the serialised way to change it.

- **Durability.** A write is one version of the model's store (:mod:`dyntc.classifier.store`),
  committed before the response; restarting the service loads the newest committed version. A
  process killed mid-write leaves the previous version.
- **Consistency.** A write applies its operation to a copy of the current classifier
  (:meth:`DynamicClassifier.copy`, copy-on-write of the label set), commits it, then swaps the
  reference; a read takes the reference once. So a prediction sees the old or the new label set,
  never a mix.
- **Readers never wait on writers.** A write embeds its examples before it takes the store's write
  lock and holds that lock only to commit (:meth:`DynamicClassifier.edit`: if another process
  committed meanwhile, the operation is applied again to the newest version). A version committed
  by another process (a ``dyntc labels`` command, another replica) is loaded in the background, by a
  follower thread (:meth:`~dyntc.classifier.store.ModelStore.follow`) or as soon as a read notices
  it, and swapped in once its cosine head is trained; reads go on with the current version meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dyntc.classifier import DynamicClassifier, ModelStore
from dyntc.classifier.service.access import Access
from dyntc.classifier.service.limits import EmbeddingWorkers, Limits
from dyntc.core.encoders.pretrained import no_disk_cache


class Service:
    """The current classifier of one model (a directory or a PostgreSQL URL), and the serialised way
    to change it."""

    def __init__(self, model_dir: str | Path, *, limits: Limits = Limits(), access: Access = Access(),
                 follow: bool = True):
        self.store = ModelStore.open(model_dir)
        self.path = self.store.location
        self.limits, self.access = limits, access
        self.workers = EmbeddingWorkers(limits.threads)
        self._current = self._load()
        self._write_lock = threading.Lock()  # this process's writers, one at a time
        self._reload_lock = threading.Lock()  # one reloader at a time; readers never wait for it
        self._swap_lock = threading.Lock()  # held for a comparison and an assignment only
        self._reload_pending = False  # a reader started a background load that has not finished
        self._stop = threading.Event()
        if follow:  # loads what other processes commit, in the background
            threading.Thread(target=self.store.follow, args=(self._stop, self._follow), daemon=True,
                             name="dyntc-follower").start()

    def close(self) -> None:
        self._stop.set()

    def _load(self) -> DynamicClassifier:
        """The newest version, ready to answer: its cosine head (if any) trained before anyone reads it."""
        clf = DynamicClassifier.load(self.store)
        if clf.head is not None:
            clf.refresh(wait=True)
        return clf

    def _follow(self) -> None:
        """Called by the follower thread when another process may have committed: load the newest
        version if it is newer. It may wait for a reader that is loading (the follower is nobody's
        reader), so no notified version is missed."""
        with self._reload_lock:
            if self.store.head_version() > self._current.version_:
                self._swap(self._load())

    def _swap(self, clf: DynamicClassifier) -> None:
        with self._swap_lock:
            if clf.version_ > self._current.version_:
                self._current = clf

    def current(self) -> DynamicClassifier:
        """The classifier to read from. A reader that sees a newer version committed by another process
        starts loading it in the background (besides the follower) and answers from the current one:
        no reader ever waits for a load."""
        clf = self._current
        if self.store.head_version() > clf.version_ and not self._reload_lock.locked():
            with self._swap_lock:
                if self._reload_pending:
                    return clf
                self._reload_pending = True
            threading.Thread(target=self._reload_now, daemon=True, name="dyntc-reload").start()
        return clf

    def _reload_now(self) -> None:
        try:
            self._follow()
        finally:
            self._reload_pending = False

    def write(self, op: Callable[[DynamicClassifier], Any], chars: int) -> DynamicClassifier:
        """Apply `op` to a copy of the newest classifier and commit it as one version; returns it."""
        with self._write_lock, no_disk_cache():
            with DynamicClassifier.edit(self.store, base=self.current(), op="http") as new:
                with self.workers.take(chars):
                    op(new)  # embeds the new examples, before the store's write lock
            # committed when the block ended (replayed on the newest version if another process
            # committed meanwhile); the lock wait held no embedding worker
            self._swap(new)
        return new

    def restore(self, version: int) -> DynamicClassifier:
        """Commit the state of `version` as the newest version (through the classifier's API)."""
        with self._write_lock:
            DynamicClassifier.restore(self.store, version)
            self._swap(self._load())
            return self._current
