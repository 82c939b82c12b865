"""Early stopping and resumable stages (dyntc.core.stopping) on real SENT data and synthetic
histories: the no-stop floor, the hold at chance, the patience, replaying a rule on a saved history,
and stage snapshots that resume to the same result."""

import dataclasses

import numpy as np
import pytest
import torch

from _training import FAST_LR, fresh
from dyntc.core.models import build_model
from dyntc.core.stopping import Patience, ended_under, is_held, load_snapshot, replay, snapshot_key, stop_step
from dyntc.core.training import TrainConfig, train_prototypical, train_supervised
from dyntc.errors import DyntcError


@pytest.mark.data
def test_min_steps_holds_off_early_stopping(sent_encoded):
    """With patience 1 training stops at the first evaluation without a gain; min_steps keeps it going
    (the slow start of prototypical training, docs/results.md §7), and the best weights still win."""
    encoder, train, dev, _, _ = sent_encoded
    small_dev = dev.per_class(10)
    results = []
    for min_steps in (0, 40):
        torch.manual_seed(0)
        model = build_model("euc", fresh(encoder), len(train.classes))
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
        model = build_model("euc", fresh(encoder), len(train.classes))
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
        return build_model(name, fresh(encoder), len(train.classes))

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
    train_prototypical(build_model("euc", fresh(encoder), len(train.classes)), sub, dev, TrainConfig(**cfg, snapshot=snapshot))
    torch.manual_seed(0)
    other = build_model("euc", fresh(encoder), len(train.classes))
    result = train_prototypical(other, sub, dev, TrainConfig(**{**cfg, "seed": 5}, snapshot=snapshot))
    torch.manual_seed(0)
    plain = build_model("euc", fresh(encoder), len(train.classes))
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
        result = train_prototypical(build_model("euc", fresh(encoder), len(train.classes)), sub, dev,
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
        return build_model("euc", fresh(encoder), len(train.classes))

    expected = train_prototypical(plain := model(), sub, dev, TrainConfig(**cfg, min_steps=40))
    snapshot = tmp_path / "stage.pt"
    with pytest.raises(_Interrupt):
        train_prototypical(model(), sub, dev, TrainConfig(**cfg, min_steps=20, snapshot=snapshot,
                                                          on_work=_interrupt_after(15)))
    saved = torch.load(snapshot, weights_only=True)
    assert saved["step"] == 10
    probe = model()  # what the snapshot is checked against: the loop's model configuration too
    torch.manual_seed(0)
    other_model = build_model("euc", fresh(encoder), len(train.classes), logit_scale=2.0)
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
    model = build_model("euc", fresh(encoder), len(train.classes))
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
    again = build_model("euc", fresh(encoder), len(train.classes))
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
