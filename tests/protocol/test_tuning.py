"""Per-model tuning (`dyntc reproduce --tune`): the grid, the selection rule, and that the choice
depends on the pretraining dev set only (never on the test set)."""

import json
from dataclasses import replace

import numpy as np
import pytest

import dyntc.protocol as protocol
from dyntc.protocol.data.types import Dataset, Split
from dyntc.errors import DyntcError
from dyntc.protocol import Profile, make_plan, tune_profile
from dyntc.protocol.reproduce import reproduce
from dyntc.protocol.tuning import TuningGrid, candidates, parse_grid, select, tune


# ---- grid and selection rule -----------------------------------------------------------------------


def test_candidates_are_the_product_with_the_defaults_first():
    space = {"lr": (1e-3, 3e-3, 1e-2), "dropout": (0.3, 0.5)}
    combos = candidates(space, {"lr": 3e-3, "dropout": 0.5})
    assert len(combos) == 6 and len({tuple(c.items()) for c in combos}) == 6
    assert combos[0] == {"lr": 3e-3, "dropout": 0.5}
    # defaults outside the grid: plain product order
    assert candidates(space, {"lr": 5.0, "dropout": 0.5})[0] == {"lr": 1e-3, "dropout": 0.3}


def test_select_highest_dev_score_ties_to_the_first_and_none_loses():
    a, b, c = {"lr": 1}, {"lr": 2}, {"lr": 3}
    assert select([(a, 0.4), (b, 0.6), (c, 0.5)]) == (b, 0.6)
    assert select([(a, 0.6), (b, 0.6)]) == (a, 0.6)
    # a tie keeps as many of the profile's values as possible (here: a dropout that changed nothing)
    tied = [({"lr": 1e-2, "dropout": 0.3}, 0.6), ({"lr": 1e-2, "dropout": 0.5}, 0.6)]
    assert select(tied, {"lr": 3e-3, "dropout": 0.5}) == ({"lr": 1e-2, "dropout": 0.5}, 0.6)
    assert select(tied) == ({"lr": 1e-2, "dropout": 0.3}, 0.6)
    assert select([(a, None), (b, 0.1)]) == (b, 0.1)
    with pytest.raises(DyntcError, match="no tuning candidate has a dev score"):
        select([(a, None)])
    with pytest.raises(DyntcError, match="empty"):
        select([])


def test_parse_grid_and_model_specific_entries():
    grid = parse_grid("lr=1e-3,3e-3; dropout=0.5; hyp.learn_scale=0,1; hyp.max_norm=none,4")
    assert grid.for_model("euc") == {"lr": (1e-3, 3e-3), "dropout": (0.5,)}
    assert grid.for_model("hyp")["learn_scale"] == (False, True)
    assert grid.for_model("hyp")["max_norm"] == (None, 4.0)
    assert "learn_scale" not in parse_grid("learn_scale=0,1").for_model("mlp")  # no prototype options for the MLP
    assert parse_grid(None).for_model("mlp") == TuningGrid().for_model("mlp")
    for bad, msg in (("lr", "expected SETTING"), ("momentum=1", "unknown setting"), ("lr=fast", r"--tune-grid: lr='fast': expected a number \(in lr='fast'\)"),
                     ("hyp.max_norm=4,big", "max_norm='big': expected a number or none"),
                     ("hyp.learn_scale=0,maybe", "learn_scale='maybe': give a flag"), ("lr=", "no values")):
        with pytest.raises(DyntcError, match=msg):
            parse_grid(bad)


def test_tune_picks_the_best_dev_score_per_model():
    dev = {("euc", 1e-3): 0.5, ("euc", 1e-2): 0.7, ("hyp", 1e-3): 0.6, ("hyp", 1e-2): 0.4}
    out = tune(["euc", "hyp"], parse_grid("lr=1e-3,1e-2"), lambda m: {"lr": 1e-3},
               lambda m, c: (dev[m, c["lr"]], {}))
    assert out["euc"]["chosen"] == {"lr": 1e-2} and out["euc"]["dev_acc"] == 0.7
    assert out["hyp"]["chosen"] == {"lr": 1e-3} and len(out["hyp"]["candidates"]) == 2


def test_per_model_profile_entries_are_checked():
    with pytest.raises(DyntcError, match="unknown model 'svm'"):
        Profile("x", per_model={"*": {"svm": {"lr": 1.0}}})
    with pytest.raises(DyntcError, match="momentum"):
        Profile("x", per_model={"*": {"hyp": {"momentum": 0.9}}})


# ---- the protocol's tuning uses dev only -------------------------------------------------------------


def _poisoned(data: Dataset) -> Dataset:
    """The same dataset with a shuffled, partly wrong test set (labels permuted, texts replaced)."""
    rng = np.random.default_rng(7)
    labels = list(rng.permutation(np.array(data.test.labels, dtype=object)))
    texts = ["zzz qqq " + t[::-1] for t in data.test.texts]
    return Dataset(data.name, data.train, data.dev, Split(texts, labels), data.hierarchy, dict(data.info))


def _tune(data, out, grid="lr=3e-3,3e-2;hyp.learn_scale=0,1"):
    plan = make_plan("sent", "tiny", models="euc,hyp,mlp", variants="un-tuned")
    return tune_profile(data, plan, out, grid=grid, log=lambda m: None)


