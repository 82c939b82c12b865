import numpy as np
import pytest
import torch

from dyntc.core.episodes import EpisodeSampler
from dyntc.errors import DyntcError
from dyntc.core.geometry import lorentz
from dyntc.core.models import (
    KNNProbe,
    PrototypicalNetwork,
    group_by_class,
    load_trainable_state,
    project_to_norm,
    trainable_state,
)


class IdentityEncoder(torch.nn.Module):
    """Stand-in encoder whose 'texts' are already vectors, to test the model maths alone."""

    output_dim = 3

    def forward(self, x):
        return x


def test_group_by_class_pads_and_masks():
    labels = torch.tensor([2, 0, 2, 1, 2])
    index, mask = group_by_class(labels, 3)
    assert index.shape == (3, 3)
    for c in range(3):
        assert sorted(index[c][mask[c]].tolist()) == torch.nonzero(labels == c).flatten().tolist()
    with pytest.raises(DyntcError, match="no support examples"):
        group_by_class(torch.tensor([0, 0, 2]), 3)


@pytest.mark.parametrize("metric", ["euclidean", "hyperbolic"])
def test_prototypes_are_per_class_means(metric):
    torch.manual_seed(0)
    model = PrototypicalNetwork(IdentityEncoder(), metric).eval()
    h = torch.randn(12, 3, dtype=torch.float64)
    labels = torch.tensor([0, 1, 2, 3] * 3)
    points = model.to_metric_space(h)
    protos = model.prototypes(points, labels, 4)
    for c in range(4):
        members = points[labels == c]
        if metric == "euclidean":
            expected = members.mean(0)
        else:
            expected = lorentz.frechet_mean(members)
        torch.testing.assert_close(protos[c], expected, atol=1e-6, rtol=0)
    logits = model.logits(points, protos)
    assert logits.shape == (12, 4) and (logits <= 1e-6).all()


def test_episode_loss_prefers_true_class():
    model = PrototypicalNetwork(IdentityEncoder(), "hyperbolic")
    support = torch.tensor([[0.0, 0, 0], [50.0, 0, 0]])  # hyperbolic d = asinh(50) ≈ 4.6
    query = torch.tensor([[0.1, 0, 0], [49.0, 0, 0]])
    loss, logits = model.episode_loss({"x": support}, torch.tensor([0, 1]), {"x": query}, torch.tensor([0, 1]), 2)
    assert logits.shape == (2, 2) and logits.argmax(1).tolist() == [0, 1] and loss.item() < 1e-3
    loss_wrong, _ = model.episode_loss({"x": support}, torch.tensor([0, 1]), {"x": query}, torch.tensor([1, 0]), 2)
    assert loss_wrong.item() > 10


def test_knn_probe_majority_vote():
    feats = torch.tensor([[0.0], [0.1], [0.2], [5.0], [5.1]])
    probe = KNNProbe(k=3).fit(feats, torch.tensor([0, 0, 0, 1, 1]))
    assert probe.predict(torch.tensor([[0.05], [5.05], [4.0]])).tolist() == [0, 1, 1]
    with pytest.raises(DyntcError, match="before fit"):
        KNNProbe().predict(feats)
    with pytest.raises(DyntcError, match="k must be"):
        KNNProbe(k=0)


def test_episode_sampler_shapes_and_disjoint_queries():
    labels = np.repeat(np.arange(5), 10)
    sampler = EpisodeSampler(labels, n_support=4, n_query=15, max_classes=3, seed=1)
    ep = sampler.sample()
    assert ep.n_classes == 3 and len(ep.support) == 12 and len(ep.query) == 15
    assert not set(ep.support) & set(ep.query)
    # local labels are consistent with the true labels of the examples
    for idx, local in zip(ep.support, ep.support_labels):
        assert labels[idx] == labels[ep.support[ep.support_labels == local][0]]
    assert len({labels[i] for i in ep.query}) <= 3
    again = EpisodeSampler(labels, n_support=4, n_query=15, max_classes=3, seed=1).sample()
    np.testing.assert_array_equal(ep.query, again.query)
    # queries are capped by what the sampled classes have left: 3 classes x (10 - 4)
    assert len(EpisodeSampler(labels, n_support=4, n_query=64, max_classes=3).sample().query) == 18


def test_episode_sampler_rejects_tiny_classes_and_bad_sizes():
    labels = np.array([0] * 10 + [1] * 4)
    with pytest.raises(DyntcError, match=r"class 'b' has 4 examples.*n_support \+ 1 = 5"):
        EpisodeSampler(labels, n_support=4, names=["a", "b"])
    with pytest.raises(DyntcError, match="n_support must be >= 1"):
        EpisodeSampler(labels, n_support=0)
    with pytest.raises(DyntcError, match="at least 2 classes"):
        EpisodeSampler(np.zeros(10, int))


