"""Discovery, accept and suggestions on the hashing-encoder toy (tests/_toy.py): known answers, one
version per accept, every bad input's error."""

import numpy as np
import pytest

from dyntc import DynamicClassifier
from dyntc.classifier.discovery import Discovery
from dyntc.errors import DyntcError
from tests._toy import LABELS, TEXTS, toy_classifier

MUSIC = ["play music song jazz", "play music song rock", "play music song playlist", "play music song loud",
         "play music song queen", "play music song beatles"]
TRANSLATE = ["translate word french language", "translate word spanish language", "translate word german language",
             "translate word italian language", "translate word japanese language", "translate word dutch language"]
KNOWN = {"alarm": "set an alarm to wake me up at six", "balance": "what is the balance of my account",
         "timer": "start a timer for ten minutes", "weather": "what is the weather forecast for tomorrow"}


@pytest.fixture(scope="module")
def clf():
    return toy_classifier()


def _texts():
    return MUSIC + TRANSLATE + list(KNOWN.values())


def test_two_new_groups_found_and_known_texts_placed(clf):
    found = clf.discover(_texts(), n_new=2)
    assert isinstance(found, Discovery) and not found.estimated and found.n_new == 2
    groups = sorted((sorted(c.texts) for c in found.clusters), key=len)
    assert sorted(groups) == sorted([sorted(MUSIC), sorted(TRANSLATE)])
    names = {c.name for c in found.clusters}
    assert any("music" in n or "song" in n for n in names) and any("translate" in n or "word" in n for n in names)
    assert found.assignments[-4:] == list(KNOWN)  # in input order: each known text in its own label
    for c in found.clusters:
        assert c.size == len(c.texts) == 6 and 0 < c.cohesion <= 1
        assert c.nearest_label in LABELS and c.nearest_distance > 0
        assert c.central_texts[0] in c.texts
    assert found.counts() == {"known": 4, "new": 12, "noise": 0}
    d = found.to_dict()
    assert d["counts"]["new"] == 12 and len(d["assignments"]) == 16  # JSON-able
    import json

    json.dumps(d)


def test_estimated_number_of_new_clusters(clf):
    found = clf.discover(_texts())
    assert found.estimated and found.overclustered_sizes
    assert 1 <= found.n_new <= found.settings["max_new"]
    # whatever the estimate, the clusters kept hold only texts of one group each
    for c in found.clusters:
        assert set(c.texts) <= set(MUSIC) or set(c.texts) <= set(TRANSLATE)


def test_accept_is_one_version_and_survives_reload(tmp_path):
    clf = toy_classifier(head=None)
    path = tmp_path / "model"
    clf.save(path)
    before = DynamicClassifier.versions(path)
    with DynamicClassifier.edit(path) as editing:
        found = editing.discover(_texts(), n_new=2)
        editing.accept(found)
    after = DynamicClassifier.versions(path)
    assert len(after) == len(before) + 1
    loaded = DynamicClassifier.load(path)
    new = {c.name for c in found.clusters}
    assert new <= set(loaded.classes_) and len(loaded.classes_) == len(LABELS) + 2
    for c in found.clusters:
        assert sorted(loaded.support(c.name)) == sorted(c.texts)
    assert loaded.predict(["play music song jazz"])[0] in new


def test_accept_a_chosen_cluster_and_add_examples():
    clf = toy_classifier(head=None)
    found = clf.discover(_texts(), n_new=2)
    first = found.clusters[0].name
    clf.accept(found, [first], add_examples=True)
    assert first in clf.classes_ and found.clusters[1].name not in clf.classes_
    assert KNOWN["alarm"] in clf.support("alarm")


def test_stale_discovery_is_refused():
    clf = toy_classifier(head=None)
    found = clf.discover(_texts(), n_new=2)
    clf.remove_label("timer")
    with pytest.raises(DyntcError, match="stale.*removed: \\['timer'\\].*discover\\(\\) again"):
        clf.accept(found)
    other = toy_classifier(head=None)
    other.accept(found)  # a discovery made on the same label set applies to another classifier
    with pytest.raises(DyntcError, match="stale"):  # ... once: its names now exist
        other.accept(found)


