"""`results.json` (`dyntc.protocol.results`): the run's grid joined over invocations, a new configuration
taken where no finished work contradicts it, concurrent writers."""

import dataclasses
import json
import subprocess
import sys

import pytest

import dyntc.protocol as protocol
from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, make_plan


def test_joined_grid_counts_scratch_only_where_it_was_asked_for():
    from dyntc.protocol.results import joined_grid

    plan = make_plan("sent", "tiny", n_fine="5,100", variants="scratch", scratch_n_fine="5")
    before = {"n_fine": [5, 10, 20, 100], "models": ["euc"], "variants": ["fine-tuned"], "scratch_n_fine": None, "rows": []}
    grid = joined_grid(before, plan)
    assert grid["n_fine"] == [5, 10, 20, 100] and grid["variants"] == ["fine-tuned", "scratch"]
    assert grid["scratch_n_fine"] == [5] and grid["models"] == ["mlp", "euc", "hyp"]
    everywhere = joined_grid({**before, "variants": ["scratch"]}, plan)
    assert everywhere["scratch_n_fine"] is None  # the earlier invocation asked for scratch at every n_fine


@pytest.mark.data
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


WRITER = """
import sys
from pathlib import Path
from dyntc.core.files import update_json
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
