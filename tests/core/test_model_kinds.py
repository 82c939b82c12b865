"""The registry of the paper's models (dyntc.core.models.MODELS): what each kind answers, and that the
research protocol asks kinds instead of comparing model names."""

import re
from pathlib import Path

import pytest
import torch

import dyntc
from dyntc.errors import DyntcError
from dyntc.core.geometry import get_metric
from dyntc.core.models import MODELS, MLPClassifier, PrototypicalNetwork, build_model, model_kind


class VectorEncoder(torch.nn.Module):
    output_dim = 4

    def forward(self, x):
        return x


def test_each_kind_answers_what_it_is():
    assert list(MODELS) == ["mlp", "euc", "hyp", "logreg"]
    #            network, prototypical, episodic, has_output_layer, euclidean_warmup, steps
    expected = {"euc": (True, True, True, False, False, "episodes"),
                "hyp": (True, True, True, False, True, "episodes"),
                "mlp": (True, False, False, True, False, "batches"),
                "logreg": (False, False, False, False, False, "batches")}
    for name, answers in expected.items():
        kind = model_kind(name)
        assert kind is MODELS[name] and kind.name == name
        assert (kind.network, kind.prototypical, kind.episodic, kind.has_output_layer, kind.euclidean_warmup,
                kind.steps) == answers
    assert MODELS["euc"].metric is get_metric("euclidean") and MODELS["hyp"].metric is get_metric("hyperbolic")
    assert MODELS["mlp"].metric is None and MODELS["logreg"].metric is None
    # the Euclidean warm-up follows from the metric's curvature, not from the model's name
    assert MODELS["euc"].metric.curvature == 0 and MODELS["hyp"].metric.curvature < 0


def test_a_kind_builds_its_network():
    assert isinstance(model_kind("mlp").build(VectorEncoder(), 3), MLPClassifier)
    hyp = build_model("hyp", VectorEncoder(), 3, logit_scale=2.0)
    assert isinstance(hyp, PrototypicalNetwork) and hyp.metric == MODELS["hyp"].metric.name and hyp.logit_scale == 2.0
    assert hyp.space is MODELS["hyp"].metric  # the network holds the metric object itself
    with pytest.raises(DyntcError, match="the mlp model takes no options"):
        build_model("mlp", VectorEncoder(), 3, logit_scale=2.0)
    with pytest.raises(DyntcError, match="the logreg baseline is a probe fitted on frozen embeddings"):
        build_model("logreg", VectorEncoder(), 3)


def test_a_copied_or_pickled_network_keeps_the_one_metric_object():
    import copy
    import pickle

    hyp = build_model("hyp", VectorEncoder(), 3)
    assert copy.deepcopy(hyp).space is hyp.space is get_metric("hyperbolic")
    assert pickle.loads(pickle.dumps(hyp)).space is hyp.space
    with hyp.metric_as("euclidean"):
        assert hyp.space is get_metric("euclidean") and hyp.metric == "euclidean"
    assert hyp.space is get_metric("hyperbolic")


@pytest.mark.parametrize("name", ["svm", "MLP", "", None, ["mlp"]])
def test_an_unknown_name_is_a_clear_error(name):
    with pytest.raises(DyntcError, match=r"unknown model .*: choose one of mlp, euc, hyp, logreg"):
        model_kind(name)
    with pytest.raises(DyntcError, match="unknown model"):
        build_model(name, VectorEncoder(), 3)


def test_no_code_compares_model_or_metric_names():
    """Decisions go through a kind (or a metric object); names stay keys of data."""
    root = Path(dyntc.__file__).parent
    models, metrics = r"""["'](?:mlp|euc|hyp|logreg)["']""", r"""["'](?:euclidean|hyperbolic)["']"""

    def compares(line: str) -> bool:
        return any(re.search(rf"[=!]=\s*{name}|{name}\s*[=!]=|{name}\s+(?:not\s+)?in\b|\bin\s*\(\s*{name}\s*,", line)
                   for name in (models, metrics))

    # the scan finds what it is meant to find (else an empty result proves nothing)
    assert all(map(compares, ['if kind == "mlp":', "if 'hyperbolic' != metric:", 'if metric in ("euclidean", x):',
                              'x = "euc" in names']))
    assert not any(map(compares, ['KINDS = {"mlp": Mlp}', 'metric: str = "euclidean"', 'get_metric("hyperbolic")']))
    paths = list(root.rglob("*.py"))
    assert len(paths) > 50  # the whole package, not an empty folder
    found = [f"{path.relative_to(root)}:{number}: {line.strip()}" for path in paths
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if compares(line)]
    assert not found, "name comparisons: " + "; ".join(found)
