"""Tuning a saved model's backbone (DynamicClassifier.tune / tune_saved, classifier/tuning.py): one
new version holding only the trained layers, writers' changes carried over, nothing committed by a
failed tune, bit-identical reloads, content-addressed weights, clear errors. MiniLM with 2-3
episodes on 6 CLINC150 intents of 8 examples: seconds per tune."""

import threading

import numpy as np
import pytest
import torch
from _postgres import postgres  # noqa: F401  (the fixture)

from dyntc import DynamicClassifier
from dyntc.classifier import tuning
from dyntc.classifier.store import ModelStore
from dyntc.errors import DyntcError, DyntcWarning

pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.data  # every test runs on a CLINC150 sample
INTENTS = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather"]


@pytest.fixture(scope="module")
def data(clinc_raw):
    groups, test = {}, {}
    for key, out in (("train", groups), ("test", test)):
        for text, label in clinc_raw[key]:
            if label in INTENTS:
                out.setdefault(label, []).append(text)
    train = {y: groups[y][:8] for y in INTENTS}
    return {"train": train, "extra": {y: groups[y][8:14] for y in INTENTS},
            "test": [(t, y) for y in INTENTS for t in test[y][:5]]}


@pytest.fixture(scope="module")
def frozen(data):
    texts = [t for y in INTENTS for t in data["train"][y]]
    labels = [y for y in INTENTS for _ in data["train"][y]]
    return DynamicClassifier(n_support=2, n_query=12).fit(texts, labels)  # small episodes


def _saved(frozen, location):
    frozen.copy().save(location)
    return location


def _stored_points_match(clf):
    """Every label's stored points are what the classifier's backbone gives its texts now."""
    for name, support in clf.labels_.items():
        np.testing.assert_allclose(support.points.numpy(), clf.encode(list(support.texts)), atol=2e-5, err_msg=name)


def test_tuned_version_reloads_bit_identically_and_embeds_with_the_tuned_backbone(frozen, data, tmp_path):
    path = _saved(frozen, tmp_path / "m")
    queries = [t for t, _ in data["test"]]
    tuned, report = tuning.tune_model(DynamicClassifier, path, 60, episodes=2)
    assert (report.base_version, report.version, report.episodes, report.replayed) == (1, 2, 2, [])
    assert 5e6 < report.weights_bytes < 20e6  # MiniLM's top two layers, not its ~90 MB
    one, two = DynamicClassifier.load(path), DynamicClassifier.load(path)
    assert one.train == "backbone" and one.version_ == 2
    assert one.versions(path)[0]["op"] == "tune"
    np.testing.assert_array_equal(one.encode(queries), tuned.encode(queries))
    np.testing.assert_array_equal(one.encode(queries), two.encode(queries))
    assert not np.allclose(one.encode(queries), frozen.encode(queries), atol=1e-4)  # the backbone did change
    for name, support in one.labels_.items():
        assert torch.equal(support.points, tuned.labels_.support(name).points)
    _stored_points_match(one)
    np.testing.assert_array_equal(one.label_scores(queries), two.label_scores(queries))
    assert one.predict(queries).tolist() == tuned.predict(queries).tolist()
    # a later label operation embeds with the tuned backbone
    new = ["flip a coin for me", "heads or tails please", "toss a coin"]
    with DynamicClassifier.edit(path) as clf:
        clf.add_label("flip_coin", new)
    back = DynamicClassifier.load(path)
    np.testing.assert_allclose(back.labels_.support("flip_coin").points.numpy(), tuned.encode(new), atol=2e-5)
    assert back.predict(["could you flip a coin"]).tolist() == ["flip_coin"]


def test_tune_in_memory_and_again_from_the_tuned_weights(frozen, data):
    """tune() changes this classifier only (a copy, sharing the network, keeps its backbone); a tuned
    classifier tunes on from its own weights into a new network."""
    clf = frozen.copy()
    before = clf.encode(data["train"]["alarm"][:3])
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert clf.tune(60, episodes=2) is clf
    assert torch.equal(torch.rand(3), expected)  # seeded inside, the caller's random stream left where it was
    assert clf.tune_result_.steps == 2 and clf.train == "backbone" and clf.labels_.log[-1]["op"] == "tune"
    assert not np.allclose(clf.encode(data["train"]["alarm"][:3]), before, atol=1e-4)
    _stored_points_match(clf)
    assert frozen.train is None and np.array_equal(frozen.encode(data["train"]["alarm"][:3]), before)  # copy untouched
    tuned_points = clf.encode(data["train"]["alarm"][:3])
    again = clf.copy().tune(60, episodes=1)  # a tuned model goes on from its own weights
    assert again.tune_result_.steps == 1 and again.model_ is not clf.model_
    assert np.array_equal(clf.encode(data["train"]["alarm"][:3]), tuned_points)
    assert not np.allclose(again.encode(data["train"]["alarm"][:3]), tuned_points, atol=1e-6)


