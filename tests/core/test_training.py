"""End-to-end: train EUC, HYP and MLP on real SENT data; save/load; the `dyntc train` CLI."""

import copy
import dataclasses
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import torch

from dyntc.protocol.checkpoint import load_model, save_model
from dyntc.core.encoders import create_encoder
from dyntc.errors import DyntcError
from dyntc.core.models import build_model
from dyntc.core.stopping import Patience, ended_under, is_held, load_snapshot, replay, snapshot_key, stop_step
from dyntc.core.training import TrainConfig, cosine_lr, episode_lr, fit_head, train_prototypical, train_supervised
from dyntc.core.inference import Encoded, prototypical_accuracy, prototypical_predict, supervised_accuracy

SMALL = dict(hidden_size=64, num_layers=2, max_len=32, dropout=0.1)
# The paper's lr of 1e-3 needs ~1,000+ episodes to leave the collapsed start (loss at chance) on
# SENT; 1e-2 gets a small model there in ~100 episodes, which keeps this end-to-end test short.
FAST_LR = 1e-2


@pytest.fixture(scope="module")
def sent_encoded(sent):
    classes = sent.labels
    # torch's default generator starts from a random seed in each process: without this the encoder's
    # initial weights, and so every trajectory a test below pins (e.g. where patience stops), vary by run
    torch.manual_seed(0)
    encoder = create_encoder("sru", sent.train.texts, **SMALL)
    train, dev, test = (Encoded.of(encoder, s.texts, s.labels, classes) for s in (sent.train, sent.dev, sent.test))
    majority = Counter(test.labels.tolist()).most_common(1)[0][1] / len(test)
    return encoder, train, dev, test, majority


def _fresh(encoder):
    """An untrained copy: the module-scoped encoder itself is never trained."""
    return copy.deepcopy(encoder)


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("name", ["euc", "hyp"])
def test_prototypical_beats_majority_on_sent(sent_encoded, name):
    encoder, train, dev, test, majority = sent_encoded
    torch.manual_seed(0)
    model = build_model(name, _fresh(encoder), len(train.classes))
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
    model = build_model("mlp", _fresh(encoder), len(train.classes))
    cfg = TrainConfig(max_epochs=3, batch_size=32, patience=2, progress=False)
    train_supervised(model, train, dev, cfg)
    acc = supervised_accuracy(model, test)
    assert acc > majority + 0.10, f"mlp: test acc {acc:.3f} vs majority {majority:.3f}"


@pytest.mark.data
def test_early_stopping_restores_best_weights(sent_encoded):
    encoder, train, dev, _, _ = sent_encoded
    model = build_model("euc", _fresh(encoder), len(train.classes))
    small_dev = dev.take(np.arange(60))
    cfg = TrainConfig(max_episodes=40, eval_every=10, patience=100, eval_support_per_class=20, progress=False, lr=3e-2)
    result = train_prototypical(model, train, small_dev, cfg)
    best = max(h["dev_acc"] for h in result.history)
    assert result.best_dev_acc == best
    # the restored weights reproduce the best dev accuracy (same support subset as during training)
    assert prototypical_accuracy(model, train.per_class(20, seed=0), small_dev) == pytest.approx(best)


@pytest.mark.data
@pytest.mark.parametrize("name, options", [("hyp", {}), ("mlp", {}),
                                           ("hyp", {"learn_scale": True, "logit_scale": 0.5, "max_norm": 4.0})])
def test_save_load_round_trip(tmp_path, sent_encoded, name, options):
    encoder, train, _, test, _ = sent_encoded
    model = build_model(name, _fresh(encoder), len(train.classes), **options).eval()
    if options:
        with torch.no_grad():
            model.log_scale.fill_(0.7)  # a learnt value, not the initial one, must come back
        assert model.config()["max_norm"] == 4.0
    save_model(tmp_path / "m", model, tensors={"marker": torch.arange(3)}, meta={"classes": train.classes})
    loaded, tensors, meta = load_model(tmp_path / "m")
    assert meta["classes"] == train.classes and tensors["marker"].tolist() == [0, 1, 2]
    items = test.items[:50]
    if name == "mlp":
        batch = encoder.collate(items)
        torch.testing.assert_close(model(**batch), loaded(**batch))
    else:
        support = train.per_class(10)
        torch.testing.assert_close(prototypical_predict(model, support, items)[1], prototypical_predict(loaded, support, items)[1])
        assert loaded.config() == model.config()
        if options:
            assert loaded.scale().item() == pytest.approx(np.exp(0.7))
    assert not list(tmp_path.glob(".m.tmp-*")), "no temporary directory left behind"


@pytest.mark.data
def test_checkpoint_errors(tmp_path, sent_encoded):
    encoder, train, _, _, _ = sent_encoded
    with pytest.raises(DyntcError, match="does not exist"):
        load_model(tmp_path / "nope")
    model = build_model("euc", _fresh(encoder), len(train.classes))
    save_model(tmp_path / "m", model)
    (tmp_path / "m" / "encoder.json").unlink()
    with pytest.raises(DyntcError, match="incomplete: missing encoder.json"):
        load_model(tmp_path / "m")
    save_model(tmp_path / "m", model)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["encoder"]["hidden_size"] = 32  # weights no longer match the config
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(DyntcError, match="does not match its config"):
        load_model(tmp_path / "m")
    config["format_version"] = 999
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(DyntcError, match="format 999"):
        load_model(tmp_path / "m")


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


