"""A throwaway PostgreSQL server for the tests: Debian's ``initdb`` and ``pg_ctl`` in a temporary
directory, listening on 127.0.0.1 at a free port (and a unix socket in that directory), run as the
``postgres`` user when the tests run as root (the server refuses root), stopped at exit.

Use the ``postgres`` fixture (import it into the test module); it skips with the reason when the
binaries or psycopg are missing (``apt-get install postgresql``; ``pip install 'psycopg[binary]'``).
``postgres.url(model)`` is the URL of one model (a schema) of the server's database."""

import atexit
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, bindir: str):
        self.bindir = bindir
        self.dir = tempfile.mkdtemp(prefix="dyntc-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = _free_port()
        self.user = None
        if os.geteuid() == 0:  # postgres will not run as root
            self.user = "postgres"
            try:
                entry = pwd.getpwnam(self.user)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", self.user], check=True)
                entry = pwd.getpwnam(self.user)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        os.chmod(self.dir, 0o755)
        self._run([f"{bindir}/initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                   "--no-locale", "--no-sync"])
        self.start()
        self.base = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        atexit.register(self.stop)

    def start(self):
        """Start the server (again: after :meth:`halt`)."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c max_connections=300 "
                   "-c shared_buffers=32MB")
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"), "-o", options,
                   "-w", "-t", "60", "start"])

    def halt(self):
        """``pg_ctl stop -m fast``: the server goes away, its data stays (:meth:`start` brings it back)."""
        self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop"])

    def _run(self, args):
        if self.user:
            args = ["runuser", "-u", self.user, "--", *args]
        proc = subprocess.run(args, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(args)} failed: {proc.stdout}{proc.stderr}")

    def url(self, model: str | None = None) -> str:
        """A URL of a model of its own (a fresh schema name unless `model` is given)."""
        return f"{self.base}?model={model or 'm_' + uuid.uuid4().hex[:12]}"

    def sql(self, statement: str, params=()):
        import psycopg

        with psycopg.connect(self.base, autocommit=True) as conn:
            cur = conn.execute(statement, params or None)
            return cur.fetchall() if cur.description else None

    def dump(self, model: str) -> str:
        """``pg_dump`` of one model's schema into a file of the server's directory; returns its path."""
        path = os.path.join(self.dir, f"{model}-{uuid.uuid4().hex[:8]}.sql")
        self._run([f"{self.bindir}/pg_dump", "-h", self.dir, "-p", str(self.port), "-U", "postgres", "-n", model,
                   "-f", path, "postgres"])
        return path

    def restore(self, path: str):
        """Run a :meth:`dump` with ``psql`` (its schema must not exist), stopping at the first error."""
        self._run([f"{self.bindir}/psql", "-h", self.dir, "-p", str(self.port), "-U", "postgres", "-d", "postgres",
                   "-q", "-v", "ON_ERROR_STOP=1", "-f", path])

    def stop(self):
        if os.path.isdir(self.data):
            try:
                self._run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"])
            except RuntimeError:
                pass
            shutil.rmtree(self.dir, ignore_errors=True)


_server: PostgresServer | None = None


def server() -> PostgresServer:
    """The one server of this test process (started on first use)."""
    global _server
    if _server is None:
        bindir = _binaries()
        if bindir is None:
            pytest.skip("PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb): "
                        "apt-get install postgresql to run the PostgreSQL tests")
        try:
            import psycopg  # noqa: F401
        except ImportError:
            pytest.skip("psycopg is not installed: pip install 'psycopg[binary]' to run the PostgreSQL tests")
        _server = PostgresServer(bindir)
    return _server


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    return server()