@pytest.mark.data
def test_tuning_choice_ignores_the_test_set(small_sent, tmp_path):
    clean = _tune(small_sent, tmp_path / "a")
    poisoned = _tune(_poisoned(small_sent), tmp_path / "b")
    strip = lambda t: {m: [(c["values"], c["dev_acc"]) for c in e["candidates"]] for m, e in t.items()}  # noqa: E731
    assert strip(clean) == strip(poisoned)
    assert {m: e["chosen"] for m, e in clean.items()} == {m: e["chosen"] for m, e in poisoned.items()}
    assert len(clean["hyp"]["candidates"]) == 4 and len(clean["mlp"]["candidates"]) == 2
    # the scores are real dev accuracies (not all equal, not test accuracies)
    scores = [c["dev_acc"] for e in clean.values() for c in e["candidates"]]
    assert all(0 <= s <= 1 for s in scores) and len(set(scores)) > 1


@pytest.mark.data
def test_tuning_choice_follows_the_dev_set(small_sent, tmp_path, monkeypatch):
    """Poisoning dev (not test) does change the scores: the selection reads dev."""
    rng = np.random.default_rng(3)
    dev = Split(list(small_sent.dev.texts), list(rng.permutation(np.array(small_sent.dev.labels, dtype=object))))
    moved = Dataset("sent", small_sent.train, dev, small_sent.test, None, dict(small_sent.info))
    a = _tune(small_sent, tmp_path / "a", grid="lr=3e-3,3e-2")
    b = _tune(moved, tmp_path / "b", grid="lr=3e-3,3e-2")
    assert [c["dev_acc"] for c in a["euc"]["candidates"]] != [c["dev_acc"] for c in b["euc"]["candidates"]]


@pytest.mark.data
def test_reproduce_with_tune_records_and_uses_the_choice(small_sent, tmp_path, monkeypatch):
    seen = []
    original = protocol.RunPlan.model_hp

    def spy(self, model):
        hp = original(self, model)
        seen.append((model, hp["lr"]))
        return hp

    monkeypatch.setattr(protocol.RunPlan, "model_hp", spy)
    res = reproduce(small_sent, "tiny", tmp_path / "run", models="euc", variants="un-tuned", n_fine="5",
                    tune=True, tune_grid="lr=3e-3,3e-2", progress=False, log=lambda m: None)
    chosen = res["tuning"]["euc"]["chosen"]
    assert res["config"]["per_model"]["euc"]["lr"] == chosen["lr"]
    assert ("euc", chosen["lr"]) in seen
    saved = json.loads((tmp_path / "run" / "tuning.json").read_text())
    assert saved["tuning"]["euc"]["chosen"] == chosen
    # a rerun reuses the cached choice without pretraining the grid again
    calls = []
    monkeypatch.setattr(protocol.ProtocolRun, "pretrain_dev_score", lambda *a, **k: calls.append(a) or (0.0, {}))
    again = reproduce(small_sent, "tiny", tmp_path / "run", models="euc", variants="un-tuned", n_fine="5",
                      tune=True, tune_grid="lr=3e-3,3e-2", progress=False, log=lambda m: None)
    assert calls == [] and again["tuning"]["euc"]["chosen"] == chosen


def test_a_per_model_finetune_lr_reaches_that_models_fine_tuning_only():
    from dyntc.protocol.plan import model_view
    from dyntc.protocol.tuning import parse_grid

    prof = Profile("t", per_model={"*": {"mlp": {"finetune_lr": 0.01}}})
    plan, plain = make_plan("sent", prof), make_plan("sent", Profile("t"))
    config = plan.train_config
    assert config("finetune", 0, model="mlp").lr == 0.01 and config("pretrain", 0, model="mlp").lr == prof.lr
    assert config("finetune", 0, model="euc").lr == config("finetune", 0, model="hyp").lr == prof.lr
    for model in ("euc", "hyp"):  # their finished work stays valid
        assert model_view(plan.fingerprint(), model) == model_view(plain.fingerprint(), model)
    assert model_view(plan.fingerprint(), "mlp") != model_view(plain.fingerprint(), "mlp")
    with pytest.raises(DyntcError, match="finetune_lr"):  # --tune scores pretraining only: not selectable there
        parse_grid("mlp.finetune_lr=1e-3,1e-2")


@pytest.mark.data
def test_per_model_settings_reach_the_models(small_sent, tmp_path):
    """Profile defaults, per_model overrides and the MLP's lack of prototype options."""
    prof = Profile("t", per_model={"*": {"hyp": {"lr": 0.5, "max_norm": 3.0}}}, pretrain_min_episodes=7)
    plan = make_plan("sent", prof, models="euc,hyp", variants="un-tuned")
    assert plan.model_options("mlp") == {}
    assert plan.model_options("euc") == {"logit_scale": 1.0, "learn_scale": False, "max_norm": None, "fixed_norm": None,
                                         "differentiable_mean": True}
    assert plan.model_options("hyp")["max_norm"] == 3.0
    assert plan.model_hp("hyp")["lr"] == 0.5 and plan.model_hp("euc")["lr"] == prof.lr
    config = plan.train_config
    assert config("pretrain", 0, model="hyp").lr == 0.5 and config("pretrain", 0, model="euc").lr == prof.lr
    # the slow-start guard applies to EUC/HYP pretraining only
    assert config("pretrain", 0, model="hyp").min_steps == 7 and config("finetune", 0, model="hyp").min_steps == 0
    assert config("pretrain", 0, model="mlp").min_steps == 0
    assert config("pretrain", 0, model="euc").hold_at_chance and not config("finetune", 0, model="euc").hold_at_chance
    assert not config("pretrain", 0, model="mlp").hold_at_chance
    # a run's stage configs are the plan's, with the run's progress, work hook and snapshot file
    run = protocol.ProtocolRun(small_sent, plan, tmp_path / "r", progress=False, log=lambda m: None)
    assert run._cfg("pretrain", 3, model="hyp", snapshot=tmp_path / "s.pt") == replace(
        config("pretrain", 3, model="hyp"), progress=False, snapshot=tmp_path / "s.pt")
