"""The `dyntc` command run in this process through its entry point (`dyntc.cli.main`), which saves a
Python start and a torch import per call. A module of its own for the reason tests/_csvfiles.py gives."""

import contextlib
import io
import sys


def run_cli(*args, input: str = "") -> tuple[int, str, str]:
    """`dyntc ARGS` with `input` on standard input; returns (exit status, stdout, stderr) whatever the
    status (a `SystemExit` with a message counts as 1)."""
    from dyntc.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, stdin = sys.argv, sys.stdin
    sys.argv, sys.stdin = ["dyntc", *map(str, args)], io.StringIO(input)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.stdin = argv, stdin
    return code, out.getvalue(), err.getvalue()
