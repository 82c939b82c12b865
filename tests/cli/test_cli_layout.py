"""The command line's modules stay readable, and `dyntc fit`'s options are the constructor's parameters
(same names, same defaults: declared once, in DynamicClassifier.__init__)."""

import inspect
from pathlib import Path

import dyntc.cli

CLI = Path(dyntc.cli.__file__).parent


def test_every_cli_module_is_under_400_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CLI.glob("*.py")}
    assert {"classifier.py", "labels.py", "common.py"} <= sizes.keys()  # the modules were found
    assert {name: n for name, n in sizes.items() if n > 400} == {}


def test_fit_options_are_the_constructor_parameters_with_its_defaults():
    from dyntc import DynamicClassifier
    from dyntc.cli.classifier import fit

    constructor = {n: p.default for n, p in inspect.signature(DynamicClassifier.__init__).parameters.items() if n != "self"}
    options = inspect.signature(fit).parameters
    for name, default in constructor.items():
        if name == "progress":  # on a terminal by default: --progress/--no-progress
            continue
        assert name in options, f"dyntc fit has no --{name.replace('_', '-')}"
        assert options[name].default == default, name
    assert {"hidden", "layers", "time_budget", "runtime"}.isdisjoint(options)


def test_fit_passes_each_option_to_the_classifier(dyntc_cli, toy_files):
    from dyntc import DynamicClassifier

    code, _, err = dyntc_cli("fit", "--data", toy_files / "train.csv", "--out", toy_files / "m", "--encoder", "hashing",
                             "--head", "none", "--no-debias", "--batch-size", "7", "--seed", "3",
                             "--head-options", "refresh_delay=2.5", "--time-budget-s", "30")
    assert code == 0, err
    clf = DynamicClassifier.load(toy_files / "m")
    assert (clf.head, clf.debias, clf.batch_size, clf.seed) == (None, False, 7, 3)


def test_calling_main_again_registers_no_command_twice(dyntc_cli):
    """Each command is registered once per process: typer builds every registered command on each call,
    so duplicates made each `main()` slower than the last (60 calls of `labels list`: 0.24 s -> 11 s)."""
    from dyntc.cli import app
    from dyntc.cli.labels import labels_app

    for _ in range(3):
        assert dyntc_cli("labels", "list", "--help")[0] == 0
        commands = [c.name or c.callback.__name__ for c in app.registered_commands]
        label_commands = [c.name or c.callback.__name__ for c in labels_app.registered_commands]
        assert len(commands) == len(set(commands)) and len(label_commands) == len(set(label_commands))
        assert "fit" in commands and "export" in label_commands
