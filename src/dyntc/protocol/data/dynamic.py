"""Dynamic label splits: simulate a label set that changes between pretraining and fine-tuning.

The paper's setup (Wohlwend et al. 2019, "Dynamic Setup"): the training data is split in half, a
pretraining pool and a fine-tuning pool. The pretraining pool is given an *old* label set
``Y_old`` with a fraction ``p`` of the labels taken away:

- flat label sets: ``round(p * L)`` labels (at least 1, at most ``L - 2``) are chosen uniformly at
  random and their examples are **removed** from the pretraining pool (new labels are brand new);
- hierarchical label sets: inner nodes of the label tree are chosen at random and **collapsed**:
  every leaf under a collapsed node is relabelled to that node in the pretraining pool, until at
  least ``p`` of the leaves are collapsed (new labels arise by splitting old ones).

The fine-tuning pool, dev set and test set keep the full label set ``Y_new`` (the leaves);
``new_classes = Y_new \\ Y_old``. The dev set relabelled to ``Y_old`` (``dev_old``; flat: removed
labels dropped) drives early stopping during pretraining. The test set is never touched by the split
(only its indices are kept), so nothing from it can leak into pretraining or fine-tuning.

Everything is a deterministic function of the dataset and ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dyntc.protocol.data.hierarchy import LabelTree
from dyntc.protocol.data.types import Dataset, Split
from dyntc.errors import DyntcError


@dataclass
class DynamicSplit:
    """One random dynamic label split of a dataset.

    Index arrays point into the dataset's original ``train`` / ``dev`` / ``test`` splits, so that
    featurized texts can be reused across splits without featurizing again.
    """

    dataset: str
    seed: int
    p: float
    kind: str  # "flat" (labels removed) or "hierarchical" (leaves collapsed into parents)
    pretrain: Split  # pretraining pool, labelled with Y_old
    finetune_pool: Split  # fine-tuning pool, labelled with Y_new
    dev_old: Split  # dev set on Y_old (pretraining early stopping)
    dev_new: Split  # dev set on Y_new (fine-tuning early stopping)
    test: Split  # test set on Y_new (untouched)
    old_labels: list[str]  # Y_old, sorted
    new_labels: list[str]  # Y_new, sorted (the leaves / the full flat label set)
    new_classes: list[str]  # Y_new \ Y_old, sorted
    old_label_of: dict[str, str | None]  # leaf -> its label in Y_old (None: removed, flat case)
    removed: list[str] = field(default_factory=list)  # flat: labels removed from the pretraining pool
    collapsed: dict[str, list[str]] = field(default_factory=dict)  # hierarchical: node -> leaves merged into it
    pretrain_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into dataset.train
    finetune_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into dataset.train
    dev_old_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into dataset.dev
    dev_new_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into dataset.dev
    test_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # into dataset.test
    _order: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # per-class shuffled pool positions

    def finetune_indices(self, n_fine: int) -> tuple[np.ndarray, dict[str, int]]:
        """Positions in ``finetune_pool`` of ``n_fine`` examples of every class of ``Y_new``.

        Samples are nested (the 10 examples of a class include its 5), which lowers the variance of
        comparisons across ``n_fine``. Classes with fewer than ``n_fine`` examples in the pool give all
        of them; they are returned as ``{label: available}`` (the *shortfall*).
        """
        if n_fine < 1:
            raise DyntcError(f"n_fine must be >= 1, got {n_fine}")
        chosen, short = [], {}
        for label in self.new_labels:
            order = self._order[label]
            if len(order) < n_fine:
                short[label] = len(order)
            chosen.append(order[:n_fine])
        return np.sort(np.concatenate(chosen)), short

    def finetune_sample(self, n_fine: int) -> tuple[Split, dict[str, int]]:
        """The ``n_fine``-per-class fine-tuning set (see :meth:`finetune_indices`)."""
        idx, short = self.finetune_indices(n_fine)
        return self.finetune_pool.subset(idx), short

    def describe(self) -> dict:
        """JSON-able summary: label sets, what was removed or collapsed, set sizes."""
        return {
            "seed": self.seed,
            "p": self.p,
            "kind": self.kind,
            "old_labels": self.old_labels,
            "new_labels": self.new_labels,
            "new_classes": self.new_classes,
            "removed": self.removed,
            "collapsed": self.collapsed,
            "fraction_new": len(self.new_classes) / len(self.new_labels),
            "sizes": {
                "pretrain": len(self.pretrain),
                "finetune_pool": len(self.finetune_pool),
                "dev_old": len(self.dev_old),
                "dev_new": len(self.dev_new),
                "test": len(self.test),
            },
            "finetune_pool_per_class": {y: len(self._order[y]) for y in self.new_labels},
        }


def check_fraction(p: float) -> float:
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise DyntcError(f"p must be a number in (0, 1), got {p!r}") from None
    if not 0.0 < p < 1.0:
        raise DyntcError(f"p (fraction of labels removed or collapsed) must be in (0, 1), got {p}")
    return p


def halve(labels: list[str], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified half split of positions ``0..len(labels)-1``: ``(first half, second half)``, sorted.

    Each class is shuffled and cut in two; an odd class gives its extra example to either half at
    random.
    """
    labels_arr = np.asarray(labels, dtype=object)
    first, second = [], []
    for label in sorted(set(labels)):
        members = rng.permutation(np.flatnonzero(labels_arr == label))
        cut = len(members) // 2 + (int(rng.integers(2)) if len(members) % 2 else 0)
        first.append(members[:cut])
        second.append(members[cut:])
    cat = lambda parts: np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)  # noqa: E731
    return cat(first), cat(second)


