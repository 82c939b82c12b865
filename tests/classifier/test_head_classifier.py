"""DynamicClassifier with the cosine head (classifier/live_head.py): the default scorer, scores by
hand, label operations during a background refresh, readers during refreshes, copies, saving, bad
options. All on the hashing encoder (no download)."""

import math
import threading

import numpy as np
import pytest
import torch

from _cli import run_cli
from dyntc import DynamicClassifier, DyntcError
from dyntc.classifier import live_head
from dyntc.classifier.head import HeadConfig, imprint_offsets
from dyntc.classifier.calibration import Calibration
from dyntc.classifier.labels import LabelSet

TEXTS = ["book a flight to paris", "flight to rome please", "fly me to berlin tomorrow", "cheap flights to oslo",
         "what is the weather", "is it raining today", "weather forecast for tomorrow", "will it snow tonight",
         "play some music", "play a song by queen", "put on some jazz music", "music please"]
LABELS = ["flight"] * 4 + ["weather"] * 4 + ["music"] * 4
QUERIES = ["a flight to madrid", "will it rain today", "play queen", "set an alarm"]


def _fit(**kwargs) -> DynamicClassifier:
    return DynamicClassifier("hashing", **kwargs).fit(TEXTS, LABELS)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _part_prototypes(clf, name: str, coords=lambda p: p) -> np.ndarray:
    s = clf.labels_.support(name)
    x, ids = coords(s.points.numpy()).astype(np.float64), s.part_ids().numpy()
    return _unit(np.stack([x[ids == p].mean(0) for p in range(s.n_parts)]))


# ------------------------------------------------------------------------------- defaults


def test_default_is_the_cosine_head_and_head_none_the_prototype_scorer():
    assert DynamicClassifier().head == "cosine" and DynamicClassifier().head_options is None
    clf = _fit()
    assert clf.head_status()["imprinted"] == [] and clf.head_status()["examples"] == len(TEXTS)
    assert clf.prior_temperature_ == 1.0
    old = _fit(head=None)
    assert old.head_status() is None
    points = old.space_.embed(QUERIES)
    np.testing.assert_allclose(old.label_scores(QUERIES), -old.labels_.sq_distances(points).double().numpy())
    assert old.prior_temperature_ == pytest.approx(1 / 16)
    with pytest.raises(DyntcError, match="head=None"):
        old.refresh()
    with pytest.raises(DyntcError, match="wait must be True or False"):
        clf.refresh(wait="yes")
    assert "head=None" in repr(old) and "head" not in repr(clf)


# ------------------------------------------------------------------------------- scores by hand


