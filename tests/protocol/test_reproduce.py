"""`dyntc reproduce` end to end (`dyntc.protocol.reproduce`): a `tiny` run on real SENT data; resuming after an
interruption, a kill mid-stage or a change of settings (`--redo`, `--force`, another GloVe file);
`--jobs`; the ETA; the command's errors."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dyntc.protocol as protocol
import dyntc.protocol.run as protocol_run
from dyntc.errors import DyntcError
from dyntc.protocol.reproduce import reproduce
from dyntc.core.machine import machine_description
from _protocol import Counter, run_tiny, without_timings


ROW_KEYS = {"model", "variant", "n_fine", "split", "acc_all", "acc_new", "acc_old", "train_seconds", "n_train",
            "shortfall", "n_test", "n_test_new", "steps"}


@pytest.mark.data
def test_out_must_be_a_directory(small_sent, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(DyntcError, match="--out .* exists and is not a directory"):
        run_tiny(small_sent, not_a_dir)  # refused before any training
    assert not_a_dir.read_text() == "x"


@pytest.mark.data
def test_only_splits_runs_those_splits_and_a_later_run_the_rest(small_sent, tmp_path, counted):
    proto, _ = counted
    kw = dict(splits=2, models="euc", variants="un-tuned", n_fine="5")
    first = run_tiny(small_sent, tmp_path, only_splits="1", **kw)
    assert proto.calls == 1 and {r["split"] for r in first["rows"]} == {1}
    assert set(first["split_info"]) == {"0", "1"} and first["finished"] is None
    second = run_tiny(small_sent, tmp_path, **kw)
    assert proto.calls == 2 and [r["split"] for r in second["rows"]] == [0, 1] and second["finished"]
    assert second["rows"][1] == first["rows"][0]


@pytest.mark.data
def test_tiny_run_schema(tiny_run, small_sent):
    out, results = tiny_run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["rows"] == results["rows"]
    for key in ("dataset", "profile", "p", "n_fine", "splits", "config", "dyntc_version", "machine", "started",
                "finished", "split_info", "pretraining", "fingerprint"):
        assert key in on_disk, key
    assert on_disk["dataset"] == "sent" and on_disk["profile"] == "tiny" and on_disk["finished"]
    assert on_disk["config"]["pretrain_episodes"] == protocol.TINY.pretrain_episodes
    assert all(info["machine"].endswith("device cpu") for per in on_disk["pretraining"].values() for info in per.values())
    rows = on_disk["rows"]
    cells = {(r["model"], r["variant"], r["n_fine"], r["split"]) for r in rows}
    assert len(rows) == len(cells) == 3 * 3 * 2  # models x variants x n_fine, one split
    for r in rows:
        assert ROW_KEYS <= set(r), ROW_KEYS - set(r)
        assert 0.0 <= r["acc_all"] <= 1.0 and 0.0 <= r["acc_new"] <= 1.0
        # each cell names where it ran: a run resumed on another machine (a GPU) mixes machines
        assert r["machine"].startswith(machine_description().split(" (")[0]) and r["machine"].endswith(", device cpu")
        assert r["n_train"] == r["n_fine"] * 10  # every SENT reason has >= 10 examples in the pool here
        if r["variant"] == "un-tuned":
            assert r["train_seconds"] == 0.0 and r["steps"] == 0
        else:
            assert r["steps"] > 0
            # the stage's dev history: its evaluations, the best of them the row's best_dev_acc
            assert r["history"] and max(h["dev_acc"] for h in r["history"] if "dev_acc" in h) == r["best_dev_acc"]
            assert all(h.get("step", 0) <= r["steps"] for h in r["history"])  # (the MLP's history counts epochs)
    info = on_disk["split_info"]["0"]
    assert len(info["removed"]) == 3 and sorted(info["removed"]) == info["new_classes"]
    assert set(info["old_labels"]) | set(info["removed"]) == set(info["new_labels"]) == set(small_sent.labels)
    assert set(on_disk["pretraining"]["0"]) == {"mlp", "euc", "hyp"}
    n_new_test = sum(y in info["new_classes"] for y in small_sent.test.labels)
    assert all(r["n_test_new"] == n_new_test for r in rows)


@pytest.mark.data
def test_resume_skips_finished_cells(tiny_run, small_sent, tmp_path, counted):
    out, results = tiny_run
    run_dir = tmp_path / "run"
    import shutil

    shutil.copytree(out, run_dir)
    proto, sup = counted
    again = run_tiny(small_sent, run_dir)
    assert proto.calls == 0 and sup.calls == 0  # nothing retrained, not even pretraining
    assert again["rows"] == results["rows"]
    # forget two cells: only they are recomputed, with the cached pretrained weights
    data = json.loads((run_dir / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if not (r["model"] == "hyp" and r["n_fine"] == 10 and r["variant"] != "un-tuned")]
    (run_dir / "results.json").write_text(json.dumps(data))
    third = run_tiny(small_sent, run_dir)
    assert proto.calls == 2 and sup.calls == 0  # hyp fine-tuned + hyp scratch at n_fine=10
    assert len(third["rows"]) == 18
    old = {(r["model"], r["variant"], r["n_fine"]): r for r in results["rows"]}
    for r in third["rows"]:
        if r["model"] != "hyp" or r["n_fine"] != 10 or r["variant"] == "un-tuned":
            assert r == old[(r["model"], r["variant"], r["n_fine"])]


@pytest.mark.data
def test_a_resume_of_a_selection_keeps_the_runs_grid_and_is_not_finished_early(tiny_run, small_sent, tmp_path, counted):
    """A resume that asks for fewer n_fine and models than the run has: the header keeps the run's grid
    (joined over invocations), names the selection apart, and the run is finished only when the
    whole grid is."""
    import shutil

    out, results = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    data = json.loads((run_dir / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if not (r["model"] == "hyp" and r["n_fine"] == 10)]
    (run_dir / "results.json").write_text(json.dumps(data))
    proto, sup = counted
    partial = run_tiny(small_sent, run_dir, models="euc", n_fine="5")
    assert proto.calls == 0 and sup.calls == 0  # EUC at 5 is done
    assert partial["n_fine"] == [5, 10] and partial["models"] == ["mlp", "euc", "hyp"]
    assert partial["config"]["n_fine"] == [5, 10]  # the resolved profile names the run's grid too
    assert partial["variants"] == ["fine-tuned", "un-tuned", "scratch"] and partial["scratch_n_fine"] is None
    assert partial["last_invocation"]["n_fine"] == [5] and partial["last_invocation"]["models"] == ["euc"]
    assert partial["finished"] is None  # HYP at 10 is still to do
    assert "not yet" in (run_dir / "tables.md").read_text()
    final = run_tiny(small_sent, run_dir, models="hyp", n_fine="10")
    assert final["finished"] and len(final["rows"]) == 18 and final["n_fine"] == [5, 10]


@pytest.mark.data
def test_tuning_one_model_keeps_the_other_models_pretraining(tiny_run, small_sent, tmp_path, counted):
    """After a change of HYP's per-model settings, EUC's finished cells and pretrained weights stay
    valid (nothing of EUC is retrained) and only HYP's cells run again."""
    import shutil

    out, results = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    data = json.loads((run_dir / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if r["model"] == "euc" and r["n_fine"] == 5]  # EUC at 10 to redo
    data["pretraining"] = {s: {"euc": v["euc"]} for s, v in data["pretraining"].items()}
    (run_dir / "results.json").write_text(json.dumps(data))
    proto, sup = counted
    hyp_tuned = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"max_norm": 5.0}}})
    again = reproduce(small_sent, hyp_tuned, run_dir, models="euc,hyp", progress=False, log=lambda m: None)
    n_hyp_trained = sum(1 for r in again["rows"] if r["model"] == "hyp" and r["variant"] != "un-tuned")
    n_euc_trained = sum(1 for r in again["rows"] if r["model"] == "euc" and r["n_fine"] == 10 and r["variant"] != "un-tuned")
    assert proto.calls == 1 + n_hyp_trained + n_euc_trained  # HYP's pretraining, no EUC pretraining
    assert [r for r in again["rows"] if r["model"] == "euc" and r["n_fine"] == 5] == data["rows"]
    # HYP's stale weights (other settings) left in checkpoints/ are not its new start: it pretrains as afresh
    fresh = reproduce(small_sent, hyp_tuned, tmp_path / "fresh", models="hyp", progress=False, log=lambda m: None)
    assert again["pretraining"]["0"]["hyp"]["history"] == fresh["pretraining"]["0"]["hyp"]["history"]


