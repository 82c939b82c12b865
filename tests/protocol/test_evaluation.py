"""A cell's evaluation (`dyntc.protocol.evaluation`): the accuracies and the logreg baseline."""

import numpy as np
import pytest
import torch

from dyntc.errors import DyntcError
from dyntc.protocol import accuracies
from dyntc.protocol.evaluation import logreg_predict
from dyntc.core.inference import Encoded


def test_accuracies_over_all_new_and_old():
    truth = np.array([0, 1, 2, 2, 1, 0])
    pred = np.array([0, 1, 1, 2, 0, 0])
    new = np.isin(truth, [2])
    acc = accuracies(pred, truth, new)
    assert acc["acc_all"] == pytest.approx(4 / 6)
    assert acc["acc_new"] == pytest.approx(1 / 2)
    assert acc["acc_old"] == pytest.approx(3 / 4)
    assert accuracies(pred, truth, np.zeros(6, bool))["acc_new"] is None


def test_logreg_on_frozen_embeddings_and_rejects_token_ids():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 8)) * 4
    def make(n):
        labels = np.repeat(np.arange(3), n)
        items = [torch.tensor(centers[y] + rng.normal(size=8), dtype=torch.float32) for y in labels]
        return Encoded(items, labels, ["a", "b", "c"])
    pred = logreg_predict(make(5), test := make(20), seed=0)
    assert (pred == test.labels).mean() > 0.9
    ids = Encoded([torch.tensor([3, 4, 5]), torch.tensor([1, 2])], np.array([0, 1]), ["a", "b"])
    with pytest.raises(DyntcError, match="frozen pretrained encoder"):
        logreg_predict(ids, ids, seed=0)
