"""DynamicClassifier as an estimator (classifier/estimator.py): parameters, fit and its input checks,
the not-fitted errors, how predict / predict_proba / top_k / decision_function agree, persistence.

On the hashing-encoder toy of tests/_toy.py (fitted in a fraction of a second, no data set, no
download): a training text's label and a prototype (the mean of its support points, computed here
from ``clf.encode``) are known answers. The label operations are in test_label_operations.py; what
needs a trained encoder or real data (SRU training, fine_tune, the MiniLM backbone) is in
test_classifier.py."""

import inspect

import numpy as np
import pytest
import torch
from _toy import LABELS, TEXTS, toy_classifier

from dyntc import DynamicClassifier, DyntcError, NotFittedError

ALL_TEXTS = [t for y in LABELS for t in TEXTS[y]]
ALL_LABELS = [y for y in LABELS for _ in TEXTS[y]]
# texts seen by no toy label, each sharing words with exactly one of them
QUERIES = {"alarm": "wake me up at six tomorrow", "balance": "what is my savings balance",
           "timer": "set a timer for five minutes", "weather": "will it rain this weekend"}
# a small SRU: its parameters are checked by fit before anything is built (no training, no GloVe)
SRU = dict(encoder="sru", metric="hyperbolic", hidden_size=64, num_layers=1, dropout=0.1, max_len=32, episodes=30, lr=3e-3)


def _hand_prototype(clf, texts) -> np.ndarray:
    """The Euclidean prototype of `texts`: the mean of their points."""
    return clf.encode(texts).astype(np.float64).mean(0)


# ------------------------------------------------------------------------------- parameters


def test_constructor_only_stores_params_and_sklearn_conventions():
    clf = DynamicClassifier("sru", "hyperbolic", hidden_size=16, episodes=5)
    params = clf.get_params()
    assert params["metric"] == "hyperbolic" and params["hidden_size"] == 16 and params["episodes"] == 5
    assert clf.set_params(lr=0.01) is clf and clf.lr == 0.01
    with pytest.raises(DyntcError, match="invalid parameter 'hiden_size'"):
        clf.set_params(hiden_size=3)
    assert "metric='hyperbolic'" in repr(clf) and "encoder='sru'" in repr(clf)
    from sklearn.base import clone

    assert clone(clf).get_params() == clf.get_params()
    # Nothing is validated or built before fit.
    assert DynamicClassifier(metric="poincare").metric == "poincare"


def test_get_params_set_params_and_repr_of_a_fitted_classifier():
    clf = toy_classifier(head=None)
    params = clf.get_params()
    assert sorted(params) == sorted(DynamicClassifier._get_param_names()) == sorted(inspect.signature(DynamicClassifier).parameters)
    assert params["encoder"] == "hashing" and params["head"] is None and params["batch_size"] == 256
    assert DynamicClassifier(**params).get_params() == params
    assert repr(clf) == "DynamicClassifier(encoder='hashing', head=None)"
    assert repr(DynamicClassifier()) == "DynamicClassifier()"
    # batch_size, device and extend_vocab follow at once into the fitted metric space ...
    assert clf.set_params(batch_size=8, extend_vocab=False) is clf
    assert (clf.space_.batch_size, clf.space_.extend_vocab) == (8, False) and clf.get_params()["batch_size"] == 8
    # ... debias too (the label set scores with it at once); the rest wait for the next fit
    clf.set_params(debias=False)
    assert clf.labels_.debias is False
    clf.set_params(metric="hyperbolic", episodes=7)
    assert clf.space_.metric == "euclidean" and clf.encode(["hi"]).shape == (1, 256)
    assert "metric='hyperbolic'" in repr(clf) and "episodes=7" in repr(clf)
    # a rejected value names the parameter and is not stored
    with pytest.raises(DyntcError, match="invalid parameter 'hiden_size'"):
        clf.set_params(hiden_size=3)
    with pytest.raises(DyntcError, match="debias must be True or False"):
        clf.set_params(debias="no")
    with pytest.raises(DyntcError, match="device must be"):
        clf.set_params(device="meta")
    assert clf.debias is False and clf.device == "cpu"


def test_batch_size_is_checked_when_set():
    clf = DynamicClassifier()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(DyntcError, match="batch_size must be an integer >= 1"):
            clf.set_params(batch_size=bad)
    assert clf.set_params(batch_size=8).batch_size == 8