def test_scores_by_hand_untrained_trained_imprinted_merged_and_distances():
    # max_iter=0: no training, every weight is the label's normalised prototype, no offset
    clf = _fit(head_options={"max_iter": 0, "refresh_delay": 3600})
    x = _unit(clf.encode(QUERIES).astype(np.float64))
    protos = np.concatenate([_part_prototypes(clf, c) for c in clf.classes_])
    expected = 16 * x @ protos.T
    scores = clf.label_scores(QUERIES)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert clf.predict(QUERIES).tolist() == [clf.classes_[i] for i in expected.argmax(1)]
    np.testing.assert_allclose(clf.predict_proba(QUERIES), torch.softmax(torch.as_tensor(expected), 1).numpy(), atol=1e-5)
    # distances: d² = 2 - 2 s / 16 = |x - p|² on the unit sphere; top_k nearest = best-scored first
    d = np.sqrt(np.maximum(2 - 2 * expected / 16, 0))
    for row, drow, srow in zip(clf.top_k(QUERIES, k=3), d, expected):
        assert [label for label, _ in row] == [clf.classes_[i] for i in np.argsort(-srow)]
        np.testing.assert_allclose([v for _, v in row], np.sort(drow), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(x[:, None] - protos[None], axis=-1), d, atol=1e-5)

    # trained: weights from the head, offset 0; an added label is imprinted with the offset
    trained = _fit(head_options={"refresh_delay": 3600})
    head = trained.labels_.head
    assert head.imprint_offset > 0 and head.scale == 16
    w = np.concatenate([head.rows(trained.labels_.support(c)) for c in trained.classes_])
    np.testing.assert_allclose(trained.label_scores(QUERIES), 16 * _unit(trained.encode(QUERIES)) @ w.T, atol=1e-5)
    trained.add_label("alarm", ["set an alarm for six", "wake me up at seven"])
    assert trained.head_status()["imprinted"] == ["alarm"]
    col = list(trained.classes_).index("alarm")
    proto = _part_prototypes(trained, "alarm")
    offset = imprint_offsets(proto, "alarm", head.reference, head.imprint_offset, HeadConfig().imprint_share)[0]
    assert head.reference.x.shape == (sum(len(trained.labels_.support(c).texts) for c in trained.classes_ if c != "alarm"),
                                      proto.shape[1]) and offset >= head.imprint_offset
    expected = 16 * (_unit(trained.encode(QUERIES)) @ proto[0] - offset)
    np.testing.assert_allclose(trained.label_scores(QUERIES)[:, col], expected, atol=1e-5)
    assert trained.predict(["set an alarm"]).tolist() == ["alarm"]

    # merged: one row per part (its prototype, imprinted), the label scores the best part
    clf.merge_labels(["music", "weather"], "misc")
    parts = _part_prototypes(clf, "misc")
    assert parts.shape[0] == 2
    x = _unit(clf.encode(QUERIES).astype(np.float64))
    col = list(clf.classes_).index("misc")
    np.testing.assert_allclose(clf.label_scores(QUERIES)[:, col], 16 * (x @ parts.T).max(1), atol=1e-5)
    clf.refresh()
    assert clf.head_status()["imprinted"] == [] and clf.labels_.head.rows(clf.labels_.support("misc")).shape[0] == 2


def test_scores_by_hand_on_a_tiny_label_set():
    """Unit vectors e1, e2, e3: trained weights set by hand, an imprinted label with the offset, a
    merged label scoring its best part, and the distances the scores stand for."""
    clf = _fit(head_options={"refresh_delay": 3600})
    dim = clf.space_.dim
    e = torch.eye(dim)[:4]
    groups = {"a": (["a1", "a2"], torch.stack([e[0], e[0]])),
              "b": (["b1", "b2"], torch.stack([e[1], e[2]])),
              "m": (["m1", "m2"], torch.stack([e[3], e[1]]), [0, 1])}  # a merged label: parts e4, e2
    labels = LabelSet.from_groups(clf.space_, groups, debias=True)
    support = dict(labels.items())
    w_a = np.zeros((1, dim), np.float32)
    w_a[0, :2] = [0.6, 0.8]  # a's trained weight
    w_b = np.zeros((1, dim), np.float32)
    w_b[0, 1] = 1.0  # b's trained weight: e2
    labels.head = live_head.Trained(((support["a"], w_a), (support["b"], w_b)), 16.0, 0.125, {})
    clf._labels = labels
    config = live_head.head_config(clf.head_options)[0]
    v = live_head.view(labels, config)
    assert v.classes == ("a", "b", "m") and v.imprinted == ("m",)
    q = torch.stack([e[1], (e[0] + e[3]) / math.sqrt(2)])
    s = live_head.scores(v, labels, q, config).numpy()
    # q1 = e2: a 16·0.8 = 12.8; b 16·1 = 16; m (imprinted, offset 0.125): parts e4, e2 -> 16·(1 − 0.125) = 14
    # q2 = (e1 + e4)/√2: a 16·0.6/√2; b 0; m: 16·(1/√2 − 0.125)
    r = 1 / math.sqrt(2)
    np.testing.assert_allclose(s, [[12.8, 16.0, 14.0], [16 * 0.6 * r, 0.0, 16 * (r - 0.125)]], atol=1e-5)
    # distances: d² = 2 − 2 s/16; q1's nearest is b at 0
    np.testing.assert_allclose(clf.squared_distances(s).numpy(), 2 - 2 * s / 16, atol=1e-12)
    assert [label for label, _ in clf.nearest_labels(clf.squared_distances(s), 3)[0]] == ["b", "m", "a"]
    # b renamed keeps its support object, so its trained weight; b given an example loses it
    labels.rename_label("b", "c")
    assert live_head.view(labels, config).imprinted == ("m",)
    labels.add_examples("c", ["one more example"])
    assert live_head.view(labels, config).imprinted == ("c", "m")