def choose_removed(labels: list[str], p: float, rng: np.random.Generator) -> list[str]:
    """Flat case: ``round(p * L)`` labels, at least 1 and at most ``L - 2`` (two old labels must remain)."""
    n = len(labels)
    if n < 3:
        raise DyntcError(f"a dynamic split of a flat label set needs at least 3 labels, got {n}")
    k = min(max(1, int(np.floor(p * n + 0.5))), n - 2)
    return sorted(rng.choice(sorted(labels), size=k, replace=False).tolist())


def choose_collapsed(tree: LabelTree, labels: list[str], p: float, rng: np.random.Generator) -> dict[str, list[str]]:
    """Hierarchical case: collapse random inner nodes until at least ``p`` of the leaves are collapsed.

    Candidates are the inner nodes (not the root) not inside an already collapsed node; picking an
    ancestor of a collapsed node absorbs it. A pick that would leave fewer than two old labels is
    skipped. Returns ``{collapsed node: leaves under it}`` for the outermost collapsed nodes.
    """
    leaves = set(labels)
    if set(tree.leaves) != leaves:
        extra, missing = sorted(leaves - set(tree.leaves)), sorted(set(tree.leaves) - leaves)
        raise DyntcError(
            f"the label tree's leaves must be exactly the dataset's labels "
            f"(labels not leaves: {extra[:5]}, leaves without examples: {missing[:5]})"
        )
    target = p * len(leaves)
    inner = sorted(n for n in tree.parent if tree.children[n])
    collapsed: dict[str, list[str]] = {}

    def old_labels_after(chosen: dict[str, list[str]]) -> int:
        merged = {leaf for ls in chosen.values() for leaf in ls}
        return len(leaves - merged) + len(chosen)

    def n_collapsed(chosen: dict[str, list[str]]) -> int:
        return sum(len(ls) for ls in chosen.values())

    while n_collapsed(collapsed) < target:
        covered = set(collapsed)
        candidates = [
            n for n in inner
            if n not in covered and not any(a in covered for a in tree.ancestors(n))
        ]
        usable = []
        for node in candidates:
            trial = {k: v for k, v in collapsed.items() if node not in tree.ancestors(k)}
            trial[node] = tree.leaves_under(node)
            if old_labels_after(trial) >= 2:
                usable.append((node, trial))
        if not usable:
            raise DyntcError(
                f"cannot collapse {p:.0%} of the {len(leaves)} leaves of this hierarchy and keep two old labels; "
                f"lower p (reached {n_collapsed(collapsed)} leaves)"
            )
        node, collapsed = usable[int(rng.integers(len(usable)))]
    return {k: collapsed[k] for k in sorted(collapsed)}


