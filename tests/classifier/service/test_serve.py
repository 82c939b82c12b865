"""`dyntc serve` over real HTTP: a uvicorn subprocess on 127.0.0.1, the stdlib as the client."""

import signal
import subprocess
import sys
import threading
import time

import pytest
from _toy import LABELS, toy_classifier
from _server import SERVER_GONE, Server, eventually

from dyntc import DynamicClassifier

pytest.importorskip("fastapi")



@pytest.fixture(scope="module")
def server(fitted, tmp_path_factory):
    with Server.serving(fitted, tmp_path_factory.mktemp("serve")) as srv:
        yield srv


def test_label_lifecycle_over_http(server):
    status, body = server.call("GET", "/labels")
    assert status == 200 and set(body["labels"]) == set(LABELS) and body["version"] == 1
    status, body = server.call("POST", "/predict", {"texts": ["wake me up at six", "what is my balance"],
                                                    "top_k": 2, "proba": True})
    assert status == 200 and len(body["results"]) == 2 and body["labels"] == sorted(LABELS)
    first = body["results"][0]
    assert first["label"] in LABELS and 0 < first["probability"] <= 1 and len(first["top_k"]) == 2
    status, body = server.call("POST", "/labels", {"name": "greeting", "examples": ["hello there", "hi"]})
    assert status == 201 and body["labels"]["greeting"] == 2 and body["version"] == 2
    assert server.call("POST", "/labels/greeting/examples", {"examples": ["good morning"]})[1]["labels"]["greeting"] == 3
    body = server.call("POST", "/labels/greeting/split", {"parts": {"hello": ["hello there"], "bye": ["goodbye"]}})[1]
    assert "greeting" not in body["labels"] and body["labels"]["hello"] == 1
    assert server.call("POST", "/labels/merge", {"names": ["hello", "bye"], "into": "smalltalk"})[1]["version"] == 5
    assert "chat" in server.call("POST", "/labels/smalltalk/rename", {"to": "chat"})[1]["labels"]
    assert "chat" not in server.call("DELETE", "/labels/chat")[1]["labels"]
    history = server.call("GET", "/versions?limit=3")[1]["versions"]
    assert [v["op"] for v in history] == ["remove_label", "rename_label", "merge_labels"]
    status, body = server.call("POST", "/versions/2/restore")
    assert status == 200 and body["labels"]["greeting"] == 2 and body["version"] == 8
    assert server.call("GET", "/openapi.json")[1]["info"]["title"] == "dyntc"
    # A restart serves the last committed version.
    server.stop()
    server.start()
    assert server.call("GET", "/labels")[1] == {"version": 8, "labels": body["labels"]}


def test_bad_input_is_4xx_and_changes_nothing(server):
    version = server.call("GET", "/labels")[1]["version"]
    cases = [
        (("POST", "/labels", {"name": "alarm", "examples": ["x"]}), 409, "already exists"),
        (("DELETE", "/labels/nope", None), 404, "'nope' does not exist"),
        (("POST", "/labels/nope/rename", {"to": "x"}), 404, "does not exist"),
        (("POST", "/labels", {"name": "new", "examples": []}), 400, "examples is empty"),
        (("POST", "/labels", {"name": "new", "examples": ["ok", "  "]}), 400, "examples[1] is empty"),
        (("POST", "/labels", {"name": "new", "examples": [3]}), 422, "examples.0"),
        (("POST", "/predict", {"texts": []}), 400, "texts is empty"),
        (("POST", "/predict", {"texts": "just one string"}), 422, "texts"),
        (("POST", "/predict", {"texts": ["a"] * 9}), 413, "at most 8"),
        (("POST", "/predict", {"texts": ["a"], "reject": True}), 409, "needs a calibrated classifier"),
        (("POST", "/versions/999/restore", None), 404, "no version 999"),
    ]
    for (method, path, body), status, words in cases:
        got, answer = server.call(method, path, body)
        assert (got, words in answer.get("error", "")) == (status, True), (path, body, got, answer)
    got, answer = server.call("POST", "/labels", raw=b'{"name": "x", "examples": [')
    assert got == 400 and "not valid JSON" in answer["error"]
    for token in (None, "wrong", "wr\u00f6ng"):
        got, answer = server.call("POST", "/labels", {"name": "x", "examples": ["y"]}, token=token)
        assert got == 401 and "Bearer" in answer["error"]
    assert server.call("GET", "/labels", token=None)[0] == 200  # reads stay open
    assert server.call("GET", "/labels")[1]["version"] == version


