"""Training the network of a :class:`~dyntc.classifier.DynamicClassifier` (the trainer: it takes a
network or a label set and a :class:`~dyntc.core.training.TrainConfig` and returns what it trained; it
never sees the classifier).

Episodic training as in the paper: episodes of up to ``max_classes`` labels with ``n_support``
support examples each and ``n_query`` queries in total, cross-entropy over ``softmax(-d²)``, Adam,
early stopping on dev accuracy. Labels with fewer than ``n_support + 1`` examples take no part in
the episodes (they still get prototypes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from dyntc.classifier.labels import LabelSet
from dyntc.errors import DyntcError, is_int, is_number
from dyntc.core.models import PrototypicalNetwork
from dyntc.core.training import TrainConfig, TrainResult, train_prototypical
from dyntc.core.inference import Encoded
from dyntc.core.text import check_texts


def check_pairs(texts: Any, labels: Any, tname: str = "texts", lname: str = "labels",
                allow_empty: bool = False) -> tuple[list[str], list[str]]:
    """`texts` and `labels` as lists of non-empty strings of equal length."""
    for value, name in ((texts, tname), (labels, lname)):
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise DyntcError(f"{name} must be a list of strings, got {type(value).__name__}")
    texts, labels = list(texts), list(labels)
    if len(texts) != len(labels):
        raise DyntcError(f"{tname} and {lname} differ in length: {len(texts)} vs {len(labels)}")
    if not texts and not allow_empty:
        raise DyntcError(f"{tname} is empty: pass at least one text with its label")
    check_texts(texts, tname)
    for i, y in enumerate(labels):
        if not isinstance(y, str) or not y.strip():
            raise DyntcError(f"{lname}[{i}] is {y!r}: labels must be non-empty strings (convert them with str())")
    return texts, labels


def check_sample_weight(weights: Any, n: int) -> list[float] | None:
    """`weights` as `n` finite non-negative numbers that do not all vanish, or None (all equal)."""
    if weights is None:
        return None
    if isinstance(weights, str) or not isinstance(weights, Iterable):
        raise DyntcError(f"sample_weight must be None or a list of numbers, got {type(weights).__name__}")
    weights = list(weights)
    if len(weights) != n:
        raise DyntcError(f"sample_weight has {len(weights)} weights for {n} texts: give one weight per text")
    for i, w in enumerate(weights):
        w = w.item() if hasattr(w, "item") else w  # numpy and torch scalars
        if not (is_number(w) and 0 <= w < math.inf):
            raise DyntcError(f"sample_weight[{i}] is {w!r}: weights must be finite numbers >= 0")
    if not any(weights):
        raise DyntcError("sample_weight is all zeros: at least one text needs a positive weight")
    return [float(w.item() if hasattr(w, "item") else w) for w in weights]


def check_dev(dev: Any, classes: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`dev` as a checked ``(texts, labels)`` pair whose labels are among `classes`, or None."""
    if dev is None:
        return None
    if not (isinstance(dev, (tuple, list)) and len(dev) == 2):
        raise DyntcError("dev must be a pair (texts, labels)")
    dev_texts, dev_labels = check_pairs(dev[0], dev[1], "dev texts", "dev labels")
    unknown = sorted(set(dev_labels) - set(classes))
    if unknown:
        raise DyntcError(f"dev labels {unknown[:5]} are not among the labels trained on: remove those dev examples")
    return dev_texts, dev_labels


def episodic_classes(labels: Sequence[str], classes: Sequence[str], n_support: int) -> list[str]:
    """The labels with enough examples for an episode (``n_support`` support + 1 query); at least two."""
    counts: dict[str, int] = {}
    for y in labels:
        counts[y] = counts.get(y, 0) + 1
    eligible = [c for c in classes if counts.get(c, 0) >= n_support + 1]
    if len(eligible) < 2:
        raise DyntcError(
            f"episodic training needs at least 2 labels with n_support + 1 = {n_support + 1} examples "
            f"each; {len(eligible)} of {len(classes)} labels have that many: add examples or lower n_support"
        )
    return eligible


