"""The versioned model store: no lost writes under concurrency, crash safety, versions, restore, storage
cost per version, pruning, the format-2 upgrade, verified reads and clear errors for a full disk or a
missing file.

Tests taking the ``where`` fixture run on both backends: a model directory (SQLite) and a model of a
throwaway PostgreSQL server (tests/_postgres.py; skipped with the reason where PostgreSQL is missing)."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _toy import LABELS, toy_classifier
import torch

from dyntc import DynamicClassifier, DyntcError
from dyntc.classifier.store import TABLES, ModelStore
from _postgres import server as postgres_server



@pytest.fixture(scope="module")
def fitted():
    return toy_classifier()


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request, tmp_path):
    """Model locations of one backend: ``where("name")`` is a directory, or a fresh model of the
    PostgreSQL test server."""
    if request.param == "sqlite":
        return lambda name: tmp_path / name
    server = postgres_server()
    return lambda name: server.url()


@pytest.fixture
def saved(fitted, where):
    return fitted.save(where("model"))


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _rows(location, sql, params=()):
    """Run one statement on the store at `location` (either backend, ``?`` placeholders), committed;
    its rows, if it returns any."""
    store = ModelStore(location)
    with store._connect() as db:
        cursor = db.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if cursor.description else None


def test_concurrent_cli_writers_all_land(saved):
    """Six `dyntc labels add` started at once on one model: every acknowledged label is there."""
    names = [f"newlabel{i}" for i in range(6)]
    procs = [subprocess.Popen([sys.executable, "-m", "dyntc", "labels", "add", str(saved), name,
                               "-e", f"an example of {name}", "-e", "another one"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for name in names]
    outcomes = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert all(code == 0 for code, _ in outcomes), outcomes
    clf = DynamicClassifier.load(saved)
    assert set(names) <= set(clf.classes_)
    assert clf.version_ == 1 + len(names)
    assert [v["op"] for v in DynamicClassifier.versions(saved)] == ["add_label"] * 6 + ["save"]


def test_stale_save_fails_loudly_and_changes_nothing(saved):
    a, b = DynamicClassifier.load(saved), DynamicClassifier.load(saved)
    a.add_label("from_a", ["set a reminder"])
    a.save(saved)
    b.add_label("from_b", ["what is the time"])
    with pytest.raises(DyntcError, match=r"changed since this classifier was loaded \(version 1, now 2\)"):
        b.save(saved)
    assert DynamicClassifier.load(saved).classes_.tolist() == sorted(LABELS + ["from_a"])
    # edit() re-reads under the lock, so the same change through it lands on top of a's.
    with DynamicClassifier.edit(saved) as clf:
        clf.add_label("from_b", ["what is the time"])
    assert DynamicClassifier.load(saved).classes_.tolist() == sorted(LABELS + ["from_a", "from_b"])


def test_failed_edit_is_discarded(saved):
    with pytest.raises(DyntcError, match="does not exist"):
        with DynamicClassifier.edit(saved) as clf:
            clf.add_label("first", ["one example"])
            clf.remove_label("no-such-label")
    assert DynamicClassifier.load(saved).classes_.tolist() == sorted(LABELS)
    assert len(DynamicClassifier.versions(saved)) == 1
    with DynamicClassifier.edit(saved) as clf:  # nothing changed: no version
        clf.predict(["hello"]).tolist()
    assert len(DynamicClassifier.versions(saved)) == 1


def test_edit_from_a_loaded_base(saved):
    """edit(base=clf) edits a copy of a classifier already loaded (the service's write path): the base
    is unchanged, the version is named by its operation, and a head moved meanwhile gets the change replayed."""
    base = DynamicClassifier.load(saved)
    with DynamicClassifier.edit(saved, base=base, op="http") as clf:
        clf.add_label("refund", ["i want my money back"])
    assert "refund" not in base.classes_ and clf.version_ == 2
    assert DynamicClassifier.versions(saved)[0]["op"] == "add_label"
    DynamicClassifier.restore(saved, 1)  # the head moves past `base`'s version
    with DynamicClassifier.edit(saved, base=base, op="http") as clf:
        clf.add_label("cancel", ["cancel my order"])
    assert clf.version_ == 4 and "cancel" in clf.classes_ and "refund" not in clf.classes_
    assert DynamicClassifier.load(saved).classes_.tolist() == sorted(LABELS + ["cancel"])
    for bad in (123, None, ""):
        with pytest.raises(DyntcError, match="a model location is a directory path or a postgresql:// URL"):
            DynamicClassifier.load(bad)
    for kwargs, match in (({"base": "model"}, "base must be a DynamicClassifier"), ({"op": ""}, "op must be a non-empty")):
        with pytest.raises(DyntcError, match=match):
            with DynamicClassifier.edit(saved, **kwargs):
                pass


def test_versions_and_restore(saved, fitted):
    texts = ["wake me at six", "how much is in my account", "will it snow"]
    with DynamicClassifier.edit(saved) as clf:
        clf.merge_labels(["alarm", "timer"], into="clock")
    with DynamicClassifier.edit(saved) as clf:
        clf.rename_label("weather", "forecast")
    history = DynamicClassifier.versions(saved)
    assert [(v["version"], v["op"], v["n_labels"]) for v in history] == [
        (3, "rename_label", 3), (2, "merge_labels", 3), (1, "save", 4)]
    assert history[1]["detail"] == [{"op": "merge_labels", "labels": ["alarm", "timer"], "into": "clock"}]
    assert DynamicClassifier.restore(saved, 1) == 4
    back = DynamicClassifier.load(saved)
    assert list(back.classes_) == list(fitted.classes_) and back.support_counts() == fitted.support_counts()
    np.testing.assert_array_equal(back.predict_proba(texts), fitted.predict_proba(texts))
    assert DynamicClassifier.load(saved, version=3).classes_.tolist() == ["balance", "clock", "forecast"]
    for bad in (0, "2", True):
        with pytest.raises(DyntcError, match="version must be an integer >= 1"):
            DynamicClassifier.restore(saved, bad)
    with pytest.raises(DyntcError, match="has no version 99"):
        DynamicClassifier.restore(saved, 99)


def test_label_operations_store_only_what_changed(saved):
    members, contents = _rows(saved, "SELECT COUNT(*) FROM members")[0][0], _rows(saved, "SELECT COUNT(*) FROM contents")[0][0]
    blobs = _rows(saved, "SELECT COUNT(*) FROM blobs")[0][0]
    with DynamicClassifier.edit(saved) as clf:
        clf.set_params(extend_vocab=False)  # keep the weights as they are
        clf.add_label("greeting", ["hello there", "hi"])
    assert _rows(saved, "SELECT COUNT(*) FROM members")[0][0] == members + 2
    assert _rows(saved, "SELECT COUNT(*) FROM contents")[0][0] == contents + 2
    # a new model document (params changed), no new weights
    assert _rows(saved, "SELECT COUNT(*) FROM blobs")[0][0] == blobs + 1
    assert len({w for (w,) in _rows(saved, "SELECT weights FROM versions")}) == 1
    with DynamicClassifier.edit(saved) as clf:
        clf.remove_label("greeting")
    assert _rows(saved, "SELECT COUNT(*) FROM members WHERE removed IS NULL")[0][0] == members
    with DynamicClassifier.edit(saved) as clf:  # the same label again: its contents are reused
        clf.add_label("greeting", ["hello there", "hi"])
    assert _rows(saved, "SELECT COUNT(*) FROM contents")[0][0] == contents + 2


def test_saving_another_classifier_replaces_the_content_as_a_new_version(saved, fitted, where):
    other = DynamicClassifier.load(saved)
    other.remove_label("alarm")
    copy = other.save(where("copy"))  # a different store: full content
    assert DynamicClassifier.load(copy).classes_.tolist() == ["balance", "timer", "weather"]
    fitted.save(saved)  # not loaded from it: replaces, and the history stays
    assert DynamicClassifier.load(saved).version_ == 2


_KILLED_IN_COMMIT = textwrap.dedent("""
    import os, signal, sys
    from dyntc import DynamicClassifier
    from dyntc.classifier import store

    commit = store.Transaction.commit
    def commit_then_die(self, **kwargs):
        commit(self, **kwargs)  # rows written inside the transaction, not yet committed
        os.kill(os.getpid(), signal.SIGKILL)
    store.Transaction.commit = commit_then_die
    with DynamicClassifier.edit(sys.argv[1]) as clf:
        clf.add_label("never", ["this label must not survive"])
""")

_WRITER = textwrap.dedent("""
    import sys
    from dyntc import DynamicClassifier
    for i in range(1000):
        with DynamicClassifier.edit(sys.argv[1]) as clf:
            clf.add_label(f"label{i}", [f"example number {i} of a label", f"and another for {i}"] * 20)
        print(f"committed label{i} as version {clf.version_}", flush=True)
""")


def test_kill_inside_a_commit_leaves_the_old_version(saved):
    proc = subprocess.run([sys.executable, "-c", _KILLED_IN_COMMIT, str(saved)], env=_env(), capture_output=True)
    assert proc.returncode == -signal.SIGKILL
    clf = DynamicClassifier.load(saved)
    assert list(clf.classes_) == sorted(LABELS) and clf.version_ == 1
    assert _rows(saved, "SELECT COUNT(*) FROM members WHERE added > 1")[0][0] == 0
    assert _rows(saved, "SELECT COUNT(*) FROM names WHERE added > 1")[0][0] == 0


def test_kill_during_writes_loses_no_acknowledged_version(saved):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(saved)], stdout=subprocess.PIPE, text=True, env=_env())
    acknowledged = []
    for line in proc.stdout:
        acknowledged.append(line.split()[1])
        if len(acknowledged) == 5:
            proc.send_signal(signal.SIGKILL)  # mid-way through the sixth (or a later) edit
            break
    proc.wait(timeout=60)
    # killed by the test after five acknowledged commits (a writer that failed early would make the rest vacuous)
    assert len(acknowledged) == 5 and proc.returncode == -signal.SIGKILL, (acknowledged, proc.returncode)
    clf = DynamicClassifier.load(saved)
    assert set(acknowledged) <= set(clf.classes_)
    # Whatever was committed is whole: every label has all its 40 examples.
    counts = clf.support_counts()
    assert all(counts[f"label{i}"] == 40 for i in range(len(clf.classes_) - len(LABELS)))
    assert clf.version_ == 1 + len(clf.classes_) - len(LABELS)


# ------------------------------------------------------------------ storage cost, verification, format
# These build stores directly through ModelStore / Transaction with random 384-d points (the size of
# the MiniLM default's), a dummy document and dummy weights: no encoder needed.

DIM = 384


def _points(rng, n):
    return torch.from_numpy(rng.standard_normal((n, DIM)).astype("float32"))


def _support(rng, prefix, n, part=0):
    return ([f"{prefix} example {i}" for i in range(n)], _points(rng, n), [part] * n)


def _commit(store, labels, *, replace_all=False, op="op"):
    with store.transaction() as txn:
        return txn.commit(op=op, detail=[{"op": op}], document={"dim": DIM}, weights=b"dummy weights",
                          labels=labels, replace_all=replace_all)


def _fake_store(path, rng, sizes):
    store = ModelStore.create(path)
    state = {name: _support(rng, name, n) for name, n in sizes.items()}
    _commit(store, state, replace_all=True, op="save")
    return store, state


def _disk_bytes(store):
    """SQLite: the store's file size once the write-ahead log is checkpointed into it. PostgreSQL (whose
    files grow by whole pages, reused later): the bytes of the stored rows."""
    if store.file is None:
        return sum(_rows(store.location, f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t")[0][0]
                   for table in ["meta", *TABLES])
    with sqlite3.connect(store.file) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store.file.stat().st_size


def _same(snapshot_labels, state):
    """A read-back label set equals `state` exactly: names, texts and parts in order, points bit for bit."""
    assert sorted(snapshot_labels) == sorted(state)
    for name, (texts, points, parts) in state.items():
        got = snapshot_labels[name]
        assert list(got[0]) == list(texts), name
        assert list(got[2]) == list(parts), name
        assert torch.equal(got[1], points), name


def _grow(support, rng, texts):
    old_texts, points, parts = support
    return (list(old_texts) + list(texts), torch.cat([points, _points(rng, len(texts))]), list(parts) + [0] * len(texts))


def test_one_added_example_or_a_rename_costs_bytes_not_megabytes(where):
    rng = np.random.default_rng(0)
    store, state = _fake_store(where("m"), rng, {"big": 1000, "small": 20, "other": 50})
    before = _disk_bytes(store)
    state["big"] = _grow(state["big"], rng, ["one more example"])
    _commit(store, {"big": state["big"]})
    added = _disk_bytes(store) - before
    state["renamed"] = state.pop("big")
    _commit(store, {"big": None, "renamed": state["renamed"]})
    renamed = _disk_bytes(store) - before - added
    assert added < 20_000 and renamed < 20_000, (added, renamed)  # format 2 wrote 2.07 MB for each
    _same(store.read().labels, state)
    # the rename touched no example
    assert _rows(store.location, "SELECT COUNT(*) FROM members WHERE added = 3 OR removed = 3")[0][0] == 0


def test_per_version_cost_stays_flat_and_every_version_reads_back(where):
    """200 small operations (add one example, remove one from the middle, rename, merge, split back):
    the second hundred costs no more than the first, each about a few kB, and every version reads
    back exactly the state committed as it."""
    rng = np.random.default_rng(1)
    store, state = _fake_store(where("m"), rng, {"big": 1000, **{f"l{i}": 30 for i in range(5)}})
    expected, cost = {1: dict(state)}, []
    for step in range(200):
        start = _disk_bytes(store) if step in (0, 100) else None
        names = sorted(state)
        name = names[step % len(names)]
        kind = step % 4
        if kind == 0:
            state[name] = changes = _grow(state[name], rng, [f"new example {step}"])
            changes = {name: changes}
        elif kind == 1 and len(state[name][0]) > 3:
            texts, points, parts = state[name]
            i = len(texts) // 2
            state[name] = (texts[:i] + texts[i + 1:], torch.cat([points[:i], points[i + 1:]]), parts[:i] + parts[i + 1:])
            changes = {name: state[name]}
        elif kind == 2:
            new = f"{name.split('~')[0]}~{step}"
            state[new] = state.pop(name)
            changes = {name: None, new: state[new]}
        else:  # merge two labels into one with two parts
            a, b = [n for n in names if n != name][:2]
            sa, sb = state.pop(a), state.pop(b)
            merged = f"m{step}"
            state[merged] = (sa[0] + sb[0], torch.cat([sa[1], sb[1]]), [0] * len(sa[0]) + [1] * len(sb[0]))
            changes = {a: None, b: None, merged: state[merged]}
            if len(state) < 4:  # keep a few labels around: split the merged one back
                state[a], state[b] = sa, sb
                del state[merged]
                changes = {merged: None, a: sa, b: sb}
        version = _commit(store, changes)
        expected[version] = dict(state)
        if start is not None:
            cost.append(start)
    cost.append(_disk_bytes(store))
    first, second = cost[1] - cost[0], cost[2] - cost[1]
    assert second <= 1.5 * first + 16_384, (first, second)
    assert (cost[2] - cost[0]) / 200 < 8_000, cost  # format 2: 26 kB rising to 66 kB per version
    for version, state_then in expected.items():
        _same(store.read(version).labels, state_then)
    assert [v["n_examples"] for v in store.versions()][::-1] == [sum(len(s[0]) for s in st.values())
                                                                 for st in expected.values()]


def test_restore_writes_only_the_difference_and_keeps_the_order(where):
    rng = np.random.default_rng(2)
    store, state = _fake_store(where("m"), rng, {"big": 1000, "a": 40, "b": 40})
    v1 = dict(state)
    texts, points, parts = state["big"]
    keep = [i for i in range(1000) if i % 100 != 7]  # ten examples from the middle removed
    state["big"] = ([texts[i] for i in keep], points[keep], [parts[i] for i in keep])
    state["renamed"] = state.pop("a")
    _commit(store, {"big": state["big"], "a": None, "renamed": state["renamed"]})
    state["big"] = _grow(state["big"], rng, ["late", "later"])
    _commit(store, {"big": state["big"]})
    before = _disk_bytes(store)
    with store.transaction() as txn:
        assert txn.restore(1) == 4
    assert _disk_bytes(store) - before < 20_000  # format 2 copied all 1,080 examples: 1.7 MB
    _same(store.read(4).labels, v1)  # the re-opened examples are back in their old places
    _same(store.read(3).labels, state)
    state["big"] = _grow(v1["big"], rng, ["after the restore"])  # and a commit on top keeps working
    _commit(store, {"big": state["big"]})
    _same(store.read().labels, {**v1, "big": state["big"]})


def test_prune_shrinks_the_file_and_refuses_pruned_versions(where):
    from dyntc.cli.labels import labels_prune

    rng = np.random.default_rng(3)
    store, state = _fake_store(where("m"), rng, {"a": 200, "b": 20})
    expected = {1: dict(state)}
    for step in range(29):  # every version replaces label a's examples: 30 versions of 200 points
        state["a"] = _support(rng, f"a{step}", 200)
        expected[_commit(store, {"a": state["a"]})] = dict(state)
    with pytest.raises(DyntcError, match="keep must be an integer >= 1"):
        store.prune(0)
    result = store.prune(5)
    assert result["versions_removed"] == 25 and result["kept"] == [26, 30]
    if store.file is not None:  # SQLite's VACUUM gives the space back to the file system
        assert result["bytes_after"] < result["bytes_before"] / 3, result
        assert store.file.stat().st_size == result["bytes_after"]
    else:  # PostgreSQL's plain VACUUM keeps it for reuse (readers never wait): the rows are gone
        assert _disk_bytes(store) < result["bytes_before"] / 3, result
    assert [v["version"] for v in store.versions()] == [30, 29, 28, 27, 26]
    for version in range(26, 31):
        _same(store.read(version).labels, expected[version])
    with pytest.raises(DyntcError, match=r"version 3 of .* was pruned; the store keeps versions 26\.\.30"):
        store.read(3)
    with pytest.raises(DyntcError, match=r"version 25 of .* was pruned; the store keeps versions 26\.\.30"):
        with store.transaction() as txn:
            txn.restore(25)
    with pytest.raises(DyntcError, match=r"has no version 31; its versions are 26\.\.30"):
        store.read(31)
    with store.transaction() as txn:  # restoring a kept version still works
        txn.restore(27)
    _same(store.read().labels, expected[27])
    # only what versions 26..31 use is left
    assert _rows(store.location, "SELECT COUNT(*) FROM contents")[0][0] == 20 + 5 * 200
    labels_prune(store.location, keep=1)
    assert [v["version"] for v in store.versions()] == [31]
    _same(store.read().labels, expected[27])


# A format-2 store (dyntc before format 3), written with its own SQL: one examples table, each commit
# closing every row of a changed label and inserting its full new support.
_V2_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE blobs (hash TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE versions (id INTEGER PRIMARY KEY, created TEXT NOT NULL, op TEXT NOT NULL, detail TEXT NOT NULL,
    model TEXT NOT NULL, weights TEXT NOT NULL, n_labels INTEGER NOT NULL, n_examples INTEGER NOT NULL);
CREATE TABLE examples (id INTEGER PRIMARY KEY, label TEXT NOT NULL, text TEXT NOT NULL, point BLOB NOT NULL,
    added INTEGER NOT NULL, removed INTEGER, part INTEGER NOT NULL DEFAULT 0);
CREATE INDEX examples_alive ON examples (removed, label);
INSERT INTO meta VALUES ('format', '2'), ('store_id', 'v2store'), ('created', '2026-01-01');
"""


