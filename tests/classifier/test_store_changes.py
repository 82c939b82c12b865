"""A version read as its difference to an earlier one (ModelStore.changes_since, DynamicClassifier.load
with base=): the same classifier as a full load, sharing the unchanged labels; None where only a full
read will do."""

import torch
from _toy import toy_classifier

from dyntc import DynamicClassifier
from dyntc.classifier.store import ModelStore


def _same(a: DynamicClassifier, b: DynamicClassifier) -> bool:
    return (a.classes_ == b.classes_ and a.support_counts() == b.support_counts() and a.version_ == b.version_
            and all(a.support(c) == b.support(c) and torch.equal(a.labels_.support(c).points, b.labels_.support(c).points)
                    and torch.equal(a.labels_._prototypes[c], b.labels_._prototypes[c]) for c in a.classes_))


def test_a_later_version_read_as_its_difference_equals_a_full_load(tmp_path):
    model = toy_classifier().save(tmp_path / "m")
    store = ModelStore.open(model)
    base = DynamicClassifier.load(store)
    with DynamicClassifier.edit(store) as clf:
        clf.add_examples("alarm", ["one more alarm"])
        clf.rename_label("timer", "countdown")
        clf.remove_label("weather")
        clf.add_label("greeting", ["hello", "hi there"])
    with DynamicClassifier.edit(store) as clf:
        clf.merge_labels(["balance", "greeting"], "misc")
    changes = store.changes_since(base.store_id_, base.version_)
    assert changes.version == 3 and set(changes.labels) == {"alarm", "countdown", "misc"}
    assert set(changes.removed) == {"timer", "weather", "balance"}
    newer = DynamicClassifier.load(store, base=base)
    assert _same(newer, DynamicClassifier.load(store))
    assert newer.labels_.support("alarm") is not base.labels_.support("alarm")
    assert base.version_ == 1 and "weather" in base.classes_  # base left as it was
    assert store.changes_since(base.store_id_, 3).labels == {}  # nothing changed since the head


def test_another_store_a_pruned_base_or_a_new_calibration_need_a_full_read(tmp_path):
    model = toy_classifier().save(tmp_path / "m")
    store = ModelStore.open(model)
    base = DynamicClassifier.load(store)
    assert store.changes_since("another store", base.version_) is None
    with DynamicClassifier.edit(store) as clf:
        clf.calibrate(["wake me up", "what is my balance", "set a timer", "is it sunny"],
                      ["alarm", "balance", "timer", "weather"])
    assert store.changes_since(base.store_id_, base.version_) is None  # the document changed
    newer = DynamicClassifier.load(store, base=base)
    assert _same(newer, DynamicClassifier.load(store)) and newer.calibration_ is not None
    with DynamicClassifier.edit(store) as clf:
        clf.add_examples("alarm", ["again"])
    DynamicClassifier.prune(model, keep=1)
    assert store.changes_since(base.store_id_, base.version_) is None
    assert _same(DynamicClassifier.load(store, base=base), DynamicClassifier.load(store))