def _relabelled(split: Split, mapping: dict[str, str | None]) -> tuple[Split, np.ndarray]:
    """Relabel through `mapping` (leaf -> old label) and drop examples mapped to None."""
    keep = np.array([i for i, y in enumerate(split.labels) if mapping.get(y) is not None], dtype=np.int64)
    return Split([split.texts[i] for i in keep], [mapping[split.labels[i]] for i in keep]), keep


def make_split(data: Dataset, seed: int, p: float = 0.3, *, hierarchical: bool | None = None) -> DynamicSplit:
    """One dynamic label split of `data` (see the module docstring), deterministic in `seed`.

    `hierarchical` defaults to "the dataset has a hierarchy"; pass False to treat a hierarchical
    dataset as flat (labels removed instead of collapsed).
    """
    p = check_fraction(p)
    if hierarchical is None:
        hierarchical = data.hierarchy is not None
    if hierarchical and data.hierarchy is None:
        raise DyntcError(f"dataset {data.name!r} has no label hierarchy; use a flat split")
    rng = np.random.default_rng([int(seed), 0x5D1C])
    new_labels = data.labels
    if len(new_labels) < 2:
        raise DyntcError(f"dataset {data.name!r} has {len(new_labels)} label(s); a dynamic split needs several")
    known = set(new_labels)
    for name, part in (("dev", data.dev), ("test", data.test)):
        unknown = sorted(set(part.labels) - known)
        if unknown:
            raise DyntcError(f"{data.name} {name} set has labels absent from its training set: {unknown[:5]}")

    pre_pos, fine_pos = halve(data.train.labels, rng)
    removed: list[str] = []
    collapsed: dict[str, list[str]] = {}
    if hierarchical:
        collapsed = choose_collapsed(data.hierarchy, new_labels, p, rng)
        old_label_of: dict[str, str | None] = {y: y for y in new_labels}
        for node, leaves in collapsed.items():
            for leaf in leaves:
                old_label_of[leaf] = node
        kind = "hierarchical"
    else:
        removed = choose_removed(new_labels, p, rng)
        old_label_of = {y: (None if y in removed else y) for y in new_labels}
        kind = "flat"

    pool_pre = data.train.subset(pre_pos)
    pretrain, keep = _relabelled(pool_pre, old_label_of)
    pretrain_idx = pre_pos[keep]
    dev_old, dev_old_idx = _relabelled(data.dev, old_label_of)
    finetune_pool = data.train.subset(fine_pos)
    old_labels = sorted({y for y in old_label_of.values() if y is not None})
    new_classes = sorted(set(new_labels) - set(old_labels))
    missing_old = sorted(set(old_labels) - set(pretrain.labels))
    if missing_old:
        raise DyntcError(f"old labels {missing_old[:5]} have no examples in the pretraining half of {data.name}")

    fine_labels = np.asarray(finetune_pool.labels, dtype=object)
    order = {y: rng.permutation(np.flatnonzero(fine_labels == y)).astype(np.int64) for y in new_labels}
    return DynamicSplit(
        dataset=data.name,
        seed=int(seed),
        p=p,
        kind=kind,
        pretrain=pretrain,
        finetune_pool=finetune_pool,
        dev_old=dev_old,
        dev_new=Split(list(data.dev.texts), list(data.dev.labels)),
        test=Split(list(data.test.texts), list(data.test.labels)),
        old_labels=old_labels,
        new_labels=list(new_labels),
        new_classes=new_classes,
        old_label_of=old_label_of,
        removed=removed,
        collapsed=collapsed,
        pretrain_idx=pretrain_idx,
        finetune_idx=fine_pos,
        dev_old_idx=dev_old_idx,
        dev_new_idx=np.arange(len(data.dev), dtype=np.int64),
        test_idx=np.arange(len(data.test), dtype=np.int64),
        _order=order,
    )


def make_splits(data: Dataset, n_splits: int, p: float = 0.3, *, base_seed: int = 0) -> list[DynamicSplit]:
    """``n_splits`` splits with seeds ``base_seed, base_seed + 1, ...``."""
    if n_splits < 1:
        raise DyntcError(f"the number of splits must be >= 1, got {n_splits}")
    return [make_split(data, base_seed + k, p) for k in range(n_splits)]


__all__ = ["DynamicSplit", "check_fraction", "choose_collapsed", "choose_removed", "halve", "make_split", "make_splits"]
