"""The training loops (dyntc.core.training) end to end on real SENT data: episodic and supervised
training, early stopping's best weights, the cosine learning rate, the fitted head, HYP's Euclidean
warm-up; bad inputs."""

import dataclasses

import numpy as np
import pytest
import torch

from _training import FAST_LR, fresh
from dyntc.core.inference import Encoded, prototypical_accuracy, supervised_accuracy
from dyntc.core.models import build_model
from dyntc.core.stopping import snapshot_key
from dyntc.core.training import TrainConfig, cosine_lr, episode_lr, fit_head, train_prototypical, train_supervised
from dyntc.errors import DyntcError


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("name", ["euc", "hyp"])
def test_prototypical_beats_majority_on_sent(sent_encoded, name):
    encoder, train, dev, test, majority = sent_encoded
    torch.manual_seed(0)
    model = build_model(name, fresh(encoder), len(train.classes))
    cfg = TrainConfig(lr=FAST_LR, max_episodes=300, eval_every=100, patience=3, eval_support_per_class=100, progress=False)
    result = train_prototypical(model, train, dev, cfg)
    acc = prototypical_accuracy(model, train, test)
    assert result.best_dev_acc is not None and len(result.history) >= 1
    assert acc > majority + 0.10, f"{name}: test acc {acc:.3f} vs majority {majority:.3f}"


@pytest.mark.data
@pytest.mark.slow
def test_mlp_beats_majority_on_sent(sent_encoded):
    encoder, train, dev, test, majority = sent_encoded
    torch.manual_seed(0)
    model = build_model("mlp", fresh(encoder), len(train.classes))
    cfg = TrainConfig(max_epochs=3, batch_size=32, patience=2, progress=False)
    train_supervised(model, train, dev, cfg)
    acc = supervised_accuracy(model, test)
    assert acc > majority + 0.10, f"mlp: test acc {acc:.3f} vs majority {majority:.3f}"


@pytest.mark.data
def test_early_stopping_restores_best_weights(sent_encoded):
    encoder, train, dev, _, _ = sent_encoded
    model = build_model("euc", fresh(encoder), len(train.classes))
    small_dev = dev.take(np.arange(60))
    cfg = TrainConfig(max_episodes=40, eval_every=10, patience=100, eval_support_per_class=20, progress=False, lr=3e-2)
    result = train_prototypical(model, train, small_dev, cfg)
    best = max(h["dev_acc"] for h in result.history)
    assert result.best_dev_acc == best
    # the restored weights reproduce the best dev accuracy (same support subset as during training)
    assert prototypical_accuracy(model, train.per_class(20, seed=0), small_dev) == pytest.approx(best)


@pytest.mark.data
def test_bad_training_inputs(sent_encoded):
    encoder, train, _, _, _ = sent_encoded
    with pytest.raises(DyntcError, match=r"texts\[1\] is empty"):
        Encoded.of(encoder, ["fine", "  "], ["a", "a"], ["a"])
    with pytest.raises(DyntcError, match="not among"):
        Encoded.of(encoder, ["fine"], ["zzz"], ["a"])
    with pytest.raises(DyntcError, match="n_support must be >= 1"):
        train_prototypical(build_model("euc", encoder, len(train.classes)), train, None, TrainConfig(n_support=0))
    tiny = train.take(np.concatenate([np.flatnonzero(train.labels == c)[:3] for c in range(len(train.classes))]))
    with pytest.raises(DyntcError, match="n_support \\+ 1 = 5"):
        train_prototypical(build_model("euc", encoder, len(train.classes)), tiny, None, TrainConfig(progress=False))
    with pytest.raises(DyntcError, match="unknown model"):
        build_model("svm", encoder, 3)


