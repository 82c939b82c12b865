"""`dyntc reproduce`'s options are ReproduceOptions' fields: each one's flag, default and help come from
the field, and what the command line gives reaches the runner as those options (the runner itself
replaced: nothing is trained)."""

import dataclasses
from pathlib import Path

import pytest
import typer

from dyntc.protocol.options import ReproduceOptions, available_device


@pytest.fixture
def calls(monkeypatch, run_dyntc):
    """`dyntc reproduce ARGS` in this process, the runner replaced; returns its (args, options, log)."""
    from dyntc.protocol import reproduce as pipeline

    seen = []

    def fake(dataset, profile, out, options, *, log=None):
        seen.append(((dataset, profile, out), options, log))
        return {"rows": [], "finished": True}

    monkeypatch.setattr(pipeline, "reproduce", fake)

    def run(*args):
        run_dyntc("reproduce", *args)
        return seen[-1]

    return run


def test_every_option_is_a_field_with_its_default_and_help():
    from dyntc.cli import _register, app

    _register()
    params = {p.name: p for p in typer.main.get_command(app).commands["reproduce"].params}
    fields = dataclasses.fields(ReproduceOptions)
    assert list(params) == ["dataset", "profile", "out", *(f.name for f in fields)]
    cli_defaults = {"device": available_device(), "threads": 1}  # the command's own defaults
    for f in fields:
        assert params[f.name].help == f.metadata["help"]
        assert params[f.name].default == cli_defaults.get(f.name, f.default), f.name
    assert params["settings"].opts == ["--set"] and params["n_fine"].opts == ["--n-fine"]
    assert params["force"].secondary_opts == ["--no-force"]


def test_the_command_line_reaches_the_runner_as_options(calls):
    (dataset, profile, out), opts, log = calls("--dataset", "sent")
    assert (dataset, profile, out) == ("sent", "quick", Path("runs/reproduce-sent-quick"))
    assert opts == ReproduceOptions(device=available_device(), threads=1, settings={}) and log is None
    _, opts, log = calls("--dataset", "news", "--n-fine", "5,20", "--set", "lr=1e-3", "--set", "max_norm=none",
                         "--no-progress", "--jobs", "2", "--threads", "3", "--p", "0.4", "--redo", "hyp",
                         "--embeddings", "glove.txt", "--device", "cpu", "--tune")
    assert opts == ReproduceOptions(n_fine="5,20", settings={"lr": "1e-3", "max_norm": "none"}, progress=False, jobs=2,
                                    threads=3, p=0.4, redo="hyp", embeddings=Path("glove.txt"), device="cpu", tune=True)
    assert callable(log)  # without progress bars, messages are printed
