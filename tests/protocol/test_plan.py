"""A run's plan (`dyntc.protocol.plan`): its options checked before any work, the selections kept out of
the fingerprint, each stage's settings, and the views of a fingerprint that a model's cells depend on."""

import dataclasses
import json

import pytest

import dyntc.protocol as protocol
from dyntc.errors import DyntcError
from dyntc.core.stopping import snapshot_key
from dyntc.core.training import TrainConfig
from dyntc.protocol import make_plan, model_view


def test_unknown_profile_model_variant_and_setting():
    with pytest.raises(DyntcError, match="unknown profile 'huge'"):
        make_plan("sent", "huge")
    with pytest.raises(DyntcError, match="unknown model"):
        make_plan("sent", "quick", models="euc,svm")
    with pytest.raises(DyntcError, match="unknown variant"):
        make_plan("sent", "quick", variants="tuned")
    with pytest.raises(DyntcError, match="unknown profile setting 'episodes'"):
        make_plan("sent", "quick", settings={"episodes": "3"})
    with pytest.raises(DyntcError, match="expected an integer"):
        make_plan("sent", "quick", settings={"pretrain_episodes": "many"})
    with pytest.raises(DyntcError, match="--set learn_scale='maybe': give a flag"):  # not silently False
        make_plan("sent", "quick", settings={"learn_scale": "maybe"})
    assert make_plan("sent", "quick", settings={"learn_scale": "yes"}).hp["learn_scale"] is True

    with pytest.raises(DyntcError, match="splits cannot be none"):
        make_plan("sent", "quick", settings={"splits": "none"})
    assert make_plan("sent", "quick", settings={"test_per_class": "none"}).hp["test_per_class"] is None


def test_dataset_aliases_get_the_datasets_hyperparameters():
    alias, canonical = make_plan("20news", "quick"), make_plan("news", "quick")
    assert alias.dataset == "news" and alias.hp == canonical.hp
    assert alias.hp["max_len"] == 128 != make_plan("sent", "quick").hp["max_len"]


def test_scratch_n_fine_limits_only_the_scratch_cells_and_not_the_fingerprint():
    full = make_plan("sent", "paper")
    some = make_plan("sent", "paper", scratch_n_fine="100,5")
    assert some.scratch_n_fine == (5, 100) and some.fingerprint() == full.fingerprint()
    assert set(full.cells(0)) - set(some.cells(0)) == {(m, "scratch", n, 0) for m in ("mlp", "euc", "hyp") for n in (10, 20)}
    with pytest.raises(DyntcError, match="must list some of the run's n_fine values \\[5, 10, 20, 100\\]; got \\[7\\]"):
        make_plan("sent", "paper", scratch_n_fine="7")
    with pytest.raises(DyntcError, match="scratch variant is not among --variants"):
        make_plan("sent", "paper", variants="fine-tuned", scratch_n_fine="5")


def test_scratch_ends_only_profile_field_is_a_selection():
    plain = make_plan("sent", "quick", settings={"scratch_ends_only": "0"})
    ends = make_plan("sent", "quick", settings={"scratch_ends_only": "1"})
    assert plain.scratch_n_fine is None and ends.scratch_n_fine == (5, 100)
    assert ends.fingerprint() == plain.fingerprint()
    assert make_plan("sent", "quick", n_fine="10,20,50", settings={"scratch_ends_only": "1"}).scratch_n_fine == (10, 50)
    assert make_plan("sent", "quick", n_fine="20", settings={"scratch_ends_only": "1"}).scratch_n_fine == (20,)
    explicit = make_plan("sent", "quick", scratch_n_fine="20", settings={"scratch_ends_only": "1"})
    assert explicit.scratch_n_fine == (20,)  # the option wins over the profile
    assert make_plan("sent", "quick", variants="fine-tuned", settings={"scratch_ends_only": "1"}).scratch_n_fine is None


def test_only_splits_is_a_checked_selection_outside_the_fingerprint():
    full = make_plan("news", "paper")
    some = make_plan("news", "paper", only_splits="3,1,3")
    assert some.only_splits == (1, 3) and some.selected_splits() == [1, 3] and full.selected_splits() == [0, 1, 2, 3, 4]
    assert some.fingerprint() == full.fingerprint()
    for bad in ("5", "-1", "", "a"):
        with pytest.raises(DyntcError, match="--only-splits"):
            make_plan("news", "paper", only_splits=bad)


def test_n_fine_must_exceed_n_support_for_metric_models():
    with pytest.raises(DyntcError, match="n_support \\+ 1 = 5"):
        make_plan("sent", "quick", n_fine="4,10")
    with pytest.raises(DyntcError, match=">= 1"):
        make_plan("sent", "quick", n_fine="0,10", models="mlp")
    # MLP alone, or un-tuned prototypes only, need no episodes: small n_fine is fine there
    assert make_plan("sent", "quick", n_fine="2,10", models="mlp").n_fine == (2, 10)
    assert make_plan("sent", "quick", n_fine="1", variants="un-tuned").n_fine == (1,)
    assert make_plan("sent", "quick", n_fine="3", settings={"n_support": "2"}).n_fine == (3,)