# ---- PrototypicalNetwork options: logit scale, norm clip --------------------------------------------------------


def test_soft_clip_norm_bounds_the_norm_keeps_direction_and_is_smooth_at_zero():
    from dyntc.core.models import soft_clip_norm

    h = torch.randn(200, 5, dtype=torch.float64) * torch.logspace(-6, 3, 200, dtype=torch.float64)[:, None]
    out = soft_clip_norm(h, 4.0)
    norms, out_norms = h.norm(dim=1), out.norm(dim=1)
    assert (out_norms < 4.0 + 1e-12).all()
    torch.testing.assert_close(out_norms, 4.0 * torch.tanh(norms / 4.0))
    torch.testing.assert_close(out / out_norms[:, None], h / norms[:, None])  # same direction
    small = norms < 1e-3
    torch.testing.assert_close(out[small], h[small], rtol=1e-7, atol=0)  # ~identity near 0
    x = torch.zeros(1, 5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(soft_clip_norm(x, 4.0).sum(), x)
    torch.testing.assert_close(g, torch.ones_like(g))  # derivative 1 at the origin, not NaN
    for r in (1e-5, 0.3, 7.0):  # both branches of the series switch
        pts = (torch.randn(3, 5, dtype=torch.float64) * r).requires_grad_()
        assert torch.autograd.gradcheck(lambda p: soft_clip_norm(p, 4.0), (pts,))


@pytest.mark.parametrize("metric", ["euclidean", "hyperbolic"])
def test_logit_scale_changes_the_loss_not_the_predictions(metric):
    torch.manual_seed(0)
    support, labels = torch.randn(12, 3), torch.arange(4).repeat(3)
    queries = torch.randn(20, 3)
    plain = PrototypicalNetwork(IdentityEncoder(), metric).eval()
    scaled = PrototypicalNetwork(IdentityEncoder(), metric, logit_scale=0.25).eval()
    p1 = plain.prototypes(plain.embed(x=support), labels, 4)
    q1 = plain.embed(x=queries)
    torch.testing.assert_close(scaled.logits(q1, p1), 0.25 * plain.logits(q1, p1))
    assert torch.equal(scaled.logits(q1, p1).argmax(1), plain.logits(q1, p1).argmax(1))


def test_learnt_scale_gets_a_gradient_and_max_norm_bounds_the_radius():
    model = PrototypicalNetwork(IdentityEncoder(), "hyperbolic", learn_scale=True, logit_scale=2.0, max_norm=3.0)
    assert model.scale().item() == pytest.approx(2.0)
    assert [n for n, _ in model.named_parameters()] == ["log_scale"]
    x = torch.randn(12, 3) * 100
    points = model.embed(x=x)
    assert (torch.acosh(points[:, 0]) <= np.arcsinh(3.0) + 1e-5).all()  # radius <= asinh(max_norm)
    loss, _ = model.episode_loss({"x": x[:8]}, torch.arange(4).repeat(2), {"x": x[8:]}, torch.arange(4), 4)
    loss.backward()
    assert model.log_scale.grad is not None and model.log_scale.grad != 0
    assert model.config()["learn_scale"] is True and model.config()["max_norm"] == 3.0
    # without a learnt scale there is no parameter (older checkpoints keep loading strictly)
    assert list(PrototypicalNetwork(IdentityEncoder(), "hyperbolic").state_dict()) == []


@pytest.mark.parametrize("bad, msg", [
    ({"logit_scale": 0.0}, "logit_scale"), ({"logit_scale": "1"}, "logit_scale"),
    ({"max_norm": -1.0}, "max_norm"), ({"learn_scale": 1}, "learn_scale"),
])
def test_option_validation(bad, msg):
    with pytest.raises(DyntcError, match=msg):
        PrototypicalNetwork(IdentityEncoder(), "hyperbolic", **bad)


# ---- hard-negative episodes -------------------------------------------------------------------

def _confuse(sampler, a, b, n=50):
    """Record `n` episodes of all 10 classes, one query each, in which the model is nearly always right
    except that the query of class `a` puts 0.9 of its mass on class `b`."""
    from dyntc.core.episodes import Episode

    probs = np.full((10, 10), 0.005) + 0.95 * np.eye(10)
    probs[a] = 0.1 / 9
    probs[a, b] = 0.9
    ids = np.arange(10)
    for _ in range(n):
        sampler.record(Episode(ids, ids, ids, ids, 10, ids), probs)


def test_hard_negative_episodes_pair_confusable_classes():
    values = np.arange(10) * 7 + 3  # label values differ from class positions: the sampler works in positions
    labels = np.repeat(values, 10)
    uniform = EpisodeSampler(labels, n_support=2, n_query=8, max_classes=4, seed=3)
    hard = EpisodeSampler(labels, n_support=2, n_query=8, max_classes=4, seed=3, hard_fraction=0.5)
    for sampler in (uniform, hard):
        _confuse(sampler, 0, 7)

    def together(sampler):
        eps = [set(labels[sampler.sample().support]) for _ in range(400)]
        with0 = [e for e in eps if values[0] in e]
        return np.mean([values[7] in e for e in with0])

    # uniform draw: P(7 | 0) = 3/9; hard draw: whenever 0 or 7 is an anchor the other is its partner
    # (rate 0.9 against ~0.01), which happens in about half the episodes that hold 0 (~0.66 measured)
    assert abs(together(uniform) - 1 / 3) < 0.1
    assert together(hard) > 0.55
    ep = hard.sample()
    assert ep.n_classes == 4 and len(set(ep.classes)) == 4 and len(set(labels[ep.support])) == 4
    np.testing.assert_array_equal(values[ep.classes][ep.support_labels], labels[ep.support])  # positions -> values


def test_hard_negatives_need_more_classes_than_an_episode_holds():
    labels = np.repeat(np.arange(4), 6)
    plain = EpisodeSampler(labels, n_support=2, max_classes=50, seed=1)
    hard = EpisodeSampler(labels, n_support=2, max_classes=50, seed=1, hard_fraction=0.5)
    a, b = plain.sample(), hard.sample()
    np.testing.assert_array_equal(a.support, b.support)  # all 4 classes in every episode: nothing to choose
    np.testing.assert_array_equal(a.query, b.query)


def test_hard_negative_bad_input():
    labels = np.repeat(np.arange(4), 6)
    with pytest.raises(DyntcError, match=r"hard_fraction must be in \[0, 0.5\] \(each partner label needs an anchor\), got 0.6"):
        EpisodeSampler(labels, n_support=2, hard_fraction=0.6)
    sampler = EpisodeSampler(labels, n_support=2, max_classes=3)
    ep = sampler.sample()
    with pytest.raises(DyntcError, match="query_probs has shape"):
        sampler.record(ep, np.ones((len(ep.query), 2)))
    from dyntc.core.training import TrainConfig

    with pytest.raises(DyntcError, match="hard_fraction"):
        TrainConfig(hard_fraction=-0.1)
    with pytest.raises(DyntcError, match=r"hard_fraction must be in \[0, 0.5\]"):
        TrainConfig(hard_fraction=0.9)


def test_trainable_state_leaves_out_frozen_parameters_and_loads_back():
    torch.manual_seed(0)
    frozen = torch.nn.Embedding.from_pretrained(torch.randn(5, 3), freeze=True)
    model = torch.nn.Sequential(frozen, torch.nn.Linear(3, 2))
    state = trainable_state(model)
    assert set(state) == {"1.weight", "1.bias"}
    saved = {k: v.clone() for k, v in state.items()}
    with torch.no_grad():
        model[1].weight.add_(1.0)
    load_trainable_state(model, saved)
    assert torch.equal(model[1].weight, saved["1.weight"])
    load_trainable_state(model, model.state_dict())  # a full state dict (older snapshots) loads too
    with pytest.raises(DyntcError, match=r"missing \['1.bias'\]"):
        load_trainable_state(model, {"1.weight": saved["1.weight"]})
    before = model[1].weight.clone()
    with pytest.raises(DyntcError, match=r"unknown \['2.weight'\]"):
        load_trainable_state(model, {**saved, "2.weight": torch.zeros(1)})
    assert torch.equal(model[1].weight, before)  # checked before anything was loaded


def test_fixed_norm_keeps_the_direction_and_gives_the_norm_no_gradient():
    torch.manual_seed(0)
    h = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    out = project_to_norm(h, 2.5)
    assert torch.allclose(out.norm(dim=1), torch.full((6,), 2.5, dtype=torch.float64))
    assert torch.allclose(out / 2.5, h / h.norm(dim=1, keepdim=True))
    (grad,) = torch.autograd.grad(out.sum(), h)
    assert torch.allclose((grad * h).sum(1), torch.zeros(6, dtype=torch.float64), atol=1e-12)  # no radial part
    assert torch.autograd.gradcheck(lambda x: project_to_norm(x, 2.5), (h.detach().requires_grad_(),))
    model = PrototypicalNetwork(IdentityEncoder(), "hyperbolic", fixed_norm=2.5)
    radius = torch.acosh(model.to_metric_space(h.detach())[:, 0])
    assert torch.allclose(radius, torch.full((6,), float(np.arcsinh(2.5)), dtype=torch.float64))
    assert model.config()["fixed_norm"] == 2.5 and "fixed_norm" not in PrototypicalNetwork(IdentityEncoder()).config()
    with pytest.raises(DyntcError, match="exclude each other"):
        PrototypicalNetwork(IdentityEncoder(), fixed_norm=2.0, max_norm=3.0)
    with pytest.raises(DyntcError, match="fixed_norm must be"):
        PrototypicalNetwork(IdentityEncoder(), fixed_norm=0)
