"""`dyntc train`'s options are SingleModelConfig's fields: each one's flag, default and help come from the
field, and what the command line gives reaches train_one as that config (train_one replaced: nothing is
trained)."""

import dataclasses
from pathlib import Path

import typer

from dyntc.protocol.options import available_device
from dyntc.protocol.single import SingleModelConfig


def test_every_option_is_a_field_with_its_default_and_help():
    from dyntc.cli import _register, app

    _register()
    params = {p.name: p for p in typer.main.get_command(app).commands["train"].params}
    fields = dataclasses.fields(SingleModelConfig)
    assert list(params) == [f.name for f in fields]
    assert params["dataset"].required and fields[0].name == "dataset"
    for f in fields[1:]:
        assert params[f.name].help == f.metadata["help"]
        assert params[f.name].default == (available_device() if f.name == "device" else f.default), f.name
    assert params["finetune"].opts == ["--finetune"] and params["finetune"].secondary_opts == []
    assert params["progress"].secondary_opts == ["--no-progress"]


def test_the_command_line_reaches_train_one_as_the_config(monkeypatch, capsys, run_dyntc):
    from dyntc.protocol import single

    seen = []

    def fake(cfg, log=print, save_prototypical=None):
        seen.append(cfg)
        return {"dataset": cfg.dataset, "model": cfg.model, "dev_acc": 0.5, "test_acc": 0.5, "total_seconds": 1.0}

    monkeypatch.setattr(single, "train_one", fake)

    def run(*args):
        run_dyntc("train", *args)
        return seen[-1]

    assert run("--dataset", "sent") == SingleModelConfig(dataset="sent", device=available_device())
    assert run("--dataset", "news", "--model", "euc", "--out", "o", "--encoder", "minilm", "--finetune",
               "--hidden", "32", "--dropout", "0.2", "--embeddings", "g.txt", "--time-budget", "60",
               "--device", "cpu", "--no-progress") == SingleModelConfig(
        dataset="news", model="euc", out=Path("o"), encoder="minilm", finetune=True, hidden=32, dropout=0.2,
        embeddings=Path("g.txt"), time_budget=60.0, device="cpu", progress=False)
    assert '"test_acc": 0.5' in capsys.readouterr().out