def _cli(*args, input=None):
    return subprocess.run([sys.executable, "-m", "dyntc", *args], capture_output=True, text=True, timeout=600,
                          input=input)


def test_cli_errors_are_one_line_without_traceback():
    for args, message in [
        (["train", "--dataset", "imdb"], "unknown dataset"),
        (["train", "--dataset", "sent", "--model", "svm"], "unknown model"),
        (["train", "--dataset", "sent", "--embeddings", "/nonexistent/glove.txt", "--episodes", "1"], "does not exist"),
    ]:
        proc = _cli(*args)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr.lower() and "Traceback" not in proc.stderr


@pytest.mark.data
@pytest.mark.slow
def test_cli_train_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = _cli("train", "--dataset", "sent", "--model", "hyp", "--out", str(out), "--episodes", "30",
                "--eval-every", "15", "--hidden", "32", "--layers", "1", "--max-len", "24", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 < metrics["test_acc"] <= 1 and metrics["steps"] == 30
    # The model is a classifier model: loaded, predicted with and served as `dyntc fit`'s are.
    from dyntc import DynamicClassifier
    from dyntc.protocol.data.datasets import load

    clf = DynamicClassifier.load(out / "model")
    assert clf.metric == "hyperbolic" and clf.n_classes_ == 10 and clf.head is None
    test = load("sent", seed=0).test
    assert clf.score(test.texts, test.labels) == pytest.approx(metrics["test_acc"], abs=0.01)
    predicted = _cli("predict", str(out / "model"), "--input", "-", input="my flight was late\n")
    assert predicted.returncode == 0 and json.loads(predicted.stdout)["label"] in clf.classes_
    from _server import Server

    server = Server(out / "model", tmp_path, token=None)
    try:
        status, body = server.call("POST", "/predict", {"texts": ["the crew was rude"]}, token=None)
        assert status == 200 and body["results"][0]["label"] in clf.classes_
    finally:
        server.stop()


def test_cli_makes_idle_openmp_threads_sleep_unless_the_user_chose():
    import os
    import subprocess
    import sys

    code = "import os, sys, dyntc.cli; assert 'torch' not in sys.modules; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "PASSIVE"  # set before torch (and its OpenMP runtime) loads
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ACTIVE"


@pytest.mark.data
def test_encoder_encode_batches_without_gradient_and_takes_an_empty_list(sent_encoded):
    encoder, train, *_ = sent_encoded
    texts = ["my flight was late", "lost my bag", "rude staff at the gate again"]
    points = encoder.encode(texts, batch_size=2)
    assert points.shape == (3, encoder.output_dim) and not points.requires_grad
    assert torch.allclose(points, encoder.encode(texts[::-1])[[2, 1, 0]], atol=1e-5)  # order kept across batches
    assert encoder.encode([]).shape == (0, encoder.output_dim)


@pytest.mark.data
def test_monitor_records_geometry_without_changing_training(sent_encoded):
    """The issue-11 diagnostics: recorded at step 0 and every evaluation, and training is unchanged."""
    from dyntc.protocol.diagnostics import geometry_stats, pretraining_monitor

    encoder, train, dev, _, _ = sent_encoded
    small_dev = dev.per_class(10)
    cfg = TrainConfig(max_episodes=20, eval_every=10, patience=100, eval_support_per_class=10, progress=False, lr=1e-2)
    runs = []
    for monitor in (None, pretraining_monitor(train, small_dev, per_class=10)):
        torch.manual_seed(0)
        model = build_model("hyp", _fresh(encoder), len(train.classes))
        runs.append((model, train_prototypical(model, train, small_dev, cfg, monitor=monitor)))
    (m0, plain), (m1, watched) = runs
    assert [h["dev_acc"] for h in plain.history] == [h["dev_acc"] for h in watched.history[1:]]
    for a, b in zip(m0.state_dict().values(), m1.state_dict().values()):
        assert torch.equal(a, b)
    assert watched.history[0]["step"] == 0 and [h["step"] for h in watched.history[1:]] == [10, 20]
    g = watched.history[-1]["geometry"]
    assert g["prototype"]["x0"]["mean"] >= 1.0 and g["query"]["h_norm"]["mean"] > 0
    # the full stats: accuracy agrees with the library's, shares add up, new/old split is consistent
    sup = train.per_class(10)
    stats = geometry_stats(m1, sup, small_dev, new_classes=[0, 1])
    assert stats["acc"] == pytest.approx(prototypical_accuracy(m1, sup, small_dev))
    assert sum(stats["pred_rate"]) == pytest.approx(1.0) and sum(stats["true_rate"]) == pytest.approx(1.0)
    assert stats["new"]["pred_share"] == pytest.approx(sum(stats["pred_rate"][:2]))
    assert stats["new"]["true_share"] + stats["old"]["true_share"] == pytest.approx(1.0)
    # margin > 0 exactly for correctly classified queries: its share is the accuracy (up to ties)
    assert np.isfinite(stats["margin"]["p50"]) and stats["d2_own"]["mean"] > 0


@pytest.mark.data
def test_min_steps_holds_off_early_stopping(sent_encoded):
    """With patience 1 training stops at the first evaluation without a gain; min_steps keeps it going
    (the slow start of prototypical training, docs/results.md §7), and the best weights still win."""
    encoder, train, dev, _, _ = sent_encoded
    small_dev = dev.per_class(10)
    results = []
    for min_steps in (0, 40):
        torch.manual_seed(0)
        model = build_model("euc", _fresh(encoder), len(train.classes))
        cfg = TrainConfig(max_episodes=40, eval_every=5, patience=1, eval_support_per_class=10, progress=False,
                          lr=1e-2, min_steps=min_steps)
        results.append(train_prototypical(model, train, small_dev, cfg))
    stopped, held = results
    assert stopped.stopped_early and stopped.steps < 40
    assert held.steps == 40 and [h["step"] for h in held.history] == list(range(5, 45, 5))
    assert held.best_dev_acc == max(h["dev_acc"] for h in held.history)
    with pytest.raises(DyntcError, match="min_steps"):
        TrainConfig(min_steps=-1)


@pytest.mark.data
def test_hold_at_chance_keeps_a_model_that_has_not_started_to_learn_training(sent_encoded):
    """A model whose training loss stays above chance (ln N_C; here an Adam step too small to move it)
    is not early-stopped with hold_at_chance, and is without it; a learning model is stopped either way."""
    encoder, train, dev, _, _ = sent_encoded
    small_dev = dev.per_class(10)

    def run(lr, hold):
        torch.manual_seed(0)
        model = build_model("euc", _fresh(encoder), len(train.classes))
        cfg = TrainConfig(max_episodes=40, eval_every=5, patience=1, eval_support_per_class=10, progress=False,
                          lr=lr, hold_at_chance=hold)
        return train_prototypical(model, train, small_dev, cfg)

    chance = np.log(len(train.classes))
    stuck_free, stuck_held = run(1e-12, False), run(1e-12, True)
    assert min(h["loss"] for h in stuck_held.history) >= chance  # EUC's start: d² in the hundreds
    assert stuck_free.stopped_early and stuck_free.steps < 40
    assert not stuck_held.stopped_early and stuck_held.steps == 40


def test_held_evaluations_do_not_count_towards_the_patience():
    """The rule on a synthetic history (chance 2.0, patience 2, floor 30): evaluations before the floor or
    at chance-level loss neither stop nor count; the patience counts from the first one that is neither."""
    cfg = TrainConfig(patience=2, min_steps=30, hold_at_chance=True)
    history = [{"step": s, "loss": loss, "dev_acc": acc} for s, loss, acc in [
        (10, 9.0, 0.30), (20, 3.0, 0.20), (30, 2.5, 0.10), (40, 2.1, 0.20),  # held: before 30, then at chance
        (50, 1.9, 0.25), (60, 1.8, 0.29)]]  # counted: 2 evaluations without beating 0.30
    assert [is_held(cfg, h["step"], h["loss"], 2.0) for h in history] == [True, True, True, True, False, False]
    assert replay(history[:5], cfg, 2.0)[0].bad == 1 and replay(history[:5], cfg, 2.0)[1] is None
    assert replay(history, cfg, 2.0)[1] == 60
    without_hold = dataclasses.replace(cfg, hold_at_chance=False)
    assert replay(history[:4], without_hold, 2.0)[1] == 40  # step 30 and 40 count: stopped at 40
    assert stop_step(history, cfg, 2.0) == 60 and stop_step(history, without_hold, 2.0) == 40
    assert stop_step(history[:5], cfg, 2.0) is None
    patience = Patience(2)
    assert patience.update(0.5) == (True, False) and patience.update(0.4, held=True) == (False, False)
    assert patience.bad == 0 and patience.update(0.4) == (False, False) and patience.update(0.6) == (True, False)


class _Interrupt(Exception):
    pass


def _interrupt_after(n: int):
    """An on_work callback that stops the loop at its n-th step (as a kill would)."""
    calls = [0]

    def on_work(_sequences: int) -> None:
        calls[0] += 1
        if calls[0] == n:
            raise _Interrupt

    return on_work


@pytest.mark.data
@pytest.mark.parametrize("name", ["euc", "hyp", "mlp", "euc-hard", "hyp-cosine"])
def test_interrupted_loop_resumes_from_its_snapshot_to_the_same_result(tmp_path, sent_encoded, name):
    """A loop killed mid-way and restarted with the same snapshot file ends exactly as an
    uninterrupted one: weights, history and step count (dropout, sampler and batch order included;
    the cosine-decayed learning rate too)."""
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    supervised = name == "mlp"
    train_fn = train_supervised if supervised else train_prototypical
    hard = name == "euc-hard"  # hard-negative episodes: the sampler's learnt confusability is resumed too
    cfg = dict(lr=FAST_LR, max_episodes=50, max_epochs=4, eval_every=10, patience=10, eval_support_per_class=20,
               hard_fraction=0.4 if hard else 0.0, max_classes=5 if hard else 50, seed=3, progress=False,
               lr_cosine=name == "hyp-cosine")
    name = {"euc-hard": "euc", "hyp-cosine": "hyp"}.get(name, name)

    def model():
        torch.manual_seed(0)
        return build_model(name, _fresh(encoder), len(train.classes))

    plain = model()
    expected = train_fn(plain, sub, dev, TrainConfig(**cfg))
    snapshot = tmp_path / "stage.pt"
    first = model()
    stop_at = 25 if not supervised else 2 * int(np.ceil(len(sub) / 64)) + 3  # mid-epoch 3 / after episode 25
    with pytest.raises(_Interrupt):
        train_fn(first, sub, dev, TrainConfig(**cfg, snapshot=snapshot, on_work=_interrupt_after(stop_at)))
    saved = torch.load(snapshot, weights_only=True)
    assert saved["step"] == (2 if supervised else 20) and not saved.get("done")
    # the frozen GloVe rows are not saved (the encoder rebuilds them), the trainable tensors all are
    frozen = {n for n, p in first.named_parameters() if not p.requires_grad}
    assert frozen and set(saved["model"]) == set(first.state_dict()) - frozen
    assert set(saved["best_state"]) == set(saved["model"])
    resumed_model = model()
    resumed = train_fn(resumed_model, sub, dev, TrainConfig(**cfg, snapshot=snapshot))
    assert resumed.steps == expected.steps and resumed.best_dev_acc == expected.best_dev_acc
    assert [{k: v for k, v in h.items()} for h in resumed.history] == expected.history
    for (k, a), b in zip(plain.state_dict().items(), resumed_model.state_dict().values()):
        assert torch.equal(a, b), k
    # the finished loop's snapshot returns its result without training again
    again_model = model()
    again = train_fn(again_model, sub, dev, TrainConfig(**cfg, snapshot=snapshot, on_work=_interrupt_after(1)))
    assert again.steps == expected.steps and again.history == expected.history
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), again_model.state_dict().values()))


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
        model = build_model("euc", _fresh(encoder), len(train.classes))
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
    mlp = build_model("mlp", _fresh(encoder), len(train.classes))
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
    model = build_model("mlp", _fresh(encoder), len(train.classes))
    fresh = supervised_accuracy(model, dev_sub)
    acc = fit_head(model, sub, dev_sub, seed=0)
    assert abs(acc - supervised_accuracy(model, dev_sub)) <= 2 / len(dev_sub)
    assert acc > fresh + 0.05
    torch.manual_seed(0)
    looped = build_model("mlp", _fresh(encoder), len(train.classes))
    result = train_supervised(looped, sub, dev_sub, TrainConfig(lr=1e-3, max_epochs=2, batch_size=64, patience=1,
                                                               fit_head=True, progress=False))
    assert result.history[0] == {"epoch": 0, "dev_acc": acc}
    assert result.best_dev_acc >= acc and supervised_accuracy(looped, dev_sub) == result.best_dev_acc
    two = [sub.take(np.flatnonzero(sub.labels < 2)), dev_sub.take(np.flatnonzero(dev_sub.labels < 2))]
    two = [dataclasses.replace(e, classes=e.classes[:2]) for e in two]
    binary = build_model("mlp", _fresh(encoder), 2)
    assert abs(fit_head(binary, *two, seed=0) - supervised_accuracy(binary, two[1])) <= 2 / len(two[1])
    missing = sub.take(np.flatnonzero(sub.labels != 0))
    with pytest.raises(DyntcError, match="fit_head needs every one of the head's"):
        fit_head(model, missing, dev_sub, seed=0)
    with pytest.raises(DyntcError, match="call model.replace_head"):
        fit_head(binary, sub, dev_sub, seed=0)