def test_names_made_unique(clf):
    found = clf.discover(_texts(), n_new=2)
    name = found.clusters[0].name
    other = toy_classifier(head=None)
    other.add_label(name, ["some text"])
    found2 = other.discover(_texts(), n_new=2)
    assert all(c.name not in other.classes_ for c in found2.clusters)
    assert len({c.name for c in found2.clusters}) == 2
    assert f"{name}_2" in {c.name for c in found2.clusters}  # the same cluster found again, its name made unique


@pytest.mark.parametrize("texts, n_new, match", [
    (["play music"] * 2, None, "repeats texts\\[0\\]"),
    (["play music", "  "], None, "empty"),
    (["a b", "c d", "e f"], None, "at least 6 texts"),
    ("play music", None, "list of texts"),
    (MUSIC + TRANSLATE, 0, "n_new must be an integer between 1 and 4"),
    (MUSIC + TRANSLATE, 5, "n_new must be an integer between 1 and 4"),
    (MUSIC + TRANSLATE, 1.5, "n_new must be an integer"),
])
def test_bad_input(clf, texts, n_new, match, monkeypatch):
    # refused before a text is embedded (with adapt_s, embedding and training take minutes)
    monkeypatch.setattr(type(clf.space_), "embed", lambda *args: pytest.fail("embedded before the checks"))
    with pytest.raises(DyntcError, match=match):
        clf.discover(texts, n_new)


def test_bad_options(clf):
    with pytest.raises(DyntcError, match="mode must be one of default, fast"):
        clf.discover(_texts(), mode="slow")
    with pytest.raises(DyntcError, match="max_new must be an integer between 1"):
        clf.discover(_texts(), max_new=0)
    with pytest.raises(DyntcError, match="min_cluster_size must be an integer >= 1"):
        clf.discover(_texts(), min_cluster_size=0)
    for weight in (-0.1, 10.5, float("nan"), "0.3", True, None):
        with pytest.raises(DyntcError, match="words_weight must be a number from 0"):
            clf.discover(_texts(), words_weight=weight)
    found = clf.discover(_texts(), n_new=2)
    with pytest.raises(DyntcError, match="no cluster named 'nope'"):
        clf.copy().accept(found, ["nope"])
    with pytest.raises(DyntcError, match="position 7 is out of range"):
        clf.copy().accept(found, [7])
    with pytest.raises(DyntcError, match="the Discovery returned by discover"):
        clf.copy().accept({"clusters": []})


def test_lexical_vectors_of_two_vocabularies():
    from dyntc.classifier import clustering as cl

    x = cl.lexical(MUSIC[:3] + TRANSLATE[:3])
    assert x.shape[0] == 6 and np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-5)
    sims = x @ x.T
    assert sims[:3, :3].min() > 0.9 and sims[3:, 3:].min() > 0.9 and np.abs(sims[:3, 3:]).max() < 0.1
    assert cl.lexical(["alpha beta", "gamma delta"]) is None  # no word in two texts
    assert cl.lexical(["alpha beta", "alpha delta"]) is None  # one word: no direction besides it


def test_joined_cosine_is_the_weighted_mix():
    from dyntc.classifier import clustering as cl

    rng = np.random.default_rng(0)
    p, w = cl.unit(rng.normal(size=(5, 8))), cl.unit(rng.normal(size=(5, 3)))
    j = cl.joined(p, w, 0.3)
    assert np.allclose(j @ j.T, (p @ p.T + 0.09 * (w @ w.T)) / 1.09, atol=1e-6)


def test_words_separate_texts_the_encoder_cannot(clf, monkeypatch):
    # an encoder blind to the new texts (every one at the same point): only their words tell the two groups apart
    same = clf.space_.embed(MUSIC[:1])
    monkeypatch.setattr(type(clf.space_), "embed", lambda self, texts, *args: same.repeat(len(texts), 1))
    texts = MUSIC + TRANSLATE
    found = clf.discover(texts, n_new=2)
    assert sorted(sorted(c.texts) for c in found.clusters) == sorted([sorted(MUSIC), sorted(TRANSLATE)])
    blind = clf.discover(texts, n_new=2, words_weight=0)
    assert blind.settings["words_weight"] == 0 and max(c.size for c in blind.clusters) == 12


