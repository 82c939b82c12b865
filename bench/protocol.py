"""Where a `paper`-profile protocol run spends its time, and ``--jobs 2`` against ``--jobs 1``.

    DYNTC_DATA=/path/to/datasets python -m bench.protocol [--datasets sent,news] [--episodes 30]
        [--jobs-dataset sent] [--skip-jobs] [--skip-profile]

**Profile** (one thread, CPU seconds of this process, ``time.process_time``: on a shared machine wall
time measures the neighbours as much as the code). For each dataset it makes split 0 of the protocol
as ``dyntc reproduce`` does, builds the paper's encoder (GloVe + SRU 4 x 128, 200 tokens) and times:

* featurizing every text (each worker of ``--jobs N`` does it once);
* how many padded tokens the episodes' batches hold per real token (collation pads a batch to its
  longest text; the SRU's matrix products run over every padded row);
* ``--episodes`` pretraining episodes of EUC and HYP (``train_prototypical`` without a dev set:
  sampling, collation, forward, backward, Adam) and as many MLP batches of 64, after a warm-up;
* one early-stopping evaluation as pretraining runs it every 100 episodes (prototypes from every
  pretraining example, accuracy on the dev set relabelled to Y_old), and its share of 100 episodes;
* embedding the test set once (every fine-tuned / scratch cell does it).

**--jobs** (wall time). The same short protocol run (`paper` profile, budgets cut by ``--set``) on
``--jobs-dataset`` with ``--jobs 1`` and then ``--jobs 2``, into fresh directories; prints both wall
times, the ratio, and whether the two results files hold the same rows (they must: accuracies, steps,
dev accuracies; only timings differ). On a 2-core machine that others share the ratio is noisy.

No assertions on time; the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench._machine import cpu_model, load_average
from dyntc.protocol.data.datasets import load
from dyntc.protocol.data.dynamic import make_split
from dyntc.core.episodes import EpisodeSampler
from dyntc.core.encoders import create_encoder
from dyntc.errors import DyntcError
from dyntc.core.models import build_model
from dyntc.protocol import make_plan
from dyntc.core.training import TrainConfig, train_prototypical, train_supervised
from dyntc.core.inference import Encoded, embed_points, prototypical_accuracy

SHORT = {"pretrain_episodes": "150", "pretrain_eval_every": "50", "pretrain_epochs": "2", "finetune_episodes": "60",
         "finetune_eval_every": "20", "finetune_epochs": "3"}  # --jobs comparison: the paper profile, short budgets
TIMINGS = {"train_seconds", "cell_seconds", "finished", "seconds"}


def padding_ratio(items: list, labels: np.ndarray, hp: dict, n: int = 200) -> float:
    lens = np.array([len(x) for x in items])
    sampler = EpisodeSampler(labels, n_support=hp["n_support"], n_query=hp["n_query"], max_classes=hp["max_classes"], seed=0)
    padded = real = 0
    for _ in range(n):
        ep = sampler.sample()
        for part in (ep.support, ep.query):
            padded += lens[part].max() * len(part)
            real += lens[part].sum()
    return padded / real


def cpu_per_step(model, train: Encoded, hp: dict, steps: int) -> float:
    """CPU seconds per episode (EUC/HYP) or batch of 64 (MLP), on a copy of `model`, no dev set."""
    model = copy.deepcopy(model)
    if hasattr(model, "metric"):
        cfg = TrainConfig(lr=hp["lr"], max_episodes=steps, n_support=hp["n_support"], n_query=hp["n_query"],
                          max_classes=hp["max_classes"], seed=1, progress=False)
        c0 = time.process_time()
        train_prototypical(model, train, None, cfg)
    else:
        subset = train.take(np.random.default_rng(1).permutation(len(train))[: steps * hp["batch_size"]])
        c0 = time.process_time()
        train_supervised(model, subset, None, TrainConfig(lr=hp["lr"], max_epochs=1, batch_size=hp["batch_size"], seed=1, progress=False))
    return (time.process_time() - c0) / steps


def profile(dataset: str, episodes: int) -> None:
    hp = make_plan(dataset, "paper").hp
    data = load(dataset)
    split = make_split(data, 0, hp["p"])
    torch.manual_seed(0)
    enc = create_encoder("sru", data.train.texts, hidden_size=hp["hidden_size"], num_layers=hp["num_layers"],
                         dropout=hp["dropout"], max_len=hp["max_len"])
    c0 = time.process_time()
    feats = {part: enc.featurize(getattr(data, part).texts) for part in ("train", "dev", "test")}
    t_feat = time.process_time() - c0
    train = Encoded.from_items([feats["train"][i] for i in split.pretrain_idx], split.pretrain.labels, split.old_labels)
    dev = Encoded.from_items([feats["dev"][i] for i in split.dev_old_idx], split.dev_old.labels, split.old_labels)
    test = [feats["test"][i] for i in split.test_idx]
    print(f"\n{dataset} (paper profile, split 0): pretraining pool {len(train)}, dev_old {len(dev)}, test {len(test)}; "
          f"{sum(map(len, feats.values()))} texts featurized in {t_feat:.1f}s; episodes hold "
          f"{padding_ratio(train.items, train.labels, hp):.2f} padded tokens per real token")
    print("| model | CPU ms per episode (MLP: batch of 64) | dev evaluation CPU s | share of 100 episodes | test set embedded, CPU s |")
    print("|---|---:|---:|---:|---:|")
    for name in ("euc", "hyp", "mlp"):
        model = build_model(name, copy.deepcopy(enc), len(train.classes))
        cpu_per_step(model, train, hp, 2)  # warm-up: kernels loaded, buffers allocated
        step = cpu_per_step(model, train, hp, episodes)
        if name == "mlp":
            print(f"| mlp | {step * 1e3:.0f} | | | |")
            continue
        c0 = time.process_time()
        prototypical_accuracy(model, train, dev)
        t_dev = time.process_time() - c0
        c0 = time.process_time()
        embed_points(model, test)
        t_test = time.process_time() - c0
        print(f"| {name} | {step * 1e3:.0f} | {t_dev:.2f} | {t_dev / (100 * step):.0%} | {t_test:.2f} |")


def compare_jobs(dataset: str) -> None:
    from dyntc.protocol.reproduce import reproduce

    walls, rows = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 2):
            t0 = time.perf_counter()
            res = reproduce(dataset, "paper", Path(tmp) / f"jobs{jobs}", splits=1, n_fine="5,20", settings=SHORT, jobs=jobs,
                            threads=1, progress=False, log=lambda msg: None)
            walls[jobs] = time.perf_counter() - t0
            rows[jobs] = json.dumps([{k: v for k, v in r.items() if k not in TIMINGS} for r in res["rows"]], sort_keys=True)
    settings = " ".join(f"--set {k}={v}" for k, v in SHORT.items())
    print(f"\n--jobs on {dataset}: `dyntc reproduce --dataset {dataset} --profile paper --splits 1 --n-fine 5,20 {settings}` "
          f"(3 units: mlp, euc, hyp)")
    print(f"| --jobs 1 wall s | --jobs 2 wall s | jobs 1 / jobs 2 | same rows |\n|---:|---:|---:|---|\n"
          f"| {walls[1]:.0f} | {walls[2]:.0f} | {walls[1] / walls[2]:.2f}x | {'yes' if rows[1] == rows[2] else 'NO'} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="sent,news")
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--jobs-dataset", default="sent")
    ap.add_argument("--skip-jobs", action="store_true")
    ap.add_argument("--skip-profile", action="store_true")
    args = ap.parse_args(argv)
    if args.episodes < 1:
        raise DyntcError(f"--episodes must be >= 1, got {args.episodes}")
    torch.set_num_threads(1)
    print(f"CPU {cpu_model()}, torch {torch.__version__}, 1 thread per process; load average {load_average()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if not args.skip_profile:
        for dataset in args.datasets.split(","):
            profile(dataset, args.episodes)
    if not args.skip_jobs:
        compare_jobs(args.jobs_dataset)
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