@pytest.mark.data
def test_redo_discards_one_models_work_so_that_its_settings_may_change(tiny_run, small_sent, tmp_path, counted):
    """A model with finished work cannot change its settings in place; --redo hyp drops HYP's cells,
    pretraining records and fine-tuning snapshots (those started from the old weights), only once the
    run is accepted, and runs it again; its pretraining snapshot stays (checked when the stage resumes)
    and its weights are reused only where they fit (a fine-tuning change keeps them). The other models'
    cells stay as they were, and the same command run again resumes. Bad --redo values are refused."""
    import shutil
    import warnings

    out, results = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    hyp_tuned = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"max_norm": 5.0}}})
    with pytest.raises(DyntcError, match="different configuration.*for hyp"):
        reproduce(small_sent, hyp_tuned, run_dir, progress=False, log=lambda m: None)
    checkpoints = run_dir / "checkpoints" / "split0"
    (checkpoints / "hyp-pretrain.partial.pt").write_bytes(b"kept")
    (checkpoints / "hyp-fine-tuned-5.partial.pt").write_bytes(b"stale")
    before = (run_dir / "results.json").read_text()
    for bad, match in (({"redo": "hyp,svm"}, "unknown --redo model.*svm"),
                       ({"redo": "hyp", "models": "euc"}, "--redo hyp: hyp not among --models euc"),
                       ({"redo": "hyp", "force": True}, "not both"),
                       ({"redo": "hyp", "settings": {"lr": "0.5"}}, "different configuration.*for euc, mlp")):
        with pytest.raises(DyntcError, match=match):
            reproduce(small_sent, hyp_tuned, run_dir, progress=False, log=lambda m: None, **bad)
    # refused runs leave everything as it was
    assert (run_dir / "results.json").read_text() == before
    assert (checkpoints / "hyp-fine-tuned-5.partial.pt").is_file() and (checkpoints / "hyp.safetensors").is_file()
    proto, sup = counted
    messages = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = reproduce(small_sent, hyp_tuned, run_dir, redo="hyp", progress=False, log=messages.append)
    unreadable = [str(w.message) for w in caught if "unreadable" in str(w.message)]
    assert len(unreadable) == 1 and "hyp-pretrain.partial.pt" in unreadable[0]  # kept; the fine-tuning one was not
    n_hyp = sum(1 for r in results["rows"] if r["model"] == "hyp")
    assert any(f"--redo hyp: discarding {n_hyp} finished cells and 1 pretraining records" in m for m in messages)
    n_hyp_trained = sum(1 for r in again["rows"] if r["model"] == "hyp" and r["variant"] != "un-tuned")
    assert proto.calls == 1 + n_hyp_trained and sup.calls == 0  # HYP pretrained again (max_norm), nothing else
    assert [r for r in again["rows"] if r["model"] != "hyp"] == [r for r in results["rows"] if r["model"] != "hyp"]
    assert again["fingerprint"]["hyperparameters"]["per_model"] == {"hyp": {"max_norm": 5.0}}
    assert again["pretraining"]["0"]["hyp"]["history"] != results["pretraining"]["0"]["hyp"]["history"]
    # the same command again resumes: HYP's settings are now the file's, so nothing is discarded
    calls = proto.calls
    third = reproduce(small_sent, hyp_tuned, run_dir, redo="hyp", progress=False, log=messages.append)
    assert proto.calls == calls and third["rows"] == again["rows"]
    assert any("--redo: hyp kept" in m for m in messages)
    # a change of how HYP is fine-tuned redoes its fine-tuned cells on the same pretrained weights
    hyp_finetune = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"max_norm": 5.0, "finetune_lr": 0.01}}})
    fourth = reproduce(small_sent, hyp_finetune, run_dir, redo="hyp", progress=False, log=messages.append)
    assert proto.calls == calls + n_hyp_trained
    assert fourth["pretraining"]["0"]["hyp"]["history"] == again["pretraining"]["0"]["hyp"]["history"]
    # a change of how HYP is pretrained only (its lr, with fine-tuning and scratch at the same finetune_lr)
    # redoes its pretraining and the cells that start from it; its scratch cells stay as they were
    hyp_pretrain = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"max_norm": 5.0, "finetune_lr": 0.01, "lr": 0.005}}})
    fifth = reproduce(small_sent, hyp_pretrain, run_dir, redo="hyp", progress=False, log=messages.append)
    def scratch(rows):
        return [r for r in rows if r["model"] == "hyp" and r["variant"] == "scratch"]

    n_scratch = len(scratch(fourth["rows"]))
    assert n_scratch == len(protocol.TINY.n_fine["*"]) and scratch(fifth["rows"]) == scratch(fourth["rows"])
    assert proto.calls == calls + n_hyp_trained + 1 + n_hyp_trained - n_scratch  # pretraining + fine-tuned cells
    assert fifth["pretraining"]["0"]["hyp"]["history"] != fourth["pretraining"]["0"]["hyp"]["history"]
    assert any(f"keeping {n_scratch} scratch cells" in m for m in messages)