# ------------------------------------------------------------------------------- fit


def test_fit_builds_one_prototype_per_label_from_all_its_examples():
    clf = toy_classifier(head=None)
    assert list(clf.classes_) == LABELS and clf.n_classes_ == 4
    assert clf.support_counts() == {y: 10 for y in LABELS}
    assert all(clf.support(y) == TEXTS[y] for y in LABELS)
    assert clf.train_result_ is None and clf.version_ is None and clf.calibration_ is None  # nothing trained
    rows, owner = clf.labels_.prototypes(), clf.labels_.prototype_owner()
    assert owner.tolist() == [0, 1, 2, 3]
    for i, y in enumerate(LABELS):
        np.testing.assert_allclose(rows[i].numpy(), _hand_prototype(clf, TEXTS[y]), atol=1e-6)
    assert clf.predict(ALL_TEXTS).tolist() == ALL_LABELS and clf.score(ALL_TEXTS, ALL_LABELS) == 1.0
    assert clf.predict(list(QUERIES.values())).tolist() == list(QUERIES)
    summary = clf.describe()
    assert summary["n_classes"] == 4 and summary["support_counts"] == clf.support_counts()
    assert summary["params"] == clf.get_params() and summary["version"] is None and summary["head"] is None


def test_fit_with_the_default_head_predicts_the_same_known_answers():
    clf = toy_classifier()
    assert clf.head == "cosine" and clf.head_status()["examples"] == len(ALL_TEXTS)
    assert clf.predict(ALL_TEXTS).tolist() == ALL_LABELS and clf.predict(list(QUERIES.values())).tolist() == list(QUERIES)


def test_fit_featurizes_each_text_once(monkeypatch):
    from dyntc.core.encoders.hashing import HashingEncoder

    seen: list[int] = []
    original = HashingEncoder.featurize
    monkeypatch.setattr(HashingEncoder, "featurize", lambda self, texts: seen.append(len(texts)) or original(self, texts))
    toy_classifier(head=None)
    assert seen == [len(ALL_TEXTS)]


def test_fit_is_seeded_without_moving_the_callers_random_stream():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    clf = toy_classifier(seed=5)
    assert torch.equal(torch.rand(3), expected)
    assert clf.predict(["wake me up at six"]).tolist() == ["alarm"]


def test_fit_again_replaces_everything():
    clf = toy_classifier(head=None)
    clf.add_label("coin", ["flip a coin", "heads or tails"])
    clf.fit(TEXTS["alarm"] + TEXTS["timer"], ["alarm"] * 10 + ["timer"] * 10)
    assert list(clf.classes_) == ["alarm", "timer"] and clf.support_counts() == {"alarm": 10, "timer": 10}


@pytest.mark.parametrize(
    "kwargs, texts, labels, match",
    [
        ({"metric": "poincare"}, ["a b"] * 10, ["x", "y"] * 5, "metric must be"),
        ({"episodes": 0}, ["a b"] * 10, ["x", "y"] * 5, "episodes must be"),
        ({"dropout": 1.5}, ["a b"] * 10, ["x", "y"] * 5, "dropout must be"),
        ({"encoder": "word2vec"}, ["a b"] * 10, ["x", "y"] * 5, "unknown encoder"),
        ({}, ["a b"] * 10, ["x", "y"] * 4, "differ in length"),
        ({}, ["a b"] * 9 + [""], ["x", "y"] * 5, r"texts\[9\] is empty"),
        ({}, ["a b"] * 9 + [3], ["x", "y"] * 5, r"texts\[9\] is int"),
        ({}, "a b", ["x"], "must be a list of strings"),
        ({}, ["a b"] * 10, ["x"] * 10, "at least 2 labels"),
        ({}, ["a b"] * 10, ["x", 1] * 5, "labels mix int and str labels"),
        ({}, ["a b"] * 10, ["x", None] * 5, r"labels\[1\] is None"),
        ({}, ["a b"] * 10, [["x"], ["y"]] * 5, "not hashable|mix"),
        ({}, [], [], "empty"),
        ({"encoder_options": {"hidden_size": -3}}, ["a b"] * 10, ["x", "y"] * 5,
         r"hidden_size must be an integer >= 1, got -3 \(encoder='sru', encoder_options="),
        ({"encoder_options": {"hiden_size": 3}}, ["a b"] * 10, ["x", "y"] * 5, r"options \['hiden_size'\] do not apply"),
        ({"encoder_options": {"dropout": "high"}}, ["a b"] * 10, ["x", "y"] * 5, "dropout must be in"),
        ({"encoder_options": {"max_len": 2.5}}, ["a b"] * 10, ["x", "y"] * 5, "max_len must be an integer"),
        ({"encoder_options": {1: 2}}, ["a b"] * 10, ["x", "y"] * 5, "encoder_options must be a dict with option names"),
        ({"embeddings": 123}, ["a b"] * 10, ["x", "y"] * 5, "embeddings must be the path of a GloVe text file"),
        ({"encoder_options": {"lower": "x"}}, ["a b"] * 10, ["x", "y"] * 5, "lower must be True or False"),
        ({"device": "meta"}, ["a b"] * 10, ["x", "y"] * 5, "device must be 'cpu' or 'cuda'"),
        ({"lr": True}, ["a b"] * 10, ["x", "y"] * 5, "lr must be a number"),
        ({"seed": True}, ["a b"] * 10, ["x", "y"] * 5, "seed must be an integer"),
        ({"time_budget_s": True}, ["a b"] * 10, ["x", "y"] * 5, "time_budget_s must be"),
        ({"encoder": "hashing", "encoder_options": {"dim": 1}}, ["a b"] * 10, ["x", "y"] * 5, "dim must be an integer >= 2"),
    ],
)
def test_fit_rejects_bad_input(kwargs, texts, labels, match):
    with pytest.raises(DyntcError, match=match):
        DynamicClassifier(**{**SRU, **kwargs}).fit(texts, labels)