def test_a_label_with_few_examples_is_left_out_of_the_training_and_embedded_by_the_tuned_backbone(frozen, data,
                                                                                                  tmp_path):
    """Labels of 8 examples and one of 3 (few-shot: under half the median): the tune trains on the six, every
    label's points come from the tuned backbone, and the report and the version's log count it."""
    path = _saved(frozen, tmp_path / "m")
    coin = ["flip a coin for me", "heads or tails please", "toss a coin"]
    with DynamicClassifier.edit(path) as clf:
        clf.add_label("flip_coin", coin)
    seen = []
    real = tuning.trainer.train_episodic
    monkey = pytest.MonkeyPatch()
    monkey.setattr(tuning.trainer, "train_episodic", lambda model, texts, labels, *a: seen.append(set(labels))
                   or real(model, texts, labels, *a))
    try:
        tuned, report = tuning.tune_model(DynamicClassifier, path, 60, episodes=2)
    finally:
        monkey.undo()
    assert seen == [set(INTENTS)] and report.few_shot == 1
    assert DynamicClassifier.versions(path)[0]["detail"][0]["few_shot"] == 1
    _stored_points_match(DynamicClassifier.load(path))
    np.testing.assert_allclose(tuned.labels_.support("flip_coin").points.numpy(), tuned.encode(coin), atol=2e-5)


@pytest.mark.parametrize("sizes, few", [
    ({"a": 200, "b": 200, "c": 200, "d": 65, "e": 19, "f": 5}, ["e", "f"]),  # under 20 (half the median: 100)
    ({"a": 8, "b": 8, "c": 8, "d": 3}, ["d"]),  # under half the median (4)
    ({"a": 5, "b": 5, "c": 5}, []),
])
def test_few_shot_labels_are_under_twenty_examples_and_under_half_the_median(sizes, few):
    from types import SimpleNamespace

    clf = SimpleNamespace(labels_=SimpleNamespace(items=lambda: [(n, SimpleNamespace(texts=["t"] * k))
                                                                 for n, k in sizes.items()]))
    assert tuning.few_shot_labels(clf) == few


def test_a_tune_while_writers_write_loses_nothing(frozen, data, tmp_path, monkeypatch):
    """A writer commits all through the tune (during its training, between its catch-up read and its
    commit, and after it); every acknowledged change is in the newest version, embedded with the
    tuned backbone, and predicted."""
    path = _saved(frozen, tmp_path / "m")
    acked, stop, started = [], threading.Event(), threading.Event()
    extra = data["extra"]

    def writer():
        i = 0
        while not stop.is_set():
            with DynamicClassifier.edit(path) as clf:
                if i == 0:
                    clf.remove_label("weather")
                    change = ("removed", "weather", None)
                elif i == 1:
                    clf.add_examples("timer", extra["timer"][:3])
                    change = ("examples", "timer", extra["timer"][:3])
                else:
                    texts = [f"{t} (request {i})" for t in extra[INTENTS[i % 5]][:3]]
                    clf.add_label(f"intent_{i}", texts)
                    change = ("added", f"intent_{i}", texts)
            acked.append(change)
            started.set()
            i += 1

    train = tuning.trainer.train_episodic

    def training_while_writing(*args, **kwargs):
        result = train(*args, **kwargs)
        while len(acked) < 3:  # the writer is well under way while the tune trains
            threading.Event().wait(0.05)
        return result

    settle = tuning.settle_calibration

    def write_before_the_lock(clf, had, held_out):  # after the catch-up read, before the commit
        n = len(acked)
        while len(acked) < n + 1:
            threading.Event().wait(0.05)
        return settle(clf, had, held_out)

    monkeypatch.setattr(tuning.trainer, "train_episodic", training_while_writing)
    monkeypatch.setattr(tuning, "settle_calibration", write_before_the_lock)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        tuned, report = tuning.tune_model(DynamicClassifier, path, 60, episodes=2)
        n_before_commit = len(acked)
        while len(acked) < n_before_commit + 2:  # and writes after the tuned version
            threading.Event().wait(0.05)
    finally:
        stop.set()
        thread.join()
    assert "timer" in report.replayed and "weather" not in tuned.labels_
    newest = DynamicClassifier.load(path)
    assert newest.train == "backbone" and newest.version_ > report.version
    for kind, name, texts in acked:
        if kind == "removed":
            assert name not in newest.labels_
        elif kind == "examples":
            assert newest.support(name)[-len(texts):] == texts
        else:
            assert newest.support(name) == texts
    _stored_points_match(newest)
    added = [(name, texts) for kind, name, texts in acked if kind == "added"]
    assert [newest.predict(texts).tolist() for _, texts in added] == [[name] * len(texts) for name, texts in added]


