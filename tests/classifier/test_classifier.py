"""DynamicClassifier on a real sample of CLINC150: fit, every label operation, persistence, bad input."""

import copy

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError, NotFittedError
from dyntc.classifier.labels import Support

OLD = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather"]
NEW = ["translate", "flip_coin"]
SMALL = dict(encoder="sru", metric="hyperbolic", hidden_size=64, num_layers=1, dropout=0.1, max_len=32, episodes=30, lr=3e-3)


@pytest.fixture(scope="module")
def clinc(clinc_raw):
    raw = clinc_raw
    keep = set(OLD + NEW)

    def split(key):
        out = {}
        for text, label in raw[key]:
            if label in keep:
                out.setdefault(label, []).append(text)
        return out

    return {"train": split("train"), "dev": split("val"), "test": split("test")}


def _flat(groups, labels):
    texts = [t for y in labels for t in groups[y]]
    return texts, [y for y in labels for _ in groups[y]]


@pytest.fixture(scope="module")
def fitted(clinc):
    texts, labels = _flat(clinc["train"], OLD)
    return DynamicClassifier(**SMALL).fit(texts, labels, dev=_flat(clinc["dev"], OLD))


@pytest.fixture
def clf(fitted):
    """A private copy of the fitted classifier, free to change."""
    return copy.deepcopy(fitted)


def _acc(clf, groups, label, expect=None):
    pred = clf.predict(groups[label])
    return float(np.mean([p == (expect or label) for p in pred]))


# ------------------------------------------------------------------------------- params and fitting


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


def test_not_fitted():
    clf = DynamicClassifier()
    assert not hasattr(clf, "classes_")
    for call in (lambda: clf.predict(["hi"]), lambda: clf.predict_proba(["hi"]), lambda: clf.top_k(["hi"]),
                 lambda: clf.encode(["hi"]), lambda: clf.add_label("x", ["hi"]), lambda: clf.save("/tmp/nowhere"),
                 lambda: clf.fine_tune(["hi"], ["x"])):
        with pytest.raises(NotFittedError, match="not fitted"):
            call()


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
        ({}, ["a b"] * 10, ["x", 1] * 5, r"labels\[1\] is 1"),
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
    ],
)
def test_fit_rejects_bad_input(kwargs, texts, labels, match):
    with pytest.raises(DyntcError, match=match):
        DynamicClassifier(**{**SMALL, **kwargs}).fit(texts, labels)


def test_fit_and_fine_tune_featurize_each_text_once(clinc, monkeypatch):
    """The episodes and the prototypes share one featurization (costly for pretrained backbones)."""
    from dyntc.encoders.glove_sru import GloveSRUEncoder

    seen: list[int] = []
    original = GloveSRUEncoder.featurize
    monkeypatch.setattr(GloveSRUEncoder, "featurize", lambda self, texts: seen.append(len(texts)) or original(self, texts))
    texts, labels = _flat(clinc["train"], OLD[:3])
    clf = DynamicClassifier(**{**SMALL, "episodes": 3}).fit(texts, labels)
    assert sum(seen) == len(texts)
    seen.clear()
    clf.fine_tune(episodes=2)
    assert sum(seen) == len(texts)


def test_fit_dev_labels_must_be_known():
    texts, labels = ["hello there friend"] * 10, ["x", "y"] * 5
    with pytest.raises(DyntcError, match="dev labels"):
        DynamicClassifier(**SMALL).fit(texts, labels, dev=(["hi"], ["z"]))


def test_fit_learns_and_predicts(fitted, clinc):
    assert fitted.classes_ == sorted(OLD)
    assert fitted.support_counts() == {y: len(clinc["train"][y]) for y in sorted(OLD)}
    texts, labels = _flat(clinc["test"], OLD)
    assert fitted.score(texts, labels) > 0.7  # chance: 1/6
    assert fitted.train_result_.best_dev_acc is not None


