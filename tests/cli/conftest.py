import shutil
import sys

import pytest
from _cli import run_cli
from _csvfiles import write_csv  # noqa: F401 (the fixtures below use it)


@pytest.fixture
def run_dyntc(monkeypatch):
    """``run_dyntc(*argv)``: the ``dyntc`` command in this process, which must exit without error."""
    from dyntc.cli import main

    def run(*argv):
        monkeypatch.setattr(sys, "argv", ["dyntc", *argv])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert not exit_.value.code

    return run


@pytest.fixture
def dyntc_cli():
    """``dyntc_cli(*argv, input="")``: the ``dyntc`` command in this process; returns (exit status,
    stdout, stderr), whatever the status."""
    return run_cli


@pytest.fixture(scope="session")
def _toy_master(tmp_path_factory):
    from _toy import TEXTS

    from dyntc import DynamicClassifier

    root = tmp_path_factory.mktemp("toy")
    train = [(t, y) for y, texts in TEXTS.items() for t in texts[:7]]
    test = [(t, y) for y, texts in TEXTS.items() for t in texts[7:]]
    oos = ["tell me a joke", "who won the game last night", "play some jazz music"]
    write_csv(root / "train.csv", train)
    write_csv(root / "dev.csv", test)
    write_csv(root / "test.csv", test + [(t, "oos") for t in oos])
    (root / "oos.txt").write_text("\n".join(oos) + "\n")
    DynamicClassifier(encoder="hashing").fit(*zip(*train)).save(root / "model")
    return root


@pytest.fixture
def toy_files(_toy_master, tmp_path):
    """The toy intents (tests/_toy.py) as train.csv (7 texts a label), test.csv (3 a label and 3
    out-of-scope texts labelled ``oos``), dev.csv (test.csv's in-scope rows) and oos.txt, in tmp_path."""
    for name in ("train.csv", "dev.csv", "test.csv", "oos.txt"):
        shutil.copy(_toy_master / name, tmp_path / name)
    return tmp_path


@pytest.fixture
def toy_model(_toy_master, toy_files):
    """A copy of a model directory fitted on train.csv with the hashing encoder, beside toy_files'."""
    shutil.copytree(_toy_master / "model", toy_files / "model")
    return toy_files / "model"
