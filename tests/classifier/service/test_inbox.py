"""The inbox of `dyntc serve`: capture of the texts it could not place (opt-in, bounded, in the
model's store), readable and clearable only with the token; accepting texts as a label is one write.
Real server processes (tests/_server.py) on the hashing toy; the capture table also on PostgreSQL."""

import subprocess
import sys

import numpy as np
import pytest
from _postgres import postgres  # noqa: F401  (the fixture)
from _server import Server, eventually
from _toy import TEXTS, toy_classifier

from dyntc import DynamicClassifier
from dyntc.classifier.store import ModelStore
from dyntc.classifier.store import captures as captures_module
from dyntc.classifier.store.captures import CaptureLog, Captured

pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server(fitted, tmp_path_factory):
    # a margin of 1 captures every predicted text; at most 4 are kept
    with Server.serving(fitted, tmp_path_factory.mktemp("inbox"),
                        args=["--capture", "4", "--capture-margin", "1"]) as srv:
        yield srv


def captured(server) -> list[str]:
    return [c["text"] for c in server.call("GET", "/captures")[1]["captures"]]


def test_capture_is_bounded_and_never_read_without_the_token(server):
    texts = [f"an unplaced text number {i}" for i in range(6)]
    for text in texts:  # one at a time: the newest four are kept
        assert server.call("POST", "/predict", {"texts": [text]})[0] == 200
        assert eventually(lambda: text in captured(server), timeout=20)
    assert sorted(captured(server)) == sorted(texts[2:])
    body = server.call("GET", "/captures")[1]
    assert body["capturing"] and body["total"] == 4
    assert {c["reason"] for c in body["captures"]} == {"low-margin"} and all(c["seen"] == 1 for c in body["captures"])
    for token in (None, "wrong-token-wrong-token"):
        for method, path, payload in (("GET", "/captures", None), ("DELETE", "/captures", None),
                                      ("POST", "/captures/dismiss", {"texts": texts})):
            status, answer = server.call(method, path, payload, token=token)
            assert status == 401 and "token" in answer["error"], (method, path, token)
    import urllib.request

    with urllib.request.urlopen(server.url + "/console/inbox") as resp:  # the page, anonymously
        html = resp.read().decode()
    assert "needs the service's token" in html and not any(t in html for t in texts)
    assert sorted(captured(server)) == sorted(texts[2:])  # nothing was cleared by the refused calls


def test_dismiss_accept_and_clear(server):
    texts = ["where is my parcel", "track my package", "my parcel is late"]
    server.call("POST", "/predict", {"texts": texts})
    assert eventually(lambda: set(texts) <= set(captured(server)), timeout=20)
    assert server.call("POST", "/captures/dismiss", {"texts": [texts[2]]})[1]["total"] == 3
    status, body = server.call("POST", "/discover/accept", {"texts": texts[:2], "name": "delivery"})
    assert status == 200 and body["labels"]["delivery"] == 2
    assert not set(texts) & set(captured(server))
    assert DynamicClassifier.load(server.model).support("delivery") == texts[:2]
    version = body["version"]
    status, body = server.call("POST", "/discover/accept", {"texts": ["is my parcel here"], "into": "delivery"})
    assert status == 200 and body["labels"]["delivery"] == 3 and body["version"] == version + 1
    cases = [({"texts": ["x"], "name": "delivery"}, 409, "already exists"),  # a stale proposal: name taken
             ({"texts": ["x"], "into": "gone"}, 404, "'gone' does not exist"),
             ({"texts": ["x"], "name": "a", "into": "delivery"}, 400, "either name"),
             ({"texts": ["x"]}, 400, "either name"),
             ({"texts": [], "name": "empty"}, 400, "examples is empty")]
    for payload, status, words in cases:
        got, answer = server.call("POST", "/discover/accept", payload)
        assert (got, words in answer["error"]) == (status, True), (payload, answer)
    assert server.call("POST", "/discover/accept", {"texts": ["x"], "name": "n"}, token=None)[0] == 401
    assert DynamicClassifier.load(server.model).version_ == version + 1
    assert server.call("DELETE", "/captures")[1]["total"] == 0 and captured(server) == []


