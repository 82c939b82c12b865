"""The versioned model store: no lost writes under concurrency, crash safety, versions, restore."""

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dyntc import DynamicClassifier, DyntcError

LABELS = ["alarm", "balance", "timer", "weather"]
TINY = dict(encoder="sru", hidden_size=16, num_layers=1, dropout=0.0, max_len=16, episodes=5, n_query=16, lr=3e-3)


@pytest.fixture(scope="module")
def fitted(clinc_raw):
    pairs = [(t, y) for y in LABELS for t in [t for t, lab in clinc_raw["train"] if lab == y][:40]]
    return DynamicClassifier(**TINY).fit([t for t, _ in pairs], [y for _, y in pairs])


@pytest.fixture
def saved(fitted, tmp_path):
    return fitted.save(tmp_path / "model")


def _env():
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def _rows(path, sql):
    with sqlite3.connect(path / "dyntc.sqlite") as db:
        return db.execute(sql).fetchall()


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
    assert DynamicClassifier.load(saved).classes_ == sorted(LABELS + ["from_a"])
    # edit() re-reads under the lock, so the same change through it lands on top of a's.
    with DynamicClassifier.edit(saved) as clf:
        clf.add_label("from_b", ["what is the time"])
    assert DynamicClassifier.load(saved).classes_ == sorted(LABELS + ["from_a", "from_b"])


def test_failed_edit_is_discarded(saved):
    with pytest.raises(DyntcError, match="does not exist"):
        with DynamicClassifier.edit(saved) as clf:
            clf.add_label("first", ["one example"])
            clf.remove_label("no-such-label")
    assert DynamicClassifier.load(saved).classes_ == sorted(LABELS)
    assert len(DynamicClassifier.versions(saved)) == 1
    with DynamicClassifier.edit(saved) as clf:  # nothing changed: no version
        clf.predict(["hello"])
    assert len(DynamicClassifier.versions(saved)) == 1


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
    assert back.classes_ == fitted.classes_ and back.support_counts() == fitted.support_counts()
    np.testing.assert_array_equal(back.predict_proba(texts), fitted.predict_proba(texts))
    assert DynamicClassifier.load(saved, version=3).classes_ == ["balance", "clock", "forecast"]
    for bad in (0, "2", True):
        with pytest.raises(DyntcError, match="version must be an integer >= 1"):
            DynamicClassifier.restore(saved, bad)
    with pytest.raises(DyntcError, match="has no version 99"):
        DynamicClassifier.restore(saved, 99)


def test_label_operations_store_only_what_changed(saved):
    examples, blobs = _rows(saved, "SELECT COUNT(*) FROM examples")[0][0], _rows(saved, "SELECT COUNT(*) FROM blobs")[0][0]
    with DynamicClassifier.edit(saved) as clf:
        clf.set_params(extend_vocab=False)  # keep the weights as they are
        clf.add_label("greeting", ["hello there", "hi"])
    assert _rows(saved, "SELECT COUNT(*) FROM examples")[0][0] == examples + 2
    # a new model document (params changed), no new weights
    assert _rows(saved, "SELECT COUNT(*) FROM blobs")[0][0] == blobs + 1
    assert len({w for (w,) in _rows(saved, "SELECT weights FROM versions")}) == 1
    with DynamicClassifier.edit(saved) as clf:
        clf.remove_label("greeting")
    assert _rows(saved, "SELECT COUNT(*) FROM examples WHERE removed IS NULL")[0][0] == examples


def test_saving_another_classifier_replaces_the_content_as_a_new_version(saved, fitted):
    other = DynamicClassifier.load(saved)
    other.remove_label("alarm")
    other.save(saved.parent / "copy")  # a different store: full content
    assert DynamicClassifier.load(saved.parent / "copy").classes_ == ["balance", "timer", "weather"]
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
    assert clf.classes_ == sorted(LABELS) and clf.version_ == 1
    assert _rows(saved, "SELECT COUNT(*) FROM examples WHERE added > 1")[0][0] == 0


def test_kill_during_writes_loses_no_acknowledged_version(saved):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(saved)], stdout=subprocess.PIPE, text=True, env=_env())
    acknowledged = []
    for line in proc.stdout:
        acknowledged.append(line.split()[1])
        if len(acknowledged) == 5:
            proc.send_signal(signal.SIGKILL)  # mid-way through the sixth (or a later) edit
            break
    proc.wait(timeout=60)
    clf = DynamicClassifier.load(saved)
    assert set(acknowledged) <= set(clf.classes_)
    # Whatever was committed is whole: every label has all its 40 examples.
    counts = clf.support_counts()
    assert all(counts[f"label{i}"] == 40 for i in range(len(clf.classes_) - len(LABELS)))
    assert clf.version_ == 1 + len(clf.classes_) - len(LABELS)
