"""Where a `paper`-profile protocol run spends its time, and the packed SRU products against the old path.

    DYNTC_DATA=/path/to/datasets taskset -c 0 python -m bench.protocol [--datasets sent,news]
        [--models euc,hyp] [--episodes 30] [--repeats 3] [--threads 1]

For each dataset it makes split 0 of the protocol (as ``dyntc reproduce`` does), builds the paper's
encoder (GloVe + SRU 4 x 128, 200 tokens) and times, on the pretraining pool and one thread:

* **padding**: tokens the episodes' padded batches hold per real token (the SRU's products run over
  every padded row unless packed);
All times are CPU seconds of this process (``time.process_time``, every thread): on a shared machine
wall time measures the neighbours as much as the code.

* **episodes**: ``--episodes`` training episodes (``train_prototypical`` without a dev set: sampling,
  collation, forward, backward, Adam) with the SRU's products packed to the real tokens (the default,
  ``dyntc.encoders.sru.PACK_BELOW``) and unpacked (the old path, ``PACK_BELOW = 0``), alternated
  ``--repeats`` times on copies of the same model from the same seed; best of the repeats. The two
  paths must give the same loss history bit for bit: the script checks and prints it.
* **dev evaluation**: one early-stopping evaluation as pretraining runs it every 100 episodes
  (prototypes from every pretraining example, accuracy on the dev set relabelled to Y_old), as a
  share of the 100 episodes' time;
* **featurization**: tokenizing every text once (each worker of ``--jobs N`` does it once).

No assertions on time: the load average is printed before and after (a shared machine is noisy).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from bench._machine import cpu_model, load_average
from dyntc.data.datasets import load
from dyntc.data.dynamic import make_split
from dyntc.data.episodes import EpisodeSampler
from dyntc.encoders import create_encoder
from dyntc.encoders import sru as sru_module
from dyntc.errors import DyntcError
from dyntc.models import build_model
from dyntc.protocol import make_plan, parse_names
from dyntc.training import Encoded, TrainConfig, prototypical_accuracy, train_prototypical


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


def time_episodes(model, train: Encoded, hp: dict, episodes: int, pack: bool) -> tuple[float, list]:
    """CPU seconds per episode (this process, all threads: robust to a shared machine's time slicing)
    and the episodes' losses."""
    sru_module.PACK_BELOW = 0.95 if pack else 0.0
    cfg = TrainConfig(lr=hp["lr"], max_episodes=episodes, n_support=hp["n_support"], n_query=hp["n_query"],
                      max_classes=hp["max_classes"], seed=1, progress=False)
    losses: list[float] = []
    model = copy.deepcopy(model)
    orig = model.episode_loss

    def record(*args, **kwargs):
        loss, correct = orig(*args, **kwargs)
        losses.append(loss.item())
        return loss, correct

    model.episode_loss = record
    c0 = time.process_time()
    train_prototypical(model, train, None, cfg)
    return (time.process_time() - c0) / episodes, losses


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="sent,news")
    ap.add_argument("--models", default="euc,hyp")
    ap.add_argument("--episodes", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    for name, value in (("--episodes", args.episodes), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value < 1:
            raise DyntcError(f"{name} must be >= 1, got {value}")
    models = parse_names(args.models, ("euc", "hyp"), "model(s)")
    torch.set_num_threads(args.threads)
    print(f"CPU {cpu_model()}, torch {torch.__version__}, {args.threads} thread(s); load average {load_average()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for dataset in args.datasets.split(","):
        hp = make_plan(dataset, "paper").hp
        data = load(dataset)
        split = make_split(data, 0, hp["p"])
        t0 = time.perf_counter()
        torch.manual_seed(0)
        enc = create_encoder("sru", data.train.texts, hidden_size=hp["hidden_size"], num_layers=hp["num_layers"],
                             dropout=hp["dropout"], max_len=hp["max_len"])
        t_enc = time.perf_counter() - t0
        t0 = time.process_time()
        feats = {part: enc.featurize(getattr(data, part).texts) for part in ("train", "dev", "test")}
        t_feat = time.process_time() - t0
        train = Encoded.from_items([feats["train"][i] for i in split.pretrain_idx], split.pretrain.labels, split.old_labels)
        dev = Encoded.from_items([feats["dev"][i] for i in split.dev_old_idx], split.dev_old.labels, split.old_labels)
        ratio = padding_ratio(train.items, train.labels, hp)
        print(f"\n{dataset} (paper profile, split 0): pretraining pool {len(train)}, dev_old {len(dev)}; encoder built in "
              f"{t_enc:.1f}s wall, {sum(map(len, feats.values()))} texts featurized in {t_feat:.1f}s CPU; episodes hold {ratio:.2f} "
              f"padded tokens per real token")
        print("| model | CPU ms/episode packed | CPU ms/episode old (unpacked) | old / packed | same losses | dev eval CPU s | dev eval / 100 episodes |")
        print("|---|---:|---:|---:|---|---:|---:|")
        for m in models:
            model = build_model(m, copy.deepcopy(enc), len(train.classes))
            time_episodes(model, train, hp, 2, True)  # warm-up: kernels loaded, buffers allocated
            best = {True: float("inf"), False: float("inf")}
            history = {}
            for _ in range(args.repeats):
                for pack in (False, True):
                    sec, losses = time_episodes(model, train, hp, args.episodes, pack)
                    best[pack] = min(best[pack], sec)
                    history[pack] = losses
            sru_module.PACK_BELOW = 0.95
            t0 = time.process_time()
            prototypical_accuracy(model, train, dev)
            t_dev = time.process_time() - t0
            same = "yes" if history[True] == history[False] else "NO"
            print(f"| {m} | {best[True] * 1e3:.0f} | {best[False] * 1e3:.0f} | {best[False] / best[True]:.2f}x | {same} | "
                  f"{t_dev:.2f} | {t_dev / (100 * best[True]):.0%} |")
    print(f"\nload average after: {load_average()}")


if __name__ == "__main__":
    main()