def _v2_version(db, version, op):
    import hashlib
    import json

    doc = json.dumps({"dim": DIM}).encode()
    keys = [hashlib.sha256(data).hexdigest() for data in (doc, b"v2 weights")]
    db.executemany("INSERT OR IGNORE INTO blobs VALUES (?, ?)", list(zip(keys, (doc, b"v2 weights"))))
    n_labels, n_examples = db.execute("SELECT COUNT(DISTINCT label), COUNT(*) FROM examples WHERE removed IS NULL").fetchone()
    db.execute("INSERT INTO versions VALUES (?, '2026-01-01', ?, '[]', ?, ?, ?, ?)", (version, op, *keys, n_labels, n_examples))


def _v2_commit(db, labels, replace_all, op):
    version = db.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM versions").fetchone()[0]
    if replace_all:
        db.execute("UPDATE examples SET removed = ? WHERE removed IS NULL", (version,))
    else:
        db.executemany("UPDATE examples SET removed = ? WHERE removed IS NULL AND label = ?", [(version, n) for n in labels])
    for name, support in labels.items():
        if support is not None:
            texts, points, parts = support
            db.executemany("INSERT INTO examples (label, text, point, added, part) VALUES (?, ?, ?, ?, ?)",
                           [(name, t, p.numpy().astype("<f4").tobytes(), version, part)
                            for t, p, part in zip(texts, points, parts)])
    _v2_version(db, version, op)


