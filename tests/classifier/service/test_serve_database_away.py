"""`dyntc serve` over PostgreSQL while the database is away: stopped (``pg_ctl stop``), or silent (a
proxy that accepts and never forwards). Reads answer from memory with the version served, writes
fail at once with 503, ``/healthz`` says "degraded"; when the database is back, everything is.
A PostgreSQL server of this module's own (tests/_postgres.py), loopback only, bounded."""

import socket
import threading

import pytest

from _postgres import PostgresServer, server as shared_server
from _server import Server, eventually

pytest.importorskip("fastapi")


class SilentProxy:
    """A TCP proxy to `port` on 127.0.0.1; while ``silent`` it accepts and reads but forwards nothing
    (a database that takes connections and never answers). :meth:`speak` ends the silence: the
    connections it held are cut (their clients reconnect), new ones are forwarded again."""

    def __init__(self, port: int):
        self.upstream = port
        self.silent = False
        self.held: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.held += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        try:
            while data := a.recv(65536):
                if not self.silent:
                    b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def speak(self):
        with self.lock:
            held, self.held = self.held, []
        for s in held:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self.silent = False

    def close(self):
        self.listener.close()
        self.speak()


@pytest.fixture(scope="module")
def database():
    shared_server()  # skips with the reason when PostgreSQL or psycopg is missing
    from _postgres import _binaries

    pg = PostgresServer(_binaries())
    yield pg
    pg.stop()


def _away_then_back(srv, make_away, bring_back):
    served = srv.call("GET", "/labels")[1]["version"]
    make_away()
    health = eventually(lambda: (h := srv.call("GET", "/healthz")[1])["status"] == "degraded" and h, timeout=20)
    assert health and health["version"] == served and health["error"]
    for k in range(5):  # reads from memory
        status, body = srv.call("POST", "/predict", {"texts": [f"wake me up at {k}"]})
        assert status == 200 and body["version"] == served
        assert srv.call("GET", "/labels")[1]["version"] == served
    status, body = srv.call("POST", "/labels", {"name": "while_away", "examples": ["x"]})
    assert status == 503 and "reads go on from memory" in body["error"]
    bring_back()
    assert eventually(lambda: srv.call("GET", "/healthz")[1]["status"] == "ok", timeout=30)
    status, body = eventually(lambda: (r := srv.call("POST", "/labels", {"name": f"back_{served}", "examples": ["y"]}))[0]
                              == 201 and r, timeout=20)
    assert body["version"] == served + 1


def test_database_silent_then_stopped_reads_from_memory_writes_503(fitted, database, tmp_path):
    proxy = SilentProxy(database.port)
    url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres?model=away"
    fitted.save(url)
    srv = Server(url, tmp_path)
    try:
        def silence():
            proxy.silent = True

        _away_then_back(srv, silence, proxy.speak)
        _away_then_back(srv, database.halt, database.start)
    finally:
        srv.stop()
        proxy.close()


def test_a_statement_on_a_silent_database_fails_instead_of_hanging(fitted, database, monkeypatch):
    from dyntc.classifier.store import ModelStore, StoreUnavailableError, postgres

    monkeypatch.setattr(postgres, "STATEMENT_TIMEOUT_S", 1.0)
    monkeypatch.setattr(postgres, "PING_TIMEOUT_S", 1.0)
    proxy = SilentProxy(database.port)
    try:
        url = f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres?model=silent"
        fitted.save(url)
        store = ModelStore.open(url)
        assert store.head_version() == 1
        proxy.silent = True
        for _ in range(2):  # a pooled connection's statement, then the check of an idle one
            with pytest.raises(StoreUnavailableError, match="gone or unreadable"):
                store.head_version()
        proxy.speak()
        assert eventually(lambda: _answers(store), timeout=20)
    finally:
        proxy.close()


def _answers(store) -> bool:
    try:
        return store.head_version() == 1
    except Exception:
        return False
