"""The ``dyntc`` command line. Each command group lives in its own module; this file lists them.

User mistakes (:class:`~dyntc.errors.DyntcError`) are printed as one line on stderr with exit
status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import typer

from dyntc.errors import DyntcError

app = typer.Typer(
    name="dyntc",
    help="Dynamic text classification with Euclidean and hyperbolic prototypical networks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from dyntc.cli import reproduce, train

    app.command("datasets")(train.datasets)
    app.command("train")(train.train)
    app.command("reproduce")(reproduce.reproduce)

    from dyntc.cli import classifier

    app.command("fit")(classifier.fit)
    app.command("predict")(classifier.predict)
    app.command("evaluate")(classifier.evaluate)
    app.add_typer(classifier.labels_app, name="labels")


def main() -> None:
    _register()
    try:
        app()
    except DyntcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
