"""`ProtocolRun` outside `dyntc reproduce` (`dyntc.protocol.run`): the stages' settings, and a finished run's
weights read without writing anything."""

import pytest

import dyntc.protocol as protocol
from dyntc.protocol import make_plan

pytestmark = pytest.mark.data  # every test runs on real SENT tweets


def test_finetune_lr_reaches_only_the_fine_tuning_stages_and_old_fingerprints_hold(small_sent, tmp_path):
    assert "finetune_lr" not in make_plan("sent", "paper").fingerprint()["hyperparameters"]  # older runs resume
    plan = make_plan("sent", "quick", settings={"finetune_lr": "2e-4"})
    assert plan.fingerprint()["hyperparameters"]["finetune_lr"] == 2e-4
    run = protocol.ProtocolRun(small_sent, plan, tmp_path, progress=False, log=lambda msg: None)
    assert run._cfg("pretrain", 0, model="euc").lr == plan.hp["lr"] == 3e-3
    assert run._cfg("finetune", 0, model="euc").lr == 2e-4
    # --set wins over quick's per_model entry for SENT's MLP (finetune_lr 1e-2); the entry's fitted head stays
    assert run._cfg("finetune", 0, model="mlp").lr == 2e-4 and run._cfg("finetune", 0, model="mlp").fit_head
    assert make_plan("sent", "quick").train_config("finetune", 0, model="mlp").lr == 1e-2
    unset = make_plan("sent", "quick", settings={"finetune_lr": "none"})
    plain = protocol.ProtocolRun(small_sent, unset, tmp_path / "b", progress=False, log=lambda msg: None)
    assert plain._cfg("finetune", 0, model="hyp").lr == unset.hp["lr"]