def test_fit_dev_labels_must_be_known():
    texts, labels = ["hello there friend"] * 10, ["x", "y"] * 5
    with pytest.raises(DyntcError, match="dev labels"):
        DynamicClassifier(**SRU).fit(texts, labels, dev=(["hi"], ["z"]))


@pytest.mark.parametrize("params, match", [
    (dict(encoder="sru", train="none"), "train='none' does not apply to encoder 'sru', which takes 'encoder'"),
    (dict(train="everything"), "train='everything' does not apply to encoder 'minilm', which takes 'none' or "
                               "'backbone' or 'head'"),
    (dict(encoder="hashing", train="head"), "does not apply to encoder 'hashing'"),
    (dict(train="head", encoder_options={"train_layers": 2}), "train_layers applies to mode='finetune' only"),
    (dict(train="backbone", encoder_options={"train_layers": 0}), "train_layers must be None"),
    (dict(train="backbone", hard_fraction=0.6), r"hard_fraction must be a number in \[0, 0.5\].*got 0.6"),
    (dict(train="backbone", hard_fraction="some"), "hard_fraction must be a number"),
])
def test_bad_train_parameters(params, match):
    with pytest.raises(DyntcError, match=match):
        DynamicClassifier(**params).fit(["a b", "c d", "e f", "g h"], ["x", "x", "y", "y"])


def test_not_fitted():
    clf = DynamicClassifier()
    assert not hasattr(clf, "classes_")
    for call in (lambda: clf.predict(["hi"]), lambda: clf.predict_proba(["hi"]), lambda: clf.top_k(["hi"]),
                 lambda: clf.encode(["hi"]), lambda: clf.add_label("x", ["hi"]), lambda: clf.save("/tmp/nowhere"),
                 lambda: clf.fine_tune(["hi"], ["x"]), lambda: clf.decision_function(["hi"]),
                 lambda: clf.remove_label("x"), lambda: clf.rename_label("x", "y"), lambda: clf.support("x"),
                 lambda: clf.support_counts(), lambda: clf.calibrate(["hi"], ["x"]), lambda: clf.refresh(),
                 lambda: clf.describe(), lambda: clf.copy(), lambda: clf.version_, lambda: clf.n_classes_,
                 lambda: clf.temperature_, lambda: clf.prediction_records(np.zeros((1, 2)))):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()
    assert isinstance(NotFittedError("x"), DyntcError)


# ------------------------------------------------------------------------------- prediction