def test_predictions_never_see_a_mixed_label_set(server):
    """Renames race a stream of predictions: each answer's labels are one committed set."""
    seen, errors = [], []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            status, body = server.call("POST", "/predict", {"texts": ["set an alarm", "weather today"]}, token=None)
            if status != 200:
                errors.append((status, body))
            else:
                seen.append((tuple(body["labels"]), tuple(r["label"] for r in body["results"])))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    names = ["weather", "forecast"]
    for i in range(6):
        assert server.call("POST", f"/labels/{names[i % 2]}/rename", {"to": names[(i + 1) % 2]})[0] == 200
    stop.set()
    for t in threads:
        t.join()
    assert not errors and seen
    for labels, predicted in seen:
        assert ("weather" in labels) != ("forecast" in labels)  # exactly one of the two names
        assert set(predicted) <= set(labels)


def test_kill_during_writes_loses_nothing_acknowledged(fitted, tmp_path):
    srv = Server(fitted.save(tmp_path / "model"), tmp_path)
    acknowledged, stop = [], threading.Event()

    def writer():
        for i in range(200):
            if stop.is_set():
                return
            try:
                status, body = srv.call("POST", "/labels", {"name": f"label{i}", "examples": [f"text {i}"] * 10})
            except SERVER_GONE:
                return
            if status == 201:
                acknowledged.append(f"label{i}")

    thread = threading.Thread(target=writer)
    thread.start()
    while len(acknowledged) < 5:
        time.sleep(0.05)
    srv.stop(signal.SIGKILL)
    stop.set()
    thread.join()
    srv.start()
    body = srv.call("GET", "/labels")[1]
    assert set(acknowledged) <= set(body["labels"])
    assert all(n == 10 for name, n in body["labels"].items() if name.startswith("label"))  # none half-applied
    assert body["version"] == 1 + sum(name.startswith("label") for name in body["labels"])
    # A CLI command on the same directory while the service runs: the service sees it.
    subprocess.run([sys.executable, "-m", "dyntc", "labels", "add", str(srv.model), "from_cli", "-e", "added by the cli"],
                   check=True, capture_output=True)
    assert eventually(lambda: "from_cli" in srv.call("GET", "/labels")[1]["labels"])
    assert srv.call("POST", "/labels", {"name": "after_cli", "examples": ["x"]})[0] == 201
    assert {"from_cli", "after_cli"} <= set(DynamicClassifier.load(srv.model).classes_)
    srv.stop()


def test_predict_returns_a_confidence_ranking(server):
    status, body = server.call("POST", "/predict", {"texts": ["wake me up at six"], "ranking": 3})
    ranking = body["results"][0]["ranking"]
    assert status == 200 and len(ranking) == 3 and ranking[0]["label"] == body["results"][0]["label"]
    confidences = [r["confidence"] for r in ranking]
    assert confidences == sorted(confidences, reverse=True) and 0 < sum(confidences) <= 1.000001
    assert "ranking" not in server.call("POST", "/predict", {"texts": ["wake me up at six"]})[1]["results"][0]
    assert server.call("POST", "/predict", {"texts": ["hi"], "ranking": -1})[0] == 422


def test_the_service_rejects_like_the_out_of_scope_examples(tmp_path):
    """A model calibrated with out-of-scope examples is served with their push: a text that only the
    push takes past the threshold is answered null, as the library answers it."""
    import warnings

    from dyntc.errors import DyntcWarning

    held_out = ["wake me at five tomorrow", "what's my savings balance", "a timer for ten minutes", "is it sunny today",
                "set my alarm for six", "how much money is in checking", "start a two minute timer", "will it rain today"]
    labels = ["alarm", "balance", "timer", "weather"] * 2
    oos = ["tell me a joke", "tell me a funny joke please", "who won the football game", "sing me a song"]
    text = "tell me the weather"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)  # 8 held-out texts: too few for a trusted temperature
        plain = toy_classifier().calibrate(held_out, labels, oos, oos_weight=0)
        pushed = toy_classifier().calibrate(held_out, labels, oos)
        before, after = plain.top_k([text], 1)[0][0][1], pushed.top_k([text], 1)[0][0][1]
        assert after > before
        threshold = (before + after) / 2
        plain.calibrate(held_out, labels, oos, oos_weight=0, threshold=threshold)
        pushed.calibrate(held_out, labels, oos, threshold=threshold)
    texts = [text, "wake me up at six", "tell me a joke"]
    assert plain.predict(texts, reject=True).tolist()[0] is not None  # placed without the push
    expected = pushed.predict(texts, reject=True).tolist()
    assert expected[0] is None and expected[1] == "alarm"
    with Server.serving(pushed, tmp_path) as server:
        status, body = server.call("POST", "/predict", {"texts": texts, "reject": True})
    assert status == 200 and [r["label"] for r in body["results"]] == expected