def test_captured_texts_marked_out_of_scope(fitted, tmp_path):
    """Marking captured texts out of scope is one version that keeps them as the calibration's
    examples (texts like them rejected from then on) and takes them out of the inbox; it needs the
    token and a calibrated model."""
    import warnings

    from dyntc.errors import DyntcWarning

    jokes = ["tell me a joke", "tell me a funny joke please", "tell me another joke"]
    with Server.serving(fitted, tmp_path / "plain", args=["--capture", "10", "--capture-margin", "1"]) as srv:
        srv.call("POST", "/predict", {"texts": jokes})
        assert eventually(lambda: set(jokes) <= set(captured(srv)), timeout=20)
        status, answer = srv.call("POST", "/captures/out-of-scope", {"texts": jokes})
        assert status == 409 and "calibrate" in answer["error"]  # not calibrated: refused, nothing changed
        assert set(jokes) <= set(captured(srv)) and DynamicClassifier.load(srv.model).version_ == 1
    clf = fitted.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)  # a small held-out set: not what this tests
        clf.calibrate([t for y in TEXTS for t in TEXTS[y][:3]], [y for y in TEXTS for _ in range(3)])
    with Server.serving(clf, tmp_path / "calibrated", args=["--capture", "10", "--capture-margin", "1"]) as srv:
        version = DynamicClassifier.load(srv.model).version_
        srv.call("POST", "/predict", {"texts": jokes + ["wake me up at six"]})
        assert eventually(lambda: set(jokes) <= set(captured(srv)), timeout=20)
        assert srv.call("POST", "/captures/out-of-scope", {"texts": jokes[:2]}, token=None)[0] == 401
        for payload, words in (({"texts": []}, "texts is empty"), ({"texts": ["  "]}, "texts[0] is empty")):
            status, answer = srv.call("POST", "/captures/out-of-scope", payload)
            assert status == 400 and words in answer["error"], answer
        status, body = srv.call("POST", "/captures/out-of-scope", {"texts": jokes[:2]})
        assert status == 200 and body["version"] == version + 1 and body["oos_examples"] == 2
        assert jokes[2] in captured(srv) and not set(jokes[:2]) & set(captured(srv))
        stored = DynamicClassifier.load(srv.model)
        assert stored.calibration_.oos_examples == tuple(jokes[:2]) and stored.calibration_.oos_weight == 0.5
        assert stored.calibration_.threshold == clf.calibration_.threshold  # nothing refitted
        history = srv.call("GET", "/versions?limit=1")[1]["versions"]
        assert history[0]["op"] == "add_out_of_scope"
        # the service answers with the new examples' push, as the stored model does
        probe = ["tell me a joke about my alarm", "wake me up at six"]
        assert stored.top_k(probe[:1], 1)[0][0][1] > clf.top_k(probe[:1], 1)[0][0][1]  # the joke is pushed
        served = srv.call("POST", "/predict", {"texts": probe, "top_k": 2})[1]["results"]
        np.testing.assert_allclose([r["top_k"][0]["distance"] for r in served], [row[0][1] for row in stored.top_k(probe, 1)],
                                   atol=1e-5)


def test_capture_needs_a_token_and_valid_options(fitted, tmp_path):
    model = fitted.save(tmp_path / "model")
    for args, words in ((["--capture", "10"], "--capture needs --token-file"),
                        (["--capture", "-1"], "--capture got -1"),
                        (["--capture", "5", "--capture-margin", "2"], "--capture-margin got 2.0")):
        run = subprocess.run([sys.executable, "-m", "dyntc", "serve", str(model), "--port", "1", *args],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and words in run.stderr + run.stdout, (args, run.stderr[-500:])
    srv = Server(model, tmp_path, token=None)  # no token, no capture: the inbox is refused, not empty
    try:
        status, answer = srv.call("GET", "/captures", token=None)
        assert status == 403 and "--token-file" in answer["error"]
    finally:
        srv.stop()


def test_unplaced_texts_rejected_or_low_margin():
    from dyntc.classifier.service.inbox import unplaced

    clf = toy_classifier()
    texts = ["wake me up at six", "purple elephants dancing"]
    scores = clf.decision_function(texts)
    assert unplaced(clf, texts, scores, 0.0) == []  # not calibrated, no margin: nothing
    assert [c.reason for c in unplaced(clf, texts, scores, 1.0)] == ["low-margin", "low-margin"]
    near = clf.top_k(texts, 1)
    threshold = (near[0][0][1] + near[1][0][1]) / 2
    assert near[0][0][1] < threshold < near[1][0][1]
    calibration_texts = [t for y in TEXTS for t in TEXTS[y][:3]]
    clf.calibrate(calibration_texts, [y for y in TEXTS for _ in range(3)], threshold=threshold)
    found = unplaced(clf, texts, clf.decision_function(texts), 0.0)
    assert [(c.text, c.reason, c.label) for c in found] == [("purple elephants dancing", "rejected", None)]


def test_the_log_forgets_old_texts(tmp_path, monkeypatch):
    store = ModelStore.open(toy_classifier().save(tmp_path / "m"))
    log = CaptureLog(store, 10, 3600)
    clock = [1_000_000.0]
    monkeypatch.setattr(captures_module.time, "time", lambda: clock[0])
    log.add([Captured("old", "low-margin", "alarm", 0.01)])
    clock[0] += 1800
    log.add([Captured("newer", "rejected", None, 0.2), Captured("old", "low-margin", "alarm", 0.01)])
    clock[0] += 3000  # "old" was seen again 3000 s ago: kept; a text unseen for 3600 s is forgotten
    assert {r["text"]: r["seen"] for r in log.read()[0]} == {"old": 2, "newer": 1}
    clock[0] += 700
    assert log.read() == ([], 0)  # past the age: not read, and deleted by the next write
    log.add([Captured("fresh", "rejected", None, 0.0)])
    assert log.texts() == ["fresh"]


def test_replicas_share_one_inbox_in_postgresql(postgres):
    url = postgres.url()
    toy_classifier().save(url)
    one, two = CaptureLog(ModelStore.open(url), 3, 3600), CaptureLog(ModelStore.open(url), 3, 3600)
    one.add([Captured("from one", "rejected", None, 0.0)])
    two.add([Captured("from two", "low-margin", "alarm", 0.05), Captured("from one", "rejected", None, 0.0)])
    assert {r["text"]: r["seen"] for r in one.read()[0]} == {"from one": 2, "from two": 1}
    two.add([Captured(f"more {i}", "rejected", None, 0.0) for i in range(3)])
    assert one.read()[1] == 3
    one.remove(["more 0"])
    assert two.read()[1] == 2
    two.remove()
    assert one.texts() == []
