"""Training the network of a :class:`~dyntc.classifier.DynamicClassifier` (the trainer half).

Episodic training as in the paper: episodes of up to ``max_classes`` labels with ``n_support``
support examples each and ``n_query`` queries in total, cross-entropy over ``softmax(-d²)``, Adam,
early stopping on dev accuracy. Labels with fewer than ``n_support + 1`` examples take no part in
the episodes (they still get prototypes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from dyntc.errors import DyntcError
from dyntc.models import PrototypicalNetwork
from dyntc.training import Encoded, TrainConfig, TrainResult, check_texts, train_prototypical


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
        raise DyntcError(f"{tname} is empty: nothing to train on")
    check_texts(texts, tname)
    for i, y in enumerate(labels):
        if not isinstance(y, str) or not y.strip():
            raise DyntcError(f"{lname}[{i}] is {y!r}: labels must be non-empty strings (convert them with str())")
    return texts, labels


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
