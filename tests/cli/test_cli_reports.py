"""`dyntc evaluate`: misclassified texts, most confused pairs, an out-of-scope section, a macro
average over the test file's labels; `dyntc calibrate --report-dir`: reliability diagram and distance
histograms with the threshold."""

import csv
import json

import numpy as np
import pytest
from _csvfiles import write_csv

from dyntc import DynamicClassifier
from dyntc.cli import report


def _rows(path):
    with open(path, newline="") as fh:
        return [(r["text"], r["label"]) for r in csv.DictReader(fh)]


def _auroc_by_hand(model, in_scope, out_of_scope):
    """scikit-learn's AUROC of the distance to the nearest label (the library's top_k), out-of-scope
    texts as the positives: what the reports must show. Out-of-scope texts that the calibration keeps
    as examples are pushed only by the others (the push, 2 w c̄ on the squared distance, undone and
    redone by hand from their directions)."""
    import torch
    from sklearn.metrics import roc_auc_score

    from dyntc.classifier.head import normalize
    from dyntc.classifier.live_head import features

    clf = DynamicClassifier.load(model)
    nearest = [row[0][1] for row in clf.top_k(in_scope, 1)]
    d2 = np.array([row[0][1] ** 2 for row in clf.top_k(out_of_scope, 1)])
    cal = clf.calibration_
    if cal is not None and cal.oos_examples:
        direction = lambda t: normalize(features(clf.space_, torch.as_tensor(clf.encode(t))))  # noqa: E731
        sims = direction(out_of_scope) @ direction(list(cal.oos_examples)).T
        served = np.sort(sims, 1)[:, ::-1][:, :3].mean(1).clip(0)
        for i, text in enumerate(out_of_scope):
            sims[i, list(cal.oos_examples).index(text)] = -np.inf
        alone = np.sort(sims, 1)[:, ::-1][:, :min(3, sims.shape[1] - 1)].mean(1).clip(0)
        d2 = d2 - 2 * cal.oos_weight * (served - alone)
    nearest += list(np.sqrt(d2.clip(0)))
    return roc_auc_score([0] * len(in_scope) + [1] * len(out_of_scope), nearest)


def test_auroc_is_the_rank_statistic():
    assert report.auroc(np.array([0.1, 0.2]), np.array([0.3, 0.4])) == 1.0
    assert report.auroc(np.array([0.3, 0.4]), np.array([0.1, 0.2])) == 0.0
    assert report.auroc(np.array([0.1, 0.5]), np.array([0.5, 0.2])) == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(0.7, size=40)
    from sklearn.metrics import roc_auc_score

    assert report.auroc(a, b) == pytest.approx(roc_auc_score([0] * 50 + [1] * 40, np.concatenate([a, b])))
    assert report.auroc(a, np.array([])) is None


def test_confused_pairs_rank_the_errors():
    labels = ["a", "a", "a", "b", "b", "c"]
    pred = ["b", "b", "a", "a", None, "c"]
    assert report.confused_pairs(labels, pred) == [{"label": "a", "predicted": "b", "count": 2},
                                                   {"label": "b", "predicted": "a", "count": 1}]


