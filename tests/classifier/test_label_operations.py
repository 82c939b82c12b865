"""The label operations of DynamicClassifier (classifier/labels.py): add_label, add_examples,
remove_label, split_label, merge_labels, rename_label. Each takes effect at once, touches only the
labels it names, and a bad one raises a DyntcError saying what is wrong and changes nothing.

On the hashing-encoder toy of tests/_toy.py (no data set, no download). ``head=None`` where a test
needs the exact geometry (a prototype is the mean of its support points, computed here from
``clf.encode``; a score is -d² to it), the default cosine head where it tests what a user gets."""

import numpy as np
import pytest
import torch
from _toy import LABELS, TEXTS, toy_classifier

from dyntc import DynamicClassifier, DyntcError
from dyntc.errors import LabelExistsError, UnknownLabelError

ALL_TEXTS = [t for y in LABELS for t in TEXTS[y]]
ALL_LABELS = [y for y in LABELS for _ in TEXTS[y]]
COIN = ["flip a coin", "toss a coin for me", "heads or tails", "flip a coin to decide"]


@pytest.fixture
def clf():
    """The toy with the default cosine head."""
    return toy_classifier()


@pytest.fixture
def held():
    """The toy with the cosine head whose background refresh does not come during the test (an
    explicit ``refresh()`` still retrains it): what scores between an operation and the refresh."""
    return toy_classifier(head_options={"refresh_delay": 600})


@pytest.fixture
def proto():
    """The toy with the nearest-prototype scorer (head=None)."""
    return toy_classifier(head=None)


def _prototypes(clf) -> dict[str, torch.Tensor]:
    """Every label's prototype rows (one per part), by name."""
    rows, owner = clf.labels_.prototypes(), clf.labels_.prototype_owner()
    return {c: rows[owner == i].clone() for i, c in enumerate(clf.classes_)}


def _hand_prototype(clf, texts) -> np.ndarray:
    """The Euclidean prototype of `texts`: the mean of their points."""
    return clf.encode(texts).astype(np.float64).mean(0)


def _unchanged(before: dict, after: dict, names) -> bool:
    return all(torch.equal(before[c], after[c]) for c in names)


# ------------------------------------------------------------------------------- add_label / add_examples


def test_add_label_is_immediate_and_touches_nothing_else(clf, monkeypatch):
    before = _prototypes(clf)
    embedded = []
    original = clf.space_.embed
    monkeypatch.setattr(clf.space_, "embed", lambda texts, items=None: embedded.append(list(texts)) or original(texts))
    assert clf.add_label("coin", COIN) == sorted(LABELS + ["coin"])
    assert embedded == [COIN]  # only the new examples were encoded
    monkeypatch.undo()
    after = _prototypes(clf)
    assert _unchanged(before, after, LABELS)
    np.testing.assert_allclose(after["coin"][0].numpy(), _hand_prototype(clf, COIN), atol=1e-6)
    assert clf.support("coin") == COIN and clf.support_counts()["coin"] == 4
    # predicted at once (scored by its prototype until the head's refresh), and after the refresh
    queries = ["flip a coin please", "heads or tails?"]
    assert clf.predict(queries).tolist() == ["coin", "coin"]
    assert clf.predict(ALL_TEXTS).tolist() == ALL_LABELS
    assert clf.predict_proba(["hi"]).shape == (1, len(LABELS) + 1)
    clf.refresh()
    assert clf.predict(queries).tolist() == ["coin", "coin"] and clf.predict(ALL_TEXTS).tolist() == ALL_LABELS


def test_add_label_leaves_the_other_labels_scores_exactly(proto):
    """Without the support-size correction (which pools the spread of every label) a new label adds
    a column and changes no other."""
    proto.set_params(debias=False)
    before = proto.decision_function(ALL_TEXTS)
    proto.add_label("coin", COIN)
    after = proto.decision_function(ALL_TEXTS)
    assert list(proto.classes_) == ["alarm", "balance", "coin", "timer", "weather"]
    np.testing.assert_allclose(after[:, [0, 1, 3, 4]], before, rtol=0, atol=1e-6)  # float rounding apart
    x = proto.encode(ALL_TEXTS).astype(np.float64)
    np.testing.assert_allclose(after[:, 2], -((x - _hand_prototype(proto, COIN)) ** 2).sum(1), atol=1e-5)


def test_add_examples_moves_only_that_prototype(proto):
    before = _prototypes(proto)
    new = ["is it going to rain tomorrow", "how hot is it outside"]
    assert proto.add_examples("weather", new) == LABELS
    assert proto.support("weather") == TEXTS["weather"] + new and proto.support_counts()["weather"] == 12
    after = _prototypes(proto)
    assert not torch.equal(after["weather"], before["weather"])
    np.testing.assert_allclose(after["weather"][0].numpy(), _hand_prototype(proto, TEXTS["weather"] + new), atol=1e-6)
    assert _unchanged(before, after, [c for c in LABELS if c != "weather"])