def test_finetune_fit_head_reaches_only_the_mlp_fine_tuning_stage():
    from dyntc.protocol import PAPER, make_plan

    profile = dataclasses.replace(PAPER, per_model={"sent": {"mlp": {"finetune_fit_head": True}}})
    plan = make_plan("sent", profile)
    assert plan.train_config("finetune", 0, model="mlp").fit_head
    assert not plan.train_config("pretrain", 0, model="mlp").fit_head
    assert not plan.train_config("scratch", 0, model="mlp").fit_head
    assert not plan.train_config("finetune", 0, model="euc").fit_head
    assert not make_plan("wos", PAPER).train_config("finetune", 0, model="mlp").fit_head
    assert all(make_plan(d, PAPER).train_config("finetune", 0, model="mlp").fit_head for d in ("sent", "news"))
    with pytest.raises(DyntcError, match=r"per_model\['sent'\]\['euc'\] sets finetune_fit_head"):
        dataclasses.replace(PAPER, per_model={"sent": {"euc": {"finetune_fit_head": True}}})
    assert "fit_head" not in snapshot_key(TrainConfig(), "supervised")  # old snapshots keep their key
    assert "('fit_head', True)" in snapshot_key(TrainConfig(fit_head=True), "supervised")


def test_snapshot_key_leaves_out_lr_cosine_at_its_default():
    """Stages snapshotted before lr_cosine existed still resume: the key names it only when on."""
    assert "lr_cosine" not in snapshot_key(TrainConfig(), "prototypical")
    assert "('lr_cosine', True)" in snapshot_key(TrainConfig(lr_cosine=True), "prototypical")


