"""``dyntc datasets`` and ``dyntc train``: list the datasets; train one model on a dataset's full label set."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer
from rich.console import Console
from rich.table import Table

from dyntc import __version__
from dyntc.protocol.checkpoint import save_model, write_json
from dyntc.errors import DyntcError
from dyntc.machine import machine_description

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
    model: Annotated[str, typer.Option(help="hyp | euc | mlp")] = "hyp",
    out: Annotated[Path, typer.Option(help="Run directory: model/ and metrics.json are written here")] = Path("runs/train"),
    encoder: Annotated[str, typer.Option(help="sru (GloVe + SRU, the paper's) | minilm | path to a sentence-transformers model")] = "sru",
    episodes: Annotated[int, typer.Option(help="Maximum training episodes (prototypical models)")] = 10_000,
    epochs: Annotated[int, typer.Option(help="Maximum training epochs (MLP)")] = 100,
    eval_every: Annotated[int, typer.Option(help="Episodes between dev evaluations")] = 100,
    patience: Annotated[int, typer.Option(help="Dev evaluations without improvement before stopping")] = 10,
    lr: Annotated[float, typer.Option(help="Adam learning rate")] = 1e-3,
    n_support: Annotated[int, typer.Option(help="Support examples per class in an episode (N_S)")] = 4,
    n_query: Annotated[int, typer.Option(help="Query examples per episode, in total (N_Q)")] = 64,
    hidden: Annotated[Optional[int], typer.Option(help="Encoder hidden size (SRU default 128)")] = None,
    layers: Annotated[Optional[int], typer.Option(help="SRU layers (default 4); for pretrained encoders, head depth (default 1)")] = None,
    dropout: Annotated[Optional[float], typer.Option(help="Dropout (SRU default: 0.3 for wos, else 0.5; pretrained head: 0.1)")] = None,
    max_len: Annotated[Optional[int], typer.Option(help="Tokens kept per text (SRU: words, default 200; pretrained: word pieces, default 256)")] = None,
    finetune: Annotated[bool, typer.Option("--finetune", help="Pretrained encoders: fine-tune the backbone too (default: frozen backbone, trainable head)")] = False,
    embeddings: Annotated[Optional[Path], typer.Option(help="GloVe text file (default: packaged glove.6B.50d)")] = None,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop training after this many seconds")] = None,
    seed: Annotated[int, typer.Option(help="Seed for splits, sampling and initialisation")] = 0,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cuda" if torch.cuda.is_available() else "cpu",
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
) -> None:
    """Train one model on a dataset's full label set and print its dev and test accuracy. A hyp or euc
    model is written as a classifier model (DynamicClassifier.load, dyntc predict, dyntc serve, the
    label commands); an MLP as a checkpoint (dyntc.protocol.checkpoint.load_model)."""
    from dyntc.data.datasets import load
    from dyntc.encoders import create_encoder
    from dyntc.models import MODEL_NAMES, build_model
    from dyntc.training import TrainConfig, train_prototypical, train_supervised
    from dyntc.inference import Encoded, prototypical_predict, supervised_accuracy
    from dyntc.machine import check_device, check_out_dir

    if model not in MODEL_NAMES:
        raise DyntcError(f"unknown model {model!r}: choose one of {', '.join(MODEL_NAMES)}")
    check_device(device)
    check_out_dir(out)
    torch.manual_seed(seed)
    data = load(dataset, data_dir, seed=seed)
    classes = data.labels
    enc_options = {"hidden_size": hidden, "num_layers": layers, "max_len": max_len, "dropout": dropout}
    if encoder == "sru":
        if dropout is None:
            enc_options["dropout"] = 0.3 if data.name == "wos" else 0.5
        enc_options["embeddings"] = str(embeddings) if embeddings else None
    else:
        enc_options["mode"] = "finetune" if finetune else "frozen"
    t0 = time.perf_counter()
    enc = create_encoder(encoder, data.train.texts, **enc_options)
    net = build_model(model, enc, len(classes))
    cfg = TrainConfig(
        lr=lr, max_episodes=episodes, max_epochs=epochs, eval_every=eval_every, patience=patience,
        n_support=n_support, n_query=n_query, time_budget_s=time_budget, seed=seed, device=device, progress=progress,
    )
    train_set, dev_set, test_set = (Encoded.of(enc, s.texts, s.labels, classes) for s in (data.train, data.dev, data.test))
    featurize_s = time.perf_counter() - t0
    console.print(f"[bold]{data.name}[/bold]: {len(train_set)} train / {len(dev_set)} dev / {len(test_set)} test, "
                  f"{len(classes)} classes; model {model} on {encoder}, device {device}")
    if model == "mlp":
        result = train_supervised(net, train_set, dev_set, cfg)
        dev_acc, test_acc = supervised_accuracy(net, dev_set), supervised_accuracy(net, test_set)
    else:
        result = train_prototypical(net, train_set, dev_set, cfg)
        # one set of prototypes (embedding all training texts once) for both dev and test
        pred, _ = prototypical_predict(net, train_set, dev_set.items + test_set.items)
        pred = pred.numpy()
        dev_acc = float((pred[: len(dev_set)] == dev_set.labels).mean())
        test_acc = float((pred[len(dev_set) :] == test_set.labels).mean())
    total_s = time.perf_counter() - t0
    metrics = {
        "dataset": data.name, "model": model, "encoder": encoder, "dev_acc": dev_acc, "test_acc": test_acc,
        "majority_test_acc": max(test_set.labels.tolist().count(c) for c in range(len(classes))) / len(test_set),
        "steps": result.steps, "stopped_early": result.stopped_early, "train_seconds": result.seconds,
        "featurize_seconds": featurize_s, "total_seconds": total_s, "machine": machine_description(),
        "device": device, "seed": seed, "config": {**vars(cfg), **enc.config()}, "history": result.history,
        "dyntc_version": __version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    out.mkdir(parents=True, exist_ok=True)
    if model == "mlp":  # an output layer, not prototypes: a checkpoint (dyntc.protocol.checkpoint.load_model)
        save_model(out / "model", net, meta={"classes": classes, "dataset": data.name})
    else:  # a classifier model that DynamicClassifier.load, dyntc predict and dyntc serve use as it is,
        # predicting by the nearest prototype of all training texts, as the accuracies above were measured
        from dyntc.classifier import DynamicClassifier

        DynamicClassifier.from_network(net.cpu(), data.train.texts, data.train.labels, head=None, debias=False,
                                       seed=seed).save(out / "model")
    write_json(out / "metrics.json", metrics)
    console.print(
        f"dev acc {dev_acc:.4f}  test acc {test_acc:.4f}  (majority {metrics['majority_test_acc']:.4f}); "
        f"{result.steps} {'batches' if model == 'mlp' else 'episodes'} in {result.seconds:.0f}s; saved to {out}"
    )
    print(json.dumps({k: metrics[k] for k in ("dataset", "model", "dev_acc", "test_acc", "total_seconds")}))