def test_add_examples_with_the_default_head_is_predicted_at_once(clf):
    clf.add_examples("balance", ["how many dollars are left", "dollars left in savings"])
    assert clf.predict(["how many dollars do i have left"]).tolist() == ["balance"]
    assert clf.predict(ALL_TEXTS).tolist() == ALL_LABELS


# ------------------------------------------------------------------------------- remove_label


def test_remove_label_makes_it_unpredictable(held):
    clf = held
    assert set(clf.predict(TEXTS["timer"]).tolist()) == {"timer"}
    before = clf.decision_function(ALL_TEXTS)
    protos = _prototypes(clf)
    assert clf.remove_label("timer") == ["alarm", "balance", "weather"]
    assert "timer" not in set(clf.predict(ALL_TEXTS).tolist())
    assert "timer" not in {lab for row in clf.top_k(ALL_TEXTS, k=10) for lab, _ in row}
    assert clf.predict_proba(ALL_TEXTS[:2]).shape == (2, len(LABELS) - 1)
    # the other labels' scores, prototypes and predictions are untouched
    np.testing.assert_allclose(clf.decision_function(ALL_TEXTS), before[:, [0, 1, 3]], rtol=0, atol=1e-6)
    assert _unchanged(protos, _prototypes(clf), ["alarm", "balance", "weather"])
    keep = [i for i, y in enumerate(ALL_LABELS) if y != "timer"]
    assert clf.predict([ALL_TEXTS[i] for i in keep]).tolist() == [ALL_LABELS[i] for i in keep]
    clf.refresh()
    assert "timer" not in set(clf.predict(ALL_TEXTS).tolist())
    with pytest.raises(DyntcError, match="'timer' does not exist"):
        clf.support("timer")


def test_remove_down_to_one_label_but_not_zero(clf):
    for name in LABELS[:-1]:
        clf.remove_label(name)
    assert list(clf.classes_) == [LABELS[-1]]
    assert clf.predict(["anything at all"]).tolist() == [LABELS[-1]]
    assert np.allclose(clf.predict_proba(["x"]), 1.0)
    with pytest.raises(DyntcError, match="only label left"):
        clf.remove_label(LABELS[-1])
    assert list(clf.classes_) == [LABELS[-1]]


# ------------------------------------------------------------------------------- merge_labels


def test_merge_is_immediate_and_predicted_for_both_labels(clf):
    before = _prototypes(clf)
    assert clf.merge_labels(["alarm", "timer"], into="clock") == ["balance", "clock", "weather"]
    assert clf.support("clock") == TEXTS["alarm"] + TEXTS["timer"]
    assert clf.predict(TEXTS["alarm"] + TEXTS["timer"]).tolist() == ["clock"] * 20
    assert clf.predict(TEXTS["balance"] + TEXTS["weather"]).tolist() == ["balance"] * 10 + ["weather"] * 10
    assert _unchanged(before, _prototypes(clf), ["balance", "weather"])
    clf.refresh()
    assert clf.predict(TEXTS["alarm"] + TEXTS["timer"]).tolist() == ["clock"] * 20


def test_a_merged_label_keeps_one_prototype_per_part(proto, tmp_path):
    """merge_labels: the merged label's score is the nearest of its parts' scores (exactly the scores
    the merged labels had), every other label's is unchanged; its prototypes are the parts' means;
    parts survive save/load, restore and merging again; new examples join the nearest part. (The
    nearest-prototype scorer; the head's merged labels are in test_head_classifier.py, fine_tune's
    in test_classifier.py.)"""
    clf = proto
    texts = ALL_TEXTS[::2] + ["wake me up at six tomorrow", "set a timer for five minutes"]
    before = clf.decision_function(texts)
    index = {c: i for i, c in enumerate(clf.classes_)}
    clf.merge_labels(["alarm", "timer"], into="clock")
    after = clf.decision_function(texts)
    expected = np.maximum(before[:, index["alarm"]], before[:, index["timer"]])  # scores are -d²
    np.testing.assert_allclose(after[:, list(clf.classes_).index("clock")], expected, rtol=1e-4, atol=1e-5)
    for name in ("balance", "weather"):
        np.testing.assert_allclose(after[:, list(clf.classes_).index(name)], before[:, index[name]], rtol=1e-4, atol=1e-5)
    support = clf.labels_.support("clock")
    assert support.n_parts == 2 and support.stored_parts() == [0] * 10 + [1] * 10
    rows = _prototypes(clf)["clock"]
    assert rows.shape[0] == 2
    np.testing.assert_allclose(rows[0].numpy(), _hand_prototype(clf, TEXTS["alarm"]), atol=1e-6)
    np.testing.assert_allclose(rows[1].numpy(), _hand_prototype(clf, TEXTS["timer"]), atol=1e-6)

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


