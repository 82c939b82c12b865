"""The cosine head (classifier/head.py): hand-computed scores, the product's prototype score, imprinting,
refresh in three steps, persistence, bad parameters."""

import math

import numpy as np
import pytest
import torch

from dyntc import DyntcError
from dyntc.classifier.head import (
    CosineHead, HeadConfig, Reference, combined_scores, cosine_logits, imprint_offsets, normalize, pooled_spread,
    prototype_scores, prototypes, reference, train,
)


# ------------------------------------------------------------------------------- pure functions


def test_prototypes_and_pooled_spread_by_hand():
    x = np.array([[1, 0], [0, 1], [1, 0]], dtype=np.float32)
    means, counts, spread = prototypes(x, np.array([0, 0, 1]), 2)
    np.testing.assert_allclose(means, [[0.5, 0.5], [1, 0]])
    np.testing.assert_allclose(counts, [2, 1])
    assert spread == pytest.approx(1.0)  # 0.25 + 0.25 for each of label 0's two points, 0 for label 1
    assert pooled_spread(spread, counts) == pytest.approx(1.0)  # 1 / (3 - 2)
    assert pooled_spread(0.0, np.array([1.0, 1.0])) == 0.0  # no degrees of freedom


def test_combined_scores_by_hand():
    # x = e1; weights e1, e2; scale 2 -> cosines (1, 0) -> logits (2, 0)
    x = np.array([[1.0, 0.0]], dtype=np.float32)
    w = np.array([[3.0, 0.0], [0.0, 1.0]], dtype=np.float32)  # not unit: the cosine ignores the norm
    np.testing.assert_allclose(cosine_logits(x, w, 2.0), [[2.0, 0.0]])
    # prototypes e1 (n=2), e2 (n=1), sigma^2 = 0.5: d^2 = (0, 2), corrections (0.25, 0.5) -> (0.25, -1.5)
    means = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    counts = np.array([2.0, 1.0])
    np.testing.assert_allclose(prototype_scores(x, means, counts, 0.5), [[0.25, -1.5]], atol=1e-6)
    np.testing.assert_allclose(prototype_scores(x, means, counts, 0.5, debias=False), [[0.0, -2.0]], atol=1e-6)
    # proto_weight 0.5, proto_scale 4: + 2 * (0.25, -1.5) = (0.5, -3); offsets (0, 0.25) take 2 * 0.25 from b
    config = HeadConfig(scale=2.0, proto_weight=0.5, proto_scale=4.0)
    out = combined_scores(x, w, 2.0, means, counts, 0.5, config)
    np.testing.assert_allclose(out, [[2.5, -3.0]], atol=1e-6)
    out = combined_scores(x, w, 2.0, means, counts, 0.5, config, offsets=np.array([0.0, 0.25], dtype=np.float32))
    np.testing.assert_allclose(out, [[2.5, -3.5]], atol=1e-6)


class _EuclideanSpace:
    """The two methods of MetricSpace a LabelSet needs, Euclidean, without an encoder."""

    def means(self, groups):
        return torch.stack([g.mean(0) for g in groups])

    def sq_distances(self, points, protos):
        return torch.cdist(points, protos) ** 2


def test_prototype_score_is_the_label_sets_debiased_distance():
    from dyntc.classifier.labels import LabelSet

    rng = np.random.default_rng(0)
    sizes = {"a": 7, "b": 2, "c": 30}
    support = {c: normalize(rng.normal(size=(n, 8))).astype(np.float32) for c, n in sizes.items()}
    groups = {c: ([f"{c}{i}" for i in range(len(p))], torch.as_tensor(p)) for c, p in support.items()}
    label_set = LabelSet.from_groups(_EuclideanSpace(), groups, debias=True)
    queries = normalize(rng.normal(size=(5, 8))).astype(np.float32)
    expected = -label_set.sq_distances(torch.as_tensor(queries)).numpy()
    x = np.concatenate(list(support.values()))
    y = np.repeat(np.arange(3), list(sizes.values()))
    means, counts, spread = prototypes(x, y, 3)
    assert pooled_spread(spread, counts) == pytest.approx(label_set.pooled_spread(), rel=1e-5)
    np.testing.assert_allclose(prototype_scores(queries, means, counts, pooled_spread(spread, counts)), expected, atol=1e-5)


