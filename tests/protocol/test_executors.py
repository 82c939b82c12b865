"""Executors of `dyntc reproduce`: the Ray executor on a real local Ray cluster (2 CPUs) gives the cells
of `--jobs 1`, resumes, and names a failing unit; without Ray, `--executor ray` is refused with the
install command. The local executor (`--jobs N`) is tested in test_reproduce.py."""

import json
import shutil
import sys

import pytest
import torch

from dyntc.protocol.data.types import Dataset, Split
from dyntc.errors import DyntcError
from dyntc.protocol import executors
from _protocol import run_tiny, without_timings

try:
    import ray
except ImportError:  # an optional extra; scripts/setup.sh installs it (requirements.lock)
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed: pip install 'dyntc[ray]' "
                                                   "(scripts/setup.sh installs it from requirements.lock)")

def _key(r: dict) -> tuple:
    return r["model"], r["variant"], r["n_fine"], r["split"]


# ---- without Ray, and the options ---------------------------------------------------------------


@pytest.mark.data
def test_ray_executor_without_ray_names_the_extra(small_sent, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    with pytest.raises(DyntcError, match=r"--executor ray needs Ray.*pip install 'dyntc\[ray\]'"):
        run_tiny(small_sent, tmp_path / "run", executor="ray")
    assert not (tmp_path / "run").exists()  # refused before any work


def test_the_cli_refuses_ray_without_ray(tmp_path, monkeypatch, capsys):
    from dyntc.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setattr(sys, "argv", ["dyntc", "reproduce", "--dataset", "sent", "--profile", "tiny", "--executor", "ray",
                                      "--address", "10.0.0.1:6379", "--no-progress", "--out", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "pip install 'dyntc[ray]'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.data
def test_executor_options_are_checked(small_sent, tmp_path):
    with pytest.raises(DyntcError, match="unknown --executor 'slurm': choose from local, ray"):
        run_tiny(small_sent, tmp_path, executor="slurm")
    with pytest.raises(DyntcError, match="--address is the address of a Ray cluster: give it with --executor ray"):
        run_tiny(small_sent, tmp_path, address="10.0.0.1:6379")
    with pytest.raises(DyntcError, match="--jobs is for the local executor"):
        run_tiny(small_sent, tmp_path, executor="ray", jobs=2)
    assert not (tmp_path / "results.json").exists()


@pytest.mark.data
@needs_ray
def test_an_address_where_nothing_answers_is_refused_at_once(small_sent, tmp_path):
    with pytest.raises(DyntcError, match=r"nothing answers at the Ray cluster address 127.0.0.1:9 \(.*\): start the cluster's head"):
        run_tiny(small_sent, tmp_path, executor="ray", address="127.0.0.1:9")


# ---- on a local Ray cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster():
    if ray is None:
        pytest.skip("Ray is not installed: pip install 'dyntc[ray]'")
    # a new local cluster of 2 CPUs (not one a `ray start` may have left on this machine); the executor uses it
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def sequential(small_sent, tmp_path_factory):
    out = tmp_path_factory.mktemp("jobs1")
    return out, run_tiny(small_sent, out, jobs=1)


def _same_results(a: dict, b: dict) -> None:
    assert [_key(r) for r in b["rows"]] == [_key(r) for r in a["rows"]]  # the plan's order
    for x, y in zip(a["rows"], b["rows"]):
        assert without_timings(x) == without_timings(y), _key(x)  # accuracies, steps, best dev acc, history
    for model, info in a["pretraining"]["0"].items():
        assert without_timings(b["pretraining"]["0"][model]) == without_timings(info), model
    assert b["split_info"] == a["split_info"] and b["vocabulary"] == a["vocabulary"]


@pytest.mark.data
@needs_ray
def test_ray_gives_the_cells_of_one_job_and_a_second_run_does_nothing(ray_cluster, sequential, small_sent, tmp_path, monkeypatch):
    out, one_job = sequential
    received = []  # the files the tasks sent (stage snapshots at every progress report here)
    merge = executors.ProtocolRun.merge_output
    monkeypatch.setattr(executors.ProtocolRun, "merge_output",
                        lambda self, output, source: (received.extend(output.get("files") or {}), merge(self, output, source))[1])
    monkeypatch.setattr(executors.RayExecutor, "snapshot_every_s", 0.0)
    results = run_tiny(small_sent, tmp_path, executor="ray")
    assert results["finished"] and results["executor"] == "ray" and results["jobs"] == 2  # 2 CPUs, 1 thread per unit
    _same_results(one_job, results)
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == results["rows"]
    # the pretrained weights came back from the tasks (no shared folder is assumed) and are the same
    for model in ("mlp", "euc", "hyp"):
        for ext in (".safetensors", ".json"):
            assert (tmp_path / "checkpoints" / "split0" / f"{model}{ext}").is_file()
        assert ((tmp_path / "checkpoints" / "split0" / f"{model}.safetensors").read_bytes()
                == (out / "checkpoints" / "split0" / f"{model}.safetensors").read_bytes())
    assert any(name.endswith(".partial.pt") for name in received)  # running stages' snapshots came too ...
    assert not list(tmp_path.rglob("*.partial.pt"))  # ... and went with their stages' ends, as in a local run
    assert (tmp_path / "tables.md").is_file()

    def no_tasks(self, *args):
        raise AssertionError("a finished run submitted work")

    monkeypatch.setattr(executors.RayExecutor, "run", no_tasks)
    again = run_tiny(small_sent, tmp_path, executor="ray")
    assert again["rows"] == results["rows"] and again["finished"]


@pytest.mark.data
@needs_ray
def test_ray_resumes_an_interrupted_run_from_the_drivers_checkpoints(ray_cluster, sequential, small_sent, tmp_path):
    """The driver sends each unit its saved weights: euc's are loaded on the worker (its record is the
    saved one, seconds included), hyp's lost weights are pretrained again; the cells equal --jobs 1."""
    out, one_job = sequential
    run = tmp_path / "run"
    shutil.copytree(out, run)
    data = json.loads((run / "results.json").read_text())
    data["rows"] = [r for r in data["rows"] if r["model"] == "mlp" or r["n_fine"] == 5]  # euc, hyp n_fine=10 lost
    data["finished"] = None
    data["pretraining"]["0"]["hyp"] = {**data["pretraining"]["0"]["hyp"], "steps": -1, "best_dev_acc": -1.0}
    (run / "results.json").write_text(json.dumps(data))
    (run / "checkpoints" / "split0" / "hyp.safetensors").unlink()
    resumed = run_tiny(small_sent, run, executor="ray")
    assert resumed["finished"]
    _same_results(one_job, resumed)
    assert resumed["pretraining"]["0"]["euc"] == one_job["pretraining"]["0"]["euc"]  # loaded, not trained again
    on_disk = json.loads((run / "results.json").read_text())
    assert on_disk["pretraining"]["0"]["hyp"]["steps"] == one_job["pretraining"]["0"]["hyp"]["steps"] > 0
    assert on_disk["rows"] == resumed["rows"]


@pytest.mark.data
@needs_ray
def test_a_failing_ray_unit_names_it_with_the_remote_traceback(ray_cluster, small_sent, tmp_path):
    # a text that is not a string: the driver plans the splits from the labels, the worker fails featurizing
    test = Split([None, *small_sent.test.texts[1:]], list(small_sent.test.labels))
    bad = Dataset(small_sent.name, small_sent.train, small_sent.dev, test, small_sent.hierarchy, dict(small_sent.info))
    with pytest.raises(RuntimeError, match=r"work unit split 0 euc failed on Ray node \S+: ") as info:
        run_tiny(bad, tmp_path, models="euc", variants="un-tuned", executor="ray")
    message = str(info.value)
    assert "rerun to resume" in message and "Remote traceback (last lines):" in message
    assert "File " in message.split("Remote traceback (last lines):")[1]  # the worker's frames, not the driver's
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == []


def test_unit_files_are_the_units_own(tmp_path):
    from dyntc.protocol import Unit

    folder = tmp_path / "checkpoints" / "split1"
    folder.mkdir(parents=True)
    for name in ("euc.safetensors", "euc.json", "euc-pretrain.partial.pt", "euc-fine-tuned-5.partial.pt",
                 "hyp.safetensors", "hyp-pretrain.partial.pt"):
        (folder / name).write_bytes(name.encode())
    files = executors.unit_files(tmp_path, Unit(1, "euc", []))
    assert files == {f"checkpoints/split1/{n}": n.encode() for n in
                     ("euc.safetensors", "euc.json", "euc-fine-tuned-5.partial.pt", "euc-pretrain.partial.pt")}
    assert executors.unit_files(tmp_path, Unit(0, "euc", [])) == {}


@pytest.mark.data
@needs_ray
def test_a_stage_stopped_mid_way_resumes_on_ray_from_the_drivers_snapshot(ray_cluster, sequential, small_sent, tmp_path,
                                                                          monkeypatch, stop_first_stage):
    """Stopped during EUC's pretraining in a local run, the stage's snapshot is sent with the unit: the
    Ray task goes on from its step 10 (half the stage's work) and ends with the uninterrupted run's
    cells; the snapshot is then gone from the driver's run directory."""
    from dyntc.protocol import reproduce as pipeline

    with pytest.raises(KeyboardInterrupt):
        run_tiny(small_sent, tmp_path, models="euc", variants="un-tuned")
    snapshot = tmp_path / "checkpoints" / "split0" / "euc-pretrain.partial.pt"
    assert torch.load(snapshot, weights_only=True)["step"] == 10
    stop_first_stage.restore()
    work, planned = {}, {}
    report = pipeline.Progress.report

    def counted(self, stage, n, finished):
        work[stage], planned[stage] = work.get(stage, 0) + n, self.costs[stage]
        return report(self, stage, n, finished)

    monkeypatch.setattr(pipeline.Progress, "report", counted)
    resumed = run_tiny(small_sent, tmp_path, models="euc", variants="un-tuned", executor="ray")
    expected = [r for r in sequential[1]["rows"] if r["model"] == "euc" and r["variant"] == "un-tuned"]
    assert [without_timings(r) for r in resumed["rows"]] == [without_timings(r) for r in expected]
    assert resumed["pretraining"]["0"]["euc"]["history"] == sequential[1]["pretraining"]["0"]["euc"]["history"]
    pretraining = (0, "pretrain", "euc")
    assert 0 < work[pretraining] <= planned[pretraining] / 2  # episodes 11 to 20 of 20 (without the snapshot: all 20)
    assert not snapshot.exists()


@pytest.mark.data
@needs_ray
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a cluster without GPUs")
def test_cuda_units_need_a_gpu_node(ray_cluster, small_sent, tmp_path):
    """The driver needs no GPU of its own for --device cuda on a cluster; one without a GPU is refused."""
    with pytest.raises(DyntcError, match=r"no node of the Ray cluster can run a unit: each needs 1 CPU\(s\) and a GPU"):
        run_tiny(small_sent, tmp_path, executor="ray", device="cuda")
    with pytest.raises(DyntcError, match="give --device cuda"):
        run_tiny(small_sent, tmp_path, executor="ray", device="cuda:1")
    with pytest.raises(DyntcError, match="no CUDA device is available"):  # the local executor's units run here
        run_tiny(small_sent, tmp_path, device="cuda")