def test_merge_into_one_of_its_names(clf):
    assert clf.merge_labels(["alarm", "timer"], into="alarm") == ["alarm", "balance", "weather"]
    assert "timer" not in clf.classes_ and clf.support("alarm") == TEXTS["alarm"] + TEXTS["timer"]
    assert clf.predict(TEXTS["timer"]).tolist() == ["alarm"] * 10


# ------------------------------------------------------------------------------- split_label


def test_merge_then_split_recovers_the_labels(clf):
    clf.merge_labels(["alarm", "timer"], into="clock")
    parts = {"alarm": TEXTS["alarm"][:5], "timer": TEXTS["timer"][:5]}
    assert clf.split_label("clock", parts) == LABELS
    # without reassign the old label's other examples are gone
    assert clf.support("alarm") == parts["alarm"] and clf.support("timer") == parts["timer"]
    unseen = ["set an alarm for six", "start a timer for ten minutes"]
    for _ in range(2):  # at once (the new labels scored by their prototypes), then after the head's refresh
        assert clf.predict(parts["alarm"] + parts["timer"]).tolist() == ["alarm"] * 5 + ["timer"] * 5
        assert clf.predict(unseen).tolist() == ["alarm", "timer"]
        assert clf.predict(TEXTS["balance"] + TEXTS["weather"]).tolist() == ["balance"] * 10 + ["weather"] * 10
        clf.refresh()


def test_split_prototypes_are_the_given_examples_means(proto):
    before = _prototypes(proto)
    parts = {"alarm": TEXTS["alarm"][:5], "timer": TEXTS["timer"][:5], "weather": TEXTS["weather"][:3]}
    # a new label may reuse the split label's own name, but no other existing one
    assert proto.split_label("weather", {"weather": parts["weather"], "snow": ["will it snow this week"]}) == \
        ["alarm", "balance", "snow", "timer", "weather"]
    after = _prototypes(proto)
    np.testing.assert_allclose(after["weather"][0].numpy(), _hand_prototype(proto, parts["weather"]), atol=1e-6)
    np.testing.assert_allclose(after["snow"][0].numpy(), _hand_prototype(proto, ["will it snow this week"]), atol=1e-6)
    assert _unchanged(before, after, ["alarm", "balance", "timer"])
    assert proto.predict(["will it snow tomorrow"]).tolist() == ["snow"]


def test_split_with_reassign_moves_old_examples_to_nearest_new_label(proto):
    clf = proto
    old_texts = clf.support("balance")
    parts = {"balance_check": ["what is my balance", "how much money do i have"],
             "balance_history": ["show my account history", "list my last payments"]}
    # by hand: each old example goes to the new label whose prototype (from the given examples) is nearest
    means = {name: _hand_prototype(clf, examples) for name, examples in parts.items()}
    x = clf.encode(old_texts).astype(np.float64)
    d2 = np.stack([((x - means[name]) ** 2).sum(1) for name in parts], axis=1)
    goes = [list(parts)[j] for j in d2.argmin(1)]
    expected = {name: parts[name] + [t for t, g in zip(old_texts, goes) if g == name] for name in parts}
    assert all(len(v) > 2 for v in expected.values())  # both new labels get some: the test means something

    assert clf.split_label("balance", parts, reassign=True) == ["alarm", "balance_check", "balance_history", "timer", "weather"]
    assert "balance" not in clf.classes_
    assert {name: clf.support(name) for name in parts} == expected
    got = clf.support("balance_check")[2:] + clf.support("balance_history")[2:]
    assert sorted(got) == sorted(old_texts)
    protos = _prototypes(clf)
    for name in parts:  # the prototypes then take in the reassigned examples too
        np.testing.assert_allclose(protos[name][0].numpy(), _hand_prototype(clf, expected[name]), atol=1e-6)


# ------------------------------------------------------------------------------- rename_label