def test_snapshot_key_ignores_which_glove_file_the_vectors_came_from():
    """A stage snapshotted with the packaged vectors resumes with a subset file of them (a GPU host
    without the package) and back; the encoder's architecture stays in the key."""
    class Encoder(torch.nn.Module):
        def __init__(self, path, hidden=8):
            super().__init__()
            self.path, self.hidden = path, hidden

        def config(self):
            return {"kind": "glove-sru", "hidden_size": self.hidden, "embeddings": self.path}

    class Model(torch.nn.Module):
        def __init__(self, path, hidden=8):
            super().__init__()
            self.encoder = Encoder(path, hidden)

    def key(path, hidden=8):
        return snapshot_key(TrainConfig(), "prototypical", Model(path, hidden))

    assert key("/a/glove-news.txt") == key(None) == key("/b/glove.txt")
    assert key(None, hidden=16) != key(None)


@pytest.mark.data
def test_snapshot_of_another_config_is_ignored(tmp_path, sent_encoded):
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    snapshot = tmp_path / "stage.pt"
    cfg = dict(lr=FAST_LR, max_episodes=20, eval_every=10, patience=10, eval_support_per_class=20, progress=False)
    torch.manual_seed(0)
    train_prototypical(build_model("euc", _fresh(encoder), len(train.classes)), sub, dev, TrainConfig(**cfg, snapshot=snapshot))
    torch.manual_seed(0)
    other = build_model("euc", _fresh(encoder), len(train.classes))
    result = train_prototypical(other, sub, dev, TrainConfig(**{**cfg, "seed": 5}, snapshot=snapshot))
    torch.manual_seed(0)
    plain = build_model("euc", _fresh(encoder), len(train.classes))
    expected = train_prototypical(plain, sub, dev, TrainConfig(**{**cfg, "seed": 5}))
    assert result.history == expected.history  # trained afresh, not the seed-0 snapshot's result


