"""``dyntc datasets`` and ``dyntc train``: list the datasets; train one model on a dataset's full label set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from dyntc.cli.options import options_from_dataclass
from dyntc.protocol.single import SingleModelConfig

console = Console(stderr=True)


def datasets(
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
) -> None:
    """List the datasets, whether their files are present, and their sizes."""
    from dyntc.protocol.data.datasets import describe_all

    table = Table("dataset", "folder", "train", "dev", "test", "labels", "depth", "status")
    for row in describe_all(data_dir):
        if row.get("present"):
            c = row["counts"]
            table.add_row(row["name"], row["folder"], *(str(c[k]) for k in ("train", "dev", "test", "labels", "depth")), "ok")
        else:
            table.add_row(row["name"], row["folder"], "", "", "", "", "", f"[red]{row.get('missing', 'missing')}[/red]")
    Console().print(table)


def train(**options: Any) -> None:
    """Train one model on a dataset's full label set and print its dev and test accuracy. A hyp or euc
    model is written as a classifier model (DynamicClassifier.load, dyntc predict, dyntc serve, the
    label commands); an MLP, whose output layer is fixed to the dataset's labels, is measured only."""
    from dyntc.protocol.single import train_one

    cfg = SingleModelConfig(**options)

    def save_classifier(network, texts, labels, path):
        # predicting by the nearest prototype of all training texts, as the accuracies were measured
        from dyntc.classifier import DynamicClassifier

        DynamicClassifier.from_network(network, texts, labels, head=None, debias=False, seed=cfg.seed).save(path)

    metrics = train_one(cfg, log=console.print, save_prototypical=save_classifier)
    print(json.dumps({k: metrics[k] for k in ("dataset", "model", "dev_acc", "test_acc", "total_seconds")}))


# the command's options: one per field of SingleModelConfig
options_from_dataclass(train, SingleModelConfig)