def test_fast_mode_same_answer_on_the_toy(clf):
    found = clf.discover(_texts(), n_new=2, mode="fast")
    assert sorted(sorted(c.texts) for c in found.clusters) == sorted([sorted(MUSIC), sorted(TRANSLATE)])


# ------------------------------------------------------------------------------------------- suggestions


FORECAST = ["weather rain forecast today", "weather rain forecast tomorrow", "weather rain forecast weekend",
            "weather rain forecast monday", "weather rain forecast tonight", "weather rain forecast friday"]


def test_suggestions_find_a_planted_merge_and_split():
    # one intent under two names (a merge should be suggested), two intents under one (a split should)
    groups = {"alarm": TEXTS["alarm"], "balance": TEXTS["balance"], "music_a": MUSIC[0::2], "music_b": MUSIC[1::2],
              "mixed": TRANSLATE + FORECAST}
    clf = DynamicClassifier(encoder="hashing", head=None).fit(
        [t for g in groups.values() for t in g], [name for name, g in groups.items() for _ in g])
    found = clf.suggest(split_ratio=1.0)  # hashed words: every group is far from every other
    # the planted pair and the planted mixture rank first (hashed words make any toy label look a little
    # split: it may follow them, below)
    assert sorted((s.kind, sorted(s.labels)) for s in found[:2]) == [("merge", ["music_a", "music_b"]),
                                                                     ("split", ["mixed"])]
    assert not any(s.kind == "merge" for s in found[2:])
    split = next(s for s in found if s.kind == "split")
    assert sorted(map(sorted, split.parts.values())) == sorted([sorted(TRANSLATE), sorted(FORECAST)])
    assert all(name.startswith("mixed_") for name in split.parts)
    assert split.evidence["part_sizes"] == [6, 6] and split.evidence["ratio"] >= 1.0
    merge = next(s for s in found if s.kind == "merge")
    assert merge.score >= 1 and merge.evidence["n_a"] == merge.evidence["n_b"] == 3
    assert merge.evidence["rate"] == (merge.evidence["a_to_b"] + merge.evidence["b_to_a"]) / 6 >= 0.3
    assert [s.score for s in found] == sorted((s.score for s in found), reverse=True)
    import json

    json.dumps([s.to_dict() for s in found])
    assert clf.suggest(split_ratio=1.0, top=1) == found[:1]


def test_untouched_toy_gets_no_merge():
    assert not [s for s in toy_classifier(head=None).suggest() if s.kind == "merge"]


def test_suggest_bad_options():
    clf = toy_classifier(head=None)
    with pytest.raises(DyntcError, match="merge_rate must be a number in \\(0, 1.0\\]"):
        clf.suggest(merge_rate=2)
    with pytest.raises(DyntcError, match="top must be None or an integer >= 1"):
        clf.suggest(top=0)


def _blobs(n_known: int, n_new: int, per_known: int, per_new: int, noise: int, seed: int = 0):
    """Unit vectors around n_known + n_new random directions in 32 dimensions (tight, well apart): the
    unlabelled points (per_known of each known direction, per_new of each new one, and `noise` points
    in random directions, as real traffic has texts of no intent) and 5 labelled ones per known
    direction."""
    from dyntc.classifier import clustering as cl

    rng = np.random.default_rng(seed)
    centres = cl.unit(rng.normal(size=(n_known + n_new, 32)))
    draw = lambda c, n: cl.unit(centres[c] + 0.05 * rng.normal(size=(n, 32)))  # noqa: E731
    points = np.concatenate([draw(c, per_known) for c in range(n_known)]
                            + [draw(n_known + c, per_new) for c in range(n_new)]
                            + [cl.unit(rng.normal(size=(noise, 32)))])
    known = np.concatenate([draw(c, 5) for c in range(n_known)])
    return points, known, np.repeat(np.arange(n_known), 5)