def test_prototype_scores_by_hand():
    """head=None, debias=False: the score of a label is -d² to its prototype, the mean of its points;
    predict_proba is softmax(16 · score) (the untrained logit scale), top_k the distances, nearest first."""
    clf = toy_classifier(head=None, debias=False)
    texts = list(QUERIES.values()) + ALL_TEXTS[::7]
    x = clf.encode(texts).astype(np.float64)
    protos = np.stack([_hand_prototype(clf, TEXTS[y]) for y in LABELS])
    d2 = ((x[:, None, :] - protos[None]) ** 2).sum(-1)
    scores = clf.decision_function(texts)
    np.testing.assert_allclose(scores, -d2, atol=1e-5)
    assert clf.prior_temperature_ == clf.temperature_ == pytest.approx(1 / 16)
    np.testing.assert_allclose(clf.predict_proba(texts), torch.softmax(torch.as_tensor(-16 * d2), 1).numpy(), atol=1e-4)
    assert clf.predict(texts).tolist() == [LABELS[i] for i in d2.argmin(1)]
    top = clf.top_k(texts, k=2)
    order = d2.argsort(1)[:, :2]
    assert [[lab for lab, _ in row] for row in top] == [[LABELS[j] for j in o] for o in order]
    np.testing.assert_allclose([[d for _, d in row] for row in top], np.sqrt(np.take_along_axis(d2, order, 1)), atol=1e-5)


def test_predict_proba_top_k_encode_agree():
    """On the hyperboloid, with the default head."""
    clf = toy_classifier(metric="hyperbolic")
    texts = TEXTS["weather"][:5] + TEXTS["alarm"][:5]
    pred = clf.predict(texts).tolist()
    assert pred == ["weather"] * 5 + ["alarm"] * 5
    proba = clf.predict_proba(texts)
    assert proba.shape == (10, len(LABELS)) and np.allclose(proba.sum(1), 1)
    assert [clf.classes_[i] for i in proba.argmax(1)] == pred
    top = clf.top_k(texts, k=3)
    assert all(len(row) == 3 and row[0][0] == p for row, p in zip(top, pred))
    assert all(row[0][1] <= row[1][1] <= row[2][1] for row in top)
    assert len(clf.top_k(texts[:1], k=100)[0]) == len(LABELS)
    points = clf.encode(texts)
    assert points.shape == (10, 257)  # the hashing encoder's 256 + the hyperboloid's time coordinate
    lorentz_norm = points[:, 0] ** 2 - (points[:, 1:] ** 2).sum(1)
    assert np.allclose(lorentz_norm, 1.0, atol=1e-3)
    assert clf.predict([]).tolist() == [] and clf.predict_proba([]).shape == (0, len(LABELS))
    assert clf.encode([]).shape == (0, 257) and clf.decision_function([]).shape == (0, len(LABELS))
    with pytest.raises(DyntcError, match="k must be"):
        clf.top_k(texts, k=0)
    with pytest.raises(DyntcError, match="k must be an integer"):
        clf.top_k(["hi"], k=True)
    with pytest.raises(DyntcError, match="single string"):
        clf.predict("what is the weather")
    with pytest.raises(DyntcError, match=r"texts\[1\] is empty"):
        clf.predict(["ok", "  "])


def test_top_k_is_nearest_labels_of_the_decision_function():
    clf = toy_classifier()
    texts = ["what is my balance", "wake me up at seven"]
    ours = clf.top_k(texts, k=4)
    theirs = clf.nearest_labels(clf.squared_distances(clf.decision_function(texts)), 4)
    assert [[lab for lab, _ in r] for r in ours] == [[lab for lab, _ in r] for r in theirs]
    np.testing.assert_allclose([[d for _, d in r] for r in ours], [[d for _, d in r] for r in theirs], rtol=1e-6)
    ranked = clf.top_k(texts, k=100)
    assert [len(r) for r in ranked] == [len(clf.classes_)] * 2
    assert all([d for _, d in r] == sorted(d for _, d in r) for r in ranked)
    assert [r[0][0] for r in ranked] == clf.predict(texts).tolist() == ["balance", "alarm"]


