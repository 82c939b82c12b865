"""discover(..., adapt_s=...) (classifier/discovery_tuning.py): the contrastive loss and the neighbours
by their definitions, bad input refused before anything is embedded or trained, and a MiniLM run on a
CLINC150 sample: new intents found, the classifier itself unchanged."""

import functools
import math

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier
from dyntc.classifier import discovery_tuning as dt
from dyntc.errors import DyntcError
from tests._toy import toy_classifier


def test_neighbours_are_the_most_similar_other_rows():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    got = dt.neighbours(x, 5, chunk=7)  # chunks that do not divide the rows
    sims = x @ x.T
    np.fill_diagonal(sims, -np.inf)
    want = np.argsort(-sims, axis=1)[:, :5]
    assert [set(r) for r in got] == [set(r) for r in want]
    assert dt.neighbours(x[:3], 50).shape == (3, 2)  # k capped at the other rows


def test_neighbour_count_is_at_most_a_quarter_of_the_mean_cluster():
    assert dt.neighbour_count(18_000, 20) == dt.NEIGHBOURS == 50  # StackOverflow: 900 texts per cluster
    assert dt.neighbour_count(104, 6) == 4
    assert dt.neighbour_count(3, 10) == 1


def test_supcon_against_its_formula():
    torch.manual_seed(0)
    z = torch.nn.functional.normalize(torch.randn(5, 4), dim=1)
    pos = torch.zeros(5, 5, dtype=torch.bool)
    pos[0, 1] = pos[1, 0] = pos[0, 2] = pos[2, 0] = True  # row 0 has two positives, rows 1, 2 one; 3, 4 none
    tau = 0.1
    want = []
    for i, ps in ((0, [1, 2]), (1, [0]), (2, [0])):
        others = [j for j in range(5) if j != i]
        denom = torch.logsumexp(torch.stack([z[i] @ z[j] / tau for j in others]), 0)
        want.append(-sum(float(z[i] @ z[p] / tau - denom) for p in ps) / len(ps))
    assert math.isclose(float(dt.supcon(z, pos | torch.eye(5, dtype=torch.bool), tau)), np.mean(want), rel_tol=1e-5)
    assert float(dt.supcon(z, torch.zeros(5, 5, dtype=torch.bool), tau)) == 0.0  # no positive: no loss


def test_neighbour_positives_symmetric_and_same_text():
    nbrs = np.array([[1, 2], [2, 3], [0, 3], [0, 1]])
    idx = np.array([0, 3, 0])
    got = dt.neighbour_positives(idx, nbrs).numpy()
    # 0 and 3 are each other's neighbours; the two copies of text 0 are positives of each other
    assert got.tolist() == [[True, True, True], [True, True, True], [True, True, True]]
    got = dt.neighbour_positives(np.array([1, 2]), np.array([[0], [3], [3], [0]])).numpy()
    assert got.tolist() == [[True, False], [False, True]]


@pytest.mark.parametrize("adapt_s, match", [(0, "adapt_s must be a finite number"), (-5, "adapt_s must be"),
                                            ("60", "adapt_s must be"), (float("nan"), "adapt_s must be"),
                                            (True, "adapt_s must be")])
def test_bad_budget(adapt_s, match):
    with pytest.raises(DyntcError, match=match):
        toy_classifier(head=None).discover([f"text number {i}" for i in range(6)], adapt_s=adapt_s)


def test_encoder_without_a_backbone_is_refused():
    clf = toy_classifier(head=None)
    texts = [f"open the {w} door" for w in ("red", "blue", "green", "front", "back", "side")]
    with pytest.raises(DyntcError, match="adapt_s fine-tunes a pretrained backbone.*encoder 'hashing'"):
        clf.discover(texts, adapt_s=10)
    assert clf.discover(texts, 1).settings["adapt_s"] is None  # without it, the same classifier discovers


def test_adapting_leaves_out_the_words_unless_asked(monkeypatch):
    # the training itself stubbed (the toy has no backbone): which words_weight reaches it and the clustering
    from dyntc.classifier.live_head import directions
    from tests.classifier.test_discovery import MUSIC, TRANSLATE

    clf = toy_classifier(head=None)
    seen = []

    def fake_adapt(clf_, texts, support_texts, support_y, n_clusters, budget_s, seed, shrink, words_weight=0.0):
        seen.append(words_weight)
        return dt.Adapted(texts=directions(clf_.space_, clf_.space_.embed(texts)),
                          support=directions(clf_.space_, clf_.space_.embed(support_texts)),
                          steps=0, train_seconds=0.0, seconds=0.0)

    monkeypatch.setattr(dt, "check_adaptable", lambda clf_: None)
    monkeypatch.setattr(dt, "adapt", fake_adapt)
    texts = MUSIC + TRANSLATE
    assert clf.discover(texts, 2, adapt_s=5).settings["words_weight"] == 0 and seen == [0]
    assert clf.discover(texts, 2, adapt_s=5, words_weight=0.3).settings["words_weight"] == 0.3 and seen[-1] == 0.3
    assert clf.discover(texts, 2).settings["words_weight"] > 0 and len(seen) == 2  # no adapting: the words, no call


KNOWN = ["alarm", "balance", "timer", "weather"]
NEW = ["book_hotel", "translate"]


@pytest.mark.data
def test_minilm_adapted_discovery_finds_the_new_intents_and_leaves_the_classifier_alone(clinc_intents, monkeypatch):
    pytest.importorskip("sentence_transformers")
    # a fixed number of steps, so that the outcome does not depend on the machine's speed
    monkeypatch.setattr(dt, "train", functools.partial(dt.train, max_steps=8))
    from sklearn.metrics import normalized_mutual_info_score

    clf = DynamicClassifier(head=None).fit([t for y in KNOWN for t in clinc_intents[y][:8]],
                                           [y for y in KNOWN for _ in range(8)])
    texts = [t for y in KNOWN + NEW for t in clinc_intents[y][8:48]]
    truth = [y for y in KNOWN + NEW for _ in range(40)]
    before = clf.encode(texts[:5])
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    found = clf.discover(texts, 2, adapt_s=120, seed=0)
    assert torch.equal(torch.rand(3), expected)  # seeded inside, the caller's random stream left where it was
    assert found.settings["adapt_s"] == 120 and found.settings["adapt_steps"] == 8
    assert found.settings["words_weight"] == 0  # the adapted backbone without the words, by default
    np.testing.assert_array_equal(clf.encode(texts[:5]), before)  # the served backbone was not touched
    # 8 steps on 240 texts: the new intents stay apart from the known ones
    new_clusters = []
    for c in found.clusters:
        members = [truth[texts.index(t)] for t in c.texts]
        top = max(set(members), key=members.count)
        if top in NEW:
            assert members.count(top) >= 0.9 * len(members), (c.name, members)
            new_clusters.append(top)
    assert sorted(set(new_clusters)) == NEW
    assert normalized_mutual_info_score(truth, [str(a) for a in found.assignments]) > 0.85