@pytest.mark.data
def test_encoder_encode_batches_without_gradient_and_takes_an_empty_list(sent_encoded):
    encoder, train, *_ = sent_encoded
    texts = ["my flight was late", "lost my bag", "rude staff at the gate again"]
    points = encoder.encode(texts, batch_size=2)
    assert points.shape == (3, encoder.output_dim) and not points.requires_grad
    assert torch.allclose(points, encoder.encode(texts[::-1])[[2, 1, 0]], atol=1e-5)  # order kept across batches
    assert encoder.encode([]).shape == (0, encoder.output_dim)


def test_cosine_lr_decays_from_base_to_zero():
    assert cosine_lr(1e-3, 1, 100) == 1e-3
    assert cosine_lr(1e-3, 51, 100) == pytest.approx(5e-4)
    assert 0 < cosine_lr(1e-3, 100, 100) < 1e-6
    rates = [cosine_lr(1.0, s, 10) for s in range(1, 11)]
    assert rates == sorted(rates, reverse=True)


@pytest.mark.data
def test_lr_cosine_changes_episodic_training_and_is_refused_for_the_mlp(sent_encoded):
    """The schedule acts (the weights differ from a constant rate after the same episodes, and the
    optimizer's last rate is cosine_lr's), and the MLP's loop refuses it by name."""
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    cfg = dict(lr=FAST_LR, max_episodes=12, eval_every=12, patience=10, eval_support_per_class=10, seed=1, progress=False)
    weights = []
    for cosine in (False, True):
        torch.manual_seed(0)
        model = build_model("euc", fresh(encoder), len(train.classes))
        seen = []
        real_step = torch.optim.Adam.step

        def spy(self, *a, **k):
            seen.append(self.param_groups[0]["lr"])
            return real_step(self, *a, **k)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.optim.Adam, "step", spy)
            train_prototypical(model, sub, dev, TrainConfig(**cfg, lr_cosine=cosine))
        assert seen == ([FAST_LR] * 12 if not cosine else [cosine_lr(FAST_LR, s, 12) for s in range(1, 13)])
        weights.append([p.detach().clone() for p in model.parameters() if p.requires_grad])
    assert any(not torch.equal(a, b) for a, b in zip(*weights))
    mlp = build_model("mlp", fresh(encoder), len(train.classes))
    with pytest.raises(DyntcError, match="lr_cosine applies to episodic"):
        train_supervised(mlp, sub, dev, TrainConfig(lr=FAST_LR, max_epochs=1, lr_cosine=True, progress=False))
    from dyntc.protocol import PAPER

    with pytest.raises(DyntcError, match=r"per_model\['sent'\]\['mlp'\] sets lr_cosine"):
        dataclasses.replace(PAPER, per_model={"sent": {"mlp": {"lr_cosine": True}}})


@pytest.mark.data
def test_fit_head_sets_the_dev_chosen_logistic_regression_and_starts_the_loop_from_it(sent_encoded):
    """fit_head's layer on the raw features predicts as the standardised regression it came from (the
    dev accuracy it reports is the head's own), beats a fresh random layer, and the supervised loop
    records it as epoch 0 and never ends below it on dev."""
    encoder, train, dev, _, _ = sent_encoded
    sub, dev_sub = train.take(np.arange(400)), dev.take(np.arange(300))
    torch.manual_seed(0)
    model = build_model("mlp", fresh(encoder), len(train.classes))
    untrained = supervised_accuracy(model, dev_sub)
    acc = fit_head(model, sub, dev_sub, seed=0)
    assert abs(acc - supervised_accuracy(model, dev_sub)) <= 2 / len(dev_sub)
    assert acc > untrained + 0.05
    torch.manual_seed(0)
    looped = build_model("mlp", fresh(encoder), len(train.classes))
    result = train_supervised(looped, sub, dev_sub, TrainConfig(lr=1e-3, max_epochs=2, batch_size=64, patience=1,
                                                               fit_head=True, progress=False))
    assert result.history[0] == {"epoch": 0, "dev_acc": acc}
    assert result.best_dev_acc >= acc and supervised_accuracy(looped, dev_sub) == result.best_dev_acc
    two = [sub.take(np.flatnonzero(sub.labels < 2)), dev_sub.take(np.flatnonzero(dev_sub.labels < 2))]
    two = [dataclasses.replace(e, classes=e.classes[:2]) for e in two]
    binary = build_model("mlp", fresh(encoder), 2)
    assert abs(fit_head(binary, *two, seed=0) - supervised_accuracy(binary, two[1])) <= 2 / len(two[1])
    missing = sub.take(np.flatnonzero(sub.labels != 0))
    with pytest.raises(DyntcError, match="fit_head needs every one of the head's"):
        fit_head(model, missing, dev_sub, seed=0)
    with pytest.raises(DyntcError, match="call model.replace_head"):
        fit_head(binary, sub, dev_sub, seed=0)


