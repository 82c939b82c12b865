"""`dyntc train`'s options are SingleModelConfig's fields: each one's flag, default and help come from the
field, and what the command line gives reaches train_one as that config (train_one replaced: nothing is
trained); and the command end to end: a trained model that `predict` and `serve` use, one-line errors."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from dyntc.protocol.options import available_device
from dyntc.protocol.single import SingleModelConfig


def test_every_option_is_a_field_with_its_default_and_help():
    from dyntc.cli import _register, app

    _register()
    params = {p.name: p for p in typer.main.get_command(app).commands["train"].params}
    fields = dataclasses.fields(SingleModelConfig)
    assert list(params) == [f.name for f in fields]
    assert params["dataset"].required and fields[0].name == "dataset"
    for f in fields[1:]:
        assert params[f.name].help == f.metadata["help"]
        assert params[f.name].default == (available_device() if f.name == "device" else f.default), f.name
    assert params["finetune"].opts == ["--finetune"] and params["finetune"].secondary_opts == []
    assert params["progress"].secondary_opts == ["--no-progress"]


def test_the_command_line_reaches_train_one_as_the_config(monkeypatch, capsys, run_dyntc):
    from dyntc.protocol import single

    seen = []

    def fake(cfg, log=print, save_prototypical=None):
        seen.append(cfg)
        return {"dataset": cfg.dataset, "model": cfg.model, "dev_acc": 0.5, "test_acc": 0.5, "total_seconds": 1.0}

    monkeypatch.setattr(single, "train_one", fake)

    def run(*args):
        run_dyntc("train", *args)
        return seen[-1]

    assert run("--dataset", "sent") == SingleModelConfig(dataset="sent", device=available_device())
    assert run("--dataset", "news", "--model", "euc", "--out", "o", "--encoder", "minilm", "--finetune",
               "--hidden", "32", "--dropout", "0.2", "--embeddings", "g.txt", "--time-budget", "60",
               "--device", "cpu", "--no-progress") == SingleModelConfig(
        dataset="news", model="euc", out=Path("o"), encoder="minilm", finetune=True, hidden=32, dropout=0.2,
        embeddings=Path("g.txt"), time_budget=60.0, device="cpu", progress=False)
    assert '"test_acc": 0.5' in capsys.readouterr().out


def _cli(*args, input=None):
    return subprocess.run([sys.executable, "-m", "dyntc", *args], capture_output=True, text=True, timeout=600,
                          input=input)


def test_cli_errors_are_one_line_without_traceback():
    for args, message in [
        (["train", "--dataset", "imdb"], "unknown dataset"),
        (["train", "--dataset", "sent", "--model", "svm"], "unknown model"),
        (["train", "--dataset", "sent", "--embeddings", "/nonexistent/glove.txt", "--episodes", "1"], "does not exist"),
    ]:
        proc = _cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr.lower() and "Traceback" not in proc.stderr


@pytest.mark.data
@pytest.mark.slow
def test_cli_train_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = _cli("train", "--dataset", "sent", "--model", "hyp", "--out", str(out), "--episodes", "30",
                "--eval-every", "15", "--hidden", "32", "--layers", "1", "--max-len", "24", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 < metrics["test_acc"] <= 1 and metrics["steps"] == 30
    # The model is a classifier model: loaded, predicted with and served as `dyntc fit`'s are.
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    clf = DynamicClassifier.load(out / "model")
    assert clf.metric == "hyperbolic" and clf.n_classes_ == 10 and clf.head is None
    test = load("sent", seed=0).test
    assert clf.score(test.texts, test.labels) == pytest.approx(metrics["test_acc"], abs=0.01)
    predicted = _cli("predict", str(out / "model"), "--input", "-", input="my flight was late\n")
    assert predicted.returncode == 0 and json.loads(predicted.stdout)["label"] in clf.classes_
    from _server import Server

    server = Server(out / "model", tmp_path, token=None)
    try:
        status, body = server.call("POST", "/predict", {"texts": ["the crew was rude"]}, token=None)
        assert status == 200 and body["results"][0]["label"] in clf.classes_
    finally:
        server.stop()


def test_cli_makes_idle_openmp_threads_sleep_unless_the_user_chose():
    import os
    import subprocess
    import sys

    code = "import os, sys, dyntc.cli; assert 'torch' not in sys.modules; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"  # set before torch (and its OpenMP runtime) loads
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"
