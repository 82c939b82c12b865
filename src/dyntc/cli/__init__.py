"""The ``dyntc`` command line. Each command group lives in its own module; this file lists them.

Every user mistake is one ``error: ...`` line on stderr with exit status 2: a
:class:`~dyntc.errors.DyntcError`, a bad option or argument (typer/click's usage errors, without their
boxes), a missing optional extra (naming the ``pip install`` that brings it). Library warnings are
one ``warning: ...`` line each. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings

# Before torch loads its OpenMP runtime: idle OpenMP threads sleep instead of spinning after each
# matrix product, so that they do not take the cores from the numba kernels' worker threads in
# between (bench.sru's wait-policy A/B: training step at 144 x 32 76-80 ms vs 86-99 ms spinning;
# docs/results.md §2). A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

try:  # typer >= 0.22 parses with its own copy of click
    from typer._click import exceptions as click_errors  # noqa: E402
except ImportError:  # pragma: no cover - older typer: click itself
    from click import exceptions as click_errors  # noqa: E402

from dyntc.cli.common import missing_extra  # noqa: E402
from dyntc.errors import DyntcError  # noqa: E402

app = typer.Typer(
    name="dyntc",
    help="Dynamic text classification: a classifier whose labels change without retraining (library, "
         "command line, HTTP service), and the reproduction of Wohlwend et al. (2019).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@functools.cache
def _register() -> None:
    """Adds the commands to `app`, once per process (typer appends a command each time it is
    registered, and builds every registered one on each call: `main()` called again in one process,
    as the tests and embedding programs do, would otherwise grow slower with each call)."""
    from dyntc.cli import classifier, labels, reproduce, serve, train

    app.command("datasets")(train.datasets)
    app.command("train")(train.train)
    app.command("reproduce")(reproduce.reproduce)
    app.command("export-glove")(reproduce.export_glove)
    app.command("fit")(classifier.fit)
    app.command("calibrate")(classifier.calibrate)
    app.command("predict")(classifier.predict)
    app.command("evaluate")(classifier.evaluate)
    app.add_typer(labels.labels_app, name="labels")
    from dyntc.cli import labels_io

    labels_io.register(labels.labels_app)

    from dyntc.cli import discovery

    app.command("discover")(discovery.discover)
    app.command("suggest")(discovery.suggest)

    app.command("serve")(serve.serve)

    from dyntc.cli import tune

    app.command("tune")(tune.tune)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A library warning as one line, without the file and line it was raised at."""
    print(f"warning: {str(message).removeprefix('dyntc: ')}", file=sys.stderr)


def _usage_error(exc: click_errors.UsageError) -> str:
    command = exc.ctx.command_path if exc.ctx is not None else "dyntc"
    return f"{exc.format_message()} (see `{command} --help`)"


def main() -> None:
    _register()
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        code = app(standalone_mode=False)
    except DyntcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except click_errors.NoArgsIsHelpError as exc:  # `dyntc` or `dyntc labels` alone: the help
        print(exc.format_message())
        sys.exit(2)
    except click_errors.UsageError as exc:  # a bad option, argument or value
        print(f"error: {_usage_error(exc)}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc.name, f"`dyntc {' '.join(sys.argv[1:2])}`")
        if error is None:
            raise
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except click_errors.ClickException as exc:  # e.g. a file option that cannot be opened
        print(f"error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except OSError as exc:  # a file the user named that cannot be read or written (a missing folder, a full disk)
        if exc.filename is None:
            raise
        print(f"error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)
    finally:
        warnings.showwarning = shown
    sys.exit(code if isinstance(code, int) else 0)