@pytest.mark.data
def test_redo_after_a_scratch_only_change_recomputes_the_scratch_cells_only(tiny_run, small_sent, tmp_path, counted):
    """Turning scratch_like_pretraining on for HYP contradicts its finished scratch cells only: the run
    is refused with the way out named, and --redo hyp recomputes those cells (with the pretraining
    recipe) and keeps HYP's pretraining and its other cells."""
    import shutil

    out, results = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    like = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"scratch_like_pretraining": True}}})
    with pytest.raises(DyntcError, match="different configuration.*for hyp; .*pass --redo hyp"):
        reproduce(small_sent, like, run_dir, progress=False, log=lambda m: None)
    proto, sup = counted
    messages = []
    again = reproduce(small_sent, like, run_dir, redo="hyp", progress=False, log=messages.append)
    scratch = [r for r in results["rows"] if r["model"] == "hyp" and r["variant"] == "scratch"]
    assert scratch and any(f"--redo hyp: discarding {len(scratch)} finished cells and 0 pretraining records" in m for m in messages)
    assert proto.calls == len(scratch) and sup.calls == 0
    assert all(cfg.max_episodes == protocol.TINY.pretrain_episodes and cfg.lr == protocol.TINY.lr for cfg in proto.configs)
    def others(rows):
        return [r for r in rows if not (r["model"] == "hyp" and r["variant"] == "scratch")]

    assert others(again["rows"]) == others(results["rows"])
    assert again["pretraining"] == results["pretraining"]
    assert reproduce(small_sent, like, run_dir, progress=False, log=lambda m: None)["rows"] == again["rows"]  # resumes


