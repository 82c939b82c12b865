"""Measured: does a CPU-affordable fine-tuning of MiniLM's top 2 layers close discovery's gap to MTP-CLNN?

MTP-CLNN (Zhang et al. ACL 2022) fine-tunes all of BERT on a GPU: supervised on the known labels,
then contrastive learning with nearest neighbours (CLNN) on the unlabelled texts. This probe does a
CPU version of the same idea on the backbone ``train="backbone"`` builds (all-MiniLM-L6-v2, only the
top :data:`~dyntc.classifier.params.BACKBONE_LAYERS` transformer layers trained, the frozen lower
layers' output computed once per text and cached: ``layer_cache.FrozenStates``):

1. neighbours: each training text's ``k`` nearest training texts in discover's adapted metric
   (``clustering.adapt_metric`` of the frozen embeddings, as ``discover`` computes it), fixed;
2. for ``budget`` seconds, Adam on the sum of two supervised-contrastive losses (SupCon,
   temperature ``tau``) per step: ``anchors`` unlabelled texts, each with one positive drawn among its
   neighbours (pairs where one is among the other's neighbours are positives too), and ``labelled``
   labelled texts (as many per known intent) whose positives share their label;
3. every text embedded with the trained layers, then discover's own pipeline in that space
   (``adapt_metric`` + ``seeded_kmeans`` with ``n_new`` given).

``discover(..., adapt_s=...)`` (classifier/discovery_tuning.py) is this probe made a product option,
with the settings it measured best on the dev split (lr 5e-5 over 1e-4); its loop differs only in
drawing at most 16 known labels per step and in logging nothing. The loss, the neighbours and the
positives are the product's own functions.

Rows (the protocol of ``bench/discovery.py``: ``protocol_split``, ``scores``; KCR 75 %, LAR 10 %):
``ours`` and ``metric`` of the same split on the frozen backbone (bench.discovery's own functions),
``tuned:metric`` (the dev / test texts assigned to the tuned clustering's centres in the tuned adapted
metric: the counterpart of ``metric``) and ``tuned:product`` (the clusters found in the tuned space
accepted into a frozen-backbone classifier, as ``discover`` + ``accept(add_examples=True)`` +
``refresh()`` would do it, then ``predict``). Every row is scored on the dev split (for choices)
and on the test split (the figure to report).

    flock /tmp/dyntc-bench.lock nice -n 5 python research/discovery_finetune.py --dataset stackoverflow \
        --seed 0 --budget 360 [--lr 5e-5 --tau 0.07 --k 50 --anchors 64 --labelled 64] [--words-weight 0]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # bench.discovery: the protocol and the frozen-backbone rows

from dyntc.classifier.discovery_tuning import neighbour_positives, neighbours, supcon  # noqa: E402


def train(encoder, states, unlabelled: np.ndarray, nbrs: np.ndarray, labelled: np.ndarray, labelled_y: np.ndarray,
          *, budget_s: float, lr: float, tau: float, anchors: int, per_label: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    params = [p for p in encoder.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    classes = np.unique(labelled_y)
    by_class = {c: labelled[labelled_y == c] for c in classes}
    encoder.train()
    start, steps, losses = time.perf_counter(), 0, []
    while time.perf_counter() - start < budget_s:
        a = rng.choice(unlabelled, size=min(anchors, len(unlabelled)), replace=False)
        p = nbrs[a, rng.integers(nbrs.shape[1], size=len(a))]
        u = np.concatenate([a, p])
        lab = np.concatenate([rng.choice(by_class[c], size=min(per_label, len(by_class[c])), replace=False)
                              for c in classes])
        lab_y = np.concatenate([np.full(min(per_label, len(by_class[c])), c) for c in classes])
        z = encoder(**states(np.concatenate([u, lab])))
        loss_u = supcon(z[:len(u)], neighbour_positives(u, nbrs), tau)
        loss_l = supcon(z[len(u):], torch.from_numpy(lab_y[:, None] == lab_y[None, :]), tau)
        loss = loss_u + loss_l
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
        losses.append((loss_u.item(), loss_l.item()))
        if steps % 50 == 0:
            lu, ll = np.mean(losses[-50:], axis=0)
            print(f"  step {steps} ({time.perf_counter() - start:.0f} s): loss unlabelled {lu:.3f}, labelled {ll:.3f}",
                  flush=True)
    encoder.eval()
    return {"steps": steps, "seconds": time.perf_counter() - start, "loss_first": losses[0] if losses else None,
            "loss_last50": np.mean(losses[-50:], axis=0).tolist() if losses else None}


@torch.no_grad()
def embed_all(encoder, states, n: int, batch: int = 512) -> np.ndarray:
    encoder.eval()
    out = [encoder(**states(np.arange(s, min(s + batch, n)))).numpy() for s in range(0, n, batch)]
    return np.concatenate(out).astype(np.float32)


def cluster_rows(x_lab, ky, x_unl, x_eval, n_known: int, n_new: int, seed: int):
    """discover's pipeline with ``n_new`` given: the assignment of the unlabelled texts and of `x_eval`
    (to the centres, in the adapted metric)."""
    from dyntc.classifier import clustering as cl
    from dyntc.classifier.discovery import MIN_CLUSTER_SIZE, MODE_SETTINGS, SHRINK

    w = cl.adapt_metric(cl.unit(x_lab), ky, SHRINK)
    lab_w, unl_w = cl.unit(x_lab @ w), cl.unit(x_unl @ w)
    assign, centres, _ = cl.seeded_kmeans(unl_w, lab_w, ky, n_known, n_new, seed=seed, min_size=MIN_CLUSTER_SIZE,
                                          **MODE_SETTINGS["default"])
    return assign, (cl.unit(x_eval @ w) @ centres.T).argmax(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", default="stackoverflow")
    parser.add_argument("--kcr", type=float, default=0.75)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=360.0, help="seconds of training")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--tau", type=float, default=0.07)
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--labelled", type=int, default=64, help="labelled texts per step (spread over the known intents)")
    parser.add_argument("--states", type=Path, default=Path("/tmp/dyntc-disco-states"),
                        help="directory to keep the frozen layers' output between runs (None: 'none')")
    parser.add_argument("--no-frozen-rows", action="store_true")
    parser.add_argument("--words-weight", type=float, default=None,
                        help="discover's words_weight in the frozen rows (default: the product's; the tuned rows have none)")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))

    from bench.discovery import baselines, cpu_name, protocol_split, run_product, scores
    from dyntc import DynamicClassifier
    from dyntc.classifier.params import encoder_options
    from dyntc.core.encoders import create_encoder
    from dyntc.protocol.data.datasets import load

    load_start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    header = (f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, CPU {cpu_name()} "
              f"({os.cpu_count()} cores), {' '.join(sys.argv[1:])}; uptime at start: {load_start}")
    print(header, flush=True)
    data = load(args.dataset)
    n_total = len(set(data.train.labels))
    known, labelled, unlabelled = protocol_split(data.train.texts, data.train.labels, args.kcr, args.seed)
    n_new = n_total - len(known)
    eval_texts = list(data.dev.texts) + list(data.test.texts)
    n_dev = len(data.dev)

    def split_scores(pred) -> dict:
        pred = list(pred)
        return {"dev": scores(data.dev.labels, pred[:n_dev]), "test": scores(data.test.labels, pred[n_dev:])}

    rows: dict[str, dict] = {}
    params = DynamicClassifier().get_params()
    frozen = create_encoder("minilm", ["warm up"], **encoder_options(params))

    def encode(texts):
        return torch.stack(frozen.featurize(list(texts))).numpy().astype(np.float32)

    if not args.no_frozen_rows:
        pred, found, seconds = run_product(labelled, unlabelled, eval_texts, n_new, "default", args.seed,
                                           words_weight=args.words_weight)
        rows["ours"] = {**split_scores(pred), "seconds": seconds}
        base = baselines(encode, unlabelled, labelled, eval_texts, n_total, n_new, args.seed, args.words_weight)
        for tag in ("metric", "seeded", "kmeans"):
            rows[tag] = split_scores(base[tag])
        for tag, r in rows.items():
            print(f"{tag}: dev {fmt(r['dev'])}  test {fmt(r['test'])}", flush=True)

    # --- the tuned backbone: train="backbone"'s encoder (top BACKBONE_LAYERS layers, no head)
    t0 = time.perf_counter()
    train_texts = labelled[0] + unlabelled
    all_texts = train_texts + eval_texts
    n_lab, n_train = len(labelled[0]), len(train_texts)
    torch.manual_seed(args.seed)
    tuned = create_encoder("minilm", [], **encoder_options({**params, "train": "backbone"}))
    items = tuned.featurize(all_texts)
    states = tuned.training_collator(items)
    assert type(states).__name__ == "FrozenStates", "the backbone did not split: every step would run all of it"
    key = hashlib.sha256("\0".join(all_texts).encode()).hexdigest()[:16]
    cache = None if str(args.states) == "none" else args.states / f"{args.dataset}-{key}.pt"
    if cache is not None and cache.is_file():
        states.states = torch.load(cache)
        states.nbytes = sum(h.element_size() * h.nelement() for h in states.states.values())
        how = "loaded"
    else:
        for s in range(0, len(items), 1024):
            states(np.arange(s, min(s + 1024, len(items))))
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            torch.save(states.states, cache)
        how = "computed"
    lower_s = time.perf_counter() - t0
    print(f"frozen layers' output of {len(items)} texts {how} in {lower_s:.0f} s ({states.nbytes / 2**20:.0f} MiB)",
          flush=True)

    from dyntc.classifier import clustering as cl
    from dyntc.classifier.discovery import SHRINK

    known_names = sorted(set(labelled[1]))
    ky = np.array([known_names.index(y) for y in labelled[1]])
    t1 = time.perf_counter()
    start_x = cl.unit(encode(train_texts))
    w = cl.adapt_metric(start_x[:n_lab], ky, SHRINK)
    nbrs = neighbours(cl.unit(start_x @ w), args.k)
    nbr_s = time.perf_counter() - t1
    truth = np.array(data_labels(data, train_texts))
    print(f"neighbours in {nbr_s:.1f} s; share of the unlabelled texts' neighbours with their own intent: "
          f"{purity(nbrs[n_lab:], truth):.3f} (adapted metric), "
          f"{purity(neighbours(start_x, args.k)[n_lab:], truth):.3f} (plain cosine)", flush=True)
    fit = train(tuned, states, np.arange(n_lab, n_train), nbrs, np.arange(n_lab), ky, budget_s=args.budget, lr=args.lr,
                tau=args.tau, anchors=args.anchors, per_label=max(1, args.labelled // len(known_names)), seed=args.seed)
    t2 = time.perf_counter()
    x = embed_all(tuned, states, len(items))
    embed_s = time.perf_counter() - t2
    print(f"trained {fit['steps']} steps in {fit['seconds']:.0f} s; embedded {len(items)} texts in {embed_s:.0f} s",
          flush=True)
    tuned_nbrs = neighbours(cl.unit(x[:n_train]), args.k)
    print(f"after training: {purity(tuned_nbrs[n_lab:], truth):.3f} (plain cosine)", flush=True)

    t3 = time.perf_counter()
    assign, eval_pred = cluster_rows(x[:n_lab], ky, x[n_lab:n_train], x[n_train:], len(known_names), n_new, args.seed)
    cluster_s = time.perf_counter() - t3
    rows["tuned:metric"] = split_scores(eval_pred)
    names = known_names + [f"new_{i}" for i in range(n_new)]
    t4 = time.perf_counter()
    clf = DynamicClassifier(seed=args.seed).fit(train_texts, labelled[1] + [names[a] for a in assign])
    rows["tuned:product"] = {**split_scores(clf.predict(eval_texts)), "seconds": time.perf_counter() - t4}
    adapt_s = lower_s + nbr_s + fit["seconds"] + embed_s
    for tag in ("tuned:metric", "tuned:product"):
        print(f"{tag}: dev {fmt(rows[tag]['dev'])}  test {fmt(rows[tag]['test'])}", flush=True)
    load_end = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result = {"header": header, "uptime_end": load_end, "args": {k: str(v) for k, v in vars(args).items()},
              "n_new": n_new, "known": len(known), "labelled": n_lab, "unlabelled": len(unlabelled),
              "timing": {"lower_states_s": lower_s, "lower_states": how, "neighbours_s": nbr_s,
                         "train_s": fit["seconds"], "embed_s": embed_s, "cluster_s": cluster_s, "adapt_total_s": adapt_s},
              "train": fit, "rows": rows}
    out = ROOT / "runs" / "discovery"
    out.mkdir(parents=True, exist_ok=True)
    path = out / (f"finetune-{args.dataset}-kcr{args.kcr:g}-s{args.seed}-b{args.budget:g}-lr{args.lr:g}"
                  f"-tau{args.tau:g}-k{args.k}.json")
    path.write_text(json.dumps(result, indent=1))
    print(header)
    print(f"uptime at end: {load_end}")
    print(f"adaptation: frozen layers {lower_s:.0f} s ({how}) + neighbours {nbr_s:.0f} s + training {fit['seconds']:.0f} s "
          f"({fit['steps']} steps) + embedding {embed_s:.0f} s = {adapt_s:.0f} s")
    print("| method | dev NMI / ARI / ACC | test NMI / ARI / ACC |\n|---|---|---|")
    for tag, r in rows.items():
        print(f"| {tag} | {fmt(r['dev'])} | {fmt(r['test'])} |")
    print(f"saved {path}")


def data_labels(data, texts):
    first: dict[str, str] = {}
    for t, y in zip(data.train.texts, data.train.labels):
        first.setdefault(t, y)
    return [first[t] for t in texts]


def purity(nbrs: np.ndarray, labels: np.ndarray) -> float:
    """Mean share of each unlabelled text's neighbours (indices into `labels`) that have its own label
    (rows of `nbrs` are the texts after the labelled ones in `labels`)."""
    own = labels[len(labels) - len(nbrs):]
    return float((labels[nbrs] == own[:, None]).mean())


def fmt(s) -> str:
    return " / ".join(f"{v:.1f}" for v in s)


if __name__ == "__main__":
    main()