@pytest.mark.data
def test_euclidean_warmup_trains_hyp_exactly_as_euc_then_switches(sent_encoded):
    """During the warm-up a HYP model's episodes are EUC's (same encoder start and seed: identical
    weights), after it the hyperbolic metric takes over (the weights part), and dev evaluations measure
    with the model's own metric throughout; the MLP's loop and non-HYP profiles refuse it by name."""
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(400))
    cfg = dict(lr=FAST_LR, max_episodes=8, eval_every=4, patience=10, eval_support_per_class=10, seed=2, progress=False)

    def trained(name, warmup, episodes=8):
        torch.manual_seed(0)
        model = build_model(name, fresh(encoder), len(train.classes))
        result = train_prototypical(model, sub, None, TrainConfig(**{**cfg, "max_episodes": episodes}, euclidean_warmup=warmup))
        return model, result

    euc, _ = trained("euc", 0)
    warm, _ = trained("hyp", 8)
    assert warm.metric == "hyperbolic"  # restored after each episode
    for (k, a), b in zip(euc.state_dict().items(), warm.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    plain, _ = trained("hyp", 0)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(euc.state_dict().values(), plain.state_dict().values()))
    half, _ = trained("hyp", 4)
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(euc.state_dict().values(), half.state_dict().values()))
    # dev accuracy during the warm-up is the hyperbolic model's
    torch.manual_seed(0)
    model = build_model("hyp", fresh(encoder), len(train.classes))
    seen = []
    real = prototypical_accuracy

    def spy(m, *a, **k):
        seen.append(m.metric)
        return real(m, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("dyntc.core.training.prototypical_accuracy", spy)
        train_prototypical(model, sub, dev.take(np.arange(100)), TrainConfig(**cfg, euclidean_warmup=8))
    assert seen == ["hyperbolic", "hyperbolic"]
    with pytest.raises(DyntcError, match="euclidean_warmup applies to episodic training"):
        train_supervised(build_model("mlp", fresh(encoder), len(train.classes)), sub, None,
                         TrainConfig(lr=FAST_LR, max_epochs=1, euclidean_warmup=5, progress=False))
    with pytest.raises(DyntcError, match="euclidean_warmup must be a whole number"):
        TrainConfig(euclidean_warmup=-1)


@pytest.mark.data
def test_unclipped_warmup_is_eucs_training_for_a_clipped_hyp(sent_encoded):
    """With euclidean_warmup_clip=False a HYP model with a soft clip trains its warm-up exactly as EUC
    (identical weights), where the clipped warm-up does not; the clip is back after the block and for
    the hyperbolic episodes; the option needs a warm-up and a bool."""
    encoder, train, _, _, _ = sent_encoded
    sub = train.take(np.arange(400))
    cfg = dict(lr=FAST_LR, max_episodes=6, eval_every=3, patience=10, seed=2, progress=False)

    def trained(name, clip=True, episodes=6, **options):
        torch.manual_seed(0)
        model = build_model(name, fresh(encoder), len(train.classes), **options)
        train_prototypical(model, sub, None, TrainConfig(**{**cfg, "max_episodes": episodes}, euclidean_warmup=6 if name == "hyp" else 0,
                                                         euclidean_warmup_clip=clip))
        return model

    euc = trained("euc")
    unclipped = trained("hyp", clip=False, max_norm=0.5)
    clipped = trained("hyp", max_norm=0.5)
    assert unclipped.max_norm == 0.5  # the clip is restored after each episode
    for (k, a), b in zip(euc.state_dict().items(), unclipped.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(euc.state_dict().values(), clipped.state_dict().values()))
    # after the warm-up the clip acts: 3 Euclidean episodes, then 3 hyperbolic ones, differ from no clip at all
    torch.manual_seed(0)
    late = build_model("hyp", fresh(encoder), len(train.classes), max_norm=0.5)
    train_prototypical(late, sub, None, TrainConfig(**cfg, euclidean_warmup=3, euclidean_warmup_clip=False))
    torch.manual_seed(0)
    never = build_model("hyp", fresh(encoder), len(train.classes))
    train_prototypical(never, sub, None, TrainConfig(**cfg, euclidean_warmup=3))
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(late.state_dict().values(), never.state_dict().values()))
    with pytest.raises(DyntcError, match="euclidean_warmup_clip=False.*set euclidean_warmup"):
        TrainConfig(euclidean_warmup_clip=False)
    with pytest.raises(DyntcError, match="euclidean_warmup_clip must be True or False"):
        TrainConfig(euclidean_warmup=5, euclidean_warmup_clip="no")
    assert "euclidean_warmup_clip" not in snapshot_key(TrainConfig(), "prototypical")  # older snapshots resume


