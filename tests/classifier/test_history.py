"""What the console reads of a store's history (dyntc.classifier.store.history): the difference
between two versions, followed by label identity, and when each label last changed."""

import pytest
from _toy import TEXTS, toy_classifier

from dyntc import DynamicClassifier, DyntcError
from dyntc.classifier.store import ModelStore
from dyntc.classifier.store import history


@pytest.fixture
def store(tmp_path):
    path = toy_classifier().save(tmp_path / "m")  # 1
    for op in (lambda c: c.rename_label("alarm", "wake up"),  # 2
               lambda c: c.add_examples("balance", ["money money"]),  # 3
               lambda c: c.remove_label("weather"),  # 4
               lambda c: c.add_label("greeting", ["hello", "hi"]),  # 5
               lambda c: c.remove_examples("timer", ["cancel my timer"])):  # 6
        with DynamicClassifier.edit(path) as clf:
            op(clf)
    return ModelStore.open(path)


def test_the_difference_between_two_versions_both_ways(store):
    d = history.diff(store, 1, 6)
    assert d["renamed"] == [{"from": "alarm", "to": "wake up"}]
    assert d["labels_removed"] == [{"label": "weather", "examples": 10}]
    assert d["labels_added"] == [{"label": "greeting", "examples": 2}]
    assert d["examples"] == [{"label": "balance", "added": ["money money"], "removed": []},
                             {"label": "timer", "added": [], "removed": ["cancel my timer"]}]
    back = history.diff(store, 6, 1)
    assert back["renamed"] == [{"from": "wake up", "to": "alarm"}]
    assert back["labels_added"] == [{"label": "weather", "examples": 10}]
    assert back["examples"][1] == {"label": "timer", "added": ["cancel my timer"], "removed": []}
    assert history.diff(store, 3, 3)["examples"] == []


def test_a_restore_is_no_difference_from_the_restored_version(store):
    DynamicClassifier.restore(store, 2)
    d = history.diff(store, 2, 7)
    assert (d["labels_added"], d["labels_removed"], d["renamed"], d["examples"]) == ([], [], [], [])
    assert history.diff(store, 6, 7)["labels_added"] == [{"label": "weather", "examples": len(TEXTS["weather"])}]


def test_when_each_label_last_changed(store):
    changed = history.label_changes(store)
    assert {n: c["version"] for n, c in changed.items()} == {"wake up": 2, "balance": 3, "greeting": 5, "timer": 6}
    assert all(c["created"] for c in changed.values())


def test_versions_page_and_bad_versions(store):
    rows, total = history.version_page(store, 1, 2)
    assert total == 6 and [r["version"] for r in rows] == [5, 4]
    with pytest.raises(DyntcError, match="no version 9 in this store; the versions kept are 1..6"):
        history.diff(store, 1, 9)
    DynamicClassifier.prune(store, 2)
    with pytest.raises(DyntcError, match="no version 1 in this store; the versions kept are 5..6"):
        history.diff(store, 1, 6)