def test_predict_proba_top_k_encode_agree(fitted, clinc):
    texts = clinc["test"]["weather"][:5] + clinc["test"]["alarm"][:5]
    pred = fitted.predict(texts)
    proba = fitted.predict_proba(texts)
    assert proba.shape == (10, len(OLD)) and np.allclose(proba.sum(1), 1)
    assert [fitted.classes_[i] for i in proba.argmax(1)] == pred
    top = fitted.top_k(texts, k=3)
    assert all(len(row) == 3 and row[0][0] == p for row, p in zip(top, pred))
    assert all(row[0][1] <= row[1][1] <= row[2][1] for row in top)
    assert len(fitted.top_k(texts[:1], k=100)[0]) == len(OLD)
    points = fitted.encode(texts)
    assert points.shape == (10, 65)  # hidden 64 + the hyperboloid's time coordinate
    lorentz_norm = points[:, 0] ** 2 - (points[:, 1:] ** 2).sum(1)
    assert np.allclose(lorentz_norm, 1.0, atol=1e-3)
    assert fitted.predict([]) == [] and fitted.predict_proba([]).shape == (0, len(OLD))
    with pytest.raises(DyntcError, match="k must be"):
        fitted.top_k(texts, k=0)
    with pytest.raises(DyntcError, match="single string"):
        fitted.predict("what is the weather")
    with pytest.raises(DyntcError, match=r"texts\[1\] is empty"):
        fitted.predict(["ok", "  "])


def test_euclidean_fit(clinc):
    texts, labels = _flat(clinc["train"], OLD[:3])
    clf = DynamicClassifier(**{**SMALL, "metric": "euclidean", "episodes": 10}).fit(texts, labels)
    assert clf.encode(["hello"]).shape == (1, 64)
    assert set(clf.predict(clinc["test"]["alarm"])) <= set(OLD[:3])


# ------------------------------------------------------------------------------- label operations


def test_add_label_is_immediate_and_touches_nothing_else(clf, clinc, monkeypatch):
    before = {c: clf.labels_._prototypes[c].clone() for c in clf.classes_}
    embedded = []
    original = clf.space_.embed
    monkeypatch.setattr(clf.space_, "embed", lambda texts, items=None: embedded.append(list(texts)) or original(texts))
    examples = clinc["train"]["flip_coin"][:20]
    assert clf.add_label("flip_coin", examples) == sorted(OLD + ["flip_coin"])
    assert embedded == [examples]  # only the new examples were encoded
    for c, p in before.items():
        assert torch.equal(clf.labels_._prototypes[c], p)
    assert clf.support("flip_coin") == examples
    assert _acc(clf, clinc["test"], "flip_coin") > 0.6  # chance: 1/7
    assert clf.predict_proba(["hi"]).shape == (1, len(OLD) + 1)


def test_add_examples_moves_only_that_prototype(clf, clinc):
    before = {c: clf.labels_._prototypes[c].clone() for c in clf.classes_}
    n = len(clf.support("weather"))
    assert clf.add_examples("weather", ["is it going to rain tomorrow", "how hot is it outside"]) == sorted(OLD)
    assert len(clf.support("weather")) == n + 2
    assert not torch.equal(clf.labels_._prototypes["weather"], before["weather"])
    assert all(torch.equal(clf.labels_._prototypes[c], before[c]) for c in OLD if c != "weather")


def test_remove_label_makes_it_unpredictable(clf, clinc):
    assert "timer" in set(clf.predict(clinc["test"]["timer"]))
    assert clf.remove_label("timer") == sorted(set(OLD) - {"timer"})
    texts, _ = _flat(clinc["test"], OLD)
    assert "timer" not in set(clf.predict(texts))
    assert "timer" not in {lab for row in clf.top_k(texts, k=10) for lab, _ in row}
    assert clf.predict_proba(texts[:2]).shape == (2, len(OLD) - 1)