@pytest.mark.data
def test_a_stage_whose_weights_do_not_load_whole_pretrains_afresh(tiny_run, small_sent, tmp_path):
    """Weights whose side file is damaged are loaded into the model before the damage shows: the
    stage must still start from a fresh initialisation, as in an empty directory."""
    import shutil

    out, results = tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    data = json.loads((run_dir / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if r["model"] != "euc"]
    data["pretraining"] = {s: {m: v for m, v in per.items() if m != "euc"} for s, per in data["pretraining"].items()}
    (run_dir / "results.json").write_text(json.dumps(data))
    (run_dir / "checkpoints" / "split0" / "euc.json").write_text("{not json")
    again = run_tiny(small_sent, run_dir, models="euc", variants="un-tuned", n_fine="5")
    fresh = run_tiny(small_sent, tmp_path / "fresh", models="euc", variants="un-tuned", n_fine="5")
    assert again["pretraining"]["0"]["euc"]["history"] == fresh["pretraining"]["0"]["euc"]["history"]


@pytest.mark.data
def test_weights_pretrained_under_another_stopping_rule_are_used_where_the_runs_rule_ends_alike(small_sent, tmp_path, counted):
    """A selection run that does not stop early (floor = budget, as scripts/pretrain_stage.py trains)
    gives the run's weights where the run's own rule, replayed on their dev history, would not have
    stopped sooner, or would have with the same best weights (no later score beat the best by then):
    they load with a note; where a later score did, the stage is pretrained afresh."""
    import shutil

    settings = {"pretrain_episodes": "30"}
    selection = reproduce(small_sent, "tiny", tmp_path / "selection", models="euc", variants="un-tuned", n_fine="5",
                          settings={**settings, "pretrain_min_episodes": "30"}, progress=False, log=lambda m: None)
    assert selection["pretraining"]["0"]["euc"]["steps"] == 30
    weights = tmp_path / "selection" / "checkpoints" / "split0"
    proto, sup = counted
    # patience 1: the second and third stop at 20; the third's weights (its best, at 30) are not the rule's
    for scores, loaded, note_says in (((0.3, 0.4, 0.5), True, "ends alike"), ((0.5, 0.4, 0.3), True, "ends it at step 20"),
                                      ((0.5, 0.4, 0.6), False, "")):
        run_dir = tmp_path / f"run-{scores[-1]}"
        (run_dir / "checkpoints").mkdir(parents=True)
        shutil.copytree(weights, run_dir / "checkpoints" / "split0")
        side = run_dir / "checkpoints" / "split0" / "euc.json"
        info = json.loads(side.read_text())
        info["history"] = [{"step": 10 * (i + 1), "loss": 1.0, "dev_acc": a} for i, a in enumerate(scores)]
        side.write_text(json.dumps(info))
        calls, messages = proto.calls, []
        out = reproduce(small_sent, "tiny", run_dir, models="euc", variants="un-tuned", n_fine="5", settings=settings,
                        progress=False, log=messages.append)
        assert (proto.calls == calls) == loaded
        note = out["pretraining"]["0"]["euc"].get("note", "")
        assert ("another stopping rule" in note and "'pretrain_min_episodes': 30" in note and note_says in note) == loaded
        if loaded:  # the un-tuned cell is the selection run's own
            assert [r["acc_all"] for r in out["rows"]] == [r["acc_all"] for r in selection["rows"]]
            assert out["pretraining"]["0"]["euc"]["steps"] == (30 if scores[-1] == 0.5 else 20)
        else:
            assert out["pretraining"]["0"]["euc"]["history"] != info["history"]
    # the rule is the only thing that may differ: weights of another lr are not the run's
    lr_dir = tmp_path / "other-lr"
    (lr_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(weights, lr_dir / "checkpoints" / "split0")
    calls = proto.calls
    reproduce(small_sent, "tiny", lr_dir, models="euc", variants="un-tuned", n_fine="5", settings={**settings, "lr": "0.01"},
              progress=False, log=lambda m: None)
    assert proto.calls == calls + 1


@pytest.mark.data
def test_a_new_fine_tuning_rule_keeps_the_pretrained_weights_and_a_new_lr_does_not(tiny_run, small_sent, tmp_path, counted):
    """The MLP's cells run again under a changed fine-tuning setting (finetune_fit_head) reuse its
    pretrained weights; a changed pretraining setting (its lr) pretrains it again."""
    import shutil

    out, results = tiny_run
    proto, sup = counted
    for setting, pretrained_again in (({"finetune_fit_head": True}, False), ({"lr": 0.01}, True)):
        run_dir = tmp_path / f"run-{next(iter(setting))}"
        shutil.copytree(out, run_dir)
        data = json.loads((run_dir / "results.json").read_text())
        data["rows"] = [r for r in data["rows"] if r["model"] != "mlp"]  # the MLP's cells are to be redone
        data["pretraining"] = {s: {m: v for m, v in per.items() if m != "mlp"} for s, per in data["pretraining"].items()}
        (run_dir / "results.json").write_text(json.dumps(data))
        profile = dataclasses.replace(protocol.TINY, per_model={"*": {"mlp": setting}})
        sup.calls = 0
        again = reproduce(small_sent, profile, run_dir, models="mlp", progress=False, log=lambda m: None)
        n_trained = sum(1 for r in again["rows"] if r["model"] == "mlp" and r["variant"] != "un-tuned")
        assert n_trained == 4 and sup.calls == n_trained + pretrained_again
    assert proto.calls == 0


@pytest.mark.data
def test_interrupted_run_keeps_finished_cells(small_sent, tmp_path, monkeypatch):
    proto = Counter(protocol_run.train_prototypical, fail_after=3)
    monkeypatch.setattr(protocol_run, "train_prototypical", proto)
    with pytest.raises(KeyboardInterrupt):
        run_tiny(small_sent, tmp_path, models="mlp,euc")
    partial = json.loads((tmp_path / "results.json").read_text())  # valid JSON after the interruption
    assert partial["finished"] is None
    done = {(r["model"], r["variant"], r["n_fine"]) for r in partial["rows"]}
    assert {("mlp", v, n) for v in ("fine-tuned", "un-tuned", "scratch") for n in (5, 10)} <= done
    assert len(done) < 12
    counter = Counter(proto.fn)
    monkeypatch.setattr(protocol_run, "train_prototypical", counter)
    sup = Counter(protocol_run.train_supervised)
    monkeypatch.setattr(protocol_run, "train_supervised", sup)
    final = run_tiny(small_sent, tmp_path, models="mlp,euc")
    assert sup.calls == 0  # the MLP cells were all written before the interruption
    assert len(final["rows"]) == 12 and final["finished"]
    kept = [r for r in final["rows"] if (r["model"], r["variant"], r["n_fine"]) in done]
    assert kept == partial["rows"]
    assert counter.calls == 2  # euc n_fine=10 fine-tuned + scratch; pretraining loaded from its checkpoint


@pytest.mark.data
def test_a_run_stopped_mid_stage_resumes_that_stage(tiny_run, small_sent, tmp_path, stop_first_stage):
    """Killed during EUC's pretraining, a run keeps the stage's snapshot (checkpoints/, *.partial.pt);
    the rerun resumes the stage from it and ends with the uninterrupted run's rows, snapshots gone."""
    snapshots = stop_first_stage.snapshots
    with pytest.raises(KeyboardInterrupt):
        run_tiny(small_sent, tmp_path, models="euc")
    assert snapshots[0].name == "euc-pretrain.partial.pt"
    assert list((tmp_path / "checkpoints").rglob("*.partial.pt")) == [snapshots[0]]
    assert torch.load(snapshots[0], weights_only=True)["step"] == 10
    stop_first_stage.restore()
    again = run_tiny(small_sent, tmp_path, models="euc")
    expected = [r for r in tiny_run[1]["rows"] if r["model"] == "euc"]
    assert [without_timings(r) for r in again["rows"]] == [without_timings(r) for r in expected]
    assert again["pretraining"]["0"]["euc"]["history"] == tiny_run[1]["pretraining"]["0"]["euc"]["history"]
    assert not list((tmp_path / "checkpoints").rglob("*.partial.pt"))


@pytest.mark.data
def test_config_mismatch_is_an_error_unless_forced(tiny_run, small_sent, tmp_path):
    out, _ = tiny_run
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    with pytest.raises(DyntcError, match="different configuration.*pretrain_episodes"):
        run_tiny(small_sent, run_dir, settings={"pretrain_episodes": "7"})
    forced = run_tiny(small_sent, run_dir, settings={"pretrain_episodes": "7"}, models="euc", variants="un-tuned",
                      force=True)
    assert len(forced["rows"]) == 2 and forced["config"]["pretrain_episodes"] == 7
    assert forced["pretraining"]["0"]["euc"]["steps"] <= 7


@pytest.mark.data
def test_resume_with_a_glove_subset_file_and_refusal_of_other_vectors(tiny_run, small_sent, tmp_path, counted):
    """A subset file of the packaged vectors resumes a run (e.g. on a GPU host without the package);
    a file with other vectors is refused before it can mix two encoders' cells in one table."""
    import shutil

    from dyntc.core.text import write_glove_subset

    out, results = tiny_run
    recorded = results["vocabulary"]
    assert recorded["dim"] == 50 and recorded["words"] > 100 and len(recorded["sha256"]) == 64
    run_dir = tmp_path / "run"
    shutil.copytree(out, run_dir)
    data = json.loads((run_dir / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if not (r["model"] == "euc" and r["variant"] == "un-tuned" and r["n_fine"] == 5)]
    (run_dir / "results.json").write_text(json.dumps(data))
    subset = tmp_path / "glove-sent.txt"
    write_glove_subset(small_sent.train.texts, subset)
    resumed = run_tiny(small_sent, run_dir, embeddings=subset)
    assert [without_timings(r) for r in resumed["rows"]] == [without_timings(r) for r in results["rows"]]
    assert resumed["vocabulary"] == recorded and counted[0].calls == 0  # the cell came from the cached pretraining
    lines = subset.read_text(encoding="utf-8").splitlines()
    word, *values = lines[0].split(" ")
    lines[0] = " ".join([word, str(float(values[0]) + 0.5), *values[1:]])
    other = tmp_path / "glove-other.txt"
    other.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data["rows"] = [r for r in resumed["rows"] if not (r["model"] == "euc" and r["variant"] == "un-tuned")]
    (run_dir / "results.json").write_text(json.dumps({**resumed, "rows": data["rows"]}))
    with pytest.raises(DyntcError, match="vocabulary built from .*glove-other.txt .*differs from the one"):
        run_tiny(small_sent, run_dir, embeddings=other)


@pytest.mark.data
def test_export_glove_writes_the_subset_and_names_an_unwritable_out(tmp_path):
    import os

    env = {**os.environ, "DYNTC_DATA": os.environ.get("DYNTC_DATA", "../shared/datasets")}
    good = subprocess.run([sys.executable, "-m", "dyntc", "export-glove", "--dataset", "sent", "--out", str(tmp_path / "g.txt")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert good.returncode == 0, good.stderr
    assert len((tmp_path / "g.txt").read_text(encoding="utf-8").splitlines()) > 5000
    (tmp_path / "afile").write_text("x")
    bad = subprocess.run([sys.executable, "-m", "dyntc", "export-glove", "--dataset", "sent", "--out",
                          str(tmp_path / "afile" / "g.txt")], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "cannot write --out" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("args, message", [(["--profile", "nope"], "unknown profile 'nope'"),
                                           (["--set", "lr"], "--set: give each as FIELD=VALUE (e.g. lr=1e-3), got 'lr'")])
def test_cli_reports_bad_input_without_traceback(tmp_path, args, message):
    proc = subprocess.run(
        [sys.executable, "-m", "dyntc", "reproduce", "--dataset", "sent", *args, "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert message in " ".join(proc.stderr.split()) and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


# ---- parallel work units (--jobs) ----------------------------------------------------------------


@pytest.mark.data
def test_jobs_must_be_a_positive_integer(small_sent, tmp_path):
    for bad in (0, -1, True, 1.5):
        with pytest.raises(DyntcError, match="--jobs must be an integer >= 1"):
            run_tiny(small_sent, tmp_path, jobs=bad)
    assert not (tmp_path / "results.json").exists()  # refused before any work


@pytest.mark.data
def test_two_jobs_give_the_same_results_as_one(tiny_run, small_sent, tmp_path, monkeypatch):
    """Every unit takes its seeds from derive_seed and featurizes the same way in its own process.
    The parent also rewrites the report while units run (here at every message): rows stay the same."""
    from dyntc.protocol import reproduce as pipeline
    from dyntc.protocol import ProtocolRun

    out, sequential = tiny_run
    writes = []
    original = ProtocolRun.write_report
    monkeypatch.setattr(pipeline, "REPORT_EVERY_S", 0.0)
    monkeypatch.setattr(ProtocolRun, "write_report", lambda self: (writes.append(len(self.results["rows"])), original(self))[1])
    parallel = run_tiny(small_sent, tmp_path, jobs=2)
    assert len(writes) > 4 and writes[0] < writes[-1]  # 3 units: more reports than units, rows growing
    assert parallel["finished"] and parallel["jobs"] == 2
    key = lambda r: (r["model"], r["variant"], r["n_fine"], r["split"])  # noqa: E731
    assert [key(r) for r in parallel["rows"]] == [key(r) for r in sequential["rows"]]  # the plan's order
    for a, b in zip(sequential["rows"], parallel["rows"]):
        assert without_timings(a) == without_timings(b), key(a)  # accuracies, steps, best dev acc, ...
    for model, info in sequential["pretraining"]["0"].items():
        other = parallel["pretraining"]["0"][model]
        assert (info["steps"], info["best_dev_acc"], info["history"]) == (other["steps"], other["best_dev_acc"], other["history"])
    assert parallel["split_info"] == sequential["split_info"]
    assert (tmp_path / "tables.md").is_file()


@pytest.mark.data
def test_two_jobs_resume_an_interrupted_run(tiny_run, small_sent, tmp_path):
    out, sequential = tiny_run
    import shutil

    shutil.copytree(out, tmp_path / "run")
    data = json.loads((tmp_path / "run" / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if r["model"] == "mlp" or r["n_fine"] == 5]  # euc, hyp n_fine=10 lost
    data["finished"] = None
    # hyp's weights are lost and its record is another model's: pretrained again, the new record must
    # replace it (the parent's copy of the old one once won the last merge)
    data["pretraining"]["0"]["hyp"] = {**data["pretraining"]["0"]["hyp"], "steps": -1, "best_dev_acc": -1.0}
    (tmp_path / "run" / "results.json").write_text(json.dumps(data))
    (tmp_path / "run" / "checkpoints" / "split0" / "hyp.safetensors").unlink()  # and hyp's pretrained weights
    resumed = run_tiny(small_sent, tmp_path / "run", jobs=2)
    assert resumed["finished"] and len(resumed["rows"]) == len(sequential["rows"])
    for a, b in zip(sequential["rows"], resumed["rows"]):
        assert without_timings(a) == without_timings(b)
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    for record in (resumed["pretraining"]["0"]["hyp"], on_disk["pretraining"]["0"]["hyp"]):
        assert record["steps"] == sequential["pretraining"]["0"]["hyp"]["steps"] > 0


@pytest.mark.data
def test_a_failing_worker_names_its_unit(small_sent, tmp_path):
    # a directory where euc's checkpoint should go: saving the pretrained weights fails in the worker
    (tmp_path / "checkpoints" / "split0" / "euc.safetensors").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="work unit split 0 euc failed in its worker process") as info:
        run_tiny(small_sent, tmp_path, models="mlp,euc", variants="un-tuned", jobs=2)
    assert "rerun to resume" in str(info.value)


def test_progress_credits_early_stopped_stages_and_gives_both_etas():
    from dyntc.protocol.reproduce import Progress

    lines = []
    costs = {"split 0 euc": {(0, "pretrain", "euc"): 1000.0, (0, "euc", "fine-tuned", 5): 500.0},
             "split 0 mlp": {(0, "pretrain", "mlp"): 300.0}}
    prog = Progress(costs, jobs=2, show=False, log=lines.append)
    assert prog.planned == 1800 and "measuring" in prog.eta_text()
    prog.report((0, "pretrain", "euc"), 250, False)
    assert prog.credited() == 250
    prog.report((0, "pretrain", "euc"), 150, True)  # stopped early at 400 of 1000: the rest is credited, not counted as work
    assert prog.credited() == 1000 and sum(prog.actual.values()) == 400 and prog.used == [(400, 1000)]
    prog.start -= 60  # as if a minute had passed: 400 sequences / 60 s
    text = prog.eta_text()
    assert text.startswith("ETA <= ") and "with early stopping as so far" in text
    prog.report((0, "pretrain", "euc"), 999, True)  # a finished stage is not counted twice
    assert sum(prog.actual.values()) == 400
    prog.unit_done(protocol.Unit(0, "mlp", []), 12.0, 11.0, 1, 2)
    assert lines and lines[-1].startswith("[1/2 units] split 0 mlp done in 0:12 wall, 0:11 CPU")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # field 4 of /proc/PID/stat: the parent's pid
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.data
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("signum", [15, 9])
def test_killing_a_parallel_run_stops_its_workers(tmp_path, signum):
    """`kill` (SIGTERM) of a --jobs 2 run ends it as Ctrl-C does; after SIGKILL the orphaned workers
    notice and stop too. Neither leaves workers training on (and writing) after the run is gone."""
    import os
    import signal
    import time

    cmd = [sys.executable, "-m", "dyntc", "reproduce", "--dataset", "sent", "--profile", "tiny", "--jobs", "2",
           "--models", "euc,hyp", "--variants", "un-tuned", "--no-progress", "--out", str(tmp_path / "run"),
           "--set", "pretrain_episodes=100000", "--set", "pretrain_epochs=1000", "--set", "pretrain_patience=100000"]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.time() + 240
        while not list((tmp_path / "run" / "checkpoints").rglob("*.partial.pt")) and time.time() < deadline:
            time.sleep(0.5)  # both workers are training once a stage snapshot exists
        workers = [c for c in _children(parent.pid) if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text(errors="ignore")]
        assert len(workers) == 2, "the run did not start its two workers"
        os.kill(parent.pid, signum)
        parent.wait(timeout=60)
        deadline = time.time() + 60
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(_alive(w) for w in workers)
    finally:
        if parent.poll() is None:
            parent.kill()
        for w in workers + _children(parent.pid):
            if _alive(w):
                os.kill(w, signal.SIGKILL)