def test_prototype_score_option_adds_the_product_distance():
    clf = _fit(head_options={"max_iter": 0, "proto_weight": 0.5, "proto_scale": 4})
    x = _unit(clf.encode(QUERIES).astype(np.float64))
    protos = np.concatenate([_part_prototypes(clf, c) for c in clf.classes_])
    d2 = clf.labels_.sq_distances(clf.space_.embed(QUERIES)).double().numpy()  # support-size corrected
    np.testing.assert_allclose(clf.label_scores(QUERIES), 16 * x @ protos.T - 0.5 * 4 * d2, atol=1e-5)


def test_hyperbolic_metric_uses_the_spatial_part():
    clf = DynamicClassifier("hashing", "hyperbolic", head_options={"max_iter": 0}).fit(TEXTS, LABELS)
    points = clf.encode(QUERIES)
    assert points.shape[1] == clf.space_.dim
    x = _unit(points[:, 1:].astype(np.float64))  # h: the direction of the log map at the origin
    protos = np.concatenate([_part_prototypes(clf, c, lambda p: p[:, 1:]) for c in clf.classes_])
    np.testing.assert_allclose(clf.label_scores(QUERIES), 16 * x @ protos.T, atol=1e-5)
    trained = DynamicClassifier("hashing", "hyperbolic").fit(TEXTS, LABELS)
    assert trained.predict(QUERIES[:3]).tolist() == ["flight", "weather", "music"]


# ------------------------------------------------------------------------------- refresh and threads


class _GatedTrainer:
    """Replaces the head's trainer: call i signals started[i] and waits for go[i] (calls past the
    prepared gates run at once)."""

    def __init__(self, monkeypatch, gates: int):
        self.real = live_head.train_cosine_head
        self.started = [threading.Event() for _ in range(gates)]
        self.go = [threading.Event() for _ in range(gates)]
        self.calls = 0
        monkeypatch.setattr(live_head, "train_cosine_head", self)

    def __call__(self, *args, **kwargs):
        i, self.calls = self.calls, self.calls + 1
        if i < len(self.started):
            self.started[i].set()
            assert self.go[i].wait(30), "the test never released the refresh"
        return self.real(*args, **kwargs)


def test_label_added_during_a_refresh_is_served_at_once_and_survives_the_swap(monkeypatch):
    clf = _fit(head_options={"refresh_delay": 0})
    gate = _GatedTrainer(monkeypatch, 2)
    clf.add_label("alarm", ["set an alarm for six", "wake me up at seven"])  # schedules refresh 1
    assert gate.started[0].wait(10)
    before = clf.labels_.head
    clf.add_label("taxi", ["call me a taxi", "book a cab to the station"])  # while refresh 1 trains
    assert clf.predict(["a taxi to the station please"]).tolist() == ["taxi"]  # imprinted, served at once
    assert set(clf.head_status()["imprinted"]) == {"alarm", "taxi"}
    assert clf.labels_.head is before  # nothing installed yet
    gate.go[0].set()
    assert gate.started[1].wait(10)  # refresh 1 installed, refresh 2 (for taxi) started
    assert clf.labels_.head is not before
    assert clf.head_status()["imprinted"] == ["taxi"]  # trained on a snapshot without it: still imprinted
    assert clf.predict(["a taxi to the station please", "set an alarm please"]).tolist() == ["taxi", "alarm"]
    assert "taxi" in clf.classes_
    gate.go[1].set()
    assert clf.wait_for_refresh(30)
    assert clf.head_status()["imprinted"] == [] and clf.head_status()["examples"] == len(TEXTS) + 4
    assert clf.predict(["a taxi to the station please"]).tolist() == ["taxi"]


