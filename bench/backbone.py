"""Where the time of ``DynamicClassifier(train="backbone")`` goes: one training episode taken apart.

The network is built exactly as ``fit`` builds it for ``train="backbone"`` (all-MiniLM-L6-v2, its
top ``BACKBONE_LAYERS`` transformer layers trained, the classifier's ``max_len``, ``n_support``,
``n_query`` and ``max_classes``), on CLINC150's training texts (featurized once: word-piece ids).
Then:

* **episodes/s**: ``train_prototypical`` itself (no dev set), after a warm-up call of ``--warmup``
  episodes: sampling, collation, forward, loss, backward, Adam step. Settings in alternating rounds
  of ``--episodes`` episodes on the same episodes: the default (the frozen lower layers' output
  cached per text, ``dyntc.core.encoders.layer_cache``, filled for every training text first, its
  one-off cost printed apart; support and query in one batch, ``TextEncoder.joint_episodes``; length
  groups of ``LENGTH_GROUP``), the steps that led to it, and the whole backbone run in every episode
  in groups of 32 with support and query apart (before the cache). Each setting's time against that
  last one is the gain per episode.
* **the parts of one episode**: the same work written out (forward through the network, loss,
  backward, Adam step) with forward hooks timing the embedding layer and every transformer layer,
  averaged over ``--episodes`` episodes. The frozen part (embeddings and lower layers) runs without
  autograd; the trained top layers record the graph their backward walks. Three settings alternate on
  the same episodes: the default, the whole backbone in length-sorted groups of 32 texts with support
  and query apart (before the cache), and the whole backbone on each batch padded to its longest text
  (before the groups).
* **inference**: the same texts embedded in eval mode without gradient (what a frozen backbone pays
  per text), for scale.

* ``--accuracy``: instead of the timings, whether the cache (whose frozen layers run in eval mode,
  without dropout) trains as good a model: ``DynamicClassifier(train="backbone",
  time_budget_s=--budget)`` with and without it, on the generalized scenario of ``bench.intents``
  (a third of the intents added with 5 examples after fitting), dev split, old / new / all.

    python -m bench.backbone [--episodes 10] [--threads 2]
    python -m bench.backbone --accuracy [--budget 120] [--datasets clinc150,hwu64] [--seed 0]

No assertions: timings on a shared machine are noisy (the load average is printed before and after).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time
from collections import defaultdict

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dataset", default="clinc150")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of --episodes episodes per setting")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--datasets", default="clinc150,hwu64")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.accuracy:
        return accuracy(args)
    from bench._machine import load_average
    from dyntc import DynamicClassifier
    from dyntc.classifier.params import BACKBONE_LAYERS, encoder_options, network_options, train_config
    from dyntc.protocol.data.datasets import load
    from dyntc.core.episodes import EpisodeSampler
    from dyntc.core.encoders import create_encoder, pretrained
    from dyntc.core.encoders.pretrained import _transformer_layers
    from dyntc.core.inference import Encoded
    from dyntc.core.models import PrototypicalNetwork
    from dyntc.core.training import make_optimizer, train_prototypical

    header(args)
    params = DynamicClassifier(train="backbone").get_params()
    data = load(args.dataset)
    texts, labels = data.train.texts, data.train.labels
    torch.manual_seed(0)
    t0 = time.perf_counter()
    encoder = create_encoder(params["encoder"], texts, **encoder_options(params))
    model = PrototypicalNetwork(encoder, params["metric"], **network_options(params))
    train = Encoded.of(encoder, texts, labels, sorted(set(labels)))
    print(f"{args.dataset}: {len(texts)} training texts, {len(train.classes)} labels; network built and texts "
          f"featurized in {time.perf_counter() - t0:.1f} s; top {BACKBONE_LAYERS} of "
          f"{len(_transformer_layers(encoder.backbone))} layers trained; max_len {params['max_len']}; episodes of "
          f"{params['max_classes']} labels x {params['n_support']} support + {params['n_query']} queries")

    # 1. the library's loop in several settings, alternating rounds on the same episodes: the default
    # (frozen layers cached, support and query in one batch, groups of LENGTH_GROUP), the variants that
    # led to it, and the whole backbone per episode in groups of 32 with support and query apart (before)
    from dyntc.core.encoders.base import TextEncoder

    cached = encoder.training_collator(train.items)
    t = time.perf_counter()
    cached(range(len(train.items)))
    fill = time.perf_counter() - t
    print(f"frozen layers cached for all {len(train.items)} training texts in {fill:.1f} s "
          f"({cached.nbytes / 2**20:.0f} MiB = {sum(len(x) for x in train.items)} word pieces x {encoder.input_dim} floats)")
    default_group = pretrained.LENGTH_GROUP
    whole_backbone = lambda items: TextEncoder.training_collator(encoder, items)  # noqa: E731
    loops = {  # name: (collator, support and query in one batch, length group)
        f"cached, one batch, groups of {default_group} (default)": (lambda items: cached, True, default_group),
        f"cached, one batch, groups of {2 * default_group}": (lambda items: cached, True, 2 * default_group),
        f"cached, support and query apart, groups of {default_group}": (lambda items: cached, False, default_group),
        "whole backbone, support and query apart, groups of 32 (before)": (whole_backbone, False, 32),
    }
    spent_loop = {name: [0.0, 0] for name in loops}
    try:
        for r in range(args.rounds + 1):  # round 0: warm-up, not counted
            for name, (collator, joint, group) in loops.items():
                encoder.training_collator, encoder.joint_episodes, pretrained.LENGTH_GROUP = collator, joint, group
                result = train_prototypical(model, train, None, train_config(params, args.episodes if r else args.warmup,
                                                                             params["lr"]))
                if r:
                    spent_loop[name][0] += result.seconds
                    spent_loop[name][1] += result.steps
    finally:
        del encoder.training_collator
        encoder.joint_episodes = True
        pretrained.LENGTH_GROUP = default_group
    print(f"\ntrain_prototypical, {args.rounds} alternating rounds of {args.episodes} episodes per setting:")
    print("| setting | episodes | s per episode | episodes/s | before / setting |")
    print("|---|---:|---:|---:|---:|")
    before_s, before_n = spent_loop[list(loops)[-1]]
    for name, (seconds, steps) in spent_loop.items():
        print(f"| {name} | {steps} | {seconds / steps:.3f} | {steps / seconds:.2f} | "
              f"{(before_s / before_n) / (seconds / steps):.2f}x |")
    after_s, after_n = spent_loop[list(loops)[0]]
    print(f"the cache's fill ({fill:.1f} s) is paid back after "
          f"{fill / (before_s / before_n - after_s / after_n):.0f} episodes of the default")

    # 2. the same episodes taken apart, the backbone run in length groups (the default) and, for
    # comparison, on the whole padded batch; the two alternate episode by episode on the same episodes
    layers = list(_transformer_layers(encoder.backbone))
    trained_from = len(layers) - BACKBONE_LAYERS
    embeddings = next(m for n, m in encoder.backbone.named_modules() if n.endswith("embeddings"))
    spent: dict[str, float] = defaultdict(float)
    started: dict[int, float] = {}

    def timed(module, name):
        module.register_forward_pre_hook(lambda m, a: started.__setitem__(id(m), time.perf_counter()))
        module.register_forward_hook(lambda m, a, out: spent.__setitem__(
            name, spent[name] + time.perf_counter() - started[id(m)]))

    timed(embeddings, "forward: embeddings (frozen)")
    for i, layer in enumerate(layers):
        timed(layer, f"forward: layers 1-{trained_from} (frozen)" if i < trained_from
              else f"forward: layers {trained_from + 1}-{len(layers)} (trained)")
    model.train()
    sampler = EpisodeSampler(train.labels, n_support=params["n_support"], n_query=params["n_query"],
                             max_classes=params["max_classes"], seed=1, names=train.classes)
    optimizer = make_optimizer(model, params["lr"])
    plain = lambda items: (lambda idx: encoder.collate([items[i] for i in idx]))  # noqa: E731
    settings = {  # name: (length group, collator, support and query in one batch)
        "cached, one batch (default)": (default_group, lambda items: cached, True),
        "whole backbone, groups of 32, apart (before)": (32, plain, False),
        "whole backbone, one padded batch, apart": (10**9, plain, False)}
    totals = {name: defaultdict(float) for name in settings}
    hooks = {name: defaultdict(float) for name in settings}
    n_texts, padded, real = [], 0, 0
    for _ in range(args.episodes):
        ep = sampler.sample()
        support_labels, query_labels = torch.as_tensor(ep.support_labels), torch.as_tensor(ep.query_labels)
        for setting, (group, collator, joint) in settings.items():
            pretrained.LENGTH_GROUP = group
            collate = collator(train.items)
            spent.clear()
            total = totals[setting]
            t = time.perf_counter()
            batches = [collate([*ep.support, *ep.query])] if joint else [collate(ep.support), collate(ep.query)]
            total["sampling and collation"] += time.perf_counter() - t
            t = time.perf_counter()
            if joint:
                points = model.embed(**batches[0])
                ns = len(ep.support)
                loss, _ = model.points_loss(points[:ns], support_labels, points[ns:], query_labels, ep.n_classes)
            else:
                loss, _ = model.episode_loss(batches[0], support_labels, batches[1], query_labels, ep.n_classes)
            total["forward (all of it)"] += time.perf_counter() - t
            t = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            total["backward"] += time.perf_counter() - t
            t = time.perf_counter()
            optimizer.step()
            total["Adam step"] += time.perf_counter() - t
            for k, v in spent.items():
                hooks[setting][k] += v
            if setting == "whole backbone, one padded batch, apart":
                for batch in batches:
                    padded += batch["attention_mask"].numel()
                    real += int(batch["attention_mask"].sum())
        n_texts.append(len(ep.support) + len(ep.query))
    pretrained.LENGTH_GROUP = default_group
    n = args.episodes
    print(f"\none episode ({np.mean(n_texts):.0f} texts, {np.mean([len(x) for x in train.items]):.1f} word pieces "
          f"per text on average; padded to each batch's longest they are {padded / real:.2f}x the real tokens), "
          f"mean of {n} episodes per setting, the settings alternating:")
    names = list(settings)
    print("| part | " + " | ".join(f"{name}: s (share)" for name in names) + " |")
    print("|---|" + "---:|" * len(names))
    wholes = {name: sum(totals[name].values()) / n for name in names}
    for part in totals[names[0]]:
        cells = [f"{totals[name][part] / n:.3f} ({100 * totals[name][part] / n / wholes[name]:.0f}%)" for name in names]
        print(f"| {part} | " + " | ".join(cells) + " |")
        if part == "forward (all of it)":
            subs = list(dict.fromkeys(k for name in reversed(names) for k in hooks[name]))  # the whole backbone's parts too
            for sub in subs:
                cells = [f"{hooks[name][sub] / n:.3f} ({100 * hooks[name][sub] / n / wholes[name]:.0f}%)" for name in names]
                print(f"| &nbsp;&nbsp;{sub} | " + " | ".join(cells) + " |")
            rest = [(totals[name][part] - sum(hooks[name].values())) / n for name in names]
            print("| &nbsp;&nbsp;forward: the rest (pooling, prototypes, distances, loss) | "
                  + " | ".join(f"{r:.3f} ({100 * r / wholes[name]:.0f}%)" for r, name in zip(rest, names)) + " |")
    print("| **episode** | " + " | ".join(f"**{wholes[name]:.3f}**" for name in names) + " |")
    print(f"before / default: {wholes[names[1]] / wholes[names[0]]:.2f}x; "
          f"one padded batch / groups of 32: {wholes[names[2]] / wholes[names[1]]:.2f}x")
    whole = wholes[names[0]]

    # 3. inference on the same number of texts
    model.eval()
    sample = [train.items[i] for i in np.random.default_rng(0).choice(len(train.items), int(np.mean(n_texts)), replace=False)]
    with torch.no_grad():
        model.embed(**encoder.collate(sample))
        t = time.perf_counter()
        for _ in range(3):
            model.embed(**encoder.collate(sample))
        infer = (time.perf_counter() - t) / 3
    print(f"\ninference, eval mode, no gradient, the same number of texts in one batch: {infer:.3f} s "
          f"({whole / infer:.1f}x less than a training episode)")
    print(f"load average after: {load_average()}")


def header(args) -> None:
    import subprocess

    import torch

    from bench._machine import load_average, omp_wait_policy
    from dyntc.core.machine import machine_description

    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {machine_description()}; "
          f"torch {torch.__version__}, {args.threads} threads; load {load_average()}; OMP_WAIT_POLICY {omp_wait_policy()}")
    print(f"uptime: {uptime}")


def accuracy(args) -> None:
    """Fine-tuned with and without the cached frozen layers, the same budget, the same run (module docstring)."""
    from bench import intents
    from bench._intents_data import load_data
    from dyntc.core.encoders.base import TextEncoder
    from dyntc.core.encoders.pretrained import PretrainedEncoder

    header(args)
    spec = f"product:train=backbone,budget={args.budget:g}"
    arms = {"frozen layers cached, eval mode (default)": PretrainedEncoder.training_collator,
            "whole backbone every episode, train mode (before)": TextEncoder.training_collator}
    print(f"DynamicClassifier(train='backbone', time_budget_s={args.budget:g}); generalized scenario (a third of the "
          f"intents new, 5 examples each, added after fit), dev split, partition seed {args.seed}")
    print("| dataset | setting | state | old | new | all | fit s |")
    print("|---|---|---|---:|---:|---:|---:|")
    try:
        for ds in args.datasets.split(","):
            data = load_data(ds)
            data.oos_dev = None  # accuracy only
            for name, collator in arms.items():
                PretrainedEncoder.training_collator = collator
                row = intents.generalized(data, "dev", args.seed, [spec], 5, 1 / 3)[spec]
                for state in ("now", "refreshed"):
                    v = row[state]
                    print(f"| {ds} | {name} | {state} | {v['old']:.1f} | {v['new']:.1f} | {v['all']:.1f} | "
                          f"{row['refreshed']['fit_s']:.0f} |", flush=True)
    finally:
        PretrainedEncoder.training_collator = arms["frozen layers cached, eval mode (default)"]
    from bench._machine import load_average

    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