@pytest.mark.parametrize("n_known, n_new", [(12, 4), (8, 8), (4, 12), (30, 3)])
def test_the_estimated_number_of_new_clusters_on_known_blobs(n_known, n_new):
    """A sample of all traffic: known and new intents of about one size, some texts of no intent; few
    new among many known, as many, three times as many (the over-clustering's bound is doubled): the
    estimate is the number of new directions."""
    from dyntc.classifier.clustering import estimate_new

    points, known, known_y = _blobs(n_known, n_new, per_known=30, per_new=30, noise=10 * (n_known + n_new))
    estimate, sizes = estimate_new(points, known, known_y, n_known, max_new=4 * max(n_known, 10))
    assert estimate == n_new
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) <= len(points)


def test_seeding_puts_one_new_centroid_in_each_far_group():
    """Greedy k-means++ among three tight groups of unit points, one already holding a centroid: the
    two new centroids land in the two other groups, for every seed."""
    from dyntc.classifier.clustering import _plus_plus, unit

    for seed in range(10):
        rng = np.random.default_rng(seed)
        axes = np.eye(3, dtype=np.float32)
        points = unit(np.concatenate([axes[i] + 0.01 * rng.normal(size=(20, 3)) for i in range(3)]))
        new = _plus_plus(points, axes[:1], 2, rng)
        assert new.shape == (2, 3) and sorted(int(np.argmax(c)) for c in new) == [1, 2]
        assert _plus_plus(points, axes[:0], 3, rng).shape == (3, 3)  # none chosen before


def test_seeding_passes_over_a_stray_text():
    """A known centroid, a group of 20 texts and one stray text opposite the centroid (the farthest
    point): the new centroid goes to the group for every seed (a single candidate drawn by the squared
    distance, or by its square as discover once did, took the stray text for 2 and 5 of these 20 seeds)."""
    from dyntc.classifier.clustering import _plus_plus, unit

    axes = np.eye(3, dtype=np.float32)
    group = unit(axes[1] + 0.05 * np.random.default_rng(123).normal(size=(20, 3)))
    points = np.concatenate([group, -axes[:1]]).astype(np.float32)
    for seed in range(20):
        new = _plus_plus(points, axes[:1], 1, np.random.default_rng(seed))
        assert float(new[0] @ axes[1]) > 0.9


def test_swap_estimates_equal_the_objective_change_by_hand():
    """With the centroids held, the gain of adding a candidate and the loss of removing a new centroid
    are the summed nearest cosines after minus before, computed by brute force."""
    from dyntc.classifier.clustering import swap_estimates, unit

    rng = np.random.default_rng(0)
    points, centroids, candidates = (unit(rng.normal(size=(n, 5))) for n in (40, 5, 4))
    n_known = 2
    gain, loss = swap_estimates(points, centroids, n_known, candidates)
    total = float((points @ centroids.T).max(1).sum())
    for i, c in enumerate(candidates):
        added = np.concatenate([centroids, c[None]])
        assert gain[i] == pytest.approx(float((points @ added.T).max(1).sum()) - total, abs=1e-4)
    for j in range(len(centroids) - n_known):
        removed = np.delete(centroids, n_known + j, axis=0)
        assert loss[j] == pytest.approx(total - float((points @ removed.T).max(1).sum()), abs=1e-4)


def test_swap_search_frees_a_new_group_inside_a_known_label():
    """A known label on axis 0 holding its texts and, at 60 degrees, a new group no centroid was seeded
    near; two new centroids split one tight group on axis 2. Lloyd's iterations keep that state; the
    swap search moves one of the two into the new group and lets the other hold the whole tight group."""
    from dyntc.classifier.clustering import lloyd, swap_search, unit

    rng = np.random.default_rng(0)
    axes = np.eye(3, dtype=np.float32)
    new_group = unit(np.array([[0.5, np.sqrt(0.75), 0.0]], np.float32))[0]

    def group(centre, n):
        return unit(centre + 0.03 * rng.normal(size=(n, 3)))

    points = np.concatenate([group(axes[0], 20), group(new_group, 20), group(axes[2], 20)]).astype(np.float32)
    known, known_y = group(axes[0], 5).astype(np.float32), np.zeros(5, np.int64)
    both = np.concatenate([points, known])
    start = unit(np.array([axes[0], axes[2] + 0.05 * axes[1], axes[2] - 0.05 * axes[1]], np.float32))
    stuck = lloyd(points, both, known_y, start)
    assert (stuck[0][20:40] == 0).all()  # the new group stays in the known label
    assign, centroids, objective = swap_search(points, both, known_y, 1, stuck, np.random.default_rng(1))
    assert objective > stuck[2]
    assert (assign[:20] == 0).all() and len(set(assign[20:40])) == 1 and len(set(assign[40:])) == 1
    assert len({0, int(assign[20]), int(assign[40])}) == 3
    assert float(centroids[assign[20]] @ new_group) > 0.99