def test_refreshes_are_debounced_and_never_overlap(monkeypatch):
    clf = _fit(head_options={"refresh_delay": 0.3})
    active, overlaps, calls = [0], [], []
    real = live_head.train_cosine_head

    def counting(*args, **kwargs):
        active[0] += 1
        overlaps.append(active[0])
        calls.append(1)
        try:
            return real(*args, **kwargs)
        finally:
            active[0] -= 1

    monkeypatch.setattr(live_head, "train_cosine_head", counting)
    for i in range(5):  # five quick operations: one background refresh after the last
        clf.add_examples("music", [f"play track number {i}"])
    assert clf.head_status()["refreshing"]
    assert clf.wait_for_refresh(30)
    assert len(calls) == 1 and clf.head_status()["imprinted"] == []
    threads = [threading.Thread(target=clf.refresh) for _ in range(3)] + [threading.Thread(target=lambda: clf.refresh(wait=False))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clf.wait_for_refresh(30)
    assert max(overlaps) == 1


def test_readers_never_see_a_half_built_head():
    holder = [_fit(head_options={"refresh_delay": 0})]
    config = live_head.head_config(None)[0]
    stop, errors, reads = threading.Event(), [], [0]

    def reader():
        while not stop.is_set():
            clf = holder[0]
            try:
                labels = clf.labels_
                v = live_head.view(labels, config)
                assert len(v.weights) == len(v.offsets) == len(v.owner) == len(v.supports) == len(v.classes)
                assert list(v.classes) == labels.classes
                scores = clf.label_scores(QUERIES)
                assert scores.shape == (len(QUERIES), len(clf.classes_)) and np.isfinite(scores).all()
                probs = clf.predict_proba(QUERIES)
                assert probs.shape == scores.shape
                assert all(label in clf.classes_ for label in clf.predict(QUERIES).tolist())
                reads[0] += 1
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(6):  # the service's pattern: copy, change, swap; each copy refreshes in the background
            new = holder[0].copy()
            new.add_label(f"topic{i}", [f"question about topic {i}", f"topic {i} help"])
            holder[0] = new
            new.refresh(wait=i % 2 == 0)
    finally:
        assert holder[0].wait_for_refresh(30)
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[0]
    assert reads[0] > 0
    assert holder[0].head_status()["imprinted"] == []


def test_copies_refresh_on_their_own():
    clf = _fit(head_options={"refresh_delay": 0})
    head, classes = clf.labels_.head, list(clf.classes_)
    other = clf.copy()
    assert other.head_options is not clf.head_options or clf.head_options is None
    other.head_options["refresh_delay"] = 5  # the copy's options are its own
    assert clf.head_options["refresh_delay"] == 0
    other.add_label("alarm", ["set an alarm for six", "wake me up at seven"])
    other.refresh()
    assert other.labels_.head is not head and other.head_status()["imprinted"] == []
    assert clf.labels_.head is head and list(clf.classes_) == classes
    assert clf.wait_for_refresh(0)  # the copy's operations left no refresh pending on the original
    assert clf.predict(["set an alarm"]) != ["alarm"]


# ------------------------------------------------------------------------------- saving


def test_save_load_round_trip_is_deterministic(tmp_path):
    clf = _fit()
    path = clf.save(tmp_path / "m")
    first, second = DynamicClassifier.load(path), DynamicClassifier.load(path)
    assert first.head == "cosine"
    np.testing.assert_array_equal(first.label_scores(QUERIES), second.label_scores(QUERIES))
    # fit trains from the prototypes, as load does: the same head
    np.testing.assert_allclose(first.label_scores(QUERIES), clf.label_scores(QUERIES), atol=1e-4)
    # after label operations a saved version still loads to the same predictions every time
    clf.add_label("alarm", ["set an alarm for six", "wake me up at seven"])
    clf.save(path)
    a, b = DynamicClassifier.load(path), DynamicClassifier.load(path)
    np.testing.assert_array_equal(a.label_scores(QUERIES), b.label_scores(QUERIES))
    assert a.head_status()["imprinted"] == [] and a.predict(["set an alarm"]).tolist() == ["alarm"]
    old = DynamicClassifier("hashing", head=None, head_options={"tau": 0.5}).fit(TEXTS, LABELS)
    loaded = DynamicClassifier.load(old.save(tmp_path / "old"))
    assert loaded.head is None and loaded.head_options == {"tau": 0.5}


def test_calibration_is_tied_to_its_scorer(tmp_path):
    clf = _fit()
    clf.calibrate(QUERIES[:3], ["flight", "weather", "music"])
    assert clf.calibration_.scorer == "cosine"
    assert clf.predict(QUERIES[:3], reject=True).tolist() == clf.predict(QUERIES[:3]).tolist()  # nothing rejected at 0 drop
    records = clf.prediction_records(clf.label_scores(QUERIES), top_k=2, proba=True, reject=True)
    assert [r["label"] for r in records] == clf.predict(QUERIES, reject=True).tolist()
    assert all(r["top_k"][0]["distance"] <= r["top_k"][1]["distance"] for r in records)
    assert DynamicClassifier.load(clf.save(tmp_path / "m")).calibration_.scorer == "cosine"
    clf.set_params(head=None)
    assert clf.calibration_ is None  # fitted on the head's scores
    # a calibration stored before the head existed (no scorer field) is not applied to the head's scores
    old = Calibration(temperature=0.05, threshold=1.0, max_accuracy_drop=0.02, n_texts=3, accuracy=1.0,
                      accuracy_with_rejection=1.0, ece_before=0.1, ece_after=0.01)
    headed = _fit()
    headed.calibration_ = Calibration.from_dict({k: v for k, v in old.to_dict().items() if k != "scorer"})
    assert headed.temperature_ == 1.0
    with pytest.raises(DyntcError, match="'prototype' scorer.*calibrate"):
        headed.predict(QUERIES, reject=True).tolist()
    headed.set_params(head=None)  # same as the stored version's scorer again? calibration dropped: refit it
    assert headed.calibration_ is None


def test_set_params_head_applies_at_once():
    clf = _fit(head=None)
    before = clf.label_scores(QUERIES)
    clf.set_params(head="cosine")
    assert clf.labels_.head is None
    after = clf.label_scores(QUERIES)  # trained at this first use
    assert clf.head_status()["imprinted"] == [] and not np.allclose(before, after)
    clf.set_params(head_options={"tau": 0.5})
    assert clf.labels_.head is None
    clf.predict(QUERIES).tolist()
    assert clf.labels_.head is not None


# ------------------------------------------------------------------------------- bad values


@pytest.mark.parametrize("kwargs, match", [
    (dict(head="linear"), "head must be None .*'cosine'"),
    (dict(head=""), "head must be None"),
    (dict(head_options="tau=1"), "head_options must be a dict"),
    (dict(head_options={"alpha": 1}), r"head_options \['alpha'\] are not options of the cosine head; it takes scale"),
    (dict(head_options={"tau": -1}), "head_options: tau must be a number >= 0"),
    (dict(head_options={"scale": 0}), "head_options: scale must be a positive number"),
    (dict(head_options={"max_iter": 2.5}), "head_options: max_iter must be an integer >= 0"),
    (dict(head_options={"learn_scale": "yes"}), "head_options: learn_scale must be True or False"),
    (dict(head_options={"refresh_delay": -1}), "refresh_delay must be a number of seconds >= 0"),
    (dict(head_options={"refresh_delay": float("nan")}), "refresh_delay must be a number of seconds >= 0"),
    (dict(head_options={"debias": False}), "'debias' is the classifier's own parameter"),
])
def test_bad_head_options(kwargs, match):
    with pytest.raises(DyntcError, match=match):
        DynamicClassifier("hashing", **kwargs).fit(TEXTS, LABELS)
    clf = _fit()
    name, value = next(iter(kwargs.items()))
    with pytest.raises(DyntcError, match=match):
        clf.set_params(**{name: value})
    assert clf.head == "cosine" and clf.head_options is None  # unchanged


def _cli(*args):
    """`dyntc ARGS` in this process; returns (exit status, stderr)."""
    code, _, err = run_cli(*args)
    return code, err


def test_cli_fit_head_option(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(TEXTS, LABELS)), encoding="utf-8")
    for flag, expected in (("none", None), ("cosine", "cosine")):
        out = tmp_path / f"m-{flag}"
        code, err = _cli("fit", "--data", data, "--out", out, "--encoder", "hashing", "--head", flag)
        assert code == 0, err
        assert DynamicClassifier.load(out).head == expected
    code, err = _cli("fit", "--data", data, "--out", tmp_path / "x", "--encoder", "hashing", "--head", "linear")
    assert code == 2 and "head must be None (nearest prototype) or 'cosine'" in err and not (tmp_path / "x").exists()
