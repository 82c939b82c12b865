"""A discovery that adapts the backbone first runs for minutes: `POST /discover` with `adapt_s`
starts a background job (202), `GET /discover/jobs/{id}` reads it. The job registry on its own, bad
requests refused before any job starts (the hashing toy's server), and a real job over MiniLM."""

import threading
import time

import pytest
from _server import Server, eventually

from dyntc import DynamicClassifier
from dyntc.classifier.service.jobs import JobConflict, Jobs
from dyntc.errors import DyntcError

pytest.importorskip("fastapi")


def finished(jobs, job_id, timeout=10.0):
    return eventually(lambda: jobs.get(job_id).status != "running", timeout=timeout) and jobs.get(job_id)


def test_jobs_run_one_at_a_time_and_keep_their_outcome():
    jobs, release = Jobs(), threading.Event()
    slow = jobs.start("discover", "texts", lambda: {"ok": release.wait(10)})
    assert slow.to_dict()["status"] == "running" and "result" not in slow.to_dict() and len(slow.id) == 32
    with pytest.raises(JobConflict, match=f"GET /discover/jobs/{slow.id}"):
        jobs.start("discover", "texts", lambda: {})
    release.set()
    assert finished(jobs, slow.id).to_dict()["result"] == {"ok": True}

    def refused():
        raise DyntcError("n_new must be an integer between 1 and 2")

    def broken():
        raise ValueError("no such thing")

    failed = finished(jobs, jobs.start("discover", "texts", refused).id)
    assert (failed.status, failed.error) == ("failed", "n_new must be an integer between 1 and 2")
    assert finished(jobs, jobs.start("discover", "texts", broken).id).error == "ValueError: no such thing"
    assert jobs.get("not-a-job") is None


def test_finished_jobs_are_forgotten_past_the_count_and_the_age():
    jobs = Jobs(keep=2, keep_s=3600)
    ids = []
    for i in range(3):
        ids.append(jobs.start("discover", "texts", lambda i=i: {"i": i}).id)
        finished(jobs, ids[-1])
        time.sleep(0.01)  # distinct finishing times
    assert jobs.get(ids[0]) is None and jobs.get(ids[1]).result == {"i": 1} and jobs.get(ids[2]).result == {"i": 2}
    jobs.keep_s = 0.0
    assert jobs.get(ids[2]) is None


@pytest.fixture(scope="module")
def toy_server(fitted, tmp_path_factory):
    with Server.serving(fitted, tmp_path_factory.mktemp("jobs"), args=["--max-adapt-s", "60"]) as srv:
        yield srv


TEXTS = [f"some new request number {i}" for i in range(12)]


@pytest.mark.parametrize("payload, status, words", [
    ({"texts": TEXTS, "adapt_s": 61}, 413, "at most 60 s (--max-adapt-s)"),
    ({"texts": TEXTS, "adapt_s": 0}, 400, "adapt_s must be a finite number of seconds > 0"),
    ({"texts": TEXTS, "adapt_s": True}, 422, "adapt_s"),
    ({"texts": TEXTS, "adapt_s": "30"}, 422, "adapt_s"),
    ({"texts": TEXTS, "adapt_s": 30}, 400, "adapt_s fine-tunes a pretrained backbone"),  # the hashing encoder
])
def test_a_bad_adapted_discovery_is_refused_before_any_job(toy_server, payload, status, words):
    got, answer = toy_server.call("POST", "/discover", payload)
    assert got == status and words in answer["error"], answer


def test_job_reads_need_the_token_and_an_existing_job(toy_server):
    assert toy_server.call("POST", "/discover", {"texts": TEXTS, "adapt_s": 30}, token=None)[0] == 401
    assert toy_server.call("GET", "/discover/jobs/0123abcd", token=None)[0] == 401
    status, answer = toy_server.call("GET", "/discover/jobs/0123abcd")
    assert status == 404 and "lives in the service process that started it" in answer["error"]


