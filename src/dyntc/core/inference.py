"""Inference with the research models: featurized text sets (:class:`Encoded`), points of a model's
metric space (embedding in eval mode, batched), and prediction by the nearest prototype (one rule:
:meth:`~dyntc.core.models.PrototypicalNetwork.nearest_prototypes`) or by the MLP's output layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from dyntc.core.encoders.base import TextEncoder, embed
from dyntc.errors import DyntcError
from dyntc.core.models import MLPClassifier, PrototypicalNetwork
from dyntc.core.text import check_texts


@dataclass
class Encoded:
    """Featurized texts with integer labels indexing ``classes``."""

    items: list[Any]
    labels: np.ndarray
    classes: list[str]

    @classmethod
    def of(cls, encoder: TextEncoder, texts: Sequence[str], labels: Sequence[str], classes: Sequence[str]) -> "Encoded":
        """Featurize `texts`; their `labels` must be among `classes` (checked first)."""
        check_texts(texts)
        ids = _label_ids(labels, classes)
        return cls(encoder.featurize(texts), ids, list(classes))

    @classmethod
    def from_items(cls, items: Sequence[Any], labels: Sequence[str], classes: Sequence[str]) -> "Encoded":
        """Already featurized `items` with their `labels` (each among `classes`)."""
        return cls(list(items), _label_ids(labels, classes), list(classes))

    def __len__(self) -> int:
        return len(self.items)

    def take(self, indices: np.ndarray) -> "Encoded":
        return Encoded([self.items[i] for i in indices], self.labels[indices], self.classes)

    def per_class(self, limit: int | None, seed: int = 0) -> "Encoded":
        """At most `limit` examples of each class (all when None), chosen at random."""
        if limit is None:
            return self
        rng = np.random.default_rng(seed)
        keep = [rng.permutation(np.flatnonzero(self.labels == c))[:limit] for c in np.unique(self.labels)]
        return self.take(np.sort(np.concatenate(keep)))


def _label_ids(labels: Sequence[str], classes: Sequence[str]) -> np.ndarray:
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(labels) - index.keys())
    if unknown:
        raise DyntcError(f"labels {unknown[:5]} are not among the {len(classes)} classes of this model")
    return np.array([index[y] for y in labels], dtype=np.int64)


class _Embedder(nn.Module):
    """Wraps a model's point-producing method so that :func:`embed` can batch it."""

    def __init__(self, model: nn.Module, method: str):
        super().__init__()
        self.model, self.method = model, method

    def forward(self, **batch):
        return getattr(self.model, self.method)(**batch)


def embed_points(model: nn.Module, items: Sequence[Any], batch_size: int = 256) -> torch.Tensor:
    """``model.embed`` over featurized `items`: points in the model's metric space, batched, eval
    mode; the model is left in the mode it was in (the wrapper carries it, so `embed` restores it)."""
    return embed(_Embedder(model, "embed").train(model.training), model.encoder, items, batch_size)


def prototypical_predict(
    model: PrototypicalNetwork, support: Encoded, queries: Sequence[Any], batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prototypes from `support` (all of its examples), then ``(predicted ids, -d² logits)`` of `queries`
    (:meth:`~dyntc.core.models.PrototypicalNetwork.nearest_prototypes`)."""
    d2 = model.nearest_prototypes(embed_points(model, support.items, batch_size), support.labels,
                                  len(support.classes), embed_points(model, queries, batch_size))
    logits = model.logits_from_sq_distances(d2)
    return logits.argmax(1).cpu(), logits.detach().cpu()


def prototypical_accuracy(model: PrototypicalNetwork, support: Encoded, query: Encoded) -> float:
    pred, _ = prototypical_predict(model, support, query.items)
    return float((pred.numpy() == query.labels).mean())


def supervised_accuracy(model: MLPClassifier, data: Encoded) -> float:
    logits = embed(model, model.encoder, data.items)
    return float((logits.argmax(1).cpu().numpy() == data.labels).mean())