def _label_with_new_group(rng, n_examples=8):
    """Unit points in 3-d: a known label on axis 0 (20 texts, `n_examples` examples drawn like them),
    a new group of 20 at 40 degrees from it, and a tight group of 20 on axis 2."""
    from dyntc.classifier.clustering import unit

    axes = np.eye(3, dtype=np.float32)
    new_group = unit(np.array([[np.cos(0.7), np.sin(0.7), 0.0]], np.float32))[0]

    def group(centre, n):
        return unit(centre + 0.05 * rng.normal(size=(n, 3))).astype(np.float32)

    points = np.concatenate([group(axes[0], 20), group(new_group, 20), group(axes[2], 20)])
    return points, group(axes[0], n_examples), np.zeros(n_examples, np.int64), new_group


def test_unsupported_parts_finds_a_new_group_the_label_examples_do_not_cover():
    """A known label's cluster holding its own 20 texts and a new group of 20: the far part holds none
    of the label's 8 examples (p = (28/48)^8 = 0.013 that a draw of 8 from the 48 points and examples
    misses a part of 20, under the level 0.05) and its centre is the new group's; the same label
    holding only its own texts has no such part."""
    from dyntc.classifier.clustering import unsupported_parts

    points, known, known_y, new_group = _label_with_new_group(np.random.default_rng(0))
    assign = np.array([0] * 40 + [1] * 20)
    parts = unsupported_parts(points, known, known_y, 1, assign, min_size=3)
    assert len(parts) == 1
    p, k, centre = parts[0]
    assert k == 0 and p == pytest.approx((28 / 48) ** 8) and float(centre @ new_group) > 0.99
    pure = np.array([0] * 20 + [1] * 40)
    assert unsupported_parts(points, known, known_y, 1, pure, min_size=3) == []


def test_split_search_moves_a_new_centroid_into_the_uncovered_part():
    """The new group left in the known label, two new centroids splitting the tight group on axis 2:
    the split search moves one of them into the new group, the objective rises, and each of the three
    groups ends in a cluster of its own, the known texts in the known label."""
    from dyntc.classifier.clustering import lloyd, split_search, unit

    points, known, known_y, new_group = _label_with_new_group(np.random.default_rng(0))
    both = np.concatenate([points, known])
    axes = np.eye(3, dtype=np.float32)
    start = unit(np.array([axes[0] + 0.3 * axes[1], axes[2] + 0.05 * axes[1], axes[2] - 0.05 * axes[1]], np.float32))
    stuck = lloyd(points, both, known_y, start)
    assert (stuck[0][:40] == 0).all()  # the new group stays in the known label
    assign, centroids, objective = split_search(points, both, known_y, 1, stuck, min_size=3)
    assert objective > stuck[2]
    assert (assign[:20] == 0).all() and len(set(assign[20:40])) == 1 and len(set(assign[40:])) == 1
    assert len({0, int(assign[20]), int(assign[40])}) == 3
    assert float(centroids[assign[20]] @ new_group) > 0.99


def test_split_search_leaves_a_clustering_whose_known_labels_are_covered():
    """Every known label's cluster covered by its examples: nothing to try, the result comes back as it was."""
    from dyntc.classifier.clustering import lloyd, split_search, unit, unsupported_parts

    points, known, known_y, new_group = _label_with_new_group(np.random.default_rng(0))
    both = np.concatenate([points, known])
    right = lloyd(points, both, known_y, unit(np.array([[1, 0, 0], new_group, [0, 0, 1]], np.float32)))
    assert (right[0][:20] == 0).all() and unsupported_parts(points, known, known_y, 1, right[0], min_size=3) == []
    assign, centroids, objective = split_search(points, both, known_y, 1, right, min_size=3)
    assert np.array_equal(assign, right[0]) and objective == right[2]
