"""End-to-end speed: training episodes per second and prediction texts per second (CPU).

    DYNTC_DATA=/path/to/datasets python -m bench.train [--datasets sent,news] [--settings quick,paper]
        [--models hyp,euc,mlp] [--episodes 20] [--ref-episodes 5]
        [--warmup 3] [--predict-texts 2000] [--latency-texts 30] [--support-per-class 50] [--threads N]

For every dataset and setting it builds a fresh GloVe + SRU encoder the way ``dyntc reproduce``
does (``create_encoder("sru", train texts, ...)`` with the profile's hidden size, layers, dropout and
max_len; ``build_model`` on a copy of it) and trains on the dataset's full training split and
label set, as ``dyntc train`` does. Settings are the protocol's profiles
(:mod:`dyntc.protocol`): ``quick`` = 2-layer SRU, 32 tokens (NEWS 64), Adam 3e-3; ``paper`` = 4-layer
SRU, 200 tokens, Adam 1e-3; both hidden 128, dropout 0.5, N_S = 4, N_Q = 64, N_C = all classes (<= 50).

What is timed:

* **training** -- the library's own loops, with no dev set (so no dev evaluation ever runs):
  ``train_prototypical`` for HYP and EUC, ``--episodes`` episodes, after a separate warm-up call of
  ``--warmup`` episodes on the same model (numba kernels loaded, buffers allocated). The figure is
  the loop's own ``TrainResult.seconds``: episode sampling, collation, forward, loss, backward and
  the Adam step. The MLP runs ``train_supervised`` for one epoch over a random subset of exactly
  ``--episodes`` batches of 64 (context: a batch is 64 texts, an episode N_C * N_S + N_Q texts).
  HYP is timed again on the pure-PyTorch paths -- the SRU's reference recurrence
  (``dyntc.core.encoders.sru.USE_FAST = False``) and the batched PyTorch Fréchet-mean solver
  (``dyntc.core.geometry.lorentz.USE_COMPILED = False``), i.e. what runs without the numba kernels --
  for ``--ref-episodes`` episodes after one warm-up episode; the ratio fast / reference is printed. Loading the data, building the encoder (GloVe lookup) and featurizing (tokenizing) the
  texts are timed separately and not counted in the training figures.
* **prediction** (HYP and EUC, fast path, after their timed training) -- prototypes from at most
  ``--support-per-class`` training examples per class (time printed separately), then raw test texts
  to predicted labels: ``featurize`` + ``embed`` in batches of 256 (eval mode, no gradient) + nearest
  prototype, the computation behind ``DynamicClassifier.predict``. Batched: texts per second over
  the first ``--predict-texts`` test texts. Single text: median milliseconds over
  ``--latency-texts`` calls with one text each.

No assertions: timings on a shared machine are noisy (the load average is printed before and after).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np
import torch

from bench._machine import cpu_model, load_average, omp_wait_policy
from dyntc.protocol.data.datasets import load, resolve_name
from dyntc.core.encoders import create_encoder
from dyntc.core.encoders import sru as sru_module
from dyntc.core.geometry import lorentz
from dyntc.core.models import PrototypicalNetwork, build_model
from dyntc.errors import DyntcError
from dyntc.protocol import get_profile, parse_names
from dyntc.core.training import TrainConfig, train_prototypical, train_supervised
from dyntc.core.inference import Encoded, embed_points


def train_config(hp: dict, steps: int, seed: int) -> TrainConfig:
    """The profile's optimisation settings; `steps` episodes (prototypical) and at most one epoch (MLP)."""
    return TrainConfig(
        lr=hp["lr"], max_episodes=steps, max_epochs=1, batch_size=hp["batch_size"], n_support=hp["n_support"],
        n_query=hp["n_query"], max_classes=hp["max_classes"], seed=seed, progress=False,
    )


def time_prototypical(model: PrototypicalNetwork, train: Encoded, hp: dict, warmup: int,
                      episodes: int) -> tuple[float, float]:
    """(warm-up seconds, timed episodes per second) of ``train_prototypical`` with no dev set."""
    warm_s = train_prototypical(model, train, None, train_config(hp, warmup, seed=1)).seconds if warmup else 0.0
    # another seed, so that the timed episodes are not the warm-up's episodes again
    result = train_prototypical(model, train, None, train_config(hp, episodes, seed=2))
    return warm_s, result.steps / result.seconds