def test_evaluate_writes_errors_pairs_and_out_of_scope(toy_model, dyntc_cli, toy_files):
    code, out, err = dyntc_cli("evaluate", toy_model, "--data", toy_files / "test.csv", "--report-dir", toy_files / "r")
    assert code == 0, err
    rep = json.loads((toy_files / "r" / "report.json").read_text())
    assert rep["n"] == 12 and "oos" not in rep["per_class"]  # the out-of-scope texts are not a label
    oos = rep["out_of_scope"]
    assert oos["n_oos"] == 3 and oos["n_in_scope"] == 12 and not oos["rejecting"]
    rows = _rows(toy_files / "test.csv")
    in_scope, oos_texts = [t for t, y in rows if y != "oos"], [t for t, y in rows if y == "oos"]
    assert len(oos_texts) == 3 and oos["auroc"] == pytest.approx(_auroc_by_hand(toy_model, in_scope, oos_texts))
    assert oos["in_scope_accuracy"] == rep["accuracy"]
    assert "AUROC" in out and "give --reject" in out
    with open(toy_files / "r" / "misclassified.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == rep["misclassified"] == round(12 * (1 - rep["accuracy"])) + 3  # every oos text is an error
    assert all(r["label"] != r["predicted"] for r in rows) and {r["label"] for r in rows} >= {"oos"}
    with open(toy_files / "r" / "confused_pairs.csv", newline="") as fh:
        pairs = list(csv.DictReader(fh))
    assert [dict(p, count=int(p["count"])) for p in pairs] == rep["confused_pairs"]
    assert sum(p["count"] for p in rep["confused_pairs"]) <= len(rows)
    assert (toy_files / "r" / "confusion_matrix.png").stat().st_size > 5000

    assert dyntc_cli("calibrate", toy_model, "--data", toy_files / "dev.csv", "--oos", toy_files / "oos.txt")[0] == 0
    code, out, err = dyntc_cli("evaluate", toy_model, "--data", toy_files / "test.csv", "--reject", "--report-dir", toy_files / "r2")
    assert code == 0, err
    oos = json.loads((toy_files / "r2" / "report.json").read_text())["out_of_scope"]
    rejected = DynamicClassifier.load(toy_model).predict(oos_texts, reject=True).tolist()
    assert oos["rejecting"] and oos["oos_recall"] == pytest.approx(np.mean([p is None for p in rejected]))
    assert "out-of-scope recall" in out


def test_evaluate_macro_average_counts_only_the_test_files_labels(toy_model, dyntc_cli, toy_files):
    rows = [(t, y) for t, y in csv.reader(open(toy_files / "test.csv")) if y in ("alarm", "balance")]
    write_csv(toy_files / "two.csv", rows)
    code, out, err = dyntc_cli("evaluate", toy_model, "--data", toy_files / "two.csv", "--report-dir", toy_files / "r")
    assert code == 0, err
    rep = json.loads((toy_files / "r" / "report.json").read_text())
    assert set(rep["per_class"]) == {"alarm", "balance"}
    recalls = [rep["per_class"][y]["recall"] for y in ("alarm", "balance")]
    assert rep["macro_avg"]["recall"] == pytest.approx(np.mean(recalls))
    assert rep["out_of_scope"] is None


def test_evaluate_reject_needs_a_calibration(toy_model, dyntc_cli, toy_files):
    code, _, err = dyntc_cli("evaluate", toy_model, "--data", toy_files / "test.csv", "--reject")
    assert code == 2 and "--reject needs a calibrated classifier" in err


def test_calibrate_draws_its_report(toy_model, dyntc_cli, toy_files):
    code, out, err = dyntc_cli("calibrate", toy_model, "--data", toy_files / "dev.csv", "--oos", toy_files / "oos.txt",
                               "--report-dir", toy_files / "cal")
    assert code == 0, err
    cal = json.loads((toy_files / "cal" / "calibration.json").read_text())
    assert cal["threshold"] == json.loads(out)["threshold"] and cal["n_oos"] == 3
    assert sum(b["n"] for b in cal["reliability_after"]) == 12 == sum(b["n"] for b in cal["reliability_before"])
    dev = [t for t, _ in _rows(toy_files / "dev.csv")]
    oos_texts = (toy_files / "oos.txt").read_text().splitlines()
    assert cal["auroc"] == pytest.approx(_auroc_by_hand(toy_model, dev, oos_texts))
    for png in ("reliability.png", "distances.png"):
        assert (toy_files / "cal" / png).read_bytes()[:4] == b"\x89PNG"


def test_evaluate_and_calibrate_report_on_a_two_label_model(dyntc_cli, toy_files):
    """A two-label model's decision_function is 1-D; the reports read label_scores, one column a label."""
    rows = [r for r in _rows(toy_files / "train.csv") if r[1] in ("alarm", "weather")]
    DynamicClassifier(encoder="hashing").fit(*zip(*rows)).save(toy_files / "two")
    dev = [r for r in _rows(toy_files / "dev.csv") if r[1] in ("alarm", "weather")]
    write_csv(toy_files / "dev2.csv", dev)
    code, out, err = dyntc_cli("evaluate", toy_files / "two", "--data", toy_files / "dev2.csv", "--report-dir", toy_files / "r")
    assert code == 0, err
    rep = json.loads((toy_files / "r" / "report.json").read_text())
    pred = DynamicClassifier.load(toy_files / "two").predict([t for t, _ in dev]).tolist()
    assert rep["n"] == 6 and rep["accuracy"] == pytest.approx(np.mean([p == y for p, (_, y) in zip(pred, dev)]))
    code, out, err = dyntc_cli("calibrate", toy_files / "two", "--data", toy_files / "dev2.csv", "--oos", toy_files / "oos.txt",
                               "--report-dir", toy_files / "cal")
    assert code == 0, err
    cal = json.loads((toy_files / "cal" / "calibration.json").read_text())
    oos_texts = (toy_files / "oos.txt").read_text().splitlines()
    assert cal["auroc"] == pytest.approx(_auroc_by_hand(toy_files / "two", [t for t, _ in dev], oos_texts))
