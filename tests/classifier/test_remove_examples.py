"""DynamicClassifier.remove_examples: the examples go, the others keep their stored points, the
prototype is the mean of what remains, a merged label keeps its parts; bad input is a clear error
that changes nothing. On the hashing toy."""

import pytest
import torch
from _toy import TEXTS, toy_classifier

from dyntc import DynamicClassifier, DyntcError
from dyntc.errors import UnknownLabelError


def test_removed_examples_leave_and_the_prototype_is_the_mean_of_the_rest(tmp_path):
    clf = toy_classifier(head=None)
    gone = TEXTS["alarm"][:3]
    clf.remove_examples("alarm", gone + [gone[0]])  # a text named twice is removed once
    kept = TEXTS["alarm"][3:]
    assert clf.support("alarm") == kept
    support = clf.labels_.support("alarm")
    assert torch.equal(support.points, torch.as_tensor(clf.encode(kept)))
    expected = clf.labels_.space.means([support.points])[0]
    assert torch.allclose(clf.labels_.prototypes()[clf.classes_.tolist().index("alarm")], expected, atol=1e-6)
    clf.save(tmp_path / "m")
    with DynamicClassifier.edit(tmp_path / "m") as edited:
        edited.remove_examples("alarm", [kept[0]])
    again = DynamicClassifier.load(tmp_path / "m")
    assert again.support("alarm") == kept[1:] and again.version_ == 2
    assert DynamicClassifier.versions(tmp_path / "m", 1)[0]["op"] == "remove_examples"


def test_a_merged_label_keeps_its_parts():
    clf = toy_classifier(head=None)
    clf.merge_labels(["timer", "weather"], "tw")
    clf.remove_examples("tw", TEXTS["timer"][:9])
    support = clf.labels_.support("tw")
    assert support.n_parts == 2 and support.texts == (TEXTS["timer"][9], *TEXTS["weather"])
    clf.remove_examples("tw", [TEXTS["timer"][9]])  # a part emptied: one part left
    assert clf.labels_.support("tw").n_parts == 1


@pytest.mark.parametrize("name, examples, error, words", [
    ("alarm", ["not an example"], DyntcError, "'not an example' is not an example of label 'alarm'"),
    ("alarm", TEXTS["alarm"], DyntcError, "would leave label 'alarm' with none: remove the label instead"),
    ("nope", ["x"], UnknownLabelError, "label 'nope' does not exist"),
    ("alarm", [], DyntcError, "examples is empty"),
    ("alarm", "wake me up at six", DyntcError, "not a single string"),
])
def test_bad_input_is_a_clear_error_that_changes_nothing(name, examples, error, words):
    clf = toy_classifier()
    before = clf.support_counts()
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        clf.remove_examples(name, examples)
    assert clf.support_counts() == before