def test_remove_down_to_one_label_but_not_zero(clf):
    for name in OLD[:-1]:
        clf.remove_label(name)
    assert clf.classes_ == [OLD[-1]]
    assert clf.predict(["anything at all"]) == [OLD[-1]]
    assert np.allclose(clf.predict_proba(["x"]), 1.0)
    with pytest.raises(DyntcError, match="only label left"):
        clf.remove_label(OLD[-1])
    assert clf.classes_ == [OLD[-1]]


def test_merge_then_split_recovers_the_labels(clf, clinc):
    test, rng = clinc["test"], np.random.default_rng(0)
    a, b = "alarm", "timer"
    assert clf.merge_labels([a, b], into="clock") == sorted(set(OLD) - {a, b} | {"clock"})
    assert len(clf.support("clock")) == len(clinc["train"][a]) + len(clinc["train"][b])
    assert _acc(clf, test, a, "clock") > 0.6 and _acc(clf, test, b, "clock") > 0.6

    parts = {name: list(rng.choice(clinc["train"][name], 20, replace=False)) for name in (a, b)}
    assert clf.split_label("clock", parts) == sorted(OLD)
    assert clf.support(a) == parts[a] and clf.support(b) == parts[b]
    clf.refresh()  # the head's background refresh, now (until then the new labels are imprinted)
    nearer = []
    for name, other in ((a, b), (b, a)):
        # The new labels are predicted for their own examples ...
        assert np.mean([p == name for p in clf.predict(parts[name])]) >= 0.8
        # ... and unseen texts of each part are nearer to their own new prototype than to the other
        # (not always nearest overall: a 20-example prototype competes with 100-example ones).
        rows = [dict(r) for r in clf.top_k(test[name], k=len(clf.classes_))]
        nearer += [r[name] < r[other] for r in rows]
    assert np.mean(nearer) >= 0.75


def test_a_merged_label_keeps_one_prototype_per_part(clf, clinc, tmp_path):
    """merge_labels: the merged label's score is the nearest of its parts' scores (exactly the scores
    the merged labels had), every other label's is unchanged; parts survive save/load, restore,
    fine_tune and merging again; new examples join the nearest part. (The nearest-prototype scorer;
    the head's merged labels are in test_head_classifier.py.)"""
    clf.set_params(head=None)
    texts = [t for y in OLD for t in clinc["test"][y][:5]]
    before = clf.decision_function(texts)
    index = {c: i for i, c in enumerate(clf.classes_)}
    clf.merge_labels(["alarm", "timer"], into="clock")
    after = clf.decision_function(texts)
    expected = np.maximum(before[:, index["alarm"]], before[:, index["timer"]])  # scores are -d²
    np.testing.assert_allclose(after[:, clf.classes_.index("clock")], expected, rtol=1e-4, atol=1e-5)
    for name in set(OLD) - {"alarm", "timer"}:
        np.testing.assert_allclose(after[:, clf.classes_.index(name)], before[:, index[name]], rtol=1e-4, atol=1e-5)
    support = clf.labels_.support("clock")
    assert support.n_parts == 2 and support.stored_parts() == [0] * 100 + [1] * 100

    clf.add_examples("clock", ["wake me up at six tomorrow", "set a timer for ten minutes"])
    assert clf.labels_.support("clock").parts[-2:] == (0, 1)  # the alarm part, the timer part

    back = DynamicClassifier.load(clf.save(tmp_path / "m"))
    assert back.labels_.support("clock").parts == clf.labels_.support("clock").parts
    np.testing.assert_allclose(back.decision_function(texts), clf.decision_function(texts), rtol=1e-5, atol=1e-6)
    with DynamicClassifier.edit(tmp_path / "m") as edit:
        edit.merge_labels(["clock", "weather"], into="misc")
    assert DynamicClassifier.load(tmp_path / "m").labels_.support("misc").n_parts == 3
    DynamicClassifier.restore(tmp_path / "m", 1)
    assert DynamicClassifier.load(tmp_path / "m").labels_.support("clock").n_parts == 2

    clf.fine_tune(episodes=2)
    assert clf.labels_.support("clock").n_parts == 2