def test_a_failed_or_interrupted_tune_commits_nothing(frozen, tmp_path, monkeypatch):
    path = _saved(frozen, tmp_path / "m")
    store = ModelStore.open(path)
    size = store.size_bytes()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(tuning.trainer, "train_episodic", interrupted)
        with pytest.raises(KeyboardInterrupt):
            DynamicClassifier.tune_saved(path, 60, episodes=2)
    with monkeypatch.context() as m:  # fails inside the commit's transaction, after the tuned weights were written
        def broken(txn, *args, **kwargs):
            txn.commit(op="tune", detail=[], document={}, weights=b"half", labels={}, replace_all=False)
            raise RuntimeError("disk gone")

        m.setattr(tuning.saving, "write_version", broken)
        with pytest.raises(RuntimeError, match="disk gone"):
            DynamicClassifier.tune_saved(path, 60, episodes=1)
    assert store.head_version() == 1 and [v["version"] for v in store.versions()] == [1]
    assert DynamicClassifier.load(path).train is None
    assert store.size_bytes() <= size + 65536


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_tuned_weights_are_stored_once_and_shared_between_versions(frozen, tmp_path, backend, request):
    location = tmp_path / "m" if backend == "sqlite" else request.getfixturevalue("postgres").url("tuned")
    _saved(frozen, location)
    store = ModelStore.open(location)

    def blobs():
        with store._connect() as db:
            return dict(db.execute("SELECT hash, LENGTH(data) FROM blobs").fetchall())

    def weights(version):
        with store._connect() as db:
            return db.execute("SELECT weights FROM versions WHERE id = ?", (version,)).fetchone()[0]

    first = DynamicClassifier.tune_saved(location, 60, episodes=2)
    after_first = blobs()
    tuned_blob = after_first[weights(first.version)]
    assert 5e6 < tuned_blob < 20e6 and tuned_blob == pytest.approx(first.weights_bytes, rel=0.01)
    DynamicClassifier.restore(location, 1)  # back to the frozen model, then the same tune again
    size = store.size_bytes()
    second = DynamicClassifier.tune_saved(location, 60, episodes=2)
    assert weights(second.version) == weights(first.version)  # equal weights, one blob
    assert blobs().keys() == after_first.keys()
    assert store.size_bytes() - size < 2e6  # the re-embedded support at most, never the layers again
    with DynamicClassifier.edit(location) as clf:  # a label operation refers to the same weights
        clf.add_label("greeting", ["hello there", "hi, how are you"])
    assert weights(clf.version_) == weights(first.version)
    np.testing.assert_array_equal(DynamicClassifier.load(location, first.version).encode(["wake me at 7"]),
                                  DynamicClassifier.load(location).encode(["wake me at 7"]))


def test_calibration_is_refitted_on_held_out_texts_or_dropped_with_a_warning(frozen, data, tmp_path):
    texts, labels = [t for t, _ in data["test"]], [y for _, y in data["test"]]
    oos = ["tell me a joke", "who won the game last night", "what is the meaning of life"]
    calibrated = frozen.copy().calibrate(texts, labels, oos, oos_weight=0.4)
    calibrated.save(tmp_path / "a")
    calibrated.save(tmp_path / "b")
    with pytest.warns(DyntcWarning, match="calibration .* is dropped \\(its 3 out-of-scope examples with it\\)"):
        report = DynamicClassifier.tune_saved(tmp_path / "a", 60, episodes=1)
    assert report.calibration == "dropped" and DynamicClassifier.load(tmp_path / "a").calibration_ is None
    report = DynamicClassifier.tune_saved(tmp_path / "b", 60, episodes=1, calibration=(texts, labels))
    assert report.calibration == "refitted"
    tuned = DynamicClassifier.load(tmp_path / "b")
    assert tuned.calibration_.n_texts == len(texts)
    assert tuned.calibration_.threshold != calibrated.calibration_.threshold  # fitted on the tuned distances
    assert tuned.predict(texts, reject=True).shape == (len(texts),)
    # the kept out-of-scope examples and their weight carry over, embedded by the tuned backbone
    assert tuned.calibration_.oos_examples == tuple(oos) and tuned.calibration_.oos_weight == 0.4
    from dyntc.classifier.rejection import example_directions

    assert not np.allclose(example_directions(tuned, tuned.calibration_),
                           example_directions(calibrated, calibrated.calibration_))


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), True, "60", None])
def test_bad_budgets_are_refused_before_anything_runs(frozen, tmp_path, budget):
    path = _saved(frozen, tmp_path / "m")
    with pytest.raises(DyntcError, match="budget_s must be a finite number of seconds > 0"):
        DynamicClassifier.tune_saved(path, budget)
    with pytest.raises(DyntcError, match="budget_s must be"):
        frozen.copy().tune(budget)


