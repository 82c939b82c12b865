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
])
def test_discovery_refuses_an_option_that_cannot_run(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bench.discovery", *argv])
    monkeypatch.setattr(discovery, "run_discovery", lambda args: pytest.fail("ran despite a bad option"))
    with pytest.raises(SystemExit) as stop:
        discovery.main()
    assert stop.value.code == 2
    assert message in capsys.readouterr().err
