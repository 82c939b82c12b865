"""Where the time of ``DynamicClassifier(train="backbone")`` goes: one training episode taken apart.

The network is built exactly as ``fit`` builds it for ``train="backbone"`` (all-MiniLM-L6-v2, its
top ``BACKBONE_LAYERS`` transformer layers trained, the classifier's ``max_len``, ``n_support``,
``n_query`` and ``max_classes``), on CLINC150's training texts (featurized once: word-piece ids).
Then:

* **episodes/s**: ``train_prototypical`` itself for ``--episodes`` episodes (no dev set), after a
  warm-up call of ``--warmup`` episodes: sampling, collation, forward, loss, backward, Adam step.
* **the parts of one episode**: the same work written out (support and query forward through the
  network, loss, backward, Adam step) with forward hooks timing the embedding layer and every
  transformer layer, averaged over ``--episodes`` episodes. The frozen part (embeddings and lower
  layers) runs without autograd; the trained top layers record the graph their backward walks. Two
  settings alternate on the same episodes: the backbone run in length-sorted groups of
  ``LENGTH_GROUP`` texts (``dyntc.core.encoders.pretrained``, the default) and on the whole batch padded
  to its longest text (as before the groups).
* **inference**: the same texts embedded in eval mode without gradient (what a frozen backbone pays
  per text), for scale.

    python -m bench.backbone [--episodes 10] [--threads 2]

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
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from bench._machine import load_average, omp_wait_policy
    from dyntc import DynamicClassifier
    from dyntc.classifier.params import BACKBONE_LAYERS, encoder_options, network_options, train_config
    from dyntc.protocol.data.datasets import load
    from dyntc.core.episodes import EpisodeSampler
    from dyntc.core.encoders import create_encoder, pretrained
    from dyntc.core.encoders.pretrained import _transformer_layers
    from dyntc.core.inference import Encoded
    from dyntc.core.machine import machine_description
    from dyntc.core.models import PrototypicalNetwork
    from dyntc.core.training import make_optimizer, train_prototypical

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; {machine_description()}; "
          f"torch {torch.__version__}, {args.threads} threads; load {load_average()}; OMP_WAIT_POLICY {omp_wait_policy()}")
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

    # 1. the library's loop
    train_prototypical(model, train, None, train_config(params, args.warmup, params["lr"]))
    result = train_prototypical(model, train, None, train_config(params, args.episodes, params["lr"]))
    per_episode = result.seconds / result.steps
    print(f"\ntrain_prototypical: {result.steps} episodes in {result.seconds:.1f} s = "
          f"{1 / per_episode:.2f} episodes/s ({per_episode:.2f} s per episode)")

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
    settings = {f"length groups of {pretrained.LENGTH_GROUP} (default)": pretrained.LENGTH_GROUP,
                "one padded batch": 10**9}
    totals = {name: defaultdict(float) for name in settings}
    hooks = {name: defaultdict(float) for name in settings}
    n_texts, padded, real = [], 0, 0
    for _ in range(args.episodes):
        ep = sampler.sample()
        for setting, group in settings.items():
            pretrained.LENGTH_GROUP = group
            spent.clear()
            total = totals[setting]
            t = time.perf_counter()
            support = encoder.collate([train.items[i] for i in ep.support])
            query = encoder.collate([train.items[i] for i in ep.query])
            total["sampling and collation"] += time.perf_counter() - t
            t = time.perf_counter()
            loss, _ = model.episode_loss(support, torch.as_tensor(ep.support_labels), query,
                                         torch.as_tensor(ep.query_labels), ep.n_classes)
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
        n_texts.append(len(ep.support) + len(ep.query))
        for batch in (support, query):
            padded += batch["attention_mask"].numel()
            real += int(batch["attention_mask"].sum())
    pretrained.LENGTH_GROUP = settings[next(iter(settings))]
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
            for sub in hooks[names[0]]:
                cells = [f"{hooks[name][sub] / n:.3f} ({100 * hooks[name][sub] / n / wholes[name]:.0f}%)" for name in names]
                print(f"| &nbsp;&nbsp;{sub} | " + " | ".join(cells) + " |")
            rest = [(totals[name][part] - sum(hooks[name].values())) / n for name in names]
            print("| &nbsp;&nbsp;forward: the rest (pooling, prototypes, distances, loss) | "
                  + " | ".join(f"{r:.3f} ({100 * r / wholes[name]:.0f}%)" for r, name in zip(rest, names)) + " |")
    print("| **episode** | " + " | ".join(f"**{wholes[name]:.3f}**" for name in names) + " |")
    print(f"one padded batch / length groups: {wholes[names[1]] / wholes[names[0]]:.2f}x")
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


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
