"""``dyntc datasets`` and ``dyntc train``: list the datasets; train one model on a dataset's full label set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer
from rich.console import Console
from rich.table import Table

from dyntc.protocol.single import SingleModelConfig

_DEFAULTS = SingleModelConfig  # the options' defaults are the config's fields'

console = Console(stderr=True)


def datasets(
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
) -> None:
    """List the datasets, whether their files are present, and their sizes."""
    from dyntc.data.datasets import describe_all

    table = Table("dataset", "folder", "train", "dev", "test", "labels", "depth", "status")
    for row in describe_all(data_dir):
        if row.get("present"):
            c = row["counts"]
            table.add_row(row["name"], row["folder"], *(str(c[k]) for k in ("train", "dev", "test", "labels", "depth")), "ok")
        else:
            table.add_row(row["name"], row["folder"], "", "", "", "", "", f"[red]{row.get('missing', 'missing')}[/red]")
    Console().print(table)


def train(
    dataset: Annotated[str, typer.Option(help="news | sent | wos | clinc150 | hwu64")],
    model: Annotated[str, typer.Option(help="hyp | euc | mlp")] = _DEFAULTS.model,
    out: Annotated[Path, typer.Option(help="Run directory: model/ and metrics.json are written here")] = _DEFAULTS.out,
    encoder: Annotated[str, typer.Option(help="sru (GloVe + SRU, the paper's) | minilm | path to a sentence-transformers model")] = _DEFAULTS.encoder,
    episodes: Annotated[int, typer.Option(help="Maximum training episodes (prototypical models)")] = _DEFAULTS.episodes,
    epochs: Annotated[int, typer.Option(help="Maximum training epochs (MLP)")] = _DEFAULTS.epochs,
    eval_every: Annotated[int, typer.Option(help="Episodes between dev evaluations")] = _DEFAULTS.eval_every,
    patience: Annotated[int, typer.Option(help="Dev evaluations without improvement before stopping")] = _DEFAULTS.patience,
    lr: Annotated[float, typer.Option(help="Adam learning rate")] = _DEFAULTS.lr,
    n_support: Annotated[int, typer.Option(help="Support examples per class in an episode (N_S)")] = _DEFAULTS.n_support,
    n_query: Annotated[int, typer.Option(help="Query examples per episode, in total (N_Q)")] = _DEFAULTS.n_query,
    hidden: Annotated[Optional[int], typer.Option(help="Encoder hidden size (SRU default 128)")] = None,
    layers: Annotated[Optional[int], typer.Option(help="SRU layers (default 4); for pretrained encoders, head depth (default 1)")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="Dropout (SRU default: 0.3 for wos, else 0.5; pretrained head: 0.1)")] = None,
    max_len: Annotated[Optional[int], typer.Option(help="Tokens kept per text (SRU: words, default 200; pretrained: word pieces, default 256)")] = None,
    finetune: Annotated[bool, typer.Option("--finetune", help="Pretrained encoders: fine-tune the backbone too (default: frozen backbone, trainable head)")] = False,
    embeddings: Annotated[Optional[Path], typer.Option(help="GloVe text file (default: packaged glove.6B.50d)")] = None,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop training after this many seconds")] = None,
    seed: Annotated[int, typer.Option(help="Seed for splits, sampling and initialisation")] = _DEFAULTS.seed,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cuda" if torch.cuda.is_available() else "cpu",
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
) -> None:
    """Train one model on a dataset's full label set and print its dev and test accuracy. A hyp or euc
    model is written as a classifier model (DynamicClassifier.load, dyntc predict, dyntc serve, the
    label commands); an MLP as a checkpoint (dyntc.protocol.checkpoint.load_model)."""
    from dyntc.protocol.single import train_one

    cfg = SingleModelConfig(dataset=dataset, model=model, out=out, encoder=encoder, episodes=episodes, epochs=epochs,
                            eval_every=eval_every, patience=patience, lr=lr, n_support=n_support, n_query=n_query,
                            hidden=hidden, layers=layers, dropout=dropout, max_len=max_len, finetune=finetune,
                            embeddings=embeddings, time_budget=time_budget, seed=seed, device=device, data_dir=data_dir,
                            progress=progress)
    metrics = train_one(cfg, log=console.print)
    print(json.dumps({k: metrics[k] for k in ("dataset", "model", "dev_acc", "test_acc", "total_seconds")}))