def test_split_with_reassign_moves_old_examples_to_nearest_new_label(clf, clinc):
    old_texts = clf.support("balance")
    parts = {"balance_check": ["what is my balance", "how much money do i have"],
             "balance_history": ["show my account history", "list my last payments"]}
    clf.split_label("balance", parts, reassign=True)
    assert "balance" not in clf.classes_
    got = clf.support("balance_check")[2:] + clf.support("balance_history")[2:]
    assert sorted(got) == sorted(old_texts)
    # Every reassigned example sits with the new prototype (from the given examples) nearest to it.
    fresh = copy.deepcopy(clf)
    for name in parts:
        support = fresh.labels_.support(name)
        fresh.labels_._support[name] = Support(tuple(parts[name]), support.points[:2])
    fresh.labels_._refresh(list(parts))
    for text in clf.support("balance_check")[2:6]:
        row = dict(fresh.top_k([text], k=len(fresh.classes_))[0])
        assert row["balance_check"] <= row["balance_history"] + 1e-4


def test_merge_into_one_of_its_names(clf, clinc):
    clf.merge_labels(["alarm", "timer"], into="alarm")
    assert "timer" not in clf.classes_ and "alarm" in clf.classes_
    assert _acc(clf, clinc["test"], "timer", "alarm") > 0.6


def test_rename_keeps_everything_else(clf, clinc):
    texts, _ = _flat(clinc["test"], OLD)
    before = clf.predict(texts)
    proto = clf.labels_._prototypes["weather"].clone()
    assert clf.rename_label("weather", "forecast") == sorted((set(OLD) - {"weather"}) | {"forecast"})
    assert clf.predict(texts) == ["forecast" if p == "weather" else p for p in before]
    assert torch.equal(clf.labels_._prototypes["forecast"], proto)


@pytest.mark.parametrize(
    "op, match",
    [
        (lambda c: c.add_label("weather", ["x"]), "already exists"),
        (lambda c: c.add_label("new", []), "needs at least one example"),
        (lambda c: c.add_label("new", "one string"), "single string"),
        (lambda c: c.add_label("new", ["ok", ""]), r"examples\[1\] is empty"),
        (lambda c: c.add_label("new", ["ok", None]), r"examples\[1\] is NoneType"),
        (lambda c: c.add_label("", ["ok"]), "non-empty label name"),
        (lambda c: c.add_label(5, ["ok"]), r"must be a label name \(str\)"),
        (lambda c: c.add_examples("nope", ["x"]), "'nope' does not exist"),
        (lambda c: c.add_examples("weather", []), "at least one example"),
        (lambda c: c.remove_label("nope"), "'nope' does not exist"),
        (lambda c: c.split_label("nope", {"a": ["x"], "b": ["y"]}), "'nope' does not exist"),
        (lambda c: c.split_label("weather", {"a": ["x"]}), "at least two new labels"),
        (lambda c: c.split_label("weather", {"a": ["x"], "b": []}), "examples of 'b' is empty"),
        (lambda c: c.split_label("weather", {"a": ["x"], "alarm": ["y"]}), "'alarm' already exists"),
        (lambda c: c.split_label("weather", [("a", ["x"])]), "must be a dict"),
        (lambda c: c.merge_labels([], into="x"), "at least two labels"),
        (lambda c: c.merge_labels(["alarm"], into="x"), "at least two labels"),
        (lambda c: c.merge_labels(["alarm", "nope"], into="x"), "'nope' does not exist"),
        (lambda c: c.merge_labels(["alarm", "alarm"], into="x"), "twice"),
        (lambda c: c.merge_labels(["alarm", "timer"], into="weather"), "'weather' already exists"),
        (lambda c: c.merge_labels("alarm", into="x"), "list of at least two"),
        (lambda c: c.rename_label("nope", "x"), "'nope' does not exist"),
        (lambda c: c.rename_label("alarm", "timer"), "'timer' already exists"),
        (lambda c: c.rename_label("alarm", "alarm"), "both"),
        (lambda c: c.fine_tune(["hello"], ["nope"]), "add them with add_label first"),
    ],
)
def test_bad_label_operations_leave_the_classifier_unchanged(clf, op, match):
    before = dict(clf.labels_.items())
    changed, log = set(clf.labels_.changed), list(clf.labels_.log)
    with pytest.raises(DyntcError, match=match):
        op(clf)
    assert clf.classes_ == sorted(OLD)
    assert dict(clf.labels_.items()) == before  # the very same (immutable) support sets
    assert clf.labels_.changed == changed and clf.labels_.log == log


