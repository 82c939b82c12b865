"""The store over PostgreSQL, beyond the tests both backends share (tests/classifier/test_store.py): migration
both ways with ``dyntc labels copy``, several models in one database, URLs, a full disk, a lost
connection or dropped tables, the writers' lock across processes, and followers told of commits
(LISTEN/NOTIFY) or polling when their listener is cut. Against a real, throwaway server
(tests/_postgres.py)."""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from dyntc import DyntcError
from dyntc.classifier.store import ModelStore, StoreFullError, StoreUnavailableError, copy_store
from dyntc.classifier.store.postgres import parse_url
from _postgres import postgres  # noqa: F401  (the fixture)

DIM = 16


def _support(rng, prefix, n, part=0):
    return ([f"{prefix} example {i}" for i in range(n)],
            torch.from_numpy(rng.standard_normal((n, DIM)).astype("float32")), [part] * n)


def _commit(store, labels, *, replace_all=False, op="op"):
    with store.transaction() as txn:
        return txn.commit(op=op, detail=[{"op": op}], document={"dim": DIM}, weights=b"weights " + op.encode(),
                          labels=labels, replace_all=replace_all)


def _history(store, rng):
    """Seven versions: save, add, rename, merge, remove, restore, add."""
    s = {"a": _support(rng, "a", 20), "b": _support(rng, "b", 10), "c": _support(rng, "c", 5)}
    _commit(store, s, replace_all=True, op="save")
    grown = (s["a"][0] + ["one more"], torch.cat([s["a"][1], s["b"][1][:1]]), s["a"][2] + [0])
    _commit(store, {"a": grown}, op="add")
    _commit(store, {"c": None, "renamed": s["c"]}, op="rename")
    _commit(store, {"a": None, "b": None, "ab": (grown[0] + s["b"][0], torch.cat([grown[1], s["b"][1]]),
                                                  [0] * 21 + [1] * 10)}, op="merge")
    _commit(store, {"renamed": None}, op="remove")
    with store.transaction() as txn:
        txn.restore(2)
    _commit(store, {"d": _support(rng, "d", 3)}, op="add2")


def _same_versions(a, b):
    va, vb = a.versions(), b.versions()
    assert [(v["version"], v["op"], v["detail"], v["n_examples"]) for v in va] == \
        [(v["version"], v["op"], v["detail"], v["n_examples"]) for v in vb]
    for v in va:
        x, y = a.read(v["version"]), b.read(v["version"])
        assert (x.document, x.weights, sorted(x.labels)) == (y.document, y.weights, sorted(y.labels))
        for name in x.labels:
            assert x.labels[name][0] == y.labels[name][0] and x.labels[name][2] == y.labels[name][2]
            assert torch.equal(x.labels[name][1], y.labels[name][1])


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "dyntc", *args], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_copy_between_a_directory_and_postgresql_both_ways(postgres, tmp_path):
    rng = np.random.default_rng(0)
    local = ModelStore.create(tmp_path / "local")
    _history(local, rng)
    url = postgres.url()
    out = _cli("labels", "copy", str(tmp_path / "local"), url)  # directory -> database, through the CLI
    assert '"versions": [1, 7]' in out.stdout
    remote = ModelStore.open(url)
    _same_versions(local, remote)
    assert remote.store_id() != local.store_id()  # a copy is a store of its own
    _commit(remote, {"e": _support(rng, "e", 4)}, op="remote")  # it lives on in the database
    remote.prune(5)
    _cli("labels", "copy", url, str(tmp_path / "back"))  # database -> directory
    back = ModelStore.open(tmp_path / "back")
    _same_versions(remote, back)
    assert [v["version"] for v in back.versions()] == [8, 7, 6, 5, 4]
    with back.transaction() as txn:  # every kept version restorable in the copy
        txn.restore(4)
    assert sorted(back.read().labels) == sorted(remote.read(4).labels)
    # database -> database, another model of the same server
    other = postgres.url()
    copy_store(url, other)
    _same_versions(remote, ModelStore.open(other))
    with pytest.raises(DyntcError, match="already holds a model"):
        copy_store(tmp_path / "local", url)
    with pytest.raises(DyntcError, match="already holds a model"):
        copy_store(url, tmp_path / "back")


def test_models_of_one_database_are_independent_and_urls_are_checked(postgres):
    rng = np.random.default_rng(1)
    one, two = postgres.url("intents"), postgres.url("topics")
    a, b = ModelStore.create(one), ModelStore.create(two)
    _commit(a, {"x": _support(rng, "x", 3)}, replace_all=True)
    _commit(b, {"y": _support(rng, "y", 3)}, replace_all=True)
    _commit(b, {"z": _support(rng, "z", 3)})
    assert (a.head_version(), b.head_version()) == (1, 2)
    assert sorted(ModelStore.open(one).read().labels) == ["x"] and sorted(ModelStore.open(two).read().labels) == ["y", "z"]
    assert ModelStore(one).backend == "postgresql"
    with pytest.raises(DyntcError, match=r"holds no dyntc model 'nothing_here'.*dyntc labels copy"):
        ModelStore.open(postgres.url("nothing_here"))
    for bad in ("Intents", "1x", "a-b", "x" * 51, "a;drop"):
        with pytest.raises(DyntcError, match="use lower-case letters"):
            ModelStore(postgres.base + f"?model={bad}")
    conninfo, model, shown = parse_url("postgresql://me:secret@db.example:5433/prod?sslmode=require&model=intents")
    assert model == "intents" and "model" not in conninfo and "sslmode=require" in conninfo
    assert "secret" not in shown and shown.startswith("postgresql://me:***@db.example:5433/prod?")
    assert parse_url("postgres://h/d")[1] == "dyntc"  # the default model


