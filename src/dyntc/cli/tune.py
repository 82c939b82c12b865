"""``dyntc tune``: fine-tune a saved (or served) model's backbone on its support sets and commit the result
as one new version (:mod:`dyntc.classifier.tuning`), here or as a Ray task (``--executor ray``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from dyntc.cli.common import ModelDir, ProgressOpt, note, progress_on, showing_progress
from dyntc.errors import DyntcError

EXECUTORS = ("local", "ray")


def tune(
    model: ModelDir,
    budget: Annotated[float, typer.Option(help="Seconds of training at most (the tune then embeds the support "
                                                "sets and commits)")] = 600.0,
    device: Annotated[str, typer.Option(help="Where to train: cpu or cuda (cuda:N)")] = "cpu",
    episodes: Annotated[Optional[int], typer.Option(help="Episodes at most (default: the model's episodes "
                                                         "parameter, 1000)")] = None,
    calibrate: Annotated[Optional[Path], typer.Option(help="Held-out labelled texts (.csv/.tsv/.jsonl, not support "
                                                           "examples) to refit the calibration on; without it a "
                                                           "calibration is dropped")] = None,
    oos: Annotated[Optional[Path], typer.Option(help="Out-of-scope examples for --calibrate")] = None,
    text_col: Annotated[str, typer.Option(help="Column with the texts (--calibrate, --oos)")] = "text",
    label_col: Annotated[str, typer.Option(help="Column with the labels (--calibrate)")] = "label",
    executor: Annotated[str, typer.Option(help="local (this process) or ray (a Ray task; a model directory must "
                                                "be reachable from the Ray node, a postgresql:// model is)")] = "local",
    address: Annotated[Optional[str], typer.Option(help="With --executor ray: the Ray cluster's address "
                                                        "(default: RAY_ADDRESS, else a local Ray instance)")] = None,
    progress: ProgressOpt = None,
) -> None:
    """Fine-tune the model's backbone on its support sets and commit it as a new version, without stopping
    writers or servers: label changes made meanwhile are carried over, `dyntc serve` picks the version up."""
    from dyntc.classifier.tuning import check_budget
    from dyntc.cli.reading import read_examples, read_labelled
    from dyntc.core.machine import check_device

    check_budget(budget, "--budget")
    if executor not in EXECUTORS:
        raise DyntcError(f"--executor must be {' or '.join(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise DyntcError("--address is the address of a Ray cluster: give it with --executor ray")
    if episodes is not None and episodes < 1:
        raise DyntcError(f"--episodes must be an integer >= 1, got {episodes}")
    if oos is not None and calibrate is None:
        raise DyntcError("--oos measures the rejection of --calibrate: give --calibrate too")
    if executor == "local":
        check_device(device, "--device")
    elif not re.fullmatch(r"cpu|cuda(:\d+)?", device):  # whether it is there, the Ray task checks where it runs
        raise DyntcError(f"--device must be cpu or cuda (cuda:N), got {device!r}")
    held_out = None
    if calibrate is not None:
        held_out = read_labelled(calibrate, text_col, label_col)
        if oos is not None:
            held_out = (*held_out, read_examples(oos, text_col))
    args = (model, budget, device, episodes, held_out)
    if executor == "ray":
        report = _on_ray(address, device, args)
    else:
        with showing_progress(progress):
            report = _tune(*args, progress=progress_on(progress))
    print(json.dumps(report))
    note(f"tuned version {report['base_version']} for {report['episodes']} episodes ({report['train_seconds']:.0f} s): "
         f"version {report['version']}, {report['weights_bytes'] / 1e6:.1f} MB of tuned layers"
         + (f"; {report['few_shot']} labels with few examples left out of the training" if report["few_shot"] else "")
         + (f"; {len(report['replayed'])} labels changed meanwhile carried over" if report["replayed"] else ""))


def _tune(model: str, budget: float, device: str, episodes: int | None, held_out, progress: bool = False) -> dict:
    from dyntc.classifier import DynamicClassifier

    return DynamicClassifier.tune_saved(model, budget, device=device, episodes=episodes, calibration=held_out,
                                        progress=progress).to_dict()


def _on_ray(address: str | None, device: str, args: tuple) -> dict:
    """The tune as one Ray task (one GPU when `device` is CUDA); its errors come back as they were raised."""
    import os

    from dyntc.protocol.executors import RAY_INSTALL

    try:
        import ray
    except ImportError as exc:
        raise DyntcError(f"--executor ray needs Ray, which is not installed here ({exc}): {RAY_INSTALL}") from None
    address = address or os.environ.get("RAY_ADDRESS") or None
    ours = not ray.is_initialized()  # a process that connected already (a test, a notebook) stays connected
    ray.init(address=address, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True,
             runtime_env={"env_vars": {k: os.environ[k] for k in ("PYTHONPATH", "DYNTC_DATA", "DYNTC_CACHE")
                                       if k in os.environ}})
    try:
        if device.startswith("cuda") and not ray.cluster_resources().get("GPU"):
            raise DyntcError(f"--device {device}: the Ray cluster has no GPU (it would wait for one forever); use "
                             "--device cpu or a cluster with a GPU node")
        task = ray.remote(num_cpus=1, num_gpus=1 if device.startswith("cuda") else 0, max_retries=0)(_tune)
        try:
            return ray.get(task.remote(*args))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, DyntcError):
                raise DyntcError(str(cause).splitlines()[-1].split(": ", 1)[-1]) from None
            raise
    finally:
        if ours:
            ray.shutdown()
