"""The benchmarks under bench/ (not installed): options that cannot run are refused before any
embedding or training starts, with a message naming the option."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import discovery  # noqa: E402

LAYERS = "--fit-layers takes 1 to 6 (MiniLM's layers) and applies with --fit-s"


@pytest.mark.parametrize("argv, message", [
    (["--fit-s", "0"], "--fit-s takes a number of seconds > 0, got 0"),
    (["--tune-s", "-5"], "--tune-s takes a number of seconds > 0, got -5"),
    (["--adapt-s", "nan"], "--adapt-s takes a number of seconds > 0, got nan"),
    (["--fit-layers", "4"], f"{LAYERS}, got 4 without --fit-s"),
    (["--fit-s", "60", "--fit-layers", "7"], f"{LAYERS}, got 7"),
    (["--fit-lr", "5e-5"], "--fit-lr takes a learning rate > 0 and applies with --fit-s, got 5e-05 without --fit-s"),
    (["--fit-s", "60", "--fit-lr", "0"], "--fit-lr takes a learning rate > 0 and applies with --fit-s, got 0"),
    (["--ceiling", "--tune-s", "60"], "--ceiling fits on every label and discovers nothing: drop --tune-s"),
    (["--ceiling", "--estimates"], "--ceiling fits on every label and discovers nothing: drop --estimates"),
    (["--ceiling", "--words-weight", "0", "--mode", "fast"],
     "--ceiling fits on every label and discovers nothing: drop --words-weight and --mode"),
])
def test_discovery_refuses_an_option_that_cannot_run(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench.discovery", *argv])
    for run in ("run_discovery", "run_ceiling", "run_estimates"):
        monkeypatch.setattr(discovery, run, lambda args: pytest.fail("ran despite a bad option"))
    with pytest.raises(SystemExit) as stop:
        discovery.main()
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_fit_options_pass_the_layers_and_the_backbone_learning_rate_to_the_encoder():
    assert discovery.fit_options(None, 4, 5e-5) == {}
    assert discovery.fit_options(600, None) == {"train": "backbone", "time_budget_s": 600}
    assert discovery.fit_options(600, 6, 5e-5) == {"train": "backbone", "time_budget_s": 600,
                                                   "encoder_options": {"train_layers": 6, "backbone_lr": 5e-5}}


def test_ceiling_table_sets_the_mean_beside_the_best_published_figure_of_each_ratio():
    rows = [{"dataset": "mcid", "seed": 0, "scores": (86.0, 77.0, 88.0), "seconds": 10.0},
            {"dataset": "mcid", "seed": 1, "scores": (84.0, 75.0, 86.0), "seconds": 20.0},
            {"dataset": "clinc150", "seed": 0, "scores": (96.0, 90.0, 95.0), "seconds": 30.0}]
    lines = discovery.ceiling_table(rows).splitlines()
    assert lines[2] == ("| clinc150 | 96.0±0.0 / 90.0±0.0 / 95.0±0.0 | 30 | 25%: USNID 94.2 / 78.0 / 83.1; "
                        "50%: USNID 95.5 / 83.0 / 87.3; 75%: USNID 96.4 / 86.8 / 90.4 |")
    assert lines[3] == "| mcid | 85.0±1.0 / 76.0±1.0 / 87.0±1.0 | 15 | 75%: MTP-CLNN 83.8 / 73.2 / 84.4 |"


def test_fit_options_fine_tune_the_backbone_only_with_a_budget():
    assert discovery.fit_options(None, 4) == {}
    assert discovery.fit_options(600, None) == {"train": "backbone", "time_budget_s": 600}
    assert discovery.fit_options(600, 4) == {"train": "backbone", "time_budget_s": 600,
                                             "encoder_options": {"train_layers": 4}}