def test_rename_keeps_everything_else(held):
    clf = held
    before_pred = clf.predict(ALL_TEXTS).tolist()
    before_scores = clf.decision_function(ALL_TEXTS)
    before = _prototypes(clf)
    assert clf.rename_label("weather", "forecast") == ["alarm", "balance", "forecast", "timer"]
    assert clf.predict(ALL_TEXTS).tolist() == ["forecast" if p == "weather" else p for p in before_pred]
    after = _prototypes(clf)
    assert torch.equal(after["forecast"], before["weather"])
    assert _unchanged(before, after, ["alarm", "balance", "timer"])
    assert clf.support("forecast") == TEXTS["weather"]
    # the head needs no retraining: the very same scores, in the new column order
    np.testing.assert_allclose(clf.decision_function(ALL_TEXTS), before_scores[:, [0, 1, 3, 2]], rtol=0, atol=1e-6)
    assert clf.head_status()["imprinted"] == []
    clf.refresh()
    assert clf.predict(ALL_TEXTS).tolist() == ["forecast" if p == "weather" else p for p in before_pred]


def test_rename_keeps_the_prototype_scores(proto):
    before = proto.decision_function(ALL_TEXTS)
    proto.rename_label("alarm", "wake_up")
    assert list(proto.classes_) == ["balance", "timer", "wake_up", "weather"]
    np.testing.assert_allclose(proto.decision_function(ALL_TEXTS), before[:, [1, 2, 0, 3]], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------- bad operations


@pytest.mark.parametrize(
    "op, match",
    [
        (lambda c: c.add_label("weather", ["x"]), "already exists"),
        (lambda c: c.add_label("new", []), "needs at least one example"),
        (lambda c: c.add_label("new", "one string"), "single string"),
        (lambda c: c.add_label("new", ["ok", ""]), r"examples\[1\] is empty"),
        (lambda c: c.add_label("new", ["ok", None]), r"examples\[1\] is NoneType"),
        (lambda c: c.add_label("new", 5), "must be a list of texts, got int"),
        (lambda c: c.add_label("", ["ok"]), "non-empty label name"),
        (lambda c: c.add_label(5, ["ok"]), r"labels are strings: pass a str"),
        (lambda c: c.add_label("a\nb", ["ok"]), "must not contain control characters"),
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
        (lambda c: c.merge_labels(["alarm", "timer"], into=""), "non-empty label name"),
        (lambda c: c.merge_labels("alarm", into="x"), "list of at least two"),
        (lambda c: c.rename_label("nope", "x"), "'nope' does not exist"),
        (lambda c: c.rename_label("alarm", "timer"), "'timer' already exists"),
        (lambda c: c.rename_label("alarm", "alarm"), "both"),
        (lambda c: c.rename_label("alarm", " "), "non-empty label name"),
        (lambda c: c.fine_tune(["wake me up"], ["alarm"]), "nothing to train"),
    ],
)
def test_bad_label_operations_leave_the_classifier_unchanged(clf, op, match):
    before = dict(clf.labels_.items())
    protos = _prototypes(clf)
    scores = clf.decision_function(ALL_TEXTS)
    changed, log = set(clf.labels_.changed), list(clf.labels_.log)
    with pytest.raises(DyntcError, match=match):
        op(clf)
    assert list(clf.classes_) == LABELS
    assert dict(clf.labels_.items()) == before  # the very same (immutable) support sets
    assert clf.labels_.changed == changed and clf.labels_.log == log
    assert _unchanged(protos, _prototypes(clf), LABELS)
    np.testing.assert_array_equal(clf.decision_function(ALL_TEXTS), scores)


def test_label_errors_have_their_own_types(clf):
    with pytest.raises(UnknownLabelError, match="label 'nope' does not exist; the labels are 'alarm', 'balance'"):
        clf.add_examples("nope", ["x"])
    with pytest.raises(LabelExistsError, match="label 'alarm' already exists: use add_examples"):
        clf.add_label("alarm", ["x"])


def test_each_operation_is_logged_and_marks_what_it_changed(proto):
    """What a save writes: the labels an operation added, changed or removed, and what was done."""
    assert proto.labels_.changed == set(LABELS)  # fitted: nothing committed yet
    proto.labels_.changed.clear()
    proto.labels_.log.clear()
    proto.add_label("coin", COIN)
    proto.add_examples("weather", ["will it hail"])
    proto.rename_label("alarm", "wake_up")
    proto.merge_labels(["wake_up", "timer"], into="clock")
    proto.split_label("clock", {"wake_up": TEXTS["alarm"][:2], "timer": TEXTS["timer"][:2]})
    proto.remove_label("coin")
    assert proto.labels_.changed == {"coin", "weather", "alarm", "wake_up", "timer", "clock"}
    assert [entry["op"] for entry in proto.labels_.log] == [
        "add_label", "add_examples", "rename_label", "merge_labels", "split_label", "remove_label"]
    assert list(proto.classes_) == ["balance", "timer", "wake_up", "weather"]