@pytest.mark.data
def test_unreadable_snapshot_warns_and_trains_afresh(tmp_path, sent_encoded):
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    snapshot = tmp_path / "stage.pt"
    snapshot.write_bytes(b"not a torch file")
    cfg = dict(lr=FAST_LR, max_episodes=10, eval_every=10, patience=10, eval_support_per_class=20, progress=False)
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="stage.pt is unreadable"):
        result = train_prototypical(build_model("euc", _fresh(encoder), len(train.classes)), sub, dev,
                                    TrainConfig(**cfg, snapshot=snapshot))
    assert result.steps == 10 and torch.load(snapshot, weights_only=True)["done"]


@pytest.mark.data
def test_raising_the_no_stop_floor_keeps_a_running_stage_s_snapshot(tmp_path, sent_encoded):
    """A stage interrupted under min_steps=20 resumes under min_steps=40 (a slow start that outlasts
    the floor) and ends exactly as an uninterrupted loop with floor 40; a lower floor fits unless the
    saved scores would have stopped the loop under it."""
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    # budget 50: dev accuracy still rises by ~5 points from step 40 to 50, so no machine's float
    # rounding stops the uninterrupted loop early (from 50 to 60 it rose by 0.3, a knife edge)
    cfg = dict(lr=FAST_LR, max_episodes=50, eval_every=10, patience=1, eval_support_per_class=20, seed=2, progress=False)

    def model():
        torch.manual_seed(0)
        return build_model("euc", _fresh(encoder), len(train.classes))

    expected = train_prototypical(plain := model(), sub, dev, TrainConfig(**cfg, min_steps=40))
    snapshot = tmp_path / "stage.pt"
    with pytest.raises(_Interrupt):
        train_prototypical(model(), sub, dev, TrainConfig(**cfg, min_steps=20, snapshot=snapshot,
                                                          on_work=_interrupt_after(15)))
    saved = torch.load(snapshot, weights_only=True)
    assert saved["step"] == 10
    probe = model()  # what the snapshot is checked against: the loop's model configuration too
    torch.manual_seed(0)
    other_model = build_model("euc", _fresh(encoder), len(train.classes), logit_scale=2.0)
    assert load_snapshot(TrainConfig(**cfg, min_steps=40, snapshot=snapshot), "prototypical", model=other_model) is None
    assert load_snapshot(TrainConfig(**cfg, min_steps=15, snapshot=snapshot), "prototypical", model=probe) is not None
    assert load_snapshot(TrainConfig(**cfg, min_steps=5, snapshot=snapshot), "prototypical", model=probe) is not None
    # a lower floor fits unless the saved dev scores would have stopped the loop under it: here a
    # non-improving 2nd evaluation (patience 1) at step 20 stops a floor <= 20, not a floor of 25
    edited = tmp_path / "edited.pt"
    torch.save({**saved, "step": 20, "history": [{"step": 10, "dev_acc": 0.5}, {"step": 20, "dev_acc": 0.4}]}, edited)
    assert load_snapshot(TrainConfig(**cfg, min_steps=25, snapshot=edited), "prototypical", model=probe) is not None
    # ... and a snapshot that went on past where the rule stops it is that stage's end when no later
    # score beat the best by then (its best weights are the rule's): here the rule stops at step 20
    ended = load_snapshot(TrainConfig(**cfg, min_steps=15, snapshot=edited), "prototypical", model=probe)
    assert ended["done"] and all(torch.equal(ended["model"][k], saved["best_state"][k]) for k in saved["best_state"])
    assert (ended["result"]["steps"], ended["result"]["stopped_early"], ended["result"]["best_dev_acc"]) == (20, True, 0.5)
    beaten = tmp_path / "beaten.pt"  # a score above 0.5 after step 20: the rule's weights are lost
    torch.save({**saved, "step": 30, "history": [{"step": 10, "dev_acc": 0.5}, {"step": 20, "dev_acc": 0.4},
                                                 {"step": 30, "dev_acc": 0.6}]}, beaten)
    with pytest.warns(UserWarning, match="went on past episode/epoch 20.*starts from its beginning"):
        assert load_snapshot(TrainConfig(**cfg, min_steps=15, snapshot=beaten), "prototypical", model=probe) is None
    # the patience is part of the replayed rule too; what the loop computes (here its seed) is the key
    assert load_snapshot(TrainConfig(**{**cfg, "patience": 2}, min_steps=40, snapshot=snapshot), "prototypical", model=probe) is not None
    assert load_snapshot(TrainConfig(**{**cfg, "seed": 3}, min_steps=40, snapshot=snapshot), "prototypical", model=probe) is None
    resumed_model = model()
    resumed = train_prototypical(resumed_model, sub, dev, TrainConfig(**cfg, min_steps=40, snapshot=snapshot))
    assert resumed.history == expected.history and resumed.steps == expected.steps
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), resumed_model.state_dict().values()))
    # the finished stage's snapshot holds a result decided under floor 40: it fits that floor, and
    # floor 50 (the budget) only because it ran to its budget (see the next test)
    assert load_snapshot(TrainConfig(**cfg, min_steps=40, snapshot=snapshot), "prototypical", model=probe)["done"]
    assert expected.steps == 50 and not expected.stopped_early
    assert load_snapshot(TrainConfig(**cfg, min_steps=50, snapshot=snapshot), "prototypical", model=probe)["done"]


