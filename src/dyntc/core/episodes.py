"""Episodic sampling for prototypical training (the paper's Algorithm 1).

Each episode samples ``N_C`` classes (all classes, at most ``max_classes``), ``N_S`` support examples
per class, and ``N_Q`` query examples *in total*, drawn uniformly from the sampled classes' remaining
examples (so a query is never in its episode's support set).

Hard negatives (``hard_fraction`` > 0, beyond the paper): when there are more classes than fit in an
episode, part of its classes are drawn as the confusable partners of the others. Confusability is
learnt online, without extra encoder passes, from the queries' softmax mass on wrong classes
(:meth:`EpisodeSampler.record`), so it follows the model as it trains.
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
    classes: np.ndarray  # the sampler's class index of each local id


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
        hard_fraction: float = 0.0,
    ):
        if n_support < 1:
            raise DyntcError(f"n_support must be >= 1, got {n_support}")
        if n_query < 1:
            raise DyntcError(f"n_query must be >= 1, got {n_query}")
        if not 0.0 <= hard_fraction <= 0.5:
            raise DyntcError(f"hard_fraction must be in [0, 0.5] (each partner label needs an anchor), got {hard_fraction}")
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
            name = names[c] if names is not None else c.item()
            raise DyntcError(
                f"class {name!r} has {n} examples but episodes need n_support + 1 = {n_support + 1} "
                f"({len(small)} classes are this small): add examples or lower n_support"
            )
        self.classes = classes
        self.n_support, self.n_query = n_support, n_query
        self.n_way = min(max_classes, len(classes))
        self.rng = np.random.default_rng(seed)
        self.hard_fraction = hard_fraction
        k = len(classes)
        # class positions 0..k-1 (indices into self.classes / self.by_class) throughout.
        # confusion[a, b]: softmax mass that queries of class a put on class b (summed over episodes),
        # exposure[a, b]: how many queries of a met b; the prior (one query with uniform mass) keeps
        # never-met pairs drawable
        self.confusion = np.full((k, k), 1.0 / self.n_way)
        self.exposure = np.ones((k, k))

    def state(self) -> dict:
        """What the next draws depend on (random generator, learnt confusability), for a resumed loop;
        plain Python values (exact for floats), so a ``torch.load(weights_only=True)`` file can hold it."""
        return {"rng": self.rng.bit_generator.state, "confusion": self.confusion.tolist(), "exposure": self.exposure.tolist()}

    def set_state(self, state: dict) -> None:
        confusion, exposure = np.asarray(state["confusion"], dtype=float), np.asarray(state["exposure"], dtype=float)
        if confusion.shape != self.confusion.shape:
            raise DyntcError(f"sampler state for {confusion.shape[0]} classes, this sampler has {len(self.classes)}")
        self.rng.bit_generator.state = state["rng"]
        self.confusion, self.exposure = confusion, exposure

    def _choose_classes(self) -> np.ndarray:
        k = len(self.classes)
        n_hard = int(round(self.hard_fraction * self.n_way)) if self.n_way < k else 0
        if n_hard == 0:
            return self.rng.choice(k, size=self.n_way, replace=False)
        # anchors at random, each followed by one partner drawn with probability proportional to its
        # confusion rate with the anchor, until n_hard partners
        rate = self.confusion / self.exposure
        rate = rate + rate.T  # confusable either way
        free = np.ones(k, dtype=bool)
        chosen: list[int] = []
        while len(chosen) < self.n_way:
            anchor = int(self.rng.choice(np.flatnonzero(free)))
            chosen.append(anchor)
            free[anchor] = False
            if n_hard > 0 and len(chosen) < self.n_way:
                weight = np.where(free, rate[anchor], 0.0)
                weight[anchor] = 0.0
                partner = int(self.rng.choice(k, p=weight / weight.sum()))
                chosen.append(partner)
                free[partner] = False
                n_hard -= 1
        return np.asarray(chosen)

    def record(self, episode: Episode, query_probs: np.ndarray) -> None:
        """Learn confusability from an episode's query class probabilities, shape (n_query, n_classes)."""
        probs = np.asarray(query_probs, dtype=np.float64)
        if probs.shape != (len(episode.query), episode.n_classes):
            raise DyntcError(f"query_probs has shape {probs.shape}, expected {(len(episode.query), episode.n_classes)}")
        true = episode.classes[episode.query_labels]
        np.add.at(self.confusion, (true[:, None], episode.classes[None, :]), probs)
        np.add.at(self.exposure, (true[:, None], episode.classes[None, :]), 1.0)

    def sample(self) -> Episode:
        chosen = self._choose_classes()
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
            classes=np.asarray(chosen),
        )