def _v2_restore(db, old):
    version = db.execute("SELECT MAX(id) + 1 FROM versions").fetchone()[0]
    db.execute("UPDATE examples SET removed = ? WHERE removed IS NULL", (version,))
    db.execute("INSERT INTO examples (label, text, point, added, part) SELECT label, text, point, ?1, part FROM examples "
               "WHERE added <= ?2 AND (removed IS NULL OR removed > ?2) ORDER BY id", (version, old))
    _v2_version(db, version, "restore")


def _v2_read(db, version):
    """What dyntc read from a format-2 store: the rows alive at `version` by label, in id order."""
    labels = {}
    for label, text, point, part in db.execute(
            "SELECT label, text, point, part FROM examples WHERE added <= ?1 AND (removed IS NULL OR removed > ?1) "
            "ORDER BY id", (version,)):
        texts, points, parts = labels.setdefault(label, ([], [], []))
        texts.append(text)
        points.append(np.frombuffer(point, dtype="<f4"))
        parts.append(part)
    return {name: (t, torch.from_numpy(np.stack(p).copy()), pa) for name, (t, p, pa) in labels.items()}


@pytest.mark.parametrize("with_parts", [True, False])
def test_format_2_stores_are_upgraded_in_place_with_every_version_identical(tmp_path, with_parts):
    rng = np.random.default_rng(4)
    path = tmp_path / "m"
    path.mkdir()
    db = sqlite3.connect(path / "dyntc.sqlite", isolation_level=None)
    db.executescript(_V2_SCHEMA)
    state = {"alarm": _support(rng, "alarm", 30), "timer": _support(rng, "timer", 20), "weather": _support(rng, "w", 25)}
    _v2_commit(db, state, True, "save")
    a = _grow(state["alarm"], rng, ["wake me"])
    state["alarm"] = (a[0] + a[0][:1], torch.cat([a[1], a[1][:1]]), a[2] + [0])  # and an example twice
    _v2_commit(db, {"alarm": state["alarm"]}, False, "add_examples")
    _v2_commit(db, {"weather": None, "forecast": state["weather"]}, False, "rename_label")
    a, t = state["alarm"], state["timer"]
    clock = (a[0] + t[0], torch.cat([a[1], t[1]]), [0] * len(a[0]) + [1] * len(t[0]))
    _v2_commit(db, {"alarm": None, "timer": None, "clock": clock}, False, "merge_labels")
    _v2_commit(db, {"forecast": None}, False, "remove_label")
    _v2_restore(db, 2)
    _v2_commit(db, {"alarm": _support(rng, "alarm again", 5)}, False, "add_label")
    if not with_parts:  # stores written before merged labels had parts
        db.execute("ALTER TABLE examples DROP COLUMN part")
        db.execute("ALTER TABLE examples ADD COLUMN part INTEGER NOT NULL DEFAULT 0")
    old = {v: _v2_read(db, v) for v in range(1, 8)}
    if not with_parts:
        db.execute("ALTER TABLE examples DROP COLUMN part")
    db.close()

    store = ModelStore.open(path)
    assert _rows(path, "SELECT value FROM meta WHERE key = 'format'") == [("4",)]
    assert not _rows(path, "SELECT name FROM sqlite_master WHERE name = 'examples'")
    assert [v["version"] for v in store.versions()] == list(range(7, 0, -1))
    for version, labels in old.items():
        snap = store.read(version)
        assert snap.store_id == "v2store" and snap.weights == b"v2 weights"
        _same(snap.labels, labels)
    assert _rows(path, "SELECT COUNT(*) FROM contents")[0][0] == 30 + 2 + 20 + 25 + 5 - 1  # nothing stored twice
    with store.transaction() as txn:  # restorable, and committable on top
        assert txn.restore(4) == 8
    _same(store.read(8).labels, old[4])
    ModelStore.open(path)  # opening it again: nothing left to upgrade
    _same(store.read(5).labels, old[5])


