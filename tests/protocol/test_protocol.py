"""The reproduction protocol: plan validation, a `tiny` run on real SENT data, resuming, reports."""

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import dyntc.protocol as protocol
import dyntc.protocol.run as protocol_run
from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, accuracies, make_plan, model_view
from dyntc.protocol.evaluation import logreg_predict
from dyntc.protocol.runner import reproduce
from dyntc.protocol.report import PAPER_TABLE2, aggregate, plot_accuracy, tables_markdown, time_shares
from dyntc.inference import Encoded
from dyntc.machine import machine_description

ROW_KEYS = {"model", "variant", "n_fine", "split", "acc_all", "acc_new", "acc_old", "train_seconds", "n_train",
            "shortfall", "n_test", "n_test_new", "steps"}


def run_tiny(data, out, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("log", lambda msg: None)
    return reproduce(data, "tiny", out, **kw)


class Counter:
    """Wraps a training function and counts its calls."""

    def __init__(self, fn, fail_after=None):
        self.fn, self.calls, self.fail_after = fn, 0, fail_after
        self.configs = []  # each call's TrainConfig

    def __call__(self, *args, **kwargs):
        self.calls += 1
        self.configs.append(args[3] if len(args) > 3 else kwargs.get("cfg"))
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated interruption")
        return self.fn(*args, **kwargs)


@pytest.fixture()
def counted(monkeypatch):
    proto = Counter(protocol_run.train_prototypical)
    sup = Counter(protocol_run.train_supervised)
    monkeypatch.setattr(protocol_run, "train_prototypical", proto)
    monkeypatch.setattr(protocol_run, "train_supervised", sup)
    return proto, sup


# ---- plan validation ----------------------------------------------------------------------------


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


def test_out_must_be_a_directory(small_sent, tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(DyntcError, match="--out .* exists and is not a directory"):
        run_tiny(small_sent, not_a_dir)  # refused before any training
    assert not_a_dir.read_text() == "x"


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


def test_only_splits_runs_those_splits_and_a_later_run_the_rest(small_sent, tmp_path, counted):
    proto, _ = counted
    kw = dict(splits=2, models="euc", variants="un-tuned", n_fine="5")
    first = run_tiny(small_sent, tmp_path, only_splits="1", **kw)
    assert proto.calls == 1 and {r["split"] for r in first["rows"]} == {1}
    assert set(first["split_info"]) == {"0", "1"} and first["finished"] is None
    second = run_tiny(small_sent, tmp_path, **kw)
    assert proto.calls == 2 and [r["split"] for r in second["rows"]] == [0, 1] and second["finished"]
    assert second["rows"][1] == first["rows"][0]


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


def test_profiles_resolve_per_dataset():
    paper = make_plan("news", "paper").hp
    assert paper["n_fine"] == [5, 10, 20, 50, 100, 500] and paper["dropout"] == 0.5 and paper["splits"] == 5
    assert paper["pretrain_episodes"] == 10_000 and paper["pretrain_epochs"] == 100
    assert (paper["n_support"], paper["n_query"], paper["max_classes"], paper["lr"]) == (4, 64, 50, 1e-3)
    assert (paper["hidden_size"], paper["num_layers"]) == (128, 4)
    assert make_plan("wos", "paper").hp["dropout"] == 0.3
    assert make_plan("sent", "paper").n_fine == (5, 10, 20, 100)
    # NEWS's HYP warms up with the Euclidean metric at EUC's rate (chosen on dev_old); SENT's does not
    news_hyp = make_plan("news", "paper").train_config("pretrain", 0, model="hyp")
    assert (news_hyp.euclidean_warmup, news_hyp.euclidean_warmup_lr, news_hyp.lr) == (2000, 1e-3, 1e-3)
    # ... fine-tunes at Adam 3e-4 (its finetune_lr), and trains from scratch as it pretrains (scratch_like_pretraining)
    assert [make_plan("news", "paper").train_config(stage, 0, model="hyp").lr for stage in ("finetune", "scratch")] == [3e-4, 1e-3]
    assert make_plan("sent", "paper").train_config("pretrain", 0, model="hyp").euclidean_warmup == 0
    # --set wins over a per-model entry of the same field (NEWS HYP's lr 1e-3), for every model
    slower = make_plan("news", "paper", settings={"lr": "5e-4"})
    assert {slower.train_config("pretrain", 0, model=m).lr for m in ("mlp", "euc", "hyp")} == {5e-4}
    assert slower.train_config("pretrain", 0, model="hyp").euclidean_warmup == 2000  # the entry's other fields stay
    quick = make_plan("news", "quick")
    assert quick.hp["max_len"] == 128 and make_plan("sent", "quick").hp["max_len"] == 32
    # the selection of cells is not part of the fingerprint, hyperparameters are
    assert make_plan("sent", "quick", splits=1).fingerprint() == make_plan("sent", "quick", splits=4).fingerprint()
    assert make_plan("sent", "quick").fingerprint() != make_plan("sent", "quick", settings={"lr": "0.01"}).fingerprint()


# ---- evaluation helpers -------------------------------------------------------------------------


def test_accuracies_over_all_new_and_old():
    truth = np.array([0, 1, 2, 2, 1, 0])
    pred = np.array([0, 1, 1, 2, 0, 0])
    new = np.isin(truth, [2])
    acc = accuracies(pred, truth, new)
    assert acc["acc_all"] == pytest.approx(4 / 6)
    assert acc["acc_new"] == pytest.approx(1 / 2)
    assert acc["acc_old"] == pytest.approx(3 / 4)
    assert accuracies(pred, truth, np.zeros(6, bool))["acc_new"] is None


def test_logreg_on_frozen_embeddings_and_rejects_token_ids():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(3, 8)) * 4
    def make(n):
        labels = np.repeat(np.arange(3), n)
        items = [torch.tensor(centers[y] + rng.normal(size=8), dtype=torch.float32) for y in labels]
        return Encoded(items, labels, ["a", "b", "c"])
    pred = logreg_predict(make(5), test := make(20), seed=0)
    assert (pred == test.labels).mean() > 0.9
    ids = Encoded([torch.tensor([3, 4, 5]), torch.tensor([1, 2])], np.array([0, 1]), ["a", "b"])
    with pytest.raises(DyntcError, match="frozen pretrained encoder"):
        logreg_predict(ids, ids, seed=0)


# ---- a real (tiny) run --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(small_sent, tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    results = run_tiny(small_sent, out)
    return out, results


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


def test_tiny_run_report(tiny_run, tmp_path):
    out, results = tiny_run
    tables = (out / "tables.md").read_text()
    assert "Table 2 layout" in tables and "Table 3 layout" in tables and "Benefits of pretraining" in tables
    mean, std = PAPER_TABLE2["sent"]["hyp"][5]
    assert f"[{mean:.1f} ± {std:.1f}]" in tables  # the paper's number beside ours
    assert "[45.7]" in tables  # Table 3: HYP (un-tuned), n_fine = 5
    for png in ("accuracy_vs_nfine.png", "pretraining_gain.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    agg = aggregate(results)
    assert agg[("euc", "fine-tuned", 5)]["all"][2] == 1  # one split
    assert tables_markdown(results) == tables
    # where the time went: pretraining and each variant's cells, adding up to every recorded second
    shares = time_shares(results)
    assert list(shares) == ["pretraining", "fine-tuned cells", "un-tuned cells", "scratch cells"]
    recorded = sum(i["seconds"] for s in results["pretraining"].values() for i in s.values())
    assert shares["pretraining"] == pytest.approx(recorded)
    assert sum(shares.values()) == pytest.approx(recorded + sum(r["cell_seconds"] for r in results["rows"]))
    assert f"pretraining {shares['pretraining']:.0f}s" in tables and "Where the time went" in tables
    assert time_shares({**results, "rows": [], "pretraining": {}}) == {}
    # a later invocation that ran only n_fine 10 (its header says so) keeps the n_fine 5 columns
    assert "n_fine=5" in tables_markdown({**results, "n_fine": [10]})
    # a run of scratch cells only: no accuracy plot (no line to draw), no matplotlib warning
    scratch_only = {**results, "rows": [r for r in results["rows"] if r["variant"] == "scratch"]}
    assert scratch_only["rows"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_accuracy(scratch_only, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


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


def test_joined_grid_counts_scratch_only_where_it_was_asked_for():
    from dyntc.protocol.results import joined_grid

    plan = make_plan("sent", "tiny", n_fine="5,100", variants="scratch", scratch_n_fine="5")
    before = {"n_fine": [5, 10, 20, 100], "models": ["euc"], "variants": ["fine-tuned"], "scratch_n_fine": None, "rows": []}
    grid = joined_grid(before, plan)
    assert grid["n_fine"] == [5, 10, 20, 100] and grid["variants"] == ["fine-tuned", "scratch"]
    assert grid["scratch_n_fine"] == [5] and grid["models"] == ["mlp", "euc", "hyp"]
    everywhere = joined_grid({**before, "variants": ["scratch"]}, plan)
    assert everywhere["scratch_n_fine"] is None  # the earlier invocation asked for scratch at every n_fine


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


def test_tables_name_the_models_whose_scratch_cells_take_the_pretraining_recipe(tiny_run):
    _, results = tiny_run
    assert "the pretraining recipe" not in tables_markdown(results)
    config = {**results["config"], "per_model": {"hyp": {"scratch_like_pretraining": True}}}
    text = tables_markdown({**results, "config": config})
    assert "Scratch = the fine-tuning recipe on a freshly initialised model (HYP: the pretraining recipe" in text
    config["per_model"]["hyp"]["scratch_unclipped_warmup"] = True
    assert ("(HYP: the pretraining recipe, scratch_like_pretraining, its Euclidean warm-up without the soft clip, "
            "scratch_unclipped_warmup)" in tables_markdown({**results, "config": config}))


def test_tables_show_scratch_cells_without_a_fine_tuned_pair(tiny_run):
    """A run of scratch cells only (no fine-tuned cell to pair with) still shows their accuracies."""
    _, results = tiny_run
    row = next(r for r in results["rows"] if r["variant"] == "scratch" and r["model"] == "hyp")
    text = tables_markdown({**results, "rows": [row]})
    assert "## Benefits of pretraining" not in text
    line = next(l for l in text.splitlines() if l.startswith("| HYP |") and " / " in l)
    on_all, on_new = line.split("|")[2].strip().split(" / ")
    assert on_all.startswith(f"{100 * row['acc_all']:.1f} ± 0.0") and on_new.startswith(f"{100 * row['acc_new']:.1f} ± 0.0")


def test_the_pretraining_gain_pairs_the_splits(tiny_run):
    """A scratch cell on one split is compared with the fine-tuned cell of that split, not with the
    mean over every split's fine-tuned cells."""
    from dyntc.protocol.report import paired_pretraining_gain

    _, results = tiny_run
    def row(variant, split, acc):
        return {"model": "euc", "variant": variant, "n_fine": 100, "split": split, "acc_all": acc, "acc_new": acc}

    rows = [row("fine-tuned", 0, 0.70), row("fine-tuned", 1, 0.80), row("scratch", 0, 0.60)]
    synthetic = {**results, "splits": 2, "rows": rows}
    (scratch, tuned), = paired_pretraining_gain(synthetic).values()
    assert scratch == pytest.approx((60.0, 0.0, 1)) and tuned == pytest.approx((70.0, 0.0, 1))
    assert "| EUC | 100 | 60.0 ± 0.0 (n=1) | 70.0 ± 0.0 (n=1) | +10.0 | 25% |" in tables_markdown(synthetic)


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
    assert [_without_timings(r) for r in again["rows"]] == [_without_timings(r) for r in expected]
    assert again["pretraining"]["0"]["euc"]["history"] == tiny_run[1]["pretraining"]["0"]["euc"]["history"]
    assert not list((tmp_path / "checkpoints").rglob("*.partial.pt"))


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


def test_a_new_configuration_is_taken_where_it_contradicts_no_finished_work(tiny_run, small_sent, tmp_path):
    """Settings may change without --force where no finished cell or pretraining depends on them: in a
    run stopped before anything finished (its running stages' snapshots are kept), or in one model's
    per-model settings while only other models have finished work. Anything else is refused."""
    out, results = tiny_run
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    header = {k: v for k, v in results.items() if k not in ("rows", "pretraining")}
    (run_dir / "results.json").write_text(json.dumps({**header, "rows": [], "pretraining": {}}))
    snapshot = run_dir / "checkpoints" / "split0" / "euc-pretrain.partial.pt"
    snapshot.parent.mkdir(parents=True)
    snapshot.write_bytes(b"kept")
    messages = []
    plan = make_plan("sent", "tiny", models="euc", variants="un-tuned", settings={"pretrain_episodes": "7"})
    ProtocolRun(small_sent, plan, run_dir, progress=False, log=messages.append)
    assert any("taking the new configuration" in m and "pretrain_episodes" in m for m in messages)
    assert snapshot.read_bytes() == b"kept"

    # finished EUC work: HYP's own settings may change, a shared one may not
    euc_only = {**header, "rows": [r for r in results["rows"] if r["model"] == "euc"],
                "pretraining": {s: {"euc": v["euc"]} for s, v in results["pretraining"].items()}}
    (run_dir / "results.json").write_text(json.dumps(euc_only))
    hyp_tuned = dataclasses.replace(protocol.TINY, per_model={"*": {"hyp": {"max_norm": 5.0}}})
    run = ProtocolRun(small_sent, make_plan("sent", hyp_tuned), run_dir, progress=False, log=messages.append)
    assert len(run.results["rows"]) == len(euc_only["rows"]) > 0
    assert run.results["fingerprint"]["hyperparameters"]["per_model"] == {"hyp": {"max_norm": 5.0}}
    (run_dir / "results.json").write_text(json.dumps(euc_only))
    with pytest.raises(DyntcError, match="different configuration.*lr.*for euc"):
        ProtocolRun(small_sent, make_plan("sent", "tiny", settings={"lr": "0.5"}), run_dir, progress=False)
    with pytest.raises(DyntcError, match="for euc"):
        euc_tuned = dataclasses.replace(protocol.TINY, per_model={"*": {"euc": {"max_norm": 5.0}}})
        ProtocolRun(small_sent, make_plan("sent", euc_tuned), run_dir, progress=False)


def test_embeddings_option_is_checked_and_not_in_the_fingerprint(tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("the 0.5 0.25\n", encoding="utf-8")
    plan = make_plan("sent", "paper", embeddings=glove)
    assert plan.embeddings == str(glove.resolve()) and plan.fingerprint() == make_plan("sent", "paper").fingerprint()
    with pytest.raises(DyntcError, match="--embeddings .*missing.txt' is not a file"):
        make_plan("sent", "paper", embeddings=tmp_path / "missing.txt")
    with pytest.raises(DyntcError, match="applies to the sru encoder only"):
        make_plan("sent", "paper", encoder="minilm", models="logreg", embeddings=glove)


def test_resume_with_a_glove_subset_file_and_refusal_of_other_vectors(tiny_run, small_sent, tmp_path, counted):
    """A subset file of the packaged vectors resumes a run (e.g. on a GPU host without the package);
    a file with other vectors is refused before it can mix two encoders' cells in one table."""
    import shutil

    from dyntc.text import write_glove_subset

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
    assert [_without_timings(r) for r in resumed["rows"]] == [_without_timings(r) for r in results["rows"]]
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


def test_overrides_are_parsed_in_one_place():
    """`--set` of the CLI and of the scripts: FIELD=VALUE pairs, spaces around either side dropped."""
    from dyntc.protocol import parse_overrides

    assert parse_overrides(["lr = 1e-3", "max_norm=none", "field=a=b"]) == {"lr": "1e-3", "max_norm": "none", "field": "a=b"}
    assert parse_overrides(None) == {}
    with pytest.raises(DyntcError, match=r"^settings: give each as FIELD=VALUE \(e.g. lr=1e-3\), got 'lr'$"):
        parse_overrides(["lr=1e-3", "lr"], option="settings")


@pytest.mark.parametrize("script, extra", [("scratch_warmup_probe", []), ("hyp_diagnose", ["--out", "OUT"])])
def test_diagnostic_scripts_refuse_a_bad_set_by_name(script, extra, tmp_path, capsys):
    """scripts/scratch_warmup_probe.py and scripts/hyp_diagnose.py: a bad --set is a usage error, before any work."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        module = __import__(script)
    finally:
        sys.path.pop(0)
    extra = [str(tmp_path / "out") if a == "OUT" else a for a in extra]
    for bad, message in ((["--set", "max_norm"], "--set: give each as FIELD=VALUE"),
                         (["--set", "lr=fast"], "lr='fast': expected a number")):
        with pytest.raises(SystemExit) as exit_:
            module.main([*bad, *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- parallel work units (--jobs) ----------------------------------------------------------------

TIMING_KEYS = {"train_seconds", "cell_seconds", "finished", "seconds", "machine"}  # and provenance


def _without_timings(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in TIMING_KEYS}


def test_jobs_must_be_a_positive_integer(small_sent, tmp_path):
    for bad in (0, -1, True, 1.5):
        with pytest.raises(DyntcError, match="--jobs must be an integer >= 1"):
            run_tiny(small_sent, tmp_path, jobs=bad)
    assert not (tmp_path / "results.json").exists()  # refused before any work


def test_two_jobs_give_the_same_results_as_one(tiny_run, small_sent, tmp_path, monkeypatch):
    """Every unit takes its seeds from derive_seed and featurizes the same way in its own process.
    The parent also rewrites the report while units run (here at every message): rows stay the same."""
    from dyntc.protocol import runner
    from dyntc.protocol import ProtocolRun

    out, sequential = tiny_run
    writes = []
    original = ProtocolRun.write_report
    monkeypatch.setattr(runner, "REPORT_EVERY_S", 0.0)
    monkeypatch.setattr(ProtocolRun, "write_report", lambda self: (writes.append(len(self.results["rows"])), original(self))[1])
    parallel = run_tiny(small_sent, tmp_path, jobs=2)
    assert len(writes) > 4 and writes[0] < writes[-1]  # 3 units: more reports than units, rows growing
    assert parallel["finished"] and parallel["jobs"] == 2
    key = lambda r: (r["model"], r["variant"], r["n_fine"], r["split"])  # noqa: E731
    assert [key(r) for r in parallel["rows"]] == [key(r) for r in sequential["rows"]]  # the plan's order
    for a, b in zip(sequential["rows"], parallel["rows"]):
        assert _without_timings(a) == _without_timings(b), key(a)  # accuracies, steps, best dev acc, ...
    for model, info in sequential["pretraining"]["0"].items():
        other = parallel["pretraining"]["0"][model]
        assert (info["steps"], info["best_dev_acc"], info["history"]) == (other["steps"], other["best_dev_acc"], other["history"])
    assert parallel["split_info"] == sequential["split_info"]
    assert (tmp_path / "tables.md").is_file()


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
        assert _without_timings(a) == _without_timings(b)
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    for record in (resumed["pretraining"]["0"]["hyp"], on_disk["pretraining"]["0"]["hyp"]):
        assert record["steps"] == sequential["pretraining"]["0"]["hyp"]["steps"] > 0


def test_a_failing_worker_names_its_unit(small_sent, tmp_path):
    # a directory where euc's checkpoint should go: saving the pretrained weights fails in the worker
    (tmp_path / "checkpoints" / "split0" / "euc.safetensors").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="work unit split 0 euc failed in its worker process") as info:
        run_tiny(small_sent, tmp_path, models="mlp,euc", variants="un-tuned", jobs=2)
    assert "rerun to resume" in str(info.value)


WRITER = """
import sys
from pathlib import Path
from dyntc.files import update_json
from dyntc.protocol import merge_results

path, who = Path(sys.argv[1]), sys.argv[2]
for i in range(60):
    ours = {"rows": [{"model": who, "variant": "fine-tuned", "n_fine": i, "split": 0}],
            "split_info": {"0": {who: i}}, "pretraining": {"0": {who: {"steps": i}}}}
    update_json(path, lambda disk: ours if disk is None else merge_results(disk, ours, header=False))
"""


def test_concurrent_writers_lose_no_row(tmp_path):
    path = tmp_path / "results.json"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who]) for who in ("a", "b", "c")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    data = json.loads(path.read_text())
    cells = {(r["model"], r["n_fine"]) for r in data["rows"]}
    assert len(data["rows"]) == len(cells) == 3 * 60
    assert data["split_info"]["0"] == {"a": 59, "b": 59, "c": 59}
    assert set(data["pretraining"]["0"]) == {"a", "b", "c"}


def test_progress_credits_early_stopped_stages_and_gives_both_etas():
    from dyntc.protocol.runner import Progress

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


def test_replay_stopping_script_finds_a_rule_change(tiny_run, tmp_path, capsys):
    """scripts/replay_stopping.py: a run replays to its own stops under its rule (status 0), and a
    history whose stop the rule would have placed elsewhere is reported (status 1)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import replay_stopping
    finally:
        sys.path.pop(0)
    out, results = tiny_run
    assert replay_stopping.main(str(out / "results.json")) == 0
    changed = json.loads((out / "results.json").read_text())
    info = changed["pretraining"]["0"]["euc"]
    info["steps"] = info["history"][-1]["step"] + 10  # as if it had run on past the rule's stop
    (tmp_path / "r.json").write_text(json.dumps(changed))
    assert replay_stopping.main(str(tmp_path / "r.json")) == 1
    assert "<- differs" in capsys.readouterr().out


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


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_compare_runs_script_pairs_each_cell_with_the_same_models_other_variant(capsys, monkeypatch, tmp_path):
    """scripts/compare_runs.py --versus-variant: the gain of fine-tuning, split by split, beside the
    paper's (its Table 2 fine-tuned minus its Table 3 un-tuned, where both print the n_fine)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import compare_runs
    finally:
        sys.path.pop(0)
    rows = [{"model": "euc", "variant": v, "n_fine": 5, "split": s, "acc_all": a}
            for v, s, a in (("fine-tuned", 0, 0.60), ("un-tuned", 0, 0.55), ("fine-tuned", 1, 0.50), ("un-tuned", 1, 0.52),
                            ("fine-tuned", 2, 0.70))]  # split 2 has no un-tuned cell: not paired
    results = {"dataset": "news", "rows": rows}
    compare_runs.versus_variant(results, compare_runs.cells(results), "un-tuned", per_split=True)
    # (+5.0 − 2.0) / 2 = +1.5, SE = std(+5, −2) / √2 = 4.95 / 1.41 = 3.5; the paper's NEWS EUC at 5:
    # 56.5 fine-tuned − 53.2 un-tuned = +3.3
    assert capsys.readouterr().out.split() == "euc fine-tuned 5: +1.5 (SE 3.5, n=2) [+3.3] (s0 +5.0, s1 -2.0)".split()
    compare_runs.paired(results, compare_runs.cells(results), compare_runs.cells(results), per_split=False, versus="euc")
    assert capsys.readouterr().out == ""  # EUC against itself is not printed
    rows.append({"model": "hyp", "variant": "fine-tuned", "n_fine": 5, "split": 0, "acc_all": 0.66})
    compare_runs.paired(results, compare_runs.cells(results), compare_runs.cells(results), per_split=False, versus="euc")
    assert capsys.readouterr().out.split() == "hyp fine-tuned 5: +6.0 (n=1)".split()  # one split: no SE
    rows.pop()
    # --markdown: ours ± std [paper], bold more than 2 points under the paper; (n=k) where splits are missing
    results["splits"] = 3
    compare_runs.markdown_table(results, compare_runs.cells(results))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| NEWS | n_fine 5 |"
    assert lines[2] == "| EUC fine-tuned | 60.0 ± 10.0 [56.5] |"  # 60.0 >= 56.5 - 2: not bold
    assert lines[3] == "| EUC un-tuned | 53.5 ± 2.1 (n=2) [53.2] |"
    results["rows"] = [dict(r, acc_all=r["acc_all"] - 0.1) for r in rows]
    compare_runs.markdown_table(results, compare_runs.cells(results))
    assert "| EUC fine-tuned | **50.0** ± 10.0 [56.5] |" in capsys.readouterr().out
    # what --markdown cannot combine with is refused by name, not ignored
    never_read = Path(__file__).parent / "_unused.json"  # the arguments are refused before it is opened
    for bad in (["--markdown", "--versus", "euc"], ["--markdown", "--field", "acc_new"], ["--versus-variant", "tuned"],
                ["--claims", "--per-split"]):
        with pytest.raises(SystemExit):
            monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(never_read), *bad])
            compare_runs.main()
    err = capsys.readouterr().err
    assert "--markdown prints a run's acc_all" in err and "invalid choice: 'tuned'" in err
    assert "--claims prints its own table from one run" in err
    # a missing or foreign file is named with the fix, not a traceback
    with pytest.raises(SystemExit, match="not a readable results.json"):
        monkeypatch.setattr(sys, "argv", ["compare_runs.py", str(never_read)])
        compare_runs.main()
    with pytest.raises(SystemExit, match="no 'dataset' and 'rows'"):
        compare_runs.read_results(_write(tmp_path / "other.json", '{"a": 1}'), "--base")


def test_compare_runs_claims_table_pairs_cells_split_by_split(capsys):
    """scripts/compare_runs.py --claims: each claim's paired difference averaged over the splits both
    cells have, `(k/n)` where a model is not ahead on every split, the paper's difference in brackets,
    and the relative error reduction of pretraining where scratch cells exist."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import compare_runs
    finally:
        sys.path.pop(0)
    cells = {("mlp", "fine-tuned"): (0.50, 0.40), ("euc", "fine-tuned"): (0.60, 0.50), ("hyp", "fine-tuned"): (0.62, 0.48),
             ("euc", "scratch"): (0.20, 0.00)}
    rows = [{"model": m, "variant": v, "n_fine": 5, "split": s, "acc_all": a[s], "acc_new": a[s]}
            for (m, v), a in cells.items() for s in (0, 1)]
    results = {"dataset": "news", "splits": 2, "rows": rows}
    compare_runs.claims_table(results, compare_runs.cells(results), compare_runs.cells(results, "acc_new"))
    lines = capsys.readouterr().out.splitlines()
    # EUC − MLP: +10 on both splits [paper NEWS 56.5 − 49.2]; HYP − MLP: (+12 + 8) / 2
    assert lines[2] == "| metric models beat the MLP at low n_fine | EUC 5: +10.0 [+7.3]; HYP 5: +10.0 [+15.6] |"
    # HYP − EUC: +2 and −2, ahead on 1 of 2 splits [64.8 − 56.5]
    assert lines[4] == "| HYP beats EUC at low n_fine (hierarchical data) | fine-tuned 5: +0.0 (1/2) [+8.3] |"
    assert lines[5].endswith("| no such cells |")  # no un-tuned cells
    # (60 − 20) / 80 and (50 − 0) / 100: half the scratch model's errors, beside the paper's Analysis
    assert lines[-1].endswith("| 5: EUC 50% [> 53%] |")


def test_quick_keeps_sents_skewed_dev_set_whole_and_caps_the_others(sent, tmp_path):
    """A dev set capped per class is balanced; SENT's labels are skewed, so `quick` keeps its dev sets
    whole, as `paper` does (early stopping then targets the accuracy the test reports)."""
    from collections import Counter

    assert make_plan("news", "quick").hp["dev_per_class"] == 30 and make_plan("sent", "paper").hp["dev_per_class"] is None
    whole = protocol.ProtocolRun(sent, make_plan("sent", "quick"), tmp_path / "a", progress=False, log=lambda msg: None).split_data(0)
    assert len(whole.dev_new) == len(sent.dev) and len(whole.dev_old) == len(whole.split.dev_old) < len(sent.dev)
    counts = Counter(whole.dev_new.labels)
    assert max(counts.values()) > 3 * min(counts.values())  # skewed: what a cap would have flattened
    capped = protocol.ProtocolRun(sent, make_plan("sent", "quick", settings={"dev_per_class": "30"}), tmp_path / "b",
                                  progress=False, log=lambda msg: None).split_data(0)
    assert max(Counter(capped.dev_new.labels).values()) == 30 and len(capped.dev_new) < len(sent.dev)


def test_pretrain_stage_script_takes_the_runs_device_and_embeddings(tmp_path):
    """scripts/pretrain_stage.py runs a selection stage where `dyntc reproduce` would (--device,
    --embeddings reach the plan); a device that is not there is a one-line exit, before any work."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import pretrain_stage
    finally:
        sys.path.pop(0)
    glove = tmp_path / "glove.txt"
    glove.write_text("the " + " ".join(["0.1"] * 50) + "\n")
    args = pretrain_stage.argparse.Namespace(settings=["lr=1e-3"], dataset="news", model="hyp", split=1, profile="paper",
                                             device="cpu", embeddings=glove)
    plan = pretrain_stage._plan(args, selection=True)
    assert plan.device == "cpu" and Path(plan.embeddings) == glove and plan.model_hp("hyp")["lr"] == 1e-3
    assert plan.hp["pretrain_min_episodes"] == plan.hp["pretrain_episodes"]  # a selection run: no early stop
    for bad, message in ((["lr"], "give each as FIELD=VALUE"), (["lr=fast"], "lr='fast': expected a number"),
                         (["learn_scale=maybe"], "learn_scale='maybe': give a flag"),
                         (["--profile", "slow"], "unknown profile 'slow'")):
        with pytest.raises(SystemExit, match=f"pretrain_stage.py: .*{message}"):
            pretrain_stage.main([str(tmp_path / "out"), *bad])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="pretrain_stage.py: --device 'cuda' requested but no CUDA device"):
            pretrain_stage.main([str(tmp_path / "out"), "--device", "cuda"])
    assert not (tmp_path / "out").exists()  # every bad option stops before any work
