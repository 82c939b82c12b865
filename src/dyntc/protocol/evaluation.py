"""How a protocol cell predicts the test set and what it reports: nearest prototype (EUC/HYP), 5-NN on
the MLP's penultimate layer (MLP-KNN), a logistic-regression probe (logreg); accuracies over all, new
and old classes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dyntc.errors import DyntcError
from dyntc.core.models import KNNProbe, PrototypicalNetwork, model_kind
from dyntc.core.encoders.base import embed
from dyntc.core.training import TrainResult
from dyntc.core.inference import Encoded, embed_points


@torch.no_grad()
def prototype_predict(model: PrototypicalNetwork, support_points: torch.Tensor, support_labels: np.ndarray,
                      n_classes: int, query_points: torch.Tensor) -> np.ndarray:
    """Class of each query point: its nearest prototype, the prototypes built from the support points."""
    return model.nearest_prototypes(support_points, support_labels, n_classes, query_points).argmin(1).cpu().numpy()


def knn_predict(features_support: torch.Tensor, labels: np.ndarray, features_query: torch.Tensor, k: int) -> np.ndarray:
    probe = KNNProbe(k).fit(features_support.cpu(), torch.as_tensor(labels))
    return probe.predict(features_query.cpu()).numpy()


def untuned_predict(model_name: str, pretrained: torch.nn.Module, fine: Encoded, test: Encoded, k: int,
                    cache: dict[str, torch.Tensor]) -> np.ndarray:
    """The un-tuned variant: the pretrained model unchanged, the n_fine examples as its support (MLP: a
    k-NN vote on its penultimate layer, the paper's MLP-KNN; EUC/HYP: their prototypes). `cache` keeps
    the embedded test set between the n_fine values of one pretrained model."""
    prototypical = model_kind(model_name).prototypical
    if "test" not in cache:
        cache["test"] = (embed_points(pretrained, test.items) if prototypical
                         else embed(pretrained.encoder, pretrained.encoder, test.items))
    if not prototypical:
        support = embed(pretrained.encoder, pretrained.encoder, fine.items)
        return knn_predict(support, fine.labels, cache["test"], k)
    return prototype_predict(pretrained, embed_points(pretrained, fine.items), fine.labels, len(fine.classes), cache["test"])


def check_frozen_items(items: list[Any]) -> None:
    if not items or not all(isinstance(x, torch.Tensor) and x.dim() == 1 and x.is_floating_point() for x in items[:10]):
        raise DyntcError(
            "the logreg baseline needs a frozen pretrained encoder whose featurized items are sentence embeddings "
            "(1-D float tensors); this encoder featurizes texts into something else (token ids?)"
        )


def logreg_predict(fine: Encoded, test: Encoded, seed: int) -> np.ndarray:
    """The SetFit-style probe: a logistic regression on frozen sentence embeddings of the n_fine examples."""
    from sklearn.linear_model import LogisticRegression

    check_frozen_items(fine.items)
    x_train = torch.stack(fine.items).float().numpy()
    x_test = torch.stack(test.items).float().numpy()
    clf = LogisticRegression(max_iter=2000, random_state=seed)
    clf.fit(x_train, fine.labels)
    return clf.predict(x_test)


def accuracies(pred: np.ndarray, truth: np.ndarray, new_mask: np.ndarray) -> dict[str, float | None]:
    correct = pred == truth
    out: dict[str, float | None] = {"acc_all": float(correct.mean())}
    out["acc_new"] = float(correct[new_mask].mean()) if new_mask.any() else None
    out["acc_old"] = float(correct[~new_mask].mean()) if (~new_mask).any() else None
    return out


def train_info(result: TrainResult | None) -> dict[str, Any]:
    """A training stage's record in a result row (none for the un-tuned variant): its dev history too,
    so that where a cell's early stopping peaked can be read from ``results.json`` (docs/results.md §8)."""
    if result is None:
        return {"steps": 0, "stopped_early": None, "best_dev_acc": None}
    return {"steps": result.steps, "stopped_early": result.stopped_early, "best_dev_acc": result.best_dev_acc,
            "history": result.history}
