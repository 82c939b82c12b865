"""One model on a dataset's full label set (``dyntc train``): the paper's single-model experiment.

Trains an MLP, EUC or HYP model on the whole label set with the paper's settings by default, reports
dev and test accuracy, and writes ``metrics.json``; for EUC and HYP also ``model/``, a classifier model
(:meth:`~dyntc.classifier.DynamicClassifier.from_network`: the trained network with one prototype per
label from all training texts, predicting as the accuracies were measured). The MLP ends in an output
layer over the dataset's labels, not prototypes: it is measured, not kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from dyntc._version import __version__
from dyntc.core.files import write_json
from dyntc.errors import DyntcError
from dyntc.protocol.options import available_device


@dataclass
class SingleModelConfig:
    """What ``dyntc train`` takes: each field holds an option's default and, in its metadata, the help
    that :mod:`dyntc.cli.train` gives the option (the keys of :mod:`dyntc.protocol.options`)."""

    dataset: str = field(metadata={"help": "news | sent | wos | clinc150 | hwu64"})
    model: str = field(default="hyp", metadata={"help": "hyp | euc | mlp"})
    out: Path = field(default=Path("runs/train"), metadata={
        "help": "Run directory: metrics.json is written here, and model/ for hyp or euc"})
    encoder: str = field(default="sru", metadata={
        "help": "sru (GloVe + SRU, the paper's) | minilm | path to a sentence-transformers model"})
    episodes: int = field(default=10_000, metadata={"help": "Maximum training episodes (prototypical models)"})
    epochs: int = field(default=100, metadata={"help": "Maximum training epochs (MLP)"})
    eval_every: int = field(default=100, metadata={"help": "Episodes between dev evaluations"})
    patience: int = field(default=10, metadata={"help": "Dev evaluations without improvement before stopping"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    n_support: int = field(default=4, metadata={"help": "Support examples per class in an episode (N_S)"})
    n_query: int = field(default=64, metadata={"help": "Query examples per episode, in total (N_Q)"})
    # None: the encoder's own default, as the help says
    hidden: int | None = field(default=None, metadata={"help": "Encoder hidden size (SRU default 128)"})
    layers: int | None = field(default=None, metadata={
        "help": "SRU layers (default 4); for pretrained encoders, head depth (default 1)"})
    dropout: float | None = field(default=None, metadata={
        "help": "Dropout (SRU default: 0.3 for wos, else 0.5; pretrained head: 0.1)"})
    max_len: int | None = field(default=None, metadata={
        "help": "Tokens kept per text (SRU: words, default 200; pretrained: word pieces, default 256)"})
    # a flag of its own (no --no-finetune): the default is the frozen backbone
    finetune: bool = field(default=False, metadata={
        "flag": "--finetune",
        "help": "Pretrained encoders: fine-tune the backbone too (default: frozen backbone, trainable head)"})
    embeddings: Path | None = field(default=None, metadata={"help": "GloVe text file (default: packaged glove.6B.50d)"})
    time_budget: float | None = field(default=None, metadata={"help": "Stop training after this many seconds"})
    seed: int = field(default=0, metadata={"help": "Seed for splits, sampling and initialisation"})
    # the command uses the GPU where there is one; a library call stays on the CPU unless told
    device: str = field(default="cpu", metadata={"help": "cpu | cuda", "command_line_default": available_device})
    data_dir: Path | None = field(default=None, metadata={
        "help": "Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)"})
    progress: bool = field(default=True, metadata={"help": "Show progress bars"})


def train_one(cfg: SingleModelConfig, log: Callable[[str], None] = print,
              save_prototypical: Callable[[torch.nn.Module, list[str], list[str], Path], None] | None = None) -> dict:
    """Train, evaluate and save one model as `cfg` says; returns the metrics written to ``metrics.json``.
    A prototypical network is handed to `save_prototypical(network, train_texts, train_labels, path)`."""
    from dyntc.protocol.data.datasets import load
    from dyntc.core.encoders import create_encoder, encoder_kind, encoder_options_for
    from dyntc.core.inference import Encoded, prototypical_predict, supervised_accuracy
    from dyntc.core.machine import check_device, check_out_dir, machine_description
    from dyntc.core.models import model_kind
    from dyntc.core.training import TrainConfig, train_prototypical, train_supervised

    kind = model_kind(cfg.model)
    if not kind.network:
        raise DyntcError(f"--model {cfg.model} is a baseline of dyntc reproduce, not a network to train: "
                         "choose hyp, euc or mlp")
    check_device(cfg.device)
    check_out_dir(cfg.out)
    torch.manual_seed(cfg.seed)
    data = load(cfg.dataset, cfg.data_dir, seed=cfg.seed)
    classes = data.labels
    dropout = cfg.dropout
    if dropout is None and encoder_kind(cfg.encoder).word_vectors:  # the paper's per dataset
        dropout = 0.3 if data.name == "wos" else 0.5
    enc_options = encoder_options_for(cfg.encoder, mode="finetune" if cfg.finetune else "frozen", hidden_size=cfg.hidden,
                                      num_layers=cfg.layers, max_len=cfg.max_len, dropout=dropout,
                                      embeddings=str(cfg.embeddings) if cfg.embeddings else None)
    t0 = time.perf_counter()
    enc = create_encoder(cfg.encoder, data.train.texts, **enc_options)
    net = kind.build(enc, len(classes))
    train_cfg = TrainConfig(
        lr=cfg.lr, max_episodes=cfg.episodes, max_epochs=cfg.epochs, eval_every=cfg.eval_every, patience=cfg.patience,
        n_support=cfg.n_support, n_query=cfg.n_query, time_budget_s=cfg.time_budget, seed=cfg.seed, device=cfg.device,
        progress=cfg.progress,
    )
    train_set, dev_set, test_set = (Encoded.of(enc, s.texts, s.labels, classes) for s in (data.train, data.dev, data.test))
    featurize_s = time.perf_counter() - t0
    log(f"{data.name}: {len(train_set)} train / {len(dev_set)} dev / {len(test_set)} test, "
        f"{len(classes)} classes; model {cfg.model} on {cfg.encoder}, device {cfg.device}")
    if not kind.episodic:
        result = train_supervised(net, train_set, dev_set, train_cfg)
        dev_acc, test_acc = supervised_accuracy(net, dev_set), supervised_accuracy(net, test_set)
    else:
        result = train_prototypical(net, train_set, dev_set, train_cfg)
        # one set of prototypes (embedding all training texts once) for both dev and test
        pred, _ = prototypical_predict(net, train_set, dev_set.items + test_set.items)
        pred = pred.numpy()
        dev_acc = float((pred[: len(dev_set)] == dev_set.labels).mean())
        test_acc = float((pred[len(dev_set) :] == test_set.labels).mean())
    total_s = time.perf_counter() - t0
    metrics = {
        "dataset": data.name, "model": cfg.model, "encoder": cfg.encoder, "dev_acc": dev_acc, "test_acc": test_acc,
        "majority_test_acc": max(test_set.labels.tolist().count(c) for c in range(len(classes))) / len(test_set),
        "steps": result.steps, "stopped_early": result.stopped_early, "train_seconds": result.seconds,
        "featurize_seconds": featurize_s, "total_seconds": total_s, "machine": machine_description(),
        "device": cfg.device, "seed": cfg.seed, "config": {**vars(train_cfg), **enc.config()}, "history": result.history,
        "dyntc_version": __version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    cfg.out.mkdir(parents=True, exist_ok=True)
    if kind.prototypical and save_prototypical is not None:
        # the caller writes it as a classifier model (the research wing does not know the product's classifier)
        save_prototypical(net.cpu(), data.train.texts, data.train.labels, cfg.out / "model")
    write_json(cfg.out / "metrics.json", metrics)
    log(
        f"dev acc {dev_acc:.4f}  test acc {test_acc:.4f}  (majority {metrics['majority_test_acc']:.4f}); "
        f"{result.steps} {kind.steps} in {result.seconds:.0f}s; saved to {cfg.out}"
    )
    return metrics