def test_imprint_offsets_by_hand():
    # reference: 4 examples of "a" and "b" on the unit circle, best trained cosines given
    x = np.array([[1, 0], [0.8, 0.6], [0.6, 0.8], [0, 1]], dtype=np.float32)
    ref = Reference(x, np.array([0.9, 0.9, 0.5, 0.95], dtype=np.float32), np.array(["a", "a", "b", "b"]))
    anchor = np.array([[1.0, 0.0]], dtype=np.float32)  # cosines 1, 0.8, 0.6, 0 -> excess 0.1, -0.1, 0.1, -0.95
    assert imprint_offsets(anchor, "new", ref, 0.05, share=0.0)[0] == pytest.approx(0.1)  # takes none
    # it takes x when its excess is above the offset: at most `allowed` of them -> the (allowed + 1)-th largest
    assert imprint_offsets(anchor, "new", ref, -1.0, share=0.25)[0] == pytest.approx(0.1)  # 1 of 4: a tie, none
    assert imprint_offsets(anchor, "new", ref, -1.0, share=0.5)[0] == pytest.approx(-0.1)  # 2 of 4
    assert imprint_offsets(anchor, "new", ref, -1.0, share=0.75)[0] == pytest.approx(-0.95)  # 3 of 4
    assert imprint_offsets(anchor, "new", ref, 0.05, share=0.75)[0] == pytest.approx(0.05)  # never below the base
    assert imprint_offsets(anchor, "new", ref, 0.05, share=1.0)[0] == pytest.approx(0.05)  # 1: the base alone
    assert imprint_offsets(anchor, "new", None, 0.05, share=0.0)[0] == pytest.approx(0.05)  # no refresh yet
    # its own examples (label "b" given new examples) do not count: excess 0.1, -0.1 of "a"
    assert imprint_offsets(anchor, "b", ref, -1.0, share=0.0)[0] == pytest.approx(0.1)
    assert imprint_offsets(anchor, "b", ref, -1.0, share=0.5)[0] == pytest.approx(-0.1)
    # two parts: one offset each
    two = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)  # second: excess -0.9, -0.3, 0.3, 0.05
    np.testing.assert_allclose(imprint_offsets(two, "new", ref, 0.0, share=0.0), [0.1, 0.3], atol=1e-6)
    # the reference: unit rows, best trained cosine, a fixed subset past REFERENCE_ROWS
    r = reference(np.array([[2.0, 0.0], [0.0, 3.0]]), np.array([0, 1]), np.array([[1.0, 0.0], [0.6, 0.8]]))
    np.testing.assert_allclose(r.x, [[1, 0], [0, 1]])
    np.testing.assert_allclose(r.top, [1.0, 0.8])


def _siblings(seed, n_old=40, n_new=20, dim=48, per_old=60, shots=5, held_out=30, noise=0.8):
    """A fine-grained label set: every new label a close sibling of an old one (centres at cosine 0.9),
    all of them sharing one direction (as sentence embeddings do), spreads varying by label."""
    rng = np.random.default_rng(seed)
    common = normalize(rng.normal(size=(1, dim)))
    old = normalize(rng.normal(size=(n_old, dim)))
    new = normalize(0.9 * old[rng.integers(0, n_old, n_new)] + math.sqrt(1 - 0.9**2) * normalize(rng.normal(size=(n_new, dim))))
    centres = normalize(np.concatenate([old, new]) + common)
    spread = rng.uniform(0.5, 1.5, size=len(centres)) * noise / math.sqrt(dim)

    def draw(c, k):
        return normalize(centres[c] + spread[c] * rng.normal(size=(k, dim))).astype(np.float32)

    train_ = {c: draw(c, per_old if c < n_old else shots) for c in range(n_old + n_new)}
    test = {c: draw(c, held_out) for c in range(n_old + n_new)}
    return n_old, train_, test


@pytest.mark.parametrize("seed", [0, 1])
def test_right_after_a_bulk_add_of_siblings_old_labels_lose_less(seed):
    """A third of the labels added at once (5 examples each), each next to an established one: with the
    base offset alone (imprint_share=1) the established labels lose over 4 points against the refreshed
    head right after the adds; the offsets of imprint_offsets halve that loss or better, and the new
    labels are served as well as after the refresh."""
    n_old, train_, test = _siblings(seed)
    x = np.concatenate(list(test.values()))
    y = np.repeat(list(test), [len(v) for v in test.values()])
    old = y < n_old

    def accuracy(config):
        head = CosineHead(config)
        for c in range(n_old):
            head.add_label(f"{c:03d}", train_[c])
        head.refresh()
        for c in range(n_old, len(train_)):
            head.add_label(f"{c:03d}", train_[c])
        out = []
        for _ in ("now", "refreshed"):
            hit = np.array([int(p) for p in head.predict(x)]) == y
            out.append((100 * hit[old].mean(), 100 * hit[~old].mean()))
            head.refresh()
        return out

    (old_now, new_now), (old_refreshed, new_refreshed) = accuracy(HeadConfig())
    (base_old_now, _), (base_old_refreshed, _) = accuracy(HeadConfig(imprint_share=1.0))
    assert base_old_refreshed == old_refreshed and base_old_refreshed - base_old_now > 4.0  # the dip
    assert old_refreshed - old_now <= (base_old_refreshed - base_old_now) / 2
    assert new_now >= new_refreshed - 2.0


# ------------------------------------------------------------------------------- the stateful head