def _episode_set(model: PrototypicalNetwork, texts: Sequence[str], labels: Sequence[str], classes: Sequence[str],
                 items: Sequence[Any] | None = None) -> Encoded:
    """The examples of `classes` among (`texts`, `labels`); `items`: their features if already computed."""
    keep = set(classes)
    idx = [i for i, y in enumerate(labels) if y in keep]
    kept_labels = [labels[i] for i in idx]
    if items is None:
        return Encoded.of(model.encoder, [texts[i] for i in idx], kept_labels, classes)
    return Encoded.from_items([items[i] for i in idx], kept_labels, classes)


def train_episodic(model: PrototypicalNetwork, texts: Sequence[str], labels: Sequence[str], items: Sequence[Any],
                   dev: tuple[list[str], list[str]] | None, config: TrainConfig) -> TrainResult:
    """Episodic training of `model` on (`texts`, `labels`) whose features are `items`; early stopping
    on `dev` (checked with :func:`check_dev`) when given. Leaves the model in eval mode."""
    episodic = episodic_classes(labels, sorted(set(labels)), config.n_support)
    train = _episode_set(model, texts, labels, episodic, items)
    dev_set = None
    if dev is not None:
        dev_set = _episode_set(model, *dev, episodic)
        dev_set = dev_set if len(dev_set) else None
    result = train_prototypical(model, train, dev_set, config)
    model.eval()
    return result


def check_fine_tune(texts: Any, labels: Any, classes: Sequence[str], episodes: Any, lr: Any
                    ) -> tuple[list[str], list[str]]:
    """:meth:`~dyntc.classifier.DynamicClassifier.fine_tune`'s arguments checked: the new pairs (empty
    lists for none), whose labels must be among `classes`."""
    if not (is_int(episodes) and episodes >= 1):
        raise DyntcError(f"episodes must be an integer >= 1, got {episodes!r}")
    if lr is not None and not (is_number(lr) and lr > 0):
        raise DyntcError(f"lr must be a number > 0 (or None for the classifier's lr), got {lr!r}")
    if texts is None and labels is None:
        return [], []
    if texts is None or labels is None:
        raise DyntcError("fine_tune needs both texts and labels (or neither)")
    texts, labels = check_pairs(texts, labels, allow_empty=True)
    unknown = sorted(set(labels) - set(classes))
    if unknown:
        raise DyntcError(f"labels {unknown[:5]} are not in the label set: add them with add_label first")
    return texts, labels


def fine_tune(labels: LabelSet, texts: Sequence[str], new_labels: Sequence[str],
              dev: tuple[list[str], list[str]] | None, config: TrainConfig, *, add_to_support: bool
              ) -> tuple[TrainResult, LabelSet]:
    """Further episodic training of the network of `labels`' space: episodes from the stored support
    sets plus the new pairs (`texts`, `new_labels`, checked with :func:`check_fine_tune`); returns the
    training result and a new label set in which every stored example is embedded again (parts of
    merged labels kept; with `add_to_support` the new pairs join their labels). `labels` is unchanged."""
    space = labels.space
    stored = labels.items()
    all_texts = [t for _, s in stored for t in s.texts]
    all_labels = [c for c, s in stored for _ in s.texts]
    pool_texts, pool_labels = all_texts + list(texts), all_labels + list(new_labels)
    episodic_classes(pool_labels, labels.classes, config.n_support)
    space.extend_vocabulary(texts)
    items = space.model.encoder.featurize(pool_texts)  # once, for the episodes and the prototypes
    result = train_episodic(space.model, pool_texts, pool_labels, items, dev, config)
    space.weights_changed()
    parts = [p for _, s in stored for p in s.stored_parts()]
    merged = {c for c, s in stored if s.n_parts > 1}
    keep = list(range(len(all_texts)))
    if add_to_support:  # new examples join their label as they are (part 0), except those of merged labels
        keep += [len(all_texts) + i for i, y in enumerate(new_labels) if y not in merged]
        parts += [0] * (len(keep) - len(all_texts))
    tuned = LabelSet.embedded(space, [pool_texts[i] for i in keep], [pool_labels[i] for i in keep],
                              [items[i] for i in keep], parts, debias=labels.debias)
    if add_to_support:  # a merged label's new examples go to its nearest part, as add_examples does
        for label in sorted(merged & set(new_labels)):
            tuned.add_examples(label, [t for t, y in zip(texts, new_labels) if y == label])
    tuned.log = labels.log + [{"op": "fine_tune", "episodes": result.steps, "examples": len(texts)}]
    return result, tuned