@pytest.mark.data
def test_a_stage_run_to_its_budget_fits_any_rule_that_would_not_have_stopped_it(tmp_path, sent_encoded):
    """A selection run without early stopping (floor = budget) ends as the real run's stage would when
    that stage's rule, replayed on the dev scores, does not stop before the budget: its finished snapshot
    then serves that rule too (and gives the same result at once); a rule that would have stopped sooner,
    or a stage that stopped early, does not fit."""
    encoder, train, dev, _, _ = sent_encoded
    sub = train.take(np.arange(600))
    cfg = dict(lr=FAST_LR, max_episodes=30, eval_every=10, eval_support_per_class=20, seed=2, progress=False)
    snapshot = tmp_path / "stage.pt"
    torch.manual_seed(0)
    model = build_model("euc", _fresh(encoder), len(train.classes))
    result = train_prototypical(model, sub, dev, TrainConfig(**cfg, patience=1, min_steps=30, snapshot=snapshot))
    assert result.steps == 30 and not result.stopped_early
    saved = torch.load(snapshot, weights_only=True)
    def history(*scores):
        return [{"step": 10 * (i + 1), "dev_acc": acc, "loss": 1.0} for i, acc in enumerate(scores)]

    declining = tmp_path / "declining.pt"
    torch.save({**saved, "result": {**saved["result"], "history": history(0.5, 0.4, 0.3)}}, declining)
    rising = tmp_path / "rising.pt"
    torch.save({**saved, "result": {**saved["result"], "history": history(0.3, 0.4, 0.5)}}, rising)
    early = tmp_path / "early.pt"
    torch.save({**saved, "result": {**saved["result"], "history": history(0.3, 0.4, 0.5), "stopped_early": True}}, early)

    def fits(path, **rule):
        return load_snapshot(TrainConfig(**cfg, **rule, snapshot=path), "prototypical", model=model) is not None

    assert fits(rising, patience=1, min_steps=0)  # a rule that never stops on rising scores
    assert fits(declining, patience=2, min_steps=0)  # stops only at the last evaluation: the budget anyway
    # ... and then says so, as a fresh loop under that rule would (it stops at the budget's evaluation)
    assert load_snapshot(TrainConfig(**cfg, patience=2, min_steps=0, snapshot=declining), "prototypical",
                         model=model)["result"]["stopped_early"]
    # would have stopped at step 20, with step 10's weights, which the stage restored too: cut back there
    cut = load_snapshot(TrainConfig(**cfg, patience=1, min_steps=0, snapshot=declining), "prototypical", model=model)
    assert cut["done"] and cut["result"]["history"] == history(0.5, 0.4) and cut["result"]["steps"] == 20
    late = tmp_path / "late.pt"  # ... not where a later score beat the best: the stage restored other weights
    torch.save({**saved, "result": {**saved["result"], "history": history(0.5, 0.4, 0.6)}}, late)
    assert not fits(late, patience=1, min_steps=0)
    assert fits(declining, patience=1, min_steps=25)  # its floor holds step 20
    assert not fits(early, patience=1, min_steps=0)
    # what the fitted snapshot gives: the saved result at once, its weights loaded
    torch.manual_seed(0)
    again = build_model("euc", _fresh(encoder), len(train.classes))
    replayed = train_prototypical(again, sub, dev, TrainConfig(**cfg, patience=10, min_steps=0, snapshot=snapshot))
    assert replayed.history == result.history and replayed.steps == 30
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_ended_under_replays_held_evaluations_and_epoch_histories():
    """ended_under on synthetic histories: held evaluations (before the floor, or at a chance-level
    loss) neither stop nor count under the new rule; a supervised loop's epochs (with an epoch-0
    record) are its steps; a loop cut short (a time budget) fits no other rule; a bad kind is refused."""
    cfg = TrainConfig(max_episodes=40, max_epochs=4, patience=1, min_steps=0, hold_at_chance=True)
    history = [{"step": 10 * (i + 1), "loss": loss, "dev_acc": acc}
               for i, (loss, acc) in enumerate([(3.0, 0.3), (2.5, 0.2), (1.0, 0.4), (0.9, 0.5)])]
    ran = {"history": history, "stopped_early": False}
    assert ended_under(ran, cfg, "prototypical", chance=2.0) == ran  # step 20 is held: loss 2.5 >= chance
    assert ended_under(ran, cfg, "prototypical", chance=3.5) is None  # no hold: patience 1 stops at step 20
    cut = {"history": history[:3], "stopped_early": False}  # ended at 30 of 40 episodes: out of time
    assert ended_under(cut, cfg, "prototypical", chance=2.0) is None
    epochs = {"history": [{"epoch": e, "loss": 1.0, "dev_acc": a} for e, a in enumerate([0.2, 0.3, 0.25, 0.2])],
              "stopped_early": True}
    assert ended_under(epochs, TrainConfig(patience=2), "supervised", chance=None) == epochs  # stops at epoch 3 too
    # patience 1 stops at epoch 2, sooner, but with epoch 1's weights, which the loop restored too
    assert ended_under(epochs, cfg, "supervised", chance=None) == {**epochs, "history": epochs["history"][:3], "steps": 2,
                                                                   "best_dev_acc": 0.3}
    assert ended_under(epochs, TrainConfig(patience=3), "supervised", chance=None) is None  # would go on
    with pytest.raises(ValueError, match="kind must be one of"):
        ended_under(ran, cfg, "proto", chance=None)


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
        model = build_model(name, _fresh(encoder), len(train.classes))
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
    model = build_model("hyp", _fresh(encoder), len(train.classes))
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
        train_supervised(build_model("mlp", _fresh(encoder), len(train.classes)), sub, None,
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
        model = build_model(name, _fresh(encoder), len(train.classes), **options)
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
    late = build_model("hyp", _fresh(encoder), len(train.classes), max_norm=0.5)
    train_prototypical(late, sub, None, TrainConfig(**cfg, euclidean_warmup=3, euclidean_warmup_clip=False))
    torch.manual_seed(0)
    never = build_model("hyp", _fresh(encoder), len(train.classes))
    train_prototypical(never, sub, None, TrainConfig(**cfg, euclidean_warmup=3))
    assert any(not torch.allclose(a, b, atol=1e-6) for a, b in zip(late.state_dict().values(), never.state_dict().values()))
    with pytest.raises(DyntcError, match="euclidean_warmup_clip=False.*set euclidean_warmup"):
        TrainConfig(euclidean_warmup_clip=False)
    with pytest.raises(DyntcError, match="euclidean_warmup_clip must be True or False"):
        TrainConfig(euclidean_warmup=5, euclidean_warmup_clip="no")
    assert "euclidean_warmup_clip" not in snapshot_key(TrainConfig(), "prototypical")  # older snapshots resume


def test_euclidean_warmup_reaches_only_hyp_pretraining_and_keeps_other_work_valid():
    from dyntc.protocol import PAPER, make_plan
    from dyntc.protocol.plan import model_view
    from dyntc.protocol.profiles import parse_setting

    profile = dataclasses.replace(PAPER, per_model={"sent": {"hyp": {"euclidean_warmup": 2000}}})
    plan = make_plan("sent", profile)
    assert plan.train_config("pretrain", 0, model="hyp").euclidean_warmup == 2000
    assert plan.train_config("finetune", 0, model="hyp").euclidean_warmup == 0
    assert plan.train_config("scratch", 0, model="hyp").euclidean_warmup == 0
    assert plan.train_config("pretrain", 0, model="euc").euclidean_warmup == 0
    # set for the whole profile it still acts on HYP alone, and EUC's and the MLP's work stays valid
    everyone = make_plan("sent", PAPER, settings={"euclidean_warmup": "2000"})
    assert everyone.train_config("pretrain", 0, model="hyp").euclidean_warmup == 2000
    assert everyone.train_config("pretrain", 0, model="mlp").euclidean_warmup == 0
    base = make_plan("sent", PAPER).fingerprint()
    for model in ("euc", "mlp"):
        assert model_view(everyone.fingerprint(), model) == model_view(base, model)
    assert model_view(everyone.fingerprint(), "hyp") != model_view(base, "hyp")
    assert "euclidean_warmup" not in json.dumps(base)  # runs recorded before it existed still resume
    assert "euclidean_warmup" not in snapshot_key(TrainConfig(), "prototypical")
    for model in ("euc", "mlp"):
        with pytest.raises(DyntcError, match=rf"per_model\['sent'\]\['{model}'\] sets euclidean_warmup"):
            dataclasses.replace(PAPER, per_model={"sent": {model: {"euclidean_warmup": 100}}})
    assert parse_setting("euclidean_warmup", "1500") == 1500
    with pytest.raises(DyntcError, match="whole number of episodes"):
        parse_setting("euclidean_warmup", "1e3")


@pytest.mark.data
def test_euclidean_warmup_lr_trains_the_warmup_as_euc_at_that_rate(sent_encoded):
    """With its own rate the warm-up is EUC's training at that rate (identical weights), the episodes
    after it run at the model's lr; the rate needs a warm-up and must be positive."""
    encoder, train, _, _, _ = sent_encoded
    sub = train.take(np.arange(400))
    cfg = dict(max_episodes=6, eval_every=3, patience=10, seed=3, progress=False)

    def trained(name, **kw):
        torch.manual_seed(0)
        model = build_model(name, _fresh(encoder), len(train.classes))
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


def test_euclidean_warmup_lr_reaches_only_hyp_pretraining_with_a_warmup():
    from dyntc.protocol import PAPER, make_plan
    from dyntc.protocol.plan import model_view
    from dyntc.protocol.profiles import parse_setting

    hyp = {"euclidean_warmup": 2000, "euclidean_warmup_lr": 1e-3, "lr": 3e-4}
    plan = make_plan("news", dataclasses.replace(PAPER, per_model={"news": {"hyp": hyp}}))
    pre = plan.train_config("pretrain", 0, model="hyp")
    assert (pre.lr, pre.euclidean_warmup, pre.euclidean_warmup_lr) == (3e-4, 2000, 1e-3)
    assert plan.train_config("finetune", 0, model="hyp").euclidean_warmup_lr is None
    assert plan.train_config("pretrain", 0, model="euc").euclidean_warmup_lr is None
    # a rate without a warm-up is refused when the run is planned, before any work (SENT: its profile
    # has no warm-up; NEWS's `paper` HYP has one)
    with pytest.raises(DyntcError, match="set euclidean_warmup"):
        make_plan("sent", PAPER, settings={"euclidean_warmup_lr": "1e-3"})
    with pytest.raises(DyntcError, match="or euclidean_warmup_lr=none"):
        make_plan("news", PAPER, settings={"euclidean_warmup": "0"})
    with pytest.raises(DyntcError, match="or scratch_unclipped_warmup=no"):  # NEWS HYP's scratch warm-up is unclipped
        make_plan("news", PAPER, settings={"euclidean_warmup": "0", "euclidean_warmup_lr": "none"})
    off = make_plan("news", PAPER, settings={"euclidean_warmup": "0", "euclidean_warmup_lr": "none",
                                             "scratch_unclipped_warmup": "no"})
    assert off.train_config("pretrain", 0, model="hyp").euclidean_warmup == 0
    assert make_plan("sent", PAPER, models="euc", settings={"euclidean_warmup_lr": "1e-3"})  # no HYP: nothing to warm
    both = make_plan("sent", PAPER, settings={"euclidean_warmup": "100", "euclidean_warmup_lr": "1e-3"})
    base = make_plan("sent", PAPER).fingerprint()
    assert model_view(both.fingerprint(), "euc") == model_view(base, "euc")
    assert model_view(both.fingerprint(), "hyp") != model_view(base, "hyp")
    assert "euclidean_warmup_lr" not in json.dumps(base)
    with pytest.raises(DyntcError, match=r"per_model\['news'\]\['euc'\] sets euclidean_warmup_lr"):
        dataclasses.replace(PAPER, per_model={"news": {"euc": {"euclidean_warmup_lr": 1e-3}}})
    assert parse_setting("euclidean_warmup_lr", "1e-3") == 1e-3
    assert parse_setting("euclidean_warmup_lr", "none") is None
