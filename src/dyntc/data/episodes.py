"""Episodic sampling for prototypical training (the paper's Algorithm 1).

Each episode samples ``N_C`` classes (all classes, at most ``max_classes``), ``N_S`` support examples
per class, and ``N_Q`` query examples *in total*, drawn uniformly from the sampled classes' remaining
examples (so a query is never in its episode's support set).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dyntc.errors import DyntcError


@dataclass
class Episode:
    support: np.ndarray  # example indices, (N_C * N_S,)
    support_labels: np.ndarray  # episode-local class ids 0..N_C-1
    query: np.ndarray  # example indices, (<= N_Q,)
    query_labels: np.ndarray
    n_classes: int


class EpisodeSampler:
    def __init__(
        self,
        labels: Sequence[int],
        *,
        n_support: int = 4,
        n_query: int = 64,
        max_classes: int = 50,
        seed: int = 0,
        names: Sequence[str] | None = None,
    ):
        if n_support < 1:
            raise DyntcError(f"n_support must be >= 1, got {n_support}")
        if n_query < 1:
            raise DyntcError(f"n_query must be >= 1, got {n_query}")
        if max_classes < 2:
            raise DyntcError(f"max_classes must be >= 2, got {max_classes}")
        labels = np.asarray(labels)
        self.by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
        classes = np.unique(labels)
        if len(classes) < 2:
            raise DyntcError(f"episodic training needs at least 2 classes, got {len(classes)}")
        small = [(c, len(ix)) for c, ix in zip(classes, self.by_class) if len(ix) < n_support + 1]
        if small:
            c, n = small[0]
            name = names[c] if names is not None else c
            raise DyntcError(
                f"class {name!r} has {n} examples but episodes need n_support + 1 = {n_support + 1} "
                f"({len(small)} classes are this small): add examples or lower n_support"
            )
        self.classes = classes
        self.n_support, self.n_query = n_support, n_query
        self.n_way = min(max_classes, len(classes))
        self.rng = np.random.default_rng(seed)

    def sample(self) -> Episode:
        chosen = self.rng.choice(len(self.classes), size=self.n_way, replace=False)
        support, rest, rest_labels = [], [], []
        for local, c in enumerate(chosen):
            members = self.rng.permutation(self.by_class[c])
            support.append(members[: self.n_support])
            rest.append(members[self.n_support :])
            rest_labels.append(np.full(len(members) - self.n_support, local))
        rest, rest_labels = np.concatenate(rest), np.concatenate(rest_labels)
        pick = self.rng.choice(len(rest), size=min(self.n_query, len(rest)), replace=False)
        return Episode(
            support=np.concatenate(support),
            support_labels=np.repeat(np.arange(self.n_way), self.n_support),
            query=rest[pick],
            query_labels=rest_labels[pick],
            n_classes=self.n_way,
        )
