"""Dynamic label splits: flat removal, hierarchical collapse, determinism, disjointness, no leakage."""

import numpy as np
import pytest

from dyntc.protocol.data.dynamic import choose_collapsed, halve, make_split, make_splits
from dyntc.protocol.data.hierarchy import LabelTree
from dyntc.protocol.data.types import Dataset, Split
from dyntc.errors import DyntcError

NEWS_PATHS = [
    ("COMPUTER", "GRAPHICS"), ("COMPUTER", "WINDOWS", "WINDOWSX"), ("COMPUTER", "WINDOWS", "WINDOWSOS"),
    ("COMPUTER", "HARDWARE", "PC"), ("COMPUTER", "HARDWARE", "MAC"),
    ("RECREATIONAL", "VEHICLES", "AUTOS"), ("RECREATIONAL", "VEHICLES", "MOTORCYCLES"),
    ("RECREATIONAL", "SPORTS", "BASEBALL"), ("RECREATIONAL", "SPORTS", "HOCKEY"),
    ("SCIENCE", "CRYPT"), ("SCIENCE", "ELECTRONICS"), ("SCIENCE", "MED"), ("SCIENCE", "SPACE"),
    ("POLITICS", "GUNS"), ("POLITICS", "MIDEAST"), ("POLITICS", "POLITICSMISC"),
    ("RELIGION", "CHRISTIAN"), ("RELIGION", "ATHEISM"), ("RELIGION", "RELIGIONMISC"),
    ("FORSALE",),
]


def _split(labels, tag, per_class):
    texts, ys = [], []
    for y in labels:
        for i in range(per_class):
            texts.append(f"{tag} {y} {i}")
            ys.append(y)
    return Split(texts, ys)


def synthetic(labels, tree=None, per_class=(21, 6, 7), name="synthetic"):
    return Dataset(name, _split(labels, "train", per_class[0]), _split(labels, "dev", per_class[1]),
                   _split(labels, "test", per_class[2]), tree)


@pytest.fixture(scope="module")
def flat():
    return synthetic([f"L{i}" for i in range(10)], name="flat")


@pytest.fixture(scope="module")
def news_like():
    tree = LabelTree.from_paths(NEWS_PATHS)
    return synthetic(tree.leaves, tree, name="tree")


def test_halve_is_stratified_disjoint_and_covering():
    labels = ["a"] * 11 + ["b"] * 4 + ["c"] * 1
    first, second = halve(labels, np.random.default_rng(0))
    assert set(first).isdisjoint(second)
    assert sorted(np.concatenate([first, second])) == list(range(len(labels)))
    for y, n in (("a", 11), ("b", 4)):
        in_first = sum(labels[i] == y for i in first)
        assert abs(in_first - n / 2) <= 0.5


@pytest.mark.parametrize("p, removed", [(0.3, 3), (0.1, 1), (0.04, 1), (0.5, 5), (0.95, 8)])
def test_flat_split_removes_round_p_labels(flat, p, removed):
    split = make_split(flat, seed=1, p=p)
    assert split.kind == "flat"
    assert len(split.removed) == removed
    assert split.new_classes == sorted(split.removed)
    assert split.old_labels == sorted(set(flat.labels) - set(split.removed))
    assert set(split.pretrain.labels) == set(split.old_labels)  # removed labels are gone from pretraining
    assert set(split.dev_old.labels) == set(split.old_labels)
    assert set(split.finetune_pool.labels) == set(flat.labels)  # fine-tuning pool keeps Y_new
    assert split.test.labels == flat.test.labels and split.dev_new.labels == flat.dev.labels


def test_new_classes_are_new_minus_old(flat, news_like):
    for data in (flat, news_like):
        split = make_split(data, seed=3)
        assert split.new_labels == data.labels
        assert split.new_classes == sorted(set(split.new_labels) - set(split.old_labels))
        assert split.new_classes


def test_hierarchy_collapse_reaches_p_and_maps_leaves_to_parents(news_like):
    tree = news_like.hierarchy
    for seed in range(10):
        split = make_split(news_like, seed=seed, p=0.3)
        assert split.kind == "hierarchical"
        collapsed_leaves = [leaf for leaves in split.collapsed.values() for leaf in leaves]
        assert len(collapsed_leaves) == len(set(collapsed_leaves))
        assert len(collapsed_leaves) >= 0.3 * len(tree.leaves)
        for node, leaves in split.collapsed.items():
            assert tree.children[node], f"{node} is not an inner node"
            assert leaves == tree.leaves_under(node)
            for leaf in leaves:
                assert split.old_label_of[leaf] == node
        # the relabelled pretraining pool: every example carries its leaf's old label
        by_text = dict(zip(news_like.train.texts, news_like.train.labels))
        for text, y_old in zip(split.pretrain.texts, split.pretrain.labels):
            assert y_old == split.old_label_of[by_text[text]]
        assert set(split.pretrain.labels) == set(split.old_labels)
        assert set(split.new_classes) == set(collapsed_leaves)  # leaves are never old labels once collapsed
        assert set(split.old_labels).isdisjoint(split.new_classes)