def test_extend_vocab_gives_new_words_their_glove_vectors(clf):
    vocab = clf.model_.encoder.vocab
    assert "zeppelin" not in vocab.index
    clf.add_label("airship", ["book a zeppelin ride", "zeppelin tickets please"])
    assert "zeppelin" in clf.model_.encoder.vocab.index
    row = clf.model_.encoder.embedding.weight[clf.model_.encoder.vocab.index["zeppelin"]]
    assert row.abs().sum() > 0
    off = copy.deepcopy(clf).set_params(extend_vocab=False)
    n = len(off.model_.encoder.vocab)
    off.add_label("blimp", ["a qwzxv blimp", "blimp"])
    assert len(off.model_.encoder.vocab) == n


def test_fine_tune_re_embeds_and_rebuilds(clf, clinc):
    clf.add_label("translate", clinc["train"]["translate"][:5])
    weights = {k: v.clone() for k, v in clf.model_.state_dict().items()}
    texts = clinc["train"]["translate"][5:10] + clinc["train"]["weather"][:5]
    clf.fine_tune(texts, ["translate"] * 5 + ["weather"] * 5, episodes=5)
    assert any(not torch.equal(weights[k], v) for k, v in clf.model_.state_dict().items())
    assert len(clf.support("translate")) == 10
    # Stored points and prototypes now come from the fine-tuned encoder.
    for c in ("translate", "alarm"):
        assert torch.allclose(clf.labels_.support(c).points, clf.space_.embed(clf.support(c)), atol=1e-5)
    alarm = clf.space_.means([clf.labels_.support("alarm").points])[0]
    assert torch.allclose(clf.labels_._prototypes["alarm"], alarm, atol=1e-6)


# ------------------------------------------------------------------------------- persistence


def test_save_load_round_trip_identical(clf, clinc, tmp_path):
    clf.add_label("translate", clinc["train"]["translate"][:5])
    clf.merge_labels(["alarm", "timer"], into="alarm_or_timer")
    clf.rename_label("weather", "forecast")
    clf.refresh()  # the head's background refresh, now: a loaded classifier trains the same head at once
    path = clf.save(tmp_path / "model")
    assert sorted(p.name for p in path.iterdir()) == ["dyntc.sqlite"]
    loaded = DynamicClassifier.load(path)
    texts, _ = _flat(clinc["test"], OLD + NEW)
    assert loaded.classes_ == clf.classes_
    assert loaded.support_counts() == clf.support_counts()
    assert np.array_equal(loaded.predict_proba(texts), clf.predict_proba(texts))
    assert loaded.top_k(texts[:5], 3) == clf.top_k(texts[:5], 3)
    assert loaded.get_params() == {**clf.get_params(), "device": "cpu"}
    # Label operations keep working after a load, and a second save is a second version.
    loaded.add_label("flip_coin", clinc["train"]["flip_coin"][:5])
    loaded.refresh()
    loaded.save(path)
    again = DynamicClassifier.load(path)
    assert "flip_coin" in again.classes_ and again.version_ == 2
    assert np.array_equal(again.predict_proba(texts[:20]), loaded.predict_proba(texts[:20]))
    assert np.array_equal(DynamicClassifier.load(path, version=1).predict_proba(texts[:20]),
                          clf.predict_proba(texts[:20]))
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temporary leftovers


