import sys

import pytest


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