def time_supervised(model, train: Encoded, hp: dict, warmup: int, batches: int) -> tuple[float, float]:
    """(warm-up seconds, batches per second) of ``train_supervised``: one epoch over exactly
    `batches` full batches of a random subset of the training set (no dev set)."""
    rng = np.random.default_rng(0)

    def one_epoch(n_batches: int, seed: int):
        n_batches = min(n_batches, len(train) // hp["batch_size"])  # a subset without repeats
        subset = train.take(rng.choice(len(train), size=n_batches * hp["batch_size"], replace=False))
        return train_supervised(model, subset, None, train_config(hp, 1, seed))

    warm_s = one_epoch(warmup, seed=1).seconds if warmup else 0.0
    result = one_epoch(batches, seed=2)
    return warm_s, result.steps / result.seconds


@torch.inference_mode()
def time_prediction(model: PrototypicalNetwork, support: Encoded, test_texts: list[str], latency_texts: int) -> dict:
    """Prototypes from `support`, then raw texts -> nearest-prototype ids, batched and one at a time."""
    model.eval()  # eval-mode Fréchet mean (more iterations) and no dropout, as at prediction time
    encoder = model.encoder

    def points(items):
        return embed_points(model, items)

    points(encoder.featurize(test_texts[:8]))  # warm-up: the inference kernels' first call is not timed
    t0 = time.perf_counter()
    prototypes = model.prototypes(points(support.items), torch.as_tensor(support.labels), len(support.classes))
    prototype_s = time.perf_counter() - t0

    def predict(texts):
        return model.logits(points(encoder.featurize(texts)), prototypes).argmax(1)

    t0 = time.perf_counter()
    predict(test_texts)
    batched_s = time.perf_counter() - t0
    single = []
    for text in test_texts[:latency_texts]:
        t0 = time.perf_counter()
        predict([text])
        single.append(time.perf_counter() - t0)
    return {"texts_per_s": len(test_texts) / batched_s, "single_ms": 1e3 * statistics.median(single),
            "prototype_s": prototype_s, "n_support": len(support)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="sent,news", help="comma-separated dataset names")
    parser.add_argument("--settings", default="quick,paper", help="comma-separated profiles: quick, paper")
    parser.add_argument("--models", default="hyp,euc,mlp", help="comma-separated: hyp, euc, mlp (the reference run is HYP's)")
    parser.add_argument("--episodes", type=int, default=20, help="timed episodes (MLP: batches) per model, fast path")
    parser.add_argument("--ref-episodes", type=int, default=5, help="timed HYP episodes on the reference SRU path (0: skip)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed warm-up episodes before the timed ones")
    parser.add_argument("--predict-texts", type=int, default=2000, help="test texts for batched prediction (at most)")
    parser.add_argument("--latency-texts", type=int, default=30, help="single-text predictions for the median latency")
    parser.add_argument("--support-per-class", type=int, default=50, help="training examples per class for the prototypes")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    args = parser.parse_args(argv)
    try:  # every option checked before anything is loaded
        settings = parse_names(args.settings, ("quick", "paper"), "settings")
        models = parse_names(args.models, ("hyp", "euc", "mlp"), "models")
        datasets = [resolve_name(name.strip()) for name in args.datasets.split(",")]
    except DyntcError as exc:
        parser.error(str(exc))
    for name in ("episodes", "predict_texts", "latency_texts", "support_per_class"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)

    use_fast_before, use_compiled_before = sru_module.USE_FAST, lorentz.USE_COMPILED
    sru_module.USE_FAST = True  # explicit, so that a DYNTC_SRU_FAST=0 in the environment cannot mislabel rows
    fast_ok, why_not = sru_module.fast_path_status(torch.zeros(1))
    print(f"CPU: {cpu_model()}; {os.cpu_count()} logical CPUs; torch {torch.__version__}, "
          f"torch.get_num_threads() = {torch.get_num_threads()}; load average before: {load_average()}; "
          f"OMP_WAIT_POLICY={omp_wait_policy()}")
    print(f"timed: {args.episodes} episodes/batches per model after {args.warmup} warm-up, {args.ref_episodes} on the "
          f"reference path; prediction over <= {args.predict_texts} test texts" + ("" if fast_ok else
          f"\nWARNING: the SRU fast path is unavailable ({why_not}): 'fast' rows run the reference path"))

    training_rows, prediction_rows = [], []
    for dataset_name in datasets:
        t0 = time.perf_counter()
        data = load(dataset_name)
        load_s = time.perf_counter() - t0
        for setting in settings:
            hp = get_profile(setting).for_dataset(data.name)
            t0 = time.perf_counter()
            torch.manual_seed(0)
            fresh_encoder = create_encoder("sru", data.train.texts, hidden_size=hp["hidden_size"],
                                           num_layers=hp["num_layers"], dropout=hp["dropout"], max_len=hp["max_len"])
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            train = Encoded.of(fresh_encoder, data.train.texts, data.train.labels, data.labels)
            featurize_s = time.perf_counter() - t0
            n_way = min(hp["max_classes"], len(train.classes))
            episode_texts = n_way * hp["n_support"] + hp["n_query"]
            print(f"\n{data.name} / {setting}: SRU {hp['num_layers']} x {hp['hidden_size']}, max_len {hp['max_len']}, "
                  f"dropout {hp['dropout']}, lr {hp['lr']}; {len(train)} train texts, {n_way} classes -> "
                  f"{episode_texts} texts per episode. Load {load_s:.1f} s, encoder build {build_s:.1f} s, "
                  f"featurize train {featurize_s:.1f} s ({len(train) / featurize_s:,.0f} texts/s)", flush=True)

            # (model, SRU path, timed steps, texts per step)
            runs = [(name, "fast", args.episodes, hp["batch_size"] if name == "mlp" else episode_texts) for name in models]
            if args.ref_episodes > 0 and "hyp" in models:
                runs.append(("hyp", "reference", args.ref_episodes, episode_texts))
            for model_name, path, steps, texts_per_step in runs:
                torch.manual_seed(0)
                model = build_model(model_name, copy.deepcopy(fresh_encoder), len(train.classes))
                sru_module.USE_FAST = path == "fast"
                lorentz.USE_COMPILED = None if path == "fast" else False
                try:
                    if model_name == "mlp":
                        warm_s, steps_per_s = time_supervised(model, train, hp, args.warmup, steps)
                    else:  # the reference path needs no compiled kernels warmed up: one episode will do
                        warmup = args.warmup if path == "fast" else min(args.warmup, 1)
                        warm_s, steps_per_s = time_prototypical(model, train, hp, warmup, steps)
                finally:
                    sru_module.USE_FAST, lorentz.USE_COMPILED = True, use_compiled_before
                row = (data.name, setting, model_name, path, texts_per_step, steps, warm_s, steps_per_s)
                training_rows.append(row)
                print(f"  train {model_name} ({path}): {steps_per_s:.2f} {'batches' if model_name == 'mlp' else 'episodes'}/s, "
                      f"{steps_per_s * texts_per_step:,.0f} texts/s (warm-up {warm_s:.1f} s)", flush=True)
                if model_name in ("hyp", "euc") and path == "fast":
                    support = train.per_class(args.support_per_class, seed=0)
                    pred = time_prediction(model, support, data.test.texts[:args.predict_texts], args.latency_texts)
                    prediction_rows.append((data.name, setting, model_name, min(len(data.test), args.predict_texts), pred))
                    print(f"  predict {model_name}: {pred['texts_per_s']:,.0f} texts/s batched, "
                          f"{pred['single_ms']:.1f} ms single text", flush=True)
    sru_module.USE_FAST = use_fast_before

    print(f"\n{'dataset':<8} {'setting':<8} {'model':<5} {'SRU path':<10} {'texts/step':>10} {'timed':>6} "
          f"{'warm-up s':>9} {'steps/s':>9} {'texts/s':>9}")
    for name, setting, model_name, path, texts_per_step, steps, warm_s, steps_per_s in training_rows:
        print(f"{name:<8} {setting:<8} {model_name:<5} {path:<10} {texts_per_step:>10} {steps:>6} "
              f"{warm_s:>9.1f} {steps_per_s:>9.2f} {steps_per_s * texts_per_step:>9,.0f}")
    speeds = {(r[0], r[1], r[2], r[3]): r[7] for r in training_rows}
    for name, setting, model_name, path in speeds:
        if path == "reference" and (name, setting, model_name, "fast") in speeds:
            ratio = speeds[(name, setting, model_name, "fast")] / speeds[(name, setting, model_name, path)]
            print(f"{name} / {setting}: {model_name.upper()} episodes/s, fast / reference (PyTorch SRU and mean solver) "
                  f"= {ratio:.2f}x")

    if prediction_rows:
        print(f"\n{'dataset':<8} {'setting':<8} {'model':<5} {'test texts':>10} {'texts/s':>9} {'1 text ms':>10} "
              f"{'prototypes s (support)':>23}")
        for name, setting, model_name, n_texts, pred in prediction_rows:
            print(f"{name:<8} {setting:<8} {model_name:<5} {n_texts:>10} {pred['texts_per_s']:>9,.0f} "
                  f"{pred['single_ms']:>10.1f} {pred['prototype_s']:>14.1f} ({pred['n_support']:>5})")
    print(f"\nload average after: {load_average()} (on a shared machine the absolute numbers are noisy)")


if __name__ == "__main__":
    main()