def _clusters(seed=0, dim=16, labels=("a", "b", "c"), n=(40, 40, 5), spread=0.6):
    rng = np.random.default_rng(seed)
    centres = normalize(rng.normal(size=(len(labels), dim)))
    data = {c: normalize(centres[i] + spread * rng.normal(size=(k, dim)) / math.sqrt(dim)).astype(np.float32)
            for i, (c, k) in enumerate(zip(labels, n))}
    return centres.astype(np.float32), data


def test_imprinted_labels_score_by_their_normalised_prototype_at_once():
    _, data = _clusters()
    head = CosineHead(HeadConfig(scale=10.0))
    for c, p in data.items():
        head.add_label(c, p)
    assert head.stale == {"a", "b", "c"}
    x = data["c"][:3]
    means = np.stack([data[c].mean(0) for c in "abc"])
    np.testing.assert_allclose(head.scores(x), 10.0 * normalize(x) @ normalize(means).T, atol=1e-5)


def test_refresh_trains_every_label_and_a_new_label_is_imprinted_with_the_offset():
    centres, data = _clusters()
    head = CosineHead(HeadConfig(scale=10.0, imprint_offset=0.5))
    for c in "ab":
        head.add_label(c, data[c])
    info = head.refresh()
    assert info["examples"] == 80 and head.stale == set()
    assert head.imprint_offset > 0  # training moved the weights off the prototypes
    head.add_label("c", data["c"])
    assert head.stale == {"c"}
    scores = head.scores(data["c"])
    cos_c = normalize(data["c"]) @ normalize(data["c"].mean(0, keepdims=True)).T
    np.testing.assert_allclose(scores[:, 2:], 10.0 * (cos_c - head.imprint_offset), atol=1e-5)
    head.refresh()
    assert head.stale == set()
    assert (np.array(head.predict(data["c"])) == "c").mean() >= 0.8  # the 5-example label is not starved


def test_a_label_changed_during_a_background_refresh_stays_imprinted():
    _, data = _clusters()
    head = CosineHead()
    for c, p in data.items():
        head.add_label(c, p)
    snap = head.snapshot()
    trained = train(snap, head.config)  # what a background thread runs
    head.add_examples("c", data["c"][:2])  # meanwhile
    head.remove_label("b")
    left = head.install(trained)
    assert left == ["c"] and head.classes == ["a", "c"]
    assert head.counts() == {"a": 40, "c": 7}


def test_state_dict_round_trip():
    _, data = _clusters()
    head = CosineHead()
    for c, p in data.items():
        head.add_label(c, p)
    head.refresh()
    head.add_label("d", data["a"][:3] + 0.1)
    state = head.state_dict()
    other = CosineHead()
    for c, p in data.items():
        other.add_label(c, p)
    other.add_label("d", data["a"][:3] + 0.1)
    other.load_state_dict(state)
    q = np.concatenate(list(data.values()))
    np.testing.assert_allclose(other.scores(q), head.scores(q), atol=1e-6)
    assert other.stale == {"d"}


# ------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, message", [
    ({"scale": 0}, "scale must be a positive number"),
    ({"scale": float("nan")}, "scale must be a positive number"),
    ({"tau": -1}, "tau must be a number >= 0"),
    ({"pull": True}, "pull must be a number >= 0"),
    ({"imprint_offset": -0.5}, "imprint_offset must be a number >= 0"),
    ({"imprint_share": 1.5}, r"imprint_share must be a number in \[0, 1\]"),
    ({"max_iter": 2.5}, "max_iter must be an integer >= 0"),
    ({"learn_scale": 1}, "learn_scale must be True or False"),
])
def test_bad_config_is_a_clear_error(kwargs, message):
    with pytest.raises(DyntcError, match=message):
        HeadConfig(**kwargs)


def test_bad_label_operations_are_clear_errors():
    head = CosineHead()
    with pytest.raises(DyntcError, match="config must be a HeadConfig"):
        CosineHead({"scale": 2})
    with pytest.raises(DyntcError, match="no labels"):
        head.scores(np.zeros((1, 4), np.float32))
    head.add_label("a", np.eye(4, dtype=np.float32)[:2])
    with pytest.raises(DyntcError, match="exists already"):
        head.add_label("a", np.eye(4, dtype=np.float32))
    with pytest.raises(DyntcError, match="at least one example"):
        head.add_label("b", np.zeros((0, 4), np.float32))
    with pytest.raises(DyntcError, match=r"finite \(n, dim\) array"):
        head.add_label("b", np.array([[np.nan, 0, 0, 0]]))
    with pytest.raises(DyntcError, match="non-empty label name"):
        head.add_label(" ", np.eye(4, dtype=np.float32))
    with pytest.raises(DyntcError, match="does not exist"):
        head.remove_label("zzz")
    with pytest.raises(DyntcError, match="at least two labels"):
        head.refresh()
    with pytest.raises(DyntcError, match="stored head is damaged"):
        head.load_state_dict({"weights": {}})
