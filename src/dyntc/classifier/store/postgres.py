"""The PostgreSQL dialect of the model store: one schema of a database per model.

Location: ``postgresql://[user[:password]@]host[:port]/database[?model=NAME&...]`` (``postgres://``
too). ``model`` names the schema holding the model's tables (default ``dyntc``; lower-case letters,
digits and ``_``, at most 50 characters), so one database holds several models; every other query
parameter goes to libpq. Connections are reused from a small per-process pool (a new server
process per operation would cost milliseconds; every read of the HTTP service asks for the head).

- Readers: ``REPEATABLE READ READ ONLY`` transactions, one consistent snapshot; they never wait.
- Writers: ``BEGIN`` then ``pg_advisory_xact_lock`` on a key of the database and model, held until
  COMMIT or ROLLBACK, so writers of one model are serialised (across any number of processes and
  machines) and writers of different models are not; a writer waits ``LOCK_TIMEOUT_S`` at most.
- Other processes are told of a commit by ``NOTIFY dyntc_<model>, '<version>'``, sent inside the
  writer's transaction, so it is delivered if and only if the commit lands; a follower LISTENs and,
  while its listening connection is down, asks for the head every ``POLL_S`` instead.
- Errors: a full disk (SQLSTATE 53100) is :class:`StoreFullError`; a server that cannot be reached,
  is shutting down or dropped the connection, or a model whose tables were dropped, is
  :class:`StoreUnavailableError`.
- Every statement has a deadline on the client side (``STATEMENT_TIMEOUT_S``; the write lock's wait
  ``LOCK_TIMEOUT_S`` more, a VACUUM none): a server that accepts connections and never answers (a
  network cut, a proxy gone silent) would otherwise hold the caller for ever. A statement past its
  deadline has its connection's socket shut down, so it fails as :class:`StoreUnavailableError` and
  the connection is dropped from the pool. Connecting has libpq's ``connect_timeout``.
- ``prune`` compacts with a plain VACUUM (the space is reused, readers never wait); VACUUM FULL would
  give it back to the file system but locks readers out, so it is left to the operator.
"""

from __future__ import annotations

import atexit
import hashlib
import heapq
import itertools
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dyntc.classifier.store.common import LOCK_TIMEOUT_S, POLL_S, StoreFullError, StoreUnavailableError
from dyntc.errors import DyntcError

try:
    import psycopg
    from psycopg import pq
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise DyntcError("a postgresql:// model location needs psycopg 3: pip install 'dyntc[postgres]' "
                     "(or pip install 'psycopg[binary]')") from exc

DEFAULT_MODEL = "dyntc"
_MODEL_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,49}$")
MAX_IDLE = 4  # idle connections a process keeps per database
CONNECT_TIMEOUT_S = 10
PING_AFTER_S = 2.0  # a pooled connection idle longer than this is checked before use
STATEMENT_TIMEOUT_S = 30.0  # a statement unanswered this long has its connection cut (module docstring)
PING_TIMEOUT_S = 5.0  # the check of an idle pooled connection, and the follower's probe


