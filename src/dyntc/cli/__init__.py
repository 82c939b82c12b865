"""The ``dyntc`` command line. Each command group lives in its own module; this file lists them.

User mistakes (:class:`~dyntc.errors.DyntcError`) are printed as one line on stderr with exit
status 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
import sys

# Before torch loads its OpenMP runtime: idle OpenMP threads sleep instead of spinning after each
# matrix product, so that they do not take the cores from the numba kernels' worker threads in
# between (bench.sru's wait-policy A/B: training step at 144 x 32 76-80 ms vs 86-99 ms spinning;
# docs/results.md §2). A value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import typer  # noqa: E402

from dyntc.errors import DyntcError  # noqa: E402

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
    app.command("export-glove")(reproduce.export_glove)

    from dyntc.cli import classifier

    app.command("fit")(classifier.fit)
    app.command("calibrate")(classifier.calibrate)
    app.command("predict")(classifier.predict)
    app.command("evaluate")(classifier.evaluate)
    app.add_typer(classifier.labels_app, name="labels")
    from dyntc.cli import labels_io

    labels_io.register(classifier.labels_app)

    from dyntc.cli import discovery

    app.command("discover")(discovery.discover)
    app.command("suggest")(discovery.suggest)

    from dyntc.cli import serve

    app.command("serve")(serve.serve)


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
