"""`ProtocolRun` outside the runner (`dyntc.protocol.run`): the stages' settings, and a finished run's
weights read without writing anything."""

import pytest

import dyntc.protocol as protocol
from dyntc.errors import DyntcError
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


def test_read_only_run_loads_the_runs_weights_and_writes_nothing(tiny_run, small_sent, counted):
    from dyntc.protocol.run import read_only_run

    out, results = tiny_run
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    plan = make_plan("sent", "tiny", models="euc", variants="un-tuned")
    with read_only_run(out, plan, small_sent) as run:
        model = run.pretrained(0, "euc")
    proto, sup = counted
    assert proto.calls == 0 and sup.calls == 0 and model is not None  # loaded, not pretrained again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    with pytest.raises(DyntcError, match="other settings"):
        with read_only_run(out, make_plan("sent", "tiny", settings={"lr": "0.1"}), small_sent):
            pass