@pytest.mark.data
def test_euclidean_warmup_lr_trains_the_warmup_as_euc_at_that_rate(sent_encoded):
    """With its own rate the warm-up is EUC's training at that rate (identical weights), the episodes
    after it run at the model's lr; the rate needs a warm-up and must be positive."""
    encoder, train, _, _, _ = sent_encoded
    sub = train.take(np.arange(400))
    cfg = dict(max_episodes=6, eval_every=3, patience=10, seed=3, progress=False)

    def trained(name, **kw):
        torch.manual_seed(0)
        model = build_model(name, fresh(encoder), len(train.classes))
        train_prototypical(model, sub, None, TrainConfig(**cfg, **kw))
        return model

    euc = trained("euc", lr=FAST_LR)
    warm = trained("hyp", lr=1e-4, euclidean_warmup=6, euclidean_warmup_lr=FAST_LR)
    for (k, a), b in zip(euc.state_dict().items(), warm.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), k
    at_lr = trained("hyp", lr=1e-4, euclidean_warmup=6)  # the warm-up at the model's own rate differs
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(euc.state_dict().values(), at_lr.state_dict().values()))

    warm_cfg = TrainConfig(lr=1e-4, max_episodes=100, euclidean_warmup=10, euclidean_warmup_lr=1e-3)
    assert episode_lr(2e-5, 10, warm_cfg) == pytest.approx(2e-4)  # a group at a fifth of lr keeps its ratio
    assert episode_lr(2e-5, 11, warm_cfg) == 2e-5
    cosine = dataclasses.replace(warm_cfg, lr_cosine=True)
    assert episode_lr(1e-4, 11, cosine) == pytest.approx(cosine_lr(1e-4, 11, 100))
    assert episode_lr(1e-4, 1, cosine) == pytest.approx(1e-3)
    with pytest.raises(DyntcError, match="set euclidean_warmup"):
        TrainConfig(euclidean_warmup_lr=1e-3)
    with pytest.raises(DyntcError, match="euclidean_warmup_lr must be None"):
        TrainConfig(euclidean_warmup=5, euclidean_warmup_lr=0.0)
    assert "euclidean_warmup_lr" not in snapshot_key(TrainConfig(), "prototypical")