def test_load_rejects_bad_directories(fitted, tmp_path):
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


def test_batch_size_is_checked_when_set():
    clf = DynamicClassifier()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(DyntcError, match="batch_size must be an integer >= 1"):
            clf.set_params(batch_size=bad)
    assert clf.set_params(batch_size=8).batch_size == 8


def test_top_k_is_nearest_labels_of_the_decision_function(fitted):
    texts = ["what is my balance", "wake me up at seven"]
    ours = fitted.top_k(texts, k=4)
    theirs = fitted.nearest_labels(fitted.squared_distances(fitted.decision_function(texts)), 4)
    assert [[lab for lab, _ in r] for r in ours] == [[lab for lab, _ in r] for r in theirs]
    np.testing.assert_allclose([[d for _, d in r] for r in ours], [[d for _, d in r] for r in theirs], rtol=1e-6)
    ranked = fitted.top_k(texts, k=100)
    assert [len(r) for r in ranked] == [len(fitted.classes_)] * 2
    assert all([d for _, d in r] == sorted(d for _, d in r) for r in ranked)
    assert [r[0][0] for r in ranked] == fitted.predict(texts)


def test_decision_function_is_what_predict_and_predict_proba_derive_from(fitted):
    texts = ["what is my balance", "book a flight to paris", "play some jazz"]
    scores = fitted.decision_function(texts)
    assert scores.shape == (3, len(fitted.classes_)) and fitted.head == "cosine"
    assert [fitted.classes_[i] for i in scores.argmax(1)] == fitted.predict(texts)
    np.testing.assert_allclose(torch.softmax(torch.as_tensor(scores), 1).numpy(), fitted.predict_proba(texts), atol=1e-12)


def test_fine_tune_checks_dev_and_lr_like_fit(fitted):
    clf = copy.deepcopy(fitted)
    vocab, counts = len(clf.model_.encoder.vocab), clf.support_counts()
    with pytest.raises(DyntcError, match="dev must be a pair"):  # checked before the new words join
        clf.fine_tune(["set an alarm for quixotic zyzzyva"], ["alarm"], episodes=1, dev=(["hi"],))
    assert len(clf.model_.encoder.vocab) == vocab and clf.support_counts() == counts
    for bad in (0, True, 1.5):
        with pytest.raises(DyntcError, match="episodes must be an integer"):
            clf.fine_tune(episodes=bad)
    with pytest.raises(DyntcError, match="k must be an integer"):
        clf.top_k(["hi"], k=True)
    with pytest.raises(DyntcError, match="not among the labels trained on"):
        clf.fine_tune(episodes=1, dev=(["hi"], ["no-such-label"]))
    for bad in (0, -1e-3, "fast", True):
        with pytest.raises(DyntcError, match="lr must be a number > 0"):
            clf.fine_tune(episodes=1, lr=bad)


def test_default_classifier_is_minilm_euclidean_end_to_end(clinc, tmp_path):
    """The defaults a user gets: the pretrained MiniLM backbone and the Euclidean metric."""
    pytest.importorskip("sentence_transformers")
    clf = DynamicClassifier(episodes=20, eval_every=10)
    assert (clf.encoder, clf.metric, clf.head) == ("minilm", "euclidean", "cosine")
    texts, labels = _flat({y: v[:30] for y, v in clinc["train"].items()}, OLD)
    clf.fit(texts, labels)
    assert clf.model_.encoder.config()["kind"] == "pretrained" and clf.model_.metric == "euclidean"
    clf.add_label("flip_coin", clinc["train"]["flip_coin"][:5])
    assert _acc(clf, clinc["test"], "flip_coin") > 0.6 and _acc(clf, clinc["test"], "alarm") > 0.6
    clf.refresh()  # what the background refresh does a second later; a loaded classifier does it at once
    back = DynamicClassifier.load(clf.save(tmp_path / "m"))
    test, _ = _flat(clinc["test"], OLD + ["flip_coin"])
    np.testing.assert_array_equal(back.predict_proba(test[:40]), clf.predict_proba(test[:40]))