@pytest.mark.parametrize("p", [0.0, 1.0, 1.3, -0.1])
def test_p_outside_unit_interval(p):
    with pytest.raises(DyntcError, match="must be in \\(0, 1\\)"):
        make_plan("sent", "quick", p=p)


def test_logreg_needs_a_pretrained_encoder():
    with pytest.raises(DyntcError, match="needs --encoder minilm"):
        make_plan("sent", "quick", models="euc,logreg", encoder="sru")


def test_scratch_view_names_what_scratch_cells_depend_on():
    """Scratch cells train a fresh model with the fine-tuning settings: pretraining-only settings (and
    the lr, once finetune_lr is set) leave them valid; model options and the scratch lr do not."""
    from dyntc.protocol.plan import scratch_view

    def fp(hyp, **top):
        fingerprint = make_plan("news", "paper", settings={k: str(v) for k, v in top.items()}).fingerprint()
        return {**fingerprint, "hyperparameters": {**fingerprint["hyperparameters"], "per_model": {"hyp": hyp}}}

    base = fp({"lr": 3e-4, "max_norm": 10.0})
    same = [fp({"lr": 1e-3, "finetune_lr": 3e-4, "max_norm": 10.0, "euclidean_warmup": 2000, "euclidean_warmup_lr": 1e-3}),
            fp({"lr": 3e-4, "max_norm": 10.0}, pretrain_episodes=500, pretrain_patience=3, knn_k=3)]
    other = [fp({"lr": 1e-3, "max_norm": 10.0}), fp({"lr": 3e-4, "max_norm": 5.0}),
             fp({"lr": 3e-4, "max_norm": 10.0}, finetune_episodes=50), fp({"lr": 3e-4, "max_norm": 10.0}, dropout=0.2)]
    assert all(scratch_view(f, "hyp") == scratch_view(base, "hyp") for f in same)
    assert all(scratch_view(f, "hyp") != scratch_view(base, "hyp") for f in other)
    assert scratch_view(same[0], "euc") == scratch_view(base, "euc")  # HYP's per-model settings are not EUC's


def test_scratch_like_pretraining_trains_a_fresh_metric_model_with_the_pretraining_recipe():
    """NEWS HYP's scratch cells (paper) take the pretraining stage's lr, Euclidean warm-up, slow-start
    guard and budget; its fine-tuned cells, EUC's scratch cells and SENT's do not. The MLP may not set it."""
    news = make_plan("news", "paper")
    scratch, finetune = news.train_config("scratch", 0, model="hyp"), news.train_config("finetune", 0, model="hyp")
    pretrain = news.train_config("pretrain", 0, model="hyp")
    for field in ("lr", "euclidean_warmup", "euclidean_warmup_lr", "min_steps", "hold_at_chance", "max_episodes", "patience"):
        assert getattr(scratch, field) == getattr(pretrain, field), field
    assert (scratch.lr, scratch.euclidean_warmup, scratch.min_steps, scratch.hold_at_chance) == (1e-3, 2000, 3000, True)
    assert (finetune.lr, finetune.euclidean_warmup, finetune.min_steps, finetune.hold_at_chance) == (3e-4, 0, 0, False)
    euc = news.train_config("scratch", 0, model="euc")
    assert euc == news.train_config("finetune", 0, model="euc") and euc.min_steps == 0
    sent = make_plan("sent", "paper")
    assert sent.train_config("scratch", 0, model="hyp") == sent.train_config("finetune", 0, model="hyp")
    everyone = make_plan("sent", "paper", settings={"scratch_like_pretraining": "yes"})
    assert everyone.train_config("scratch", 0, model="euc").min_steps == 3000
    assert everyone.train_config("scratch", 0, model="mlp", n_train=50) == sent.train_config("scratch", 0, model="mlp", n_train=50)
    with pytest.raises(DyntcError, match="scratch_like_pretraining.*EUC/HYP.*set it for euc or hyp"):
        dataclasses.replace(protocol.PAPER, per_model={"*": {"mlp": {"scratch_like_pretraining": True}}})


