"""Three `dyntc serve` replicas over one PostgreSQL store (a real, throwaway server: tests/_postgres.py):
a write through any replica, or through the CLI, is served by every replica within a second (each
learns of it by LISTEN/NOTIFY and loads it in the background: /healthz reports the version a replica
serves without loading anything); writers on all replicas at once, one replica killed with SIGKILL
among them, lose no acknowledged write."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from _postgres import postgres  # noqa: F401  (the fixture)
from _server import SERVER_GONE, Server

from dyntc import DynamicClassifier

pytest.importorskip("fastapi")



@pytest.fixture
def replicas(fitted, postgres, tmp_path):
    url = fitted.save(postgres.url())
    servers = []
    try:
        for i in range(3):
            (tmp_path / f"r{i}").mkdir()
            servers.append(Server(url, tmp_path / f"r{i}", args=["--workers", "1"]))
        yield url, servers
    finally:
        for srv in servers:
            if srv.proc.poll() is None:
                srv.stop()


def _serving(srv) -> int | None:
    try:
        status, body = srv.call("GET", "/healthz")
    except OSError:
        return None
    return body["version"] if status == 200 else None


def _visible_everywhere(servers, version, limit_s=5.0) -> float:
    """Seconds until every server serves `version` (or a later one)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        if all((_serving(s) or 0) >= version for s in servers):
            return time.perf_counter() - t0
        time.sleep(0.01)
    raise AssertionError(f"version {version} not served by all replicas after {limit_s}s: "
                         f"{[_serving(s) for s in servers]}")


def test_writes_through_any_replica_or_the_cli_are_served_by_all_within_a_second(replicas):
    url, servers = replicas
    assert all(s.call("GET", "/healthz")[1]["backend"] == "postgresql" for s in servers)
    lags = []
    for k in range(6):
        srv = servers[k % 3]
        status, body = srv.call("POST", "/labels", {"name": f"via_{k % 3}_{k}", "examples": [f"example {k}", "more"]})
        assert status == 201, body
        lags.append(_visible_everywhere(servers, body["version"]))
    cli = subprocess.run([sys.executable, "-m", "dyntc", "labels", "add", url, "via_cli", "-e", "from the command line"],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert cli.returncode == 0, cli.stderr
    lags.append(_visible_everywhere(servers, 8))
    assert max(lags) < 1.0, lags
    for srv in servers:  # and they answer from it
        status, body = srv.call("GET", "/labels")
        assert body["version"] == 8 and {"via_cli", "via_0_0", "via_2_5"} <= set(body["labels"])
        assert srv.call("POST", "/predict", {"texts": ["from the command line"]})[1]["version"] == 8


def test_concurrent_writers_on_all_replicas_and_a_kill_lose_nothing_acknowledged(replicas):
    url, servers = replicas
    acknowledged, lock, stop = [], threading.Lock(), threading.Event()

    def writer(i):
        k = 0
        while not stop.is_set() and k < 40:
            name = f"w{i}_{k}"
            try:
                status, body = servers[i].call("POST", "/labels", {"name": name, "examples": [f"{name} text", "x"]})
            except SERVER_GONE:  # the replica was killed: nothing acknowledged
                return
            if status == 201:
                with lock:
                    acknowledged.append((name, body["version"]))
            k += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3) for _ in range(2)]
    for t in threads:
        t.start()
    while len(acknowledged) < 12:
        time.sleep(0.02)
    servers[1].proc.send_signal(signal.SIGKILL)  # mid-write, most likely
    servers[1].proc.wait(timeout=30)
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    clf = DynamicClassifier.load(url)
    names = {name for name, _ in acknowledged}
    assert names <= set(clf.classes_), names - set(clf.classes_)
    assert len({v for _, v in acknowledged}) == len(acknowledged)  # one version per write
    assert all(clf.support_counts()[name] == 2 for name in names)  # each one whole
    alive = [servers[0], servers[2]]
    assert _visible_everywhere(alive, clf.version_) < 1.0
    servers[1].start()  # a restarted replica serves the head at once
    assert _serving(servers[1]) == clf.version_