def test_train_none_embeds_only(clinc):
    """train='none' (the pretrained default): the backbone's own embeddings, no head, no training;
    a one-example label is fine (no episodes need it) and fine_tune says there is nothing to train."""
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:10] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier().fit(texts + ["what time is it in tokyo"], labels + ["time_zone"])
    assert clf.train_result_ is None and list(clf.model_.parameters()) == []
    assert clf.space_.dim == 384
    np.testing.assert_allclose(np.linalg.norm(clf.encode(texts[:5]), axis=1), 1.0, rtol=1e-5)  # MiniLM's Normalize
    with pytest.raises(DyntcError, match="nothing to train"):
        clf.fine_tune(episodes=2)


def test_train_backbone_trains_only_the_top_layers(clinc):
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:8] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=3, n_support=2, n_query=12, eval_every=3)
    clf.fit(texts, labels)
    model = clf.model_
    assert clf.train_result_.steps == 3 and model.learn_scale
    encoder = model.encoder
    layers = encoder.backbone[0].auto_model.encoder.layer
    trained = [any(p.requires_grad for p in block.parameters()) for block in layers]
    assert trained == [False] * (len(layers) - 2) + [True, True]
    from dyntc.encoders.pretrained import load_sentence_transformer, resolve_backbone

    before = dict(load_sentence_transformer(resolve_backbone("minilm")).named_parameters())
    after = dict(encoder.backbone.named_parameters())
    bottom = next(n for n in after if ".layer.0." in n)
    top = next(n for n in after if f".layer.{len(layers) - 1}." in n and n.endswith("weight"))
    torch.testing.assert_close(after[bottom], before[bottom])
    assert not torch.equal(after[top], before[top])


def test_backbone_with_hard_negative_episodes(clinc):
    """hard_fraction reaches the episode sampler: with more labels than max_classes the training
    episodes' predictions are recorded as confusability (and the sampler draws partners from it)."""
    pytest.importorskip("sentence_transformers")
    from dyntc.data import episodes

    seen = []
    original = episodes.EpisodeSampler.record

    def spy(self, episode, probs):
        seen.append((self.hard_fraction, episode.n_classes))
        return original(self, episode, probs)

    texts, labels = _flat({y: v[:6] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=2, n_support=2, n_query=8, max_classes=3, hard_fraction=0.5)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(episodes.EpisodeSampler, "record", spy)
        clf.fit(texts, labels)
    assert seen == [(0.5, 3), (0.5, 3)] and len(set(labels)) > 3
    assert clf.train_result_.steps == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_train_backbone_on_cuda(clinc):
    """The same backbone fine-tuning on a GPU: trains, predicts, and matches the CPU embedding of
    the trained weights."""
    pytest.importorskip("sentence_transformers")
    texts, labels = _flat({y: v[:8] for y, v in clinc["train"].items()}, OLD)
    clf = DynamicClassifier(train="backbone", episodes=5, n_support=2, n_query=12, hard_fraction=0.5,
                            max_classes=3, device="cuda").fit(texts, labels)
    assert clf.train_result_.steps == 5
    on_gpu = clf.encode(texts[:16])
    pred = clf.predict(texts[:16])
    clf.set_params(device="cpu")
    np.testing.assert_allclose(clf.encode(texts[:16]), on_gpu, atol=1e-4)
    assert clf.predict(texts[:16]) == pred


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