def test_scratch_like_pretraining_is_read_by_scratch_cells_only():
    """The setting is in the scratch cells' view (which then follows the pretraining settings, not the
    fine-tuning ones) and in no other cell's or pretrained weights' view."""
    from dyntc.protocol.plan import scratch_view

    def fp(hyp, **top):
        fingerprint = make_plan("news", "paper", settings={k: str(v) for k, v in top.items()}).fingerprint()
        return {**fingerprint, "hyperparameters": {**fingerprint["hyperparameters"], "per_model": {"hyp": hyp}}}

    plain = fp({"lr": 1e-3, "finetune_lr": 3e-4, "euclidean_warmup": 2000})
    like = fp({"lr": 1e-3, "finetune_lr": 3e-4, "euclidean_warmup": 2000, "scratch_like_pretraining": True})
    assert scratch_view(like, "hyp") != scratch_view(plain, "hyp")
    assert model_view(like, "hyp") == model_view(plain, "hyp")
    assert model_view(like, "hyp", pretraining=True) == model_view(plain, "hyp", pretraining=True)
    assert scratch_view(like, "euc") == scratch_view(plain, "euc") and model_view(like, "euc") == model_view(plain, "euc")
    # under it, scratch follows the pretraining lr and warm-up, not finetune_lr nor the fine-tuning budget
    like_ft = fp({"lr": 1e-3, "finetune_lr": 1e-2, "euclidean_warmup": 2000, "scratch_like_pretraining": True}, finetune_episodes=50)
    like_pre = fp({"lr": 3e-4, "finetune_lr": 3e-4, "euclidean_warmup": 2000, "scratch_like_pretraining": True})
    like_warm = fp({"lr": 1e-3, "finetune_lr": 3e-4, "euclidean_warmup": 500, "scratch_like_pretraining": True})
    assert scratch_view(like_ft, "hyp") == scratch_view(like, "hyp")
    assert scratch_view(like_pre, "hyp") != scratch_view(like, "hyp") and scratch_view(like_warm, "hyp") != scratch_view(like, "hyp")
    # the current paper profile's NEWS HYP is `like` with its other settings
    assert make_plan("news", "paper").model_hp("hyp")["scratch_like_pretraining"] is True


def test_scratch_unclipped_warmup_reaches_hyp_scratch_cells_only():
    """scratch_unclipped_warmup turns HYP's soft clip off in its scratch cells' Euclidean warm-up (under
    scratch_like_pretraining): not in its pretraining nor in EUC's cells; only the HYP scratch view
    changes (runs recorded before it existed keep theirs); other models may not set it."""
    from dyntc.protocol.plan import scratch_view

    unclipped = make_plan("news", "paper")  # the paper profile's NEWS HYP sets it
    clipped_hyp = {k: v for k, v in protocol.PAPER.per_model["news"]["hyp"].items() if k != "scratch_unclipped_warmup"}
    profile = dataclasses.replace(protocol.PAPER, per_model={**protocol.PAPER.per_model, "news": {
        **protocol.PAPER.per_model["news"], "hyp": clipped_hyp}})  # the profile before it set the field
    news = make_plan("news", profile)
    assert unclipped.train_config("scratch", 0, model="hyp").euclidean_warmup_clip is False
    assert news.train_config("scratch", 0, model="hyp").euclidean_warmup_clip is True
    for stage in ("pretrain", "finetune"):
        assert unclipped.train_config(stage, 0, model="hyp") == news.train_config(stage, 0, model="hyp")
    assert unclipped.train_config("scratch", 0, model="euc") == news.train_config("scratch", 0, model="euc")
    a, b = news.fingerprint(), unclipped.fingerprint()
    assert scratch_view(a, "hyp") != scratch_view(b, "hyp")
    for model in ("hyp", "euc", "mlp"):
        assert model_view(a, model) == model_view(b, model)
        assert model_view(a, model, pretraining=True) == model_view(b, model, pretraining=True)
    assert scratch_view(a, "euc") == scratch_view(b, "euc")
    everyone = make_plan("news", profile, settings={"scratch_unclipped_warmup": "yes"})
    assert scratch_view(everyone.fingerprint(), "euc") == scratch_view(a, "euc")
    # a run that set it by --set resumes under the profile that sets it: the views it is checked by agree
    assert scratch_view(everyone.fingerprint(), "hyp") == scratch_view(b, "hyp")
    assert model_view(everyone.fingerprint(), "hyp") == model_view(b, "hyp")
    assert "scratch_unclipped_warmup" not in json.dumps(make_plan("sent", "paper").fingerprint())
    with pytest.raises(DyntcError, match="scratch_unclipped_warmup.*needs scratch_like_pretraining=yes and euclidean_warmup"):
        make_plan("sent", "paper", settings={"scratch_unclipped_warmup": "yes"})  # SENT's HYP has no warm-up
    for model in ("euc", "mlp"):
        with pytest.raises(DyntcError, match=rf"\['{model}'\] sets scratch_unclipped_warmup.*set it for hyp"):
            dataclasses.replace(protocol.PAPER, per_model={"*": {model: {"scratch_unclipped_warmup": True}}})


def test_embeddings_option_is_checked_and_not_in_the_fingerprint(tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.5 0.25\n", encoding="utf-8")
    plan = make_plan("sent", "paper", embeddings=glove)
    assert plan.embeddings == str(glove.resolve()) and plan.fingerprint() == make_plan("sent", "paper").fingerprint()
    with pytest.raises(DyntcError, match="--embeddings .*missing.txt' is not a file"):
        make_plan("sent", "paper", embeddings=tmp_path / "missing.txt")
    with pytest.raises(DyntcError, match="applies to the sru encoder only"):
        make_plan("sent", "paper", encoder="minilm", models="logreg", embeddings=glove)


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