def test_stores_of_a_newer_format_and_files_that_are_not_stores_are_refused(tmp_path):
    rng = np.random.default_rng(5)
    store, _ = _fake_store(tmp_path / "m", rng, {"a": 3})
    with sqlite3.connect(store.file) as db:
        db.execute("UPDATE meta SET value = '5' WHERE key = 'format'")
    with pytest.raises(DyntcError, match="store format 5, written by a newer dyntc"):
        ModelStore.open(store.path)
    for name, content, match in [("empty", b"", r"is not a dyntc store \(the file is empty"),
                                 ("text", b"hello" * 100, r"damaged or not a dyntc store \(not an SQLite database\)")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "dyntc.sqlite").write_bytes(content)
        with pytest.raises(DyntcError, match=match):
            ModelStore.open(tmp_path / name)
    (tmp_path / "other").mkdir()
    with sqlite3.connect(tmp_path / "other" / "dyntc.sqlite") as db:
        db.execute("CREATE TABLE t (x)")
    with pytest.raises(DyntcError, match=r"is not a dyntc store \(an SQLite database without dyntc's tables\)"):
        ModelStore.open(tmp_path / "other")


def test_damaged_blobs_contents_and_non_finite_points_are_detected_with_the_version(where):
    from dyntc.classifier.store.schema import content_hash

    rng = np.random.default_rng(6)
    store, state = _fake_store(where("m"), rng, {"x": 30, "y": 30})
    at = store.location
    _commit(store, {"z": _support(rng, "z", 30)})
    with pytest.raises(DyntcError, match="non-finite points"):  # refused before anything is written
        bad = _support(rng, "bad", 5)
        bad[1][2, 7] = float("inf")
        _commit(store, {"bad": bad})
    assert store.read().version == 2
    model = _rows(at, "SELECT model FROM versions WHERE id = 2")[0][0]
    _rows(at, "UPDATE blobs SET data = ? WHERE hash = ?", (b'{"dim": 1}', model))
    with pytest.raises(DyntcError, match="damaged: the model document of version 2 .* does not match its hash"):
        store.read()
    _rows(at, "UPDATE blobs SET data = ? WHERE hash = ?", (f'{{"dim": {DIM}}}'.encode(), model))
    weights = _rows(at, "SELECT weights FROM versions WHERE id = 2")[0][0]
    _rows(at, "UPDATE blobs SET data = ? WHERE hash = ?", (b"tampered", weights))
    with pytest.raises(DyntcError, match="damaged: the weights of version 2"):
        store.read()
    _rows(at, "UPDATE blobs SET data = ? WHERE hash = ?", (b"dummy weights", weights))
    zid = _rows(at, "SELECT c.id FROM contents c WHERE c.text = 'z example 3'")[0][0]
    _rows(at, "UPDATE contents SET text = 'changed' WHERE id = ?", (zid,))
    with pytest.raises(DyntcError, match="an example of label 'z' in version 2 does not match its hash"):
        store.read()
    _same(store.read(1).labels, state)  # version 1 does not use it
    # 20 points set to +inf with matching hashes (as a buggy writer would store them): refused by name
    _rows(at, "UPDATE contents SET text = 'z example 3' WHERE id = ?", (zid,))
    for cid, text in _rows(at, "SELECT id, text FROM contents WHERE text LIKE 'x example %' ORDER BY id LIMIT 20"):
        point = np.full(DIM, np.inf, dtype="<f4").tobytes()
        _rows(at, "UPDATE contents SET point = ?, hash = ? WHERE id = ?", (point, content_hash(text, point), cid))
    with pytest.raises(DyntcError, match="label 'x' of version 2 has non-finite points; restore an earlier version"):
        store.read()
    with pytest.raises(DyntcError, match="label 'x' of version 1 has non-finite points"):
        DynamicClassifier.load(at, version=1)