def test_without_a_token_a_local_client_reads_a_job_like_any_read(fitted, tmp_path):
    srv = Server(fitted.save(tmp_path / "model"), tmp_path, token=None)
    try:  # a GET, so no body type needed (writes need one on a service without a token)
        status, answer = srv.call("GET", "/discover/jobs/0123abcd", token=None, headers={"Content-Type": None})
        assert status == 404 and "no discovery job" in answer["error"]
    finally:
        srv.stop()


def test_captured_texts_to_cluster_are_bounded(fitted, tmp_path):
    # one replica captures 8 texts; another, without --capture, clusters at most --max-examples of them
    model = fitted.save(tmp_path / "model")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    capturing = Server(model, tmp_path / "a", args=["--capture", "10", "--capture-margin", "1"])
    other = Server(model, tmp_path / "b", args=["--max-examples", "5"])
    try:
        texts = [f"an unplaced text number {i}" for i in range(8)]
        assert capturing.call("POST", "/predict", {"texts": texts})[0] == 200
        assert eventually(lambda: capturing.call("GET", "/captures")[1]["total"] == 8, timeout=20)
        status, answer = other.call("POST", "/discover", {})
        assert status == 413 and "8 captured texts; this service clusters at most 5" in answer["error"], answer
        status, answer = capturing.call("POST", "/discover", {"n_new": 1})  # its own --capture bounds it
        assert status == 200 and answer["source"] == "captures" and len(answer["assignments"]) == 8
    finally:
        capturing.stop()
        other.stop()


def test_max_adapt_s_must_be_positive(fitted, tmp_path):
    import subprocess
    import sys

    model = fitted.save(tmp_path / "model")
    run = subprocess.run([sys.executable, "-m", "dyntc", "serve", str(model), "--max-adapt-s", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "max_adapt_s must be a finite number > 0" in run.stderr + run.stdout


KNOWN = ["alarm", "balance", "timer", "weather"]
NEW = ["book_hotel", "translate"]


@pytest.mark.data
def test_an_adapted_discovery_over_http_is_a_job_whose_clusters_can_be_accepted(clinc_intents, tmp_path):
    pytest.importorskip("sentence_transformers")
    clf = DynamicClassifier(head=None).fit([t for y in KNOWN for t in clinc_intents[y][:8]],
                                           [y for y in KNOWN for _ in range(8)])
    texts = [t for y in KNOWN + NEW for t in clinc_intents[y][8:38]]
    with Server.serving(clf, tmp_path, args=["--max-adapt-s", "5"]) as srv:
        status, job = srv.call("POST", "/discover", {"texts": texts, "n_new": 2, "adapt_s": 3})
        assert status == 202 and job["status"] == "running" and job["url"] == f"/discover/jobs/{job['job']}"
        # the first job trains for 3 s after embedding: a second one is refused meanwhile
        status, answer = srv.call("POST", "/discover", {"texts": texts, "n_new": 2, "adapt_s": 3})
        assert status == 409 and job["job"] in answer["error"]
        assert srv.call("GET", job["url"], token=None)[0] == 401
        done = eventually(lambda: srv.call("GET", job["url"])[1]["status"] != "running", timeout=300)
        body = srv.call("GET", job["url"])[1]
        assert done and body["status"] == "done", body
        result = body["result"]
        assert result["settings"]["adapt_s"] == 3 and result["settings"]["adapt_steps"] >= 1
        assert result["version"] == 1 and result["source"] == "texts" and result["n_new"] == 2
        assert len(result["assignments"]) == len(texts) and result["clusters"]
        cluster = result["clusters"][0]
        status, labels = srv.call("POST", "/discover/accept", {"texts": cluster["texts"], "name": cluster["name"]})
        assert status == 200 and labels["version"] == 2 and labels["labels"][cluster["name"]] == cluster["size"]
