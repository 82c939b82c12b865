"""Bad arguments to the library API that used to fail deep inside (numpy, pathlib, sqlite) with a
TypeError or ValueError: each now gets a DyntcError naming the argument and what it accepts, before
any work is done. The toy (hashing encoder) classifier of tests/_toy.py, fitted once."""

import math

import numpy as np
import pytest

from dyntc import DynamicClassifier
from dyntc.errors import DyntcError
from tests._toy import TEXTS, toy_classifier

NEW = ["play some jazz", "play rock music", "put on my playlist", "play the radio", "music please", "play a song",
       "play some blues", "start my music", "play classical music", "play the top hits", "shuffle my songs",
       "play something relaxing"]
TWO = ["wake me up at six", "will it rain tomorrow"]  # predicted alarm, weather
LABELLED = ["alarm", "alarm"]  # so the first is right and the second wrong


@pytest.fixture(scope="module")
def clf():
    return toy_classifier()


@pytest.fixture(scope="module")
def saved(clf, tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "m"
    clf.save(path)
    return path


@pytest.mark.parametrize("call, match", [
    (lambda c, p: c.score(TWO, LABELLED, sample_weight=[1.0]), r"sample_weight has 1 weights for 2 texts"),
    (lambda c, p: c.score(TWO, LABELLED, sample_weight=[math.nan, 1]), r"sample_weight\[0\] is nan: weights must be finite"),
    (lambda c, p: c.score(TWO, LABELLED, sample_weight=[1, math.inf]), r"sample_weight\[1\] is inf"),
    (lambda c, p: c.score(TWO, LABELLED, sample_weight=[-1, 1]), r"sample_weight\[0\] is -1"),
    (lambda c, p: c.score(TWO, LABELLED, sample_weight=[0, 0]), "sample_weight is all zeros"),
    (lambda c, p: c.score(TWO, LABELLED, sample_weight="11"), "sample_weight must be None or a list of numbers"),
    (lambda c, p: c.score([], []), "texts is empty: pass at least one text"),
    (lambda c, p: c.save(None), "a model location is a directory path or a postgresql:// URL, got None"),
    (lambda c, p: c.save(3), "a model location is a directory path or a postgresql:// URL, got 3"),
    (lambda c, p: DynamicClassifier.versions(p, limit=-1), r"limit must be None \(every version\) or an integer >= 1, got -1"),
    (lambda c, p: DynamicClassifier.versions(p, limit=0), "limit must be None .* got 0"),
    (lambda c, p: DynamicClassifier.versions(p, limit="a"), "limit must be None .* got 'a'"),
    (lambda c, p: c.discover(NEW, seed="a"), r"seed must be an integer >= 0 \(or None for a fresh random draw\), got 'a'"),
    (lambda c, p: c.discover(NEW, seed=-1), "seed must be an integer >= 0 .* got -1"),
    (lambda c, p: c.discover(NEW, seed=1.5), "seed must be an integer >= 0 .* got 1.5"),
    (lambda c, p: c.suggest(seed="a"), "seed must be an integer >= 0 .* got 'a'"),
    (lambda c, p: c.suggest(split_ratio=math.nan), r"split_ratio must be a number > 0, got nan"),
    (lambda c, p: c.suggest(merge_rate=math.nan), r"merge_rate must be a number in \(0, 1.0\], got nan"),
    (lambda c, p: c.suggest(min_share=math.nan), r"min_share must be a number in \(0, 0.5\], got nan"),
    (lambda c, p: DynamicClassifier(encoder="hashing", seed=-1).fit(TEXTS["alarm"], ["alarm"] * 10),
     "seed must be an integer >= 0, got -1"),
    (lambda c, p: c.prediction_records(np.zeros((1, 7))), r"scores must be \(n, 4\), one column per label of classes_, got shape \(1, 7\): pass label_scores\(texts\)"),
    (lambda c, p: c.nearest_labels(np.zeros((1, 7)), 2), r"sq_distances must be \(n, 4\).* got shape \(1, 7\): pass squared_distances\(label_scores"),
    (lambda c, p: c.nearest_labels(np.zeros((1, 4)), 0), "k must be an integer >= 1, got 0"),
    (lambda c, p: c.squared_distances(np.zeros((2, 3))), r"scores must be \(n, 4\).* got shape \(2, 3\)"),
    (lambda c, p: c.proba_from_scores(np.zeros(4)), r"scores must be \(n, 4\).* got shape \(4,\) \(a two-label decision"),
    (lambda c, p: c.copy().split_label("alarm", {"a": TEXTS["alarm"][:5], "b": TEXTS["alarm"][5:]}, reassign="yes"),
     "reassign must be True or False, got 'yes'"),
    (lambda c, p: c.suggest(min_part=True), "min_part must be an integer >= 1, got True"),
    (lambda c, p: c.suggest(top=True), "top must be None or an integer >= 1, got True"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_bad_argument_is_a_dyntc_error_naming_it(clf, saved, call, match):
    with pytest.raises(DyntcError, match=match):
        call(clf, saved)


def test_score_weights_count_each_text_as_given(clf):
    """The weighted accuracy is the known answer: one right and one wrong text (predictions checked
    first), weighted 3:1 and 0:1."""
    assert clf.predict(TWO).tolist() == ["alarm", "weather"]
    assert clf.score(TWO, LABELLED) == 0.5
    assert clf.score(TWO, LABELLED, sample_weight=[3, 1]) == 0.75
    assert clf.score(TWO, LABELLED, sample_weight=[0, 1]) == 0.0


def test_a_two_label_decision_function_still_gives_probabilities():
    two = DynamicClassifier(encoder="hashing").fit(TEXTS["alarm"] + TEXTS["weather"], ["alarm"] * 10 + ["weather"] * 10)
    texts = ["wake me at five", "is it raining"]
    np.testing.assert_allclose(two.proba_from_scores(two.decision_function(texts)), two.predict_proba(texts), atol=1e-12)


def test_versions_limit_and_seed_none_still_work(clf, saved):
    assert [v["version"] for v in DynamicClassifier.versions(saved, limit=1)] == [1]
    assert clf.discover(NEW, seed=None).texts == NEW
