"""The in-memory form every dataset reader produces."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dyntc.protocol.data.hierarchy import LabelTree


@dataclass
class Split:
    """Aligned texts and string labels of one part (train, dev or test) of a dataset."""

    texts: list[str]
    labels: list[str]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.labels):
            raise ValueError(f"Split has {len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.texts)

    def label_counts(self) -> Counter:
        return Counter(self.labels)

    def subset(self, indices) -> "Split":
        return Split([self.texts[i] for i in indices], [self.labels[i] for i in indices])


@dataclass
class Dataset:
    """A labelled text corpus with train/dev/test splits and, optionally, a label hierarchy.

    `hierarchy` is None for flat label sets; otherwise its leaves are exactly the labels used in
    the splits.
    """

    name: str
    train: Split
    dev: Split
    test: Split
    hierarchy: LabelTree | None = None
    info: dict = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        """Sorted label set of the training split."""
        return sorted(set(self.train.labels))

    def summary(self) -> dict:
        return {
            "name": self.name,
            "train": len(self.train),
            "dev": len(self.dev),
            "test": len(self.test),
            "labels": len(self.labels),
            "depth": self.hierarchy.depth if self.hierarchy else "flat",
        }
