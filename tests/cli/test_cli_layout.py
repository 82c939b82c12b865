"""The command line's modules stay readable, and `dyntc fit`'s options are the constructor's parameters
(same names, same defaults: declared once, in DynamicClassifier.__init__)."""

import inspect
from pathlib import Path

import dyntc.cli

CLI = Path(dyntc.cli.__file__).parent


def test_every_cli_module_is_under_400_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CLI.glob("*.py")}
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