def test_a_changed_label_name_or_membership_row_is_detected_by_the_version_digest(where):
    rng = np.random.default_rng(8)
    store, state = _fake_store(where("m"), rng, {"x": 6, "y": 6})
    at = store.location
    _commit(store, {"z": _support(rng, "z", 4)})  # version 2
    label = {name: _rows(at, "SELECT label FROM names WHERE name = ?", (name,))[0][0] for name in "xyz"}
    y, z = ([r[0] for r in _rows(at, "SELECT id FROM members WHERE label = ? ORDER BY pos", (label[n],))] for n in "yz")
    damaged = "damaged: the label names or the examples each label holds in version 2 do not match its digest"
    edits = [  # (the edit, its undo, whether it is in what a process serving version 1 reads to follow: z)
        ("UPDATE names SET name = 'Z' WHERE name = 'z'", (), "UPDATE names SET name = 'z' WHERE name = 'Z'", (), True),
        ("UPDATE members SET pos = -1 WHERE id = ?", (z[2],), "UPDATE members SET pos = id WHERE id = ?", (z[2],), True),
        ("UPDATE names SET name = 'Y' WHERE name = 'y'", (), "UPDATE names SET name = 'y' WHERE name = 'Y'", (), False),
        ("UPDATE members SET label = ? WHERE id = ?", (label["x"], y[0]),
         "UPDATE members SET label = ? WHERE id = ?", (label["y"], y[0]), False),
        ("UPDATE members SET part = 1 WHERE id = ?", (y[2],), "UPDATE members SET part = 0 WHERE id = ?", (y[2],), False),
    ]
    for edit, args, undo, undo_args, followed in edits:
        _rows(at, edit, args)
        with pytest.raises(DyntcError, match=damaged):
            store.read()
        if followed:  # the labels it did not change are served from its verified copy of version 1
            with pytest.raises(DyntcError, match=damaged):
                store.changes_since(store.store_id(), 1)
        _rows(at, undo, undo_args)
        _same(store.read(1).labels, state)
        assert sorted(store.read().labels) == ["x", "y", "z"]
    assert store.changes_since(store.store_id(), 1).labels.keys() == {"z"}
    # a commit on top carries the digest on from the labels it changed
    _commit(store, {"x": None, "w": _support(rng, "w", 2)})
    _rows(at, "UPDATE names SET name = 'Y' WHERE name = 'y'")
    with pytest.raises(DyntcError, match=damaged.replace("version 2", "version 3")):
        store.read()


