"""The :class:`Service`: the classifier ``dyntc serve`` answers from, and the serialised way to change it.

- **Durability.** A write is one version of the model's store (:mod:`dyntc.classifier.store`),
  committed before the response; restarting the service loads the newest committed version. A
  process killed mid-write leaves the previous version.
- **Consistency.** A write applies its operation to a copy of the current classifier
  (:meth:`DynamicClassifier.copy`, copy-on-write of the label set), commits it, then swaps the
  reference; a read takes the reference once. So a prediction sees the old or the new label set,
  never a mix. A write's own version is served as soon as it is acknowledged.
- **Reads never touch the store and never train.** A read answers from the classifier in memory, so
  it goes on while the database is down or silent. A version is served the moment it is loaded: it
  takes over the cosine head of the version before it for every label whose examples did not change
  (:meth:`DynamicClassifier.adopt_head`); the changed ones are scored by their prototype until the
  service's one refresher (:class:`HeadRefresher`) has retrained the head on the newest version.
- **Following.** A version committed by another process (a ``dyntc labels`` command, another
  replica) is loaded by one loader thread, woken by the store (:meth:`~dyntc.classifier.store.ModelStore.follow`:
  a PostgreSQL notification, or polling) or by the store monitor (:class:`StoreMonitor`), which asks
  the store every ``PROBE_EVERY_S`` for its identity and head version. A store that went back in
  time (a backup restored) or was replaced (another store id) is followed as well: the service
  serves what the store holds.
- **A store away.** While the monitor's probe fails or gets no answer within ``PROBE_TIMEOUT_S``, the
  service is *degraded*: reads answer from memory, ``/healthz`` says so with the version served, and
  writes fail at once with 503 instead of waiting on the database.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dyntc.classifier import DynamicClassifier, ModelStore
from dyntc.classifier.head import before_each_evaluation
from dyntc.classifier.service.access import Access
from dyntc.classifier.service.limits import EmbeddingWorkers, Limits
from dyntc.classifier.store import StoreUnavailableError
from dyntc.core.encoders.pretrained import no_disk_cache
from dyntc.errors import DyntcError, VersionNotFoundError

PROBE_EVERY_S = 1.0  #: how often the monitor asks the store for its identity and head
PROBE_TIMEOUT_S = 3.0  #: a probe unanswered this long marks the store away (degraded)
WRITE_WAIT_S = 30.0  #: how long a write waits for this service's previous write before a 503
REFRESH_MAX_DEFER_S = 10.0  #: a burst of writes defers the head's refresh at most this long
REFRESH_YIELD_MAX_S = 0.1  #: the most a refresh waits for requests before each loss evaluation


class StoreMonitor:
    """Probes the store every ``PROBE_EVERY_S``, each probe in a thread of its own: ``(store id, head
    version)``, or why it could not be had. A probe unanswered after ``PROBE_TIMEOUT_S`` marks the
    store away; at most ``MAX_HUNG`` probes wait on a silent database at once."""

    MAX_HUNG = 3

    def __init__(self, store: ModelStore, on_probe: Callable[[tuple[str, int]], None], stop: threading.Event):
        self.store, self.on_probe, self.stop = store, on_probe, stop
        self.error: str | None = None  # None: the last probe answered
        self._waiting = 0  # probes started and not finished
        self._lock = threading.Lock()

    @property
    def ok(self) -> bool:
        return self.error is None

    def _probe(self, done: threading.Event) -> None:
        try:
            self.store.check()
            identity = (self.store.store_id(), self.store.head_version())
        except DyntcError as exc:
            self.error = str(exc)
        except Exception as exc:  # a driver error not mapped: still the store's fault, never the reads'
            self.error = f"the store {self.store.where} could not be read ({type(exc).__name__}: {exc})"
        else:
            self.error = None
            self.on_probe(identity)
        finally:
            with self._lock:
                self._waiting -= 1
            done.set()

    def run(self) -> None:
        while not self.stop.is_set():
            with self._lock:
                start = self._waiting < self.MAX_HUNG
                self._waiting += start
            if start:
                done = threading.Event()
                threading.Thread(target=self._probe, args=(done,), daemon=True, name="dyntc-store-probe").start()
                answered = done.wait(PROBE_TIMEOUT_S)
            else:
                answered = False
            if not answered:
                self.error = (f"the store {self.store.where} did not answer within {PROBE_TIMEOUT_S:g} s (a database "
                              "server down, silent or unreachable)")
            self.stop.wait(PROBE_EVERY_S)


class HeadRefresher:
    """The one thread that retrains the cosine head of a service, always on the newest version it
    serves. Every version swapped in pokes it; it starts once no poke came for the head's
    ``refresh_delay``, and at the latest ``REFRESH_MAX_DEFER_S`` (or that delay, if longer) after the
    first poke of a burst, so a burst of writes costs one refresh or two, not one per write. A refresh finished after a newer version was swapped in
    is passed on to it for its unchanged labels, and the next refresh trains that newer version:
    versions superseded meanwhile are never trained. While it trains, it lets requests go first:
    before each loss evaluation it waits while requests embed (`busy`), at most
    ``REFRESH_YIELD_MAX_S`` each time, so a refresh takes the CPU that requests leave and is never
    starved (at the refresher's own priority: a lower one would leave requests waiting on a
    de-prioritised thread that holds the interpreter lock)."""

    def __init__(self, current: Callable[[], DynamicClassifier], stop: threading.Event,
                 busy: Callable[[], int] = lambda: 0):
        self.current, self.stop, self.busy = current, stop, busy
        self._cond = threading.Condition()
        self._poked_at: float | None = None
        self._first_poke: float | None = None
        self.refreshes = 0  #: refreshes run since the service started
        self.running = False
        self.last_error: str | None = None

    def poke(self) -> None:
        with self._cond:
            now = time.monotonic()
            self._poked_at = now
            self._first_poke = self._first_poke or now
            self._cond.notify_all()

    def run(self) -> None:
        while not self.stop.is_set():
            with self._cond:
                while self._poked_at is None and not self.stop.is_set():
                    self._cond.wait(1.0)
                if self.stop.is_set():
                    return
                quiet = self._delay()
                due = min(self._poked_at + quiet, self._first_poke + max(quiet, REFRESH_MAX_DEFER_S))
                if time.monotonic() < due:
                    self._cond.wait(due - time.monotonic())
                    continue
                self._poked_at = self._first_poke = None
            self._refresh_newest()

    def _delay(self) -> float:
        options = self.current().head_options or {}
        return float(options.get("refresh_delay", 1.0))

    def _refresh_newest(self) -> None:
        target = self.current()
        status = target.head_status() if target.head is not None else None
        if target.head is None or (status is not None and not status["imprinted"]):
            return  # nothing to train: no head, or every label trained already
        self.running = True
        try:
            with before_each_evaluation(self._let_requests_go_first):
                target.refresh(wait=True)
            self.refreshes += 1
            self.last_error = None
        except Exception as exc:  # keep serving imprinted labels; the next version retries
            self.last_error = f"{type(exc).__name__}: {exc}"
            return
        finally:
            self.running = False
        newest = self.current()
        if newest is not target and newest.head == target.head:
            newest.adopt_head(target)

    def _let_requests_go_first(self) -> None:
        deadline = time.monotonic() + REFRESH_YIELD_MAX_S
        while self.busy() and time.monotonic() < deadline and not self.stop.is_set():
            time.sleep(0.002)


class Service:
    """The current classifier of one model (a directory or a PostgreSQL URL), and the serialised way
    to change it."""

    def __init__(self, model_dir: str | Path, *, limits: Limits = Limits(), access: Access = Access(),
                 follow: bool = True):
        self.store = ModelStore.open(model_dir)
        self.path = self.store.location
        self.limits, self.access = limits, access
        self.workers = EmbeddingWorkers(limits.threads)
        clf = DynamicClassifier.load(self.store)
        clf.auto_refresh = False  # refreshed by this service's one refresher, never by a read
        if clf.head is not None:
            clf.refresh(wait=True)  # before the first request: the service starts with a trained head
        with no_disk_cache():  # the backbone loads on first use (3.5 s for MiniLM): here, not in a request
            clf.encode(["warm-up"])
            clf.warm()
        self._current = clf
        self._write_lock = threading.Lock()  # this process's writers, one at a time
        self._swap_lock = threading.Lock()  # writers and the loader; readers never take it
        self._wake = threading.Event()  # the store may hold a version this service does not serve
        self._stop = threading.Event()
        self.refresher = HeadRefresher(self.current, self._stop, lambda: self.workers.busy)
        self.monitor = StoreMonitor(self.store, self._probed, self._stop)
        threads = [(self.refresher.run, "dyntc-head-refresh")]
        if follow:
            threads += [(self._load_loop, "dyntc-loader"), (self.monitor.run, "dyntc-store-monitor"),
                        (lambda: self.store.follow(self._stop, self._wake.set), "dyntc-follower")]
        for target, name in threads:
            threading.Thread(target=target, daemon=True, name=name).start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()

    def current(self) -> DynamicClassifier:
        """The classifier to read from: a reference taken once, never waiting, never touching the store."""
        return self._current

    # ------------------------------------------------------------------ following the store

    def _probed(self, identity: tuple[str, int]) -> None:
        clf = self._current
        if identity != (clf.store_id_, clf.version_):
            self._wake.set()

    def _load_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._follow()
            except Exception:  # the store away for a moment: the monitor wakes this loop again
                time.sleep(0.2)

    def _follow(self) -> None:
        """Serve the store's newest version if it is not the one served (newer, older: a backup
        restored, or from another store at the same location)."""
        clf = self._current
        if (self.store.store_id(), self.store.head_version()) == (clf.store_id_, clf.version_):
            return
        # only the labels changed since the version served are read, when that is all that changed
        self._swap(self._loaded(DynamicClassifier.load(self.store, base=clf)))

    def _loaded(self, clf: DynamicClassifier) -> DynamicClassifier:
        """A version just read, ready to answer at once: the current head carried over, nothing trained."""
        clf.auto_refresh = False
        current = self._current
        if clf.head is not None and clf.head == current.head and clf.head_options == current.head_options:
            clf.adopt_head(current)
        return clf.warm()

    def _swap(self, clf: DynamicClassifier) -> None:
        """Serve `clf` if it is newer than the version served, from another store, or the store's head
        (the store went back in time); a slower thread's older version never replaces a newer one."""
        with self._swap_lock:
            current = self._current
            if clf is current:
                return
            newer = clf.store_id_ != current.store_id_ or clf.version_ > current.version_
            if not newer and clf.version_ != self.store.head_version():
                return
            self._current = clf
        self.refresher.poke()

    # ------------------------------------------------------------------ writes

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """This service's write lock, refused at once with 503 while the store is away."""
        if not self.monitor.ok:
            raise StoreUnavailableError(f"{self.monitor.error}: writes are refused until it is back; reads go on "
                                        f"from memory (version {self._current.version_})")
        if not self._write_lock.acquire(timeout=WRITE_WAIT_S):
            raise StoreUnavailableError(f"an earlier write of this service has been waiting on the store "
                                        f"{self.store.where} for {WRITE_WAIT_S:g} s: try again later")
        try:
            yield
        finally:
            self._write_lock.release()

    def write(self, op: Callable[[DynamicClassifier], Any], chars: int) -> DynamicClassifier:
        """Apply `op` to a copy of the newest classifier and commit it as one version; returns it."""
        with self._writing(), no_disk_cache():
            base = self._current
            with DynamicClassifier.edit(self.store, base=base, op="http") as new:
                with self.workers.take(chars):
                    op(new)  # embeds the new examples, before the store's write lock
            # committed when the block ended (replayed on the newest version if another process
            # committed meanwhile, which reads the labels anew: the head is carried over); the lock
            # wait held no embedding worker
            if new.head is not None and new.head_status() is None:
                self._loaded(new)
            self._swap(new)
        return new

    def restore(self, version: int) -> DynamicClassifier:
        """Commit the state of `version` as the newest version (through the classifier's API)."""
        with self._writing():
            kept = self.store.versions()
            first, head = (kept[-1]["version"], kept[0]["version"]) if kept else (1, 0)
            if not (first <= version <= head):
                raise VersionNotFoundError(
                    f"version {version} was pruned; the store keeps versions {first}..{head}" if 1 <= version < first
                    else f"no version {version}; the versions are {first}..{head}")
            DynamicClassifier.restore(self.store, version)
            new = self._loaded(DynamicClassifier.load(self.store, base=self._current))
            self._swap(new)
            return new

    # ------------------------------------------------------------------ health

    def health(self) -> dict:
        """What ``/healthz`` answers, from memory (the monitor's last probe): never waits on the store."""
        clf = self._current
        status = clf.head_status() if clf.head is not None else None
        body = {"status": "ok" if self.monitor.ok else "degraded", "version": clf.version_,
                "n_labels": clf.n_classes_, "backend": self.store.backend}
        if not self.monitor.ok:
            body["error"] = self.monitor.error
        if status is not None:
            body["head"] = {"imprinted": len(status["imprinted"]), "refreshing": self.refresher.running,
                            "refreshes": self.refresher.refreshes, "last_seconds": status["seconds"]}
        return body