def test_collapse_keeps_two_old_labels_and_rejects_impossible_p():
    tree = LabelTree.from_paths([("A", "a1"), ("A", "a2"), ("B", "b1"), ("B", "b2")])
    rng = np.random.default_rng(0)
    collapsed = choose_collapsed(tree, tree.leaves, 0.5, rng)
    assert len(collapsed) == 1  # one of A, B: 2 of 4 leaves
    both = choose_collapsed(tree, tree.leaves, 0.9, np.random.default_rng(0))
    assert both == {"A": ["a1", "a2"], "B": ["b1", "b2"]}  # two old labels remain: allowed
    nested = LabelTree.from_paths([("X", "Y", "y1"), ("X", "Y", "y2"), ("X", "x1")])
    assert choose_collapsed(nested, nested.leaves, 0.5, np.random.default_rng(0)) == {"Y": ["y1", "y2"]}
    with pytest.raises(DyntcError, match="keep two old labels"):  # collapsing X would leave one label
        choose_collapsed(nested, nested.leaves, 0.9, np.random.default_rng(0))


def test_deterministic_by_seed_and_different_across_seeds(flat, news_like):
    for data in (flat, news_like):
        a, b = make_split(data, seed=7), make_split(data, seed=7)
        assert a.describe() == b.describe()
        assert a.pretrain.texts == b.pretrain.texts
        assert np.array_equal(a.finetune_indices(5)[0], b.finetune_indices(5)[0])
        others = make_splits(data, 6, base_seed=100)
        assert len({tuple(s.removed) if s.removed else tuple(s.collapsed) for s in others}) > 1
        assert len({tuple(s.pretrain_idx[:20]) for s in others}) > 1


def test_halves_disjoint_covering_and_no_test_leakage(flat, news_like):
    for data in (flat, news_like):
        split = make_split(data, seed=2)
        pool = set(split.finetune_idx.tolist())
        pre_all = set(split.pretrain_idx.tolist())
        assert pre_all.isdisjoint(pool)
        if split.kind == "hierarchical":  # nothing is dropped: the two halves cover the training split
            assert sorted(pre_all | pool) == list(range(len(data.train)))
        assert abs(len(split.finetune_pool) - len(data.train) / 2) <= len(data.labels) / 2
        test_texts = set(data.test.texts) | set(data.dev.texts)
        assert test_texts.isdisjoint(split.pretrain.texts)
        assert test_texts.isdisjoint(split.finetune_pool.texts)
        assert [data.train.texts[i] for i in split.pretrain_idx] == split.pretrain.texts
        assert [data.train.texts[i] for i in split.finetune_idx] == split.finetune_pool.texts


def test_flat_halves_cover_train_exactly(flat):
    split = make_split(flat, seed=4, p=0.3)
    # count the pretraining half before removal: removed labels' examples are the only ones missing
    kept = len(split.pretrain)
    removed_in_first_half = sum(
        1 for i in range(len(flat.train)) if i not in set(split.finetune_idx.tolist()) and flat.train.labels[i] in split.removed
    )
    assert kept + removed_in_first_half + len(split.finetune_pool) == len(flat.train)


def test_finetune_sample_is_nested_and_records_shortfall():
    labels = ["a", "b", "c", "d"]
    data = synthetic(labels, per_class=(30, 3, 3))
    # make class "d" small in the fine-tuning pool
    keep = [i for i, y in enumerate(data.train.labels) if y != "d" or data.train.texts[i].endswith((" 0", " 1", " 2", " 3", " 4", " 5"))]
    data = Dataset("small", data.train.subset(keep), data.dev, data.test)
    split = make_split(data, seed=0, p=0.3)
    five, short5 = split.finetune_indices(5)
    ten, short10 = split.finetune_indices(10)
    assert set(five) <= set(ten)
    assert short5 == {"d": 3} and short10 == {"d": 3}
    sample, _ = split.finetune_sample(10)
    assert sorted(sample.label_counts().items()) == [("a", 10), ("b", 10), ("c", 10), ("d", 3)]


@pytest.mark.parametrize("p", [0.0, 1.0, -0.2, 1.5, "x"])
def test_p_outside_unit_interval_is_rejected(flat, p):
    with pytest.raises(DyntcError, match="p"):
        make_split(flat, seed=0, p=p)


def test_flat_needs_three_labels_and_known_test_labels():
    with pytest.raises(DyntcError, match="at least 3 labels"):
        make_split(synthetic(["a", "b"]), seed=0)
    data = synthetic(["a", "b", "c"])
    bad = Dataset("bad", data.train, data.dev, Split(["x"], ["zzz"]))
    with pytest.raises(DyntcError, match="absent from its training set"):
        make_split(bad, seed=0)


@pytest.mark.data
def test_real_sent_and_news_splits(sent, data_dir):
    split = make_split(sent, seed=0)
    assert len(split.removed) == 3 and len(split.new_labels) == 10
    assert set(sent.test.texts).isdisjoint(split.pretrain.texts + split.finetune_pool.texts)