def test_a_format_3_store_is_upgraded_and_its_old_versions_read_as_before(where):
    rng = np.random.default_rng(9)
    store, state = _fake_store(where("m"), rng, {"x": 5, "y": 5})
    at = store.location
    _rows(at, "ALTER TABLE versions DROP COLUMN state")  # what format 3 wrote
    _rows(at, "UPDATE meta SET value = '3' WHERE key = 'format'")
    store = ModelStore.open(at)
    assert _rows(at, "SELECT value FROM meta WHERE key = 'format'") == [("4",)]
    assert _rows(at, "SELECT state FROM versions") == [(None,)]  # no digest was recorded for it
    _same(store.read(1).labels, state)
    _commit(store, {"z": _support(rng, "z", 3)})
    _rows(at, "UPDATE names SET name = 'Y' WHERE name = 'y'")
    with pytest.raises(DyntcError, match="damaged: the label names or the examples each label holds in version 2"):
        store.read(2)
    assert sorted(store.read(1).labels) == ["Y", "x"]  # a version from before the digest: read as it is
    ModelStore.open(at)  # nothing left to upgrade


def test_a_full_disk_is_reported_as_such_and_commits_nothing(tmp_path, monkeypatch):
    from dyntc.classifier.store import StoreFullError

    rng = np.random.default_rng(7)
    store, state = _fake_store(tmp_path / "m", rng, {"a": 10})
    connect = sqlite3.connect

    def full_disk(*args, **kwargs):  # the database may not grow by more than two pages
        db = connect(*args, **kwargs)
        db.execute(f"PRAGMA max_page_count = {db.execute('PRAGMA page_count').fetchone()[0] + 2}")
        return db

    monkeypatch.setattr(sqlite3, "connect", full_disk)
    with pytest.raises(StoreFullError, match="disk holding .* is full .*nothing was committed"):
        _commit(store, {"b": _support(rng, "b", 500)})
    monkeypatch.undo()
    assert store.read().version == 1 and [v["version"] for v in store.versions()] == [1]
    _same(store.read().labels, state)

    class NoRoomToVacuum:  # VACUUM needs free space about the size of the store
        def __init__(self, db):
            self.db = db

        def __getattr__(self, name):
            return getattr(self.db, name)

        def execute(self, sql, *args):
            if sql == "VACUUM":
                raise sqlite3.OperationalError("database or disk is full")
            return self.db.execute(sql, *args)

    _commit(store, {"a": _support(rng, "a2", 10)})
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: NoRoomToVacuum(connect(*a, **k)))
    with pytest.raises(StoreFullError, match="versions before 2 .* were deleted, but the file could not be compacted"):
        store.prune(1)


def test_a_store_removed_while_in_use_is_reported_as_gone(tmp_path):
    from dyntc.classifier.store import StoreUnavailableError

    rng = np.random.default_rng(8)
    store, _ = _fake_store(tmp_path / "m", rng, {"a": 10})
    store.check()
    with pytest.raises(StoreUnavailableError, match="deleted or replaced while this write was under way"):
        with store.transaction() as txn:  # SQLite itself would commit into the orphaned log
            store.file.rename(store.file.with_suffix(".moved"))
            txn.commit(op="x", detail=[], document={"dim": DIM}, weights=b"w", labels={"b": _support(rng, "b", 2)},
                       replace_all=False)
    store.file.with_suffix(".moved").rename(store.file)
    assert store.read().version == 1
    store.file.unlink()
    for call in (store.check, store.read, store.versions, lambda: _commit(store, {"b": _support(rng, "b", 2)})):
        with pytest.raises(StoreUnavailableError, match="is gone or unreadable"):
            call()
    assert not store.file.exists()  # not silently re-created as an empty database