def test_the_writers_lock_serialises_processes_and_keeps_readers_free(postgres):
    """Four processes commit 15 versions each into one model at once: all 60 land, numbered 2..61;
    a reader meanwhile never waits for them."""
    rng = np.random.default_rng(2)
    url = postgres.url()
    store = ModelStore.create(url)
    _commit(store, {"base": _support(rng, "base", 2)}, replace_all=True)
    code = (
        "import sys, numpy as np, torch\n"
        "from dyntc.classifier.store import ModelStore\n"
        "s = ModelStore.open(sys.argv[1])\n"
        "for i in range(15):\n"
        "    with s.transaction() as t:\n"
        "        v = t.commit(op='w', detail=[], document={'dim': 16}, weights=b'w', replace_all=False,\n"
        "                     labels={f'{sys.argv[2]}_{i}': ([f'{sys.argv[2]} {i}'], torch.ones(1, 16), [0])})\n"
        "    print(v, flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, url, f"p{k}"], stdout=subprocess.PIPE, text=True)
             for k in range(4)]
    slowest = 0.0
    while any(p.poll() is None for p in procs):
        t0 = time.perf_counter()
        store.read()
        slowest = max(slowest, time.perf_counter() - t0)
    acknowledged = [int(v) for p in procs for v in p.stdout.read().split()]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(acknowledged) == list(range(2, 62))
    assert len(store.read().labels) == 61
    assert slowest < 1.0, slowest


def test_a_full_disk_a_lost_connection_and_dropped_tables_are_reported(postgres):
    rng = np.random.default_rng(3)
    url = postgres.url()
    store = ModelStore.create(url)
    _commit(store, {"a": _support(rng, "a", 5)}, replace_all=True)
    schema = parse_url(url)[1]
    # the server itself raising "disk full" (SQLSTATE 53100) while the commit inserts its rows
    postgres.sql(f"""CREATE FUNCTION "{schema}".full() RETURNS trigger LANGUAGE plpgsql AS
                     $$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device'
                     USING ERRCODE = 'disk_full'; END $$""")
    postgres.sql(f'CREATE TRIGGER disk_full BEFORE INSERT ON "{schema}".members FOR EACH ROW EXECUTE FUNCTION "{schema}".full()')
    with pytest.raises(StoreFullError, match="disk of the database server holding .* is full .*nothing was committed"):
        _commit(store, {"b": _support(rng, "b", 5)})
    postgres.sql(f'DROP TRIGGER disk_full ON "{schema}".members')
    assert store.head_version() == 1 and sorted(store.read().labels) == ["a"]
    # every connection of the pool cut by the server: reported as unavailable, then reconnected
    store.check()
    postgres.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'dyntc'")
    time.sleep(0.2)
    assert store.head_version() == 1  # the pool noticed and reconnected
    # a server nobody listens on
    with pytest.raises(StoreUnavailableError, match="is gone or unreadable"):
        ModelStore.open("postgresql://postgres@127.0.0.1:1/postgres?model=x&connect_timeout=2")
    # the model's tables dropped under it
    postgres.sql(f'DROP SCHEMA "{schema}" CASCADE')
    for call in (store.check, store.read, store.versions, lambda: _commit(store, {"b": _support(rng, "b", 2)})):
        with pytest.raises(StoreUnavailableError, match="is gone or unreadable"):
            call()


def test_followers_are_told_at_once_and_poll_while_their_listener_is_cut(postgres):
    rng = np.random.default_rng(4)
    url = postgres.url()
    store = ModelStore.create(url)
    _commit(store, {"a": _support(rng, "a", 2)}, replace_all=True)
    follower = ModelStore.open(url)
    seen, stop = [], threading.Event()

    def on_change():
        seen.append((time.perf_counter(), follower.head_version()))

    thread = threading.Thread(target=follower.follow, args=(stop, on_change), daemon=True)
    thread.start()
    try:
        deadline = time.time() + 10
        while not seen and time.time() < deadline:  # listening (it reads the head once it is)
            time.sleep(0.05)
        lags = []
        for i in range(10):
            t0 = time.perf_counter()
            version = _commit(store, {f"l{i}": _support(rng, f"l{i}", 2)})
            while not any(v >= version for _, v in seen) and time.perf_counter() - t0 < 5:
                time.sleep(0.005)
            lags.append(next(t for t, v in seen if v >= version) - t0)
        assert max(lags) < 0.25, lags  # a notification, not a poll
        # the listening connection cut: the follower polls, and listens again
        assert postgres.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE application_name = 'dyntc-follower'") == [(True,)]
        t0 = time.perf_counter()
        version = _commit(store, {"after": _support(rng, "after", 2)})
        while not any(v >= version for _, v in seen) and time.perf_counter() - t0 < 5:
            time.sleep(0.01)
        assert any(v >= version for _, v in seen)
        assert next(t for t, v in seen if v >= version) - t0 < 1.0
    finally:
        stop.set()
        thread.join(timeout=5)
    assert not thread.is_alive()