def test_decision_function_is_what_predict_and_predict_proba_derive_from():
    clf = toy_classifier()
    texts = ["what is my balance", "book a flight to paris", "play some jazz"]
    scores = clf.decision_function(texts)
    assert scores.shape == (3, len(clf.classes_)) and clf.head == "cosine"
    assert [clf.classes_[i] for i in scores.argmax(1)] == clf.predict(texts).tolist()
    np.testing.assert_allclose(torch.softmax(torch.as_tensor(scores), 1).numpy(), clf.predict_proba(texts), atol=1e-12)
    np.testing.assert_allclose(clf.proba_from_scores(scores), clf.predict_proba(texts), atol=1e-12)
    records = clf.prediction_records(scores, top_k=2, proba=True)
    assert [r["label"] for r in records] == clf.predict(texts).tolist()
    assert [r["top_k"][0]["label"] for r in records] == clf.predict(texts).tolist()
    np.testing.assert_allclose([r["probability"] for r in records], clf.predict_proba(texts).max(1), atol=1e-6)
    assert clf.prediction_records(scores) == [{"label": y} for y in clf.predict(texts)]
    with pytest.raises(DyntcError, match="top_k must be an integer >= 1"):
        clf.prediction_records(scores, top_k=0)


# ------------------------------------------------------------------------------- persistence


@pytest.mark.parametrize("head", ["cosine", None])
def test_save_load_round_trip_identical(tmp_path, head):
    clf = toy_classifier(head=head)
    clf.add_label("coin", ["flip a coin", "toss a coin for me", "heads or tails"])
    clf.merge_labels(["alarm", "timer"], into="alarm_or_timer")
    clf.rename_label("weather", "forecast")
    if head is not None:
        clf.refresh()  # the head's background refresh, now: a loaded classifier trains the same head at once
    path = clf.save(tmp_path / "model")
    assert sorted(p.name for p in path.iterdir()) == ["dyntc.sqlite"]
    assert clf.version_ == 1
    loaded = DynamicClassifier.load(path)
    texts = ALL_TEXTS + list(QUERIES.values()) + ["flip a coin please"]
    assert list(loaded.classes_) == list(clf.classes_) == ["alarm_or_timer", "balance", "coin", "forecast"]
    assert loaded.support_counts() == clf.support_counts()
    assert all(loaded.support(c) == clf.support(c) for c in clf.classes_)
    assert loaded.labels_.support("alarm_or_timer").n_parts == 2
    assert torch.equal(loaded.labels_.prototypes(), clf.labels_.prototypes())
    assert np.array_equal(loaded.decision_function(texts), clf.decision_function(texts))
    assert np.array_equal(loaded.predict_proba(texts), clf.predict_proba(texts))
    assert loaded.predict(texts).tolist() == clf.predict(texts).tolist()
    assert loaded.top_k(texts[:5], 3) == clf.top_k(texts[:5], 3)
    assert loaded.get_params() == {**clf.get_params(), "device": "cpu"} and loaded.version_ == 1
    # Label operations keep working after a load, and a second save is a second version.
    loaded.add_label("greeting", ["hello there", "hi how are you"])
    if head is not None:
        loaded.refresh()
    loaded.save(path)
    again = DynamicClassifier.load(path)
    assert "greeting" in again.classes_ and again.version_ == 2
    assert np.array_equal(again.predict_proba(texts), loaded.predict_proba(texts))
    assert np.array_equal(DynamicClassifier.load(path, version=1).predict_proba(texts), clf.predict_proba(texts))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary leftovers


def test_load_rejects_bad_directories(tmp_path):
    fitted = toy_classifier(head=None)
    with pytest.raises(DyntcError, match="does not exist"):
        DynamicClassifier.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DyntcError, match="not a dyntc model directory"):
        DynamicClassifier.load(tmp_path / "empty")
    old = tmp_path / "old"  # the format-1 directory of earlier dyntc versions
    old.mkdir()
    (old / "config.json").write_text("{}")
    (old / "support.json").write_text("{}")
    with pytest.raises(DyntcError, match="old directory format"):
        DynamicClassifier.load(old)
    (old / "support.json").unlink()
    with pytest.raises(DyntcError, match="holds a checkpoint .*not a classifier model"):
        DynamicClassifier.load(old)
    path = fitted.save(tmp_path / "m")
    with pytest.raises(DyntcError, match="has no version 7; its versions are 1..1"):
        DynamicClassifier.load(path, version=7)
    garbage = tmp_path / "g"
    garbage.mkdir()
    (garbage / "dyntc.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DyntcError, match="damaged or not a dyntc store"):
        DynamicClassifier.load(garbage)
    with pytest.raises(DyntcError, match="not an empty directory or a dyntc model"):
        fitted.save(old)


def test_lazy_top_level_import():
    import subprocess
    import sys

    code = "import sys, dyntc; assert 'torch' not in sys.modules; print(dyntc.DynamicClassifier.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "DynamicClassifier"