class _Deadlines:
    """One thread that cuts connections whose statement outlived its deadline: it shuts their socket
    down (a duplicate of its descriptor, so the driver, blocked reading it, sees the end at once)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, int] = {}  # token -> socket descriptor
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    @contextmanager
    def within(self, conn: psycopg.Connection, seconds: float | None) -> Iterator[None]:
        if seconds is None or conn.closed:
            yield
            return
        token = next(self._tokens)
        with self._cond:
            self._armed[token] = conn.fileno()
            heapq.heappush(self._heap, (time.monotonic() + seconds, token))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="dyntc-pg-deadlines")
                self._thread.start()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._armed.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                left = self._heap[0][0] - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # under the lock: the owner cannot disarm, so cannot close the connection (and the
                # descriptor be reused) before the cut
                fd = self._armed.pop(heapq.heappop(self._heap)[1])
                try:
                    with socket.socket(fileno=os.dup(fd)) as sock:
                        sock.shutdown(socket.SHUT_RDWR)
                except OSError:  # already closed by the server
                    pass


_DEADLINES = _Deadlines()


def _run(conn: psycopg.Connection, sql: str, seconds: float | None = -1.0) -> None:
    """A statement on a raw connection, within `seconds` (default ``PING_TIMEOUT_S``)."""
    with _DEADLINES.within(conn, PING_TIMEOUT_S if seconds == -1.0 else seconds):
        conn.execute(sql)


def parse_url(url: str) -> tuple[str, str, str]:
    """``(libpq URL without 'model', model name, the URL as shown: no password)``."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    models = [v for k, v in query if k == "model"]
    model = models[-1] if models else DEFAULT_MODEL
    if not _MODEL_NAME.match(model):
        raise DyntcError(f"model name {model!r} in {url.split('?')[0]}: use lower-case letters, digits and _ "
                         "(at most 50, not starting with a digit); it names the model's schema")
    rest = [(k, v) for k, v in query if k != "model"]
    conninfo = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), ""))
    netloc = parts.netloc
    if "@" in netloc:
        user, host = netloc.rsplit("@", 1)
        netloc = f"{user.split(':', 1)[0]}{':***' if ':' in user else ''}@{host}"
    shown = urlunsplit((parts.scheme, netloc, parts.path, urlencode([*rest, ("model", model)]), ""))
    return conninfo, model, shown


class _Pool:
    """Idle connections of one process to one database and model (LIFO, at most ``MAX_IDLE``)."""

    def __init__(self, conninfo: str, schema: str):
        self.conninfo, self.schema = conninfo, schema
        self.idle: list[tuple[psycopg.Connection, float]] = []
        self.lock = threading.Lock()
        self.pid = os.getpid()

    def get(self) -> psycopg.Connection:
        while True:
            with self.lock:
                if self.pid != os.getpid():  # a forked child must not use its parent's sockets
                    self.idle, self.pid = [], os.getpid()
                if not self.idle:
                    break
                conn, since = self.idle.pop()
            if conn.closed or conn.info.transaction_status != pq.TransactionStatus.IDLE:
                conn.close()
                continue
            # A connection that idled a while, or has something to read (an idle connection is only sent
            # something when the server ends it), is checked before use: a server restarted or a
            # connection terminated meanwhile must not fail the next operation.
            if time.monotonic() - since > PING_AFTER_S or select.select([conn.fileno()], [], [], 0)[0]:
                try:
                    _run(conn, "SELECT 1")
                except psycopg.Error:
                    conn.close()
                    continue
            return conn
        conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name="dyntc")
        _run(conn, f'SET search_path TO "{self.schema}"', STATEMENT_TIMEOUT_S)
        return conn

    def put(self, conn: psycopg.Connection) -> None:
        if conn.closed or conn.broken or conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.close()
            return
        with self.lock:
            if len(self.idle) < MAX_IDLE and self.pid == os.getpid():
                self.idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = (self.idle if self.pid == os.getpid() else []), []
        for conn, _ in idle:
            conn.close()


_POOLS: dict[tuple[str, str], _Pool] = {}
_POOLS_LOCK = threading.Lock()


