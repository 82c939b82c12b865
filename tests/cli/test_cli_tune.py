"""``dyntc tune``: its errors, a tune committed as a version, a killed tune committing nothing, and a
``dyntc serve`` process answering with the tuned version after its commit. MiniLM fitted on the toy
intents (tests/_toy.py), 1-2 episodes per tune."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from _server import Server, eventually
from _toy import LABELS, TEXTS

from dyntc import DynamicClassifier
from dyntc.classifier.store import ModelStore

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def _minilm_master(tmp_path_factory):
    root = tmp_path_factory.mktemp("minilm")
    clf = DynamicClassifier(n_support=2, n_query=12)  # small episodes
    clf.fit([t for y in LABELS for t in TEXTS[y]], [y for y in LABELS for _ in TEXTS[y]]).save(root / "m")
    return root / "m"


@pytest.fixture
def minilm_model(_minilm_master, tmp_path):
    shutil.copytree(_minilm_master, tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("argv, words", [
    (["--budget", "0"], "--budget must be a finite number of seconds > 0, got 0.0"),
    (["--budget", "-30"], "--budget must be a finite number of seconds > 0, got -30.0"),
    (["--budget", "nan"], "got nan"),
    (["--budget", "inf"], "got inf"),
    (["--budget", "ten"], "Invalid value for '--budget'"),
    (["--device", "tpu"], "--device must be a torch device such as 'cpu' or 'cuda', got 'tpu'"),
    (["--executor", "spark"], "--executor must be local or ray, got 'spark'"),
    (["--address", "10.0.0.1:6379"], "--address is the address of a Ray cluster: give it with --executor ray"),
    (["--episodes", "0"], "--episodes must be an integer >= 1, got 0"),
    (["--oos", "oos.txt"], "--oos measures the rejection of --calibrate: give --calibrate too"),
])
def test_bad_options_are_one_error_line(toy_model, dyntc_cli, argv, words):
    code, out, err = dyntc_cli("tune", toy_model, *argv)
    assert code == 2 and out == "" and err.startswith("error: ") and words in err and len(err.splitlines()) == 1, err
    assert ModelStore.open(toy_model).head_version() == 1


def test_cuda_without_a_gpu_and_a_model_without_a_backbone(toy_model, dyntc_cli):
    if not torch.cuda.is_available():
        code, _, err = dyntc_cli("tune", toy_model, "--device", "cuda")
        assert code == 2 and "--device 'cuda' requested but no CUDA device is available: use cpu" in err
    code, _, err = dyntc_cli("tune", toy_model)
    assert code == 2 and "tune fine-tunes a pretrained backbone; encoder 'hashing' has none" in err


def test_tune_commits_one_version_and_reports_it(minilm_model, dyntc_cli):
    code, out, err = dyntc_cli("tune", minilm_model, "--budget", "60", "--episodes", "2")
    assert code == 0, err
    report = json.loads(out)
    assert (report["base_version"], report["version"], report["episodes"]) == (1, 2, 2)
    assert "tuned version 1 for 2 episodes" in err and "version 2," in err
    clf = DynamicClassifier.load(minilm_model)
    assert clf.train == "backbone" and clf.version_ == 2
    assert DynamicClassifier.versions(minilm_model)[0]["op"] == "tune"


def test_a_killed_tune_leaves_the_model_as_it_was(minilm_model):
    """SIGKILL while the tune trains: the store keeps version 1 only and loads as before."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "dyntc", "tune", str(minilm_model), "--budget", "600",
                             "--episodes", "100000", "--progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: proc.stderr.read(64), "")), daemon=True)
    reader.start()
    try:
        assert eventually(lambda: "episodes" in "".join(seen) or proc.poll() is not None, timeout=120), "".join(seen)
        assert proc.poll() is None, "".join(seen)  # training when killed
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    store = ModelStore.open(minilm_model)
    assert store.head_version() == 1 and len(store.versions()) == 1
    assert DynamicClassifier.load(minilm_model).train is None


def test_a_served_replica_answers_with_the_tuned_version(minilm_model, tmp_path, dyntc_cli):
    """`dyntc serve` follows the tune's commit like any other write (reads answered throughout), and
    a label added through it afterwards is embedded with the tuned backbone."""
    pytest.importorskip("fastapi")
    server = Server(minilm_model, tmp_path)
    answers, stop = [], threading.Event()

    def read():
        while not stop.is_set():
            answers.append(server.call("POST", "/predict", {"texts": ["wake me up at 5"]}))

    reader = threading.Thread(target=read)
    try:
        reader.start()
        code, out, err = dyntc_cli("tune", minilm_model, "--budget", "60", "--episodes", "1")
        assert code == 0, err
        version = json.loads(out)["version"]
        assert eventually(lambda: server.call("GET", "/healthz")[1].get("version") == version, timeout=60)
        stop.set()
        reader.join()
        assert answers and all(status == 200 and body["results"][0]["label"] == "alarm" for status, body in answers)
        new = ["flip a coin for me", "heads or tails please", "toss a coin"]
        status, body = server.call("POST", "/labels", {"name": "flip_coin", "examples": new})
        assert status == 201 and body["version"] == version + 1
        status, body = server.call("POST", "/predict", {"texts": ["could you flip a coin"]})
        assert status == 200 and body["results"][0]["label"] == "flip_coin"
    finally:
        stop.set()
        server.stop()
    served = DynamicClassifier.load(minilm_model)
    assert served.train == "backbone" and served.version_ == version + 1
    np.testing.assert_allclose(served.labels_.support("flip_coin").points.numpy(), served.encode(new), atol=2e-5)


@pytest.mark.slow
def test_executor_ray_runs_the_tune_as_a_ray_task(minilm_model, dyntc_cli):
    """--executor ray on a local Ray instance: the task commits the version; its errors come back as one line."""
    pytest.importorskip("ray")
    code, out, err = dyntc_cli("tune", minilm_model, "--budget", "60", "--episodes", "1", "--executor", "ray",
                               "--address", "local")
    assert code == 0, err
    assert json.loads(out)["version"] == 2 and DynamicClassifier.load(minilm_model).train == "backbone"
    code, out, err = dyntc_cli("tune", minilm_model, "--device", "cuda:7", "--executor", "ray", "--address", "local")
    if not torch.cuda.is_available():
        assert code == 2 and "the Ray cluster has no GPU" in err and len(err.splitlines()) == 1, err
    code, out, err = dyntc_cli("tune", minilm_model, "--budget", "60", "--episodes", "1", "--executor", "ray",
                               "--address", "local", "--device", "tpu")
    assert code == 2 and err == "error: --device must be cpu or cuda (cuda:N), got 'tpu'\n", err
    assert ModelStore.open(minilm_model).head_version() == 2