def test_bad_devices_models_and_episodes_get_clear_errors(frozen, tmp_path):
    path = _saved(frozen, tmp_path / "m")
    if not torch.cuda.is_available():
        with pytest.raises(DyntcError, match="no CUDA device is available"):
            DynamicClassifier.tune_saved(path, 60, device="cuda")
    with pytest.raises(DyntcError, match="must be a torch device"):
        DynamicClassifier.tune_saved(path, 60, device="gpu0")
    with pytest.raises(DyntcError, match="episodes must be None .* or an integer >= 1"):
        DynamicClassifier.tune_saved(path, 60, episodes=0)
    with pytest.raises(DyntcError, match="calibration must be None or \\(texts, labels\\)"):
        DynamicClassifier.tune_saved(path, 60, calibration=["only texts"])
    few = DynamicClassifier().fit(["wake me up at 7", "what is my balance", "set a timer"], ["alarm", "balance", "timer"])
    with pytest.raises(DyntcError, match="too few examples to tune: .* n_support \\+ 1 = 5"):
        few.tune(60)
    from _toy import LABELS, TEXTS

    lopsided = DynamicClassifier(n_support=2).fit(TEXTS["alarm"] + TEXTS["weather"][:3], ["alarm"] * 10 + ["weather"] * 3)
    with pytest.raises(DyntcError, match="1 labels with under 20 examples and under half the median label's are left"):
        lopsided.tune(60)  # the 3 weather texts are few-shot: one label left to train on

    toy = DynamicClassifier(encoder="hashing").fit([t for y in LABELS for t in TEXTS[y]],
                                                   [y for y in LABELS for _ in TEXTS[y]])
    with pytest.raises(DyntcError, match="tune fine-tunes a pretrained backbone; encoder 'hashing' has none"):
        toy.tune(60)
    with DynamicClassifier.edit(path) as clf, pytest.raises(DyntcError, match="cannot run inside"):
        clf.tune(60)
    assert ModelStore.open(path).head_version() == 1


def test_older_formats_still_load_and_a_different_backbone_is_refused(frozen, data, tmp_path):
    """A version of classifier format 2 (the whole backbone in its weights) loads as before; a tuned
    version whose recorded backbone fingerprint is not the installed backbone's is refused."""
    from safetensors.torch import save as save_safetensors

    clf = frozen.copy().tune(60, episodes=1)
    clf.save(tmp_path / "m")
    store = ModelStore.open(tmp_path / "m")
    snap = store.read()
    assert snap.document["format"] == 3
    whole = save_safetensors({k: v.contiguous() for k, v in clf.model_.state_dict().items()})
    assert len(whole) > 5 * len(snap.weights)  # format 3 keeps the two trained layers only
    queries = [t for t, _ in data["test"][:8]]
    with store.transaction() as txn:
        txn.commit(op="save", detail=[{"op": "save"}], document={**snap.document, "format": 2}, weights=whole,
                   labels={}, replace_all=False)
    old = DynamicClassifier.load(tmp_path / "m")
    assert old.version_ == 2 and np.array_equal(old.encode(queries), clf.encode(queries))
    for document, words in [({**snap.document, "format": 4}, "format 4; this dyntc reads formats 2, 3"),
                            ({**snap.document, "encoder": {**snap.document["encoder"], "fingerprint": {
                                **snap.document["encoder"]["fingerprint"], "weights": "0" * 16}}},
                             "takes the others from its backbone, whose weights differ")]:
        with store.transaction() as txn:
            txn.commit(op="save", detail=[{"op": "save"}], document=document, weights=snap.weights_hash, labels={},
                       replace_all=False)
        with pytest.raises(DyntcError, match=words):
            DynamicClassifier.load(tmp_path / "m")