@atexit.register
def _close_pools() -> None:
    """Say goodbye to the server at exit rather than leave it to notice a dropped socket."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
    for pool in pools:
        pool.close()


def _pool(conninfo: str, schema: str) -> _Pool:
    with _POOLS_LOCK:
        return _POOLS.setdefault((conninfo, schema), _Pool(conninfo, schema))


class _Connection:
    """A psycopg connection speaking the store's SQL: ``?`` placeholders, ``executemany``."""

    _sql: dict[str, str] = {}

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    @classmethod
    def _translate(cls, sql: str) -> str:
        out = cls._sql.get(sql)
        if out is None:
            out = cls._sql[sql] = sql.replace("%", "%%").replace("?", "%s")
        return out

    def execute(self, sql: str, params: tuple | list = (), *, timeout: float | None = -1.0) -> psycopg.Cursor:
        """`timeout`: seconds until the connection is cut (default ``STATEMENT_TIMEOUT_S``; None: never)."""
        cursor = self.conn.cursor()
        with _DEADLINES.within(self.conn, STATEMENT_TIMEOUT_S if timeout == -1.0 else timeout):
            if params:
                cursor.execute(self._translate(sql), params)
            else:
                cursor.execute(sql)
        return cursor

    def executemany(self, sql: str, rows) -> psycopg.Cursor:
        cursor = self.conn.cursor()
        rows = list(rows)
        if rows:
            with _DEADLINES.within(self.conn, STATEMENT_TIMEOUT_S):
                cursor.executemany(self._translate(sql), rows)
        return cursor


class PostgresDialect:
    backend = "postgresql"
    types = {"int": "BIGINT", "blob": "BYTEA"}
    driver_error = psycopg.Error

    def __init__(self, url: str):
        self.conninfo, self.schema, self.where = parse_url(url)
        self.path = url
        self.channel = f"dyntc_{self.schema}"
        self.pool = _pool(self.conninfo, self.schema)
        # the advisory lock's key: this model of this database (another model's writers do not wait)
        self.lock_key = int.from_bytes(hashlib.sha256(f"dyntc/{self.schema}".encode()).digest()[:8], "big",
                                       signed=True)

    # ---------------------------------------------------------------- locations

    def exists(self) -> bool:
        try:
            with self.connect() as db:
                return self.has_table(db, "meta")
        except psycopg.Error as exc:
            raise self.error(exc) from exc

    def check_openable(self) -> None:
        """Nothing to look at before connecting: a missing model is found by its missing tables."""

    def prepare_create(self) -> None:
        """The schema is created in ModelStore.create's transaction (under the lock)."""

    def not_a_store(self) -> DyntcError:
        return DyntcError(f"{self.where} holds no dyntc model {self.schema!r} (no tables in schema "
                          f"{self.schema!r}): create one with `dyntc fit --out URL`, DynamicClassifier.save(URL) "
                          "or `dyntc labels copy MODEL_DIR URL`")

    # ---------------------------------------------------------------- connections and transactions

    @contextmanager
    def connect(self, *, create: bool = False) -> Iterator[_Connection]:
        conn = self.pool.get()
        try:
            if create:
                try:
                    _run(conn, f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"', STATEMENT_TIMEOUT_S)
                except psycopg.errors.UniqueViolation:
                    pass  # created at the same moment by another process
            yield _Connection(conn)
        finally:
            if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                try:
                    _run(conn, "ROLLBACK")
                except psycopg.Error:
                    conn.close()
            self.pool.put(conn)

    def begin_read(self, db: _Connection) -> None:
        db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def begin_write(self, db: _Connection) -> None:
        db.execute("BEGIN")
        db.execute(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT_S * 1000)}ms'")
        db.execute("SELECT pg_advisory_xact_lock(?)", (self.lock_key,), timeout=LOCK_TIMEOUT_S + 10)

    def commit(self, db: _Connection) -> None:
        db.execute("COMMIT")

    def rollback(self, db: _Connection) -> None:
        conn = db.conn
        if not conn.closed and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            try:
                _run(conn, "ROLLBACK")
            except psycopg.Error:
                conn.close()  # the server rolls back what a lost connection left

    def has_table(self, db: _Connection, name: str) -> bool:
        return db.execute("SELECT 1 FROM pg_tables WHERE schemaname = ? AND tablename = ?",
                          (self.schema, name)).fetchone() is not None

    def columns(self, db: _Connection, table: str) -> list[str]:
        return [r[0] for r in db.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = ? "
                                         "AND table_name = ? ORDER BY ordinal_position", (self.schema, table))]

    # ---------------------------------------------------------------- errors, health, size

    def error(self, exc: Exception) -> DyntcError:
        """The user-facing error for a PostgreSQL failure: what happened and what to do."""
        original = exc
        state = getattr(exc, "sqlstate", None) or ""
        exc = (str(exc).strip().splitlines() or [type(exc).__name__])[0]  # the message, without CONTEXT lines
        if state == "53100":  # disk_full
            return StoreFullError(f"the disk of the database server holding {self.where} is full ({exc}): nothing "
                                  "was committed, the store still holds its previous version; free some space (or "
                                  "prune old versions with `dyntc labels prune`) and try again")
        if state == "55P03":  # lock_not_available: lock_timeout
            return DyntcError(f"{self.where} stayed locked by another writer for {LOCK_TIMEOUT_S:.0f}s; "
                              "try again when it is done")
        if state in ("3F000", "42P01"):  # the schema or a table is gone
            return StoreUnavailableError(f"the store {self.where} is gone or unreadable ({exc}): nothing was "
                                         "committed; its tables were dropped")
        if isinstance(original, psycopg.OperationalError) or state[:2] in ("08", "53", "57", "58"):
            return StoreUnavailableError(f"the store {self.where} is gone or unreadable (the database server cannot "
                                         f"be reached or gave up: {exc}): nothing was committed; check "
                                         "that the server is up and reachable")
        if state in ("42501", "25006"):
            return DyntcError(f"{self.where} is read-only for this user ({exc}): nothing was committed; grant "
                              "it write access to change it")
        return DyntcError(f"{self.where} is damaged or not a dyntc store ({exc})")

    def identity(self) -> None:
        return None  # a model whose tables are dropped mid-write fails on its own (42P01)

    def check(self) -> None:
        """Connecting and the query are the check."""

    def size_bytes(self, db: _Connection) -> int:
        # the tables' data, their indexes and TOAST; not the free-space and visibility maps that
        # VACUUM adds (they would make a prune look as if it grew the store)
        return int(db.execute(
            "SELECT COALESCE(SUM(pg_relation_size(c.oid) + pg_indexes_size(c.oid) + CASE WHEN c.reltoastrelid <> 0 "
            "THEN pg_relation_size(c.reltoastrelid) ELSE 0 END), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ? AND c.relkind = 'r'",
            (self.schema,)).fetchone()[0])

    def compact(self, db: _Connection) -> None:
        try:
            db.execute("VACUUM (ANALYZE) meta, blobs, versions, contents, labels, names, members", timeout=None)
        except psycopg.Error as exc:
            raise self.error(exc) from exc

    # ---------------------------------------------------------------- telling the others

    def announce(self, db: _Connection, version: int) -> None:
        db.execute("SELECT pg_notify(?, ?)", (self.channel, str(version)))

    def follow(self, stop: threading.Event, on_change: Callable[[], None]) -> None:
        """LISTEN on the model's channel; on every notification call `on_change`. While the listening
        connection is down (the server restarting, a network cut), call it every ``POLL_S`` and try to
        listen again. A quiet connection is probed every few seconds so that a dead one is noticed."""

        def changed() -> None:
            try:
                on_change()
            except Exception:  # the store unreachable for a moment: the next change or poll tries again
                pass

        while not stop.is_set():
            try:
                conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                       application_name="dyntc-follower")
            except psycopg.Error:
                changed()
                stop.wait(POLL_S)
                continue
            try:
                with conn:
                    _run(conn, f'LISTEN "{self.channel}"')
                    changed()  # whatever was committed before this connection listened
                    probe = time.monotonic()
                    while not stop.is_set():
                        seen = False
                        for _ in conn.notifies(timeout=POLL_S, stop_after=1):
                            seen = True
                        if seen:
                            changed()
                        elif time.monotonic() - probe > 5:
                            _run(conn, "SELECT 1")
                            probe = time.monotonic()
            except psycopg.Error:
                changed()
                stop.wait(POLL_S)
