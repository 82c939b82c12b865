"""Measured: the geometry of EUC or HYP during pretraining (norms, radii, margins, distance scales,
per-class prediction rates) and the un-tuned variant it gives (docs/results.md §7 and §8.2). It
pretrains on one dynamic split as `dyntc reproduce` does (same split, seeds, encoder and profile),
records the geometry over pretraining, then measures the un-tuned variant (prototypes of Y_new from
n_fine examples, no training) on dev and test.

    OMP_NUM_THREADS=1 python research/hyp_diagnose.py \
        --dataset sent --model hyp --profile quick --out /tmp/diag-hyp.json [--set pretrain_episodes=2000 ...]

Writes a JSON file (history with `diagnostics.geometry_stats` per dev evaluation; un-tuned
figures per n_fine) and prints a short table. Everything selected or compared here is on dev; the
test figures are printed for the record only.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dyntc.protocol.data.datasets import load
from dyntc.protocol.data.dynamic import make_split
from dyntc.core.episodes import EpisodeSampler
from diagnostics import geometry_stats, pretraining_monitor
from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, derive_seed, make_plan, parse_overrides
from dyntc.core.training import train_prototypical
from dyntc.core.machine import machine_description


@torch.no_grad()
def episode_scale(model, train, cfg, seed: int) -> dict:
    """Squared distances of one training episode in train mode (dropout on): the logits' scale."""
    from diagnostics import _summary

    sampler = EpisodeSampler(train.labels, n_support=cfg.n_support, n_query=cfg.n_query,
                             max_classes=cfg.max_classes, seed=seed, names=train.classes)
    ep = sampler.sample()
    model.train()
    enc = model.encoder
    s = model.embed(**enc.collate([train.items[i] for i in ep.support]))
    q = model.embed(**enc.collate([train.items[i] for i in ep.query]))
    protos = model.prototypes(s, torch.as_tensor(ep.support_labels), ep.n_classes)
    d2 = model.sq_distances(q, protos)
    loss = torch.nn.functional.cross_entropy(-d2, torch.as_tensor(ep.query_labels))
    logits = model.logits(q, protos)
    return {"d2": _summary(d2), "d2_row_std": _summary(d2.std(1)), "loss_unscaled": float(loss),
            "loss": float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(ep.query_labels))),
            "chance_loss": float(np.log(ep.n_classes))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="sent")
    ap.add_argument("--model", default="hyp", choices=["euc", "hyp"])
    ap.add_argument("--profile", default="quick")
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-fine", default="5,100")
    ap.add_argument("--monitor-per-class", type=int, default=50, help="train examples per class for the monitor's prototypes")
    ap.add_argument("--set", dest="settings", action="append", default=[], help="profile override FIELD=VALUE")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    try:  # a bad --set, profile or dataset is a one-line error, before any work
        plan = make_plan(args.dataset, args.profile, splits=args.split + 1, models=args.model, n_fine=args.n_fine,
                         variants="un-tuned", seed=args.seed, settings=parse_overrides(args.settings))
    except DyntcError as exc:
        ap.error(str(exc))
    data = load(plan.dataset, None, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = ProtocolRun(data, plan, Path(tmp), progress=False, log=lambda m: print(m, file=sys.stderr))
        hp = run.hp
        split_seed = args.seed + args.split
        split = make_split(data, split_seed, hp["p"])
        enc0 = run.encoders.fresh(split_seed)
        feats = run.encoders.features(enc0)
        old, new = split.old_labels, split.new_labels
        pretrain = feats.encoded("train", split.pretrain_idx, split.pretrain.labels, old)
        dev_old_full = feats.encoded("dev", split.dev_old_idx, split.dev_old.labels, old)
        dev_old = dev_old_full.per_class(hp["dev_per_class"], derive_seed(plan.seed, args.split, "dev"))
        dev_new = feats.encoded("dev", split.dev_new_idx, split.dev_new.labels, new)
        pool = feats.encoded("train", split.finetune_idx, split.finetune_pool.labels, new)
        test = feats.encoded("test", split.test_idx, split.test.labels, new)
        new_ids = [new.index(c) for c in split.new_classes]

        # the protocol's own helpers (and order of seeding), so that the model, encoder and config are the run's
        model = run.new_model(args.model, enc0, split_seed, len(old))
        cfg = run._cfg("pretrain", derive_seed(plan.seed, split_seed, args.model, "pretrain"), model=args.model)
        cfg.progress = False
        init_scale = episode_scale(copy.deepcopy(model), pretrain, cfg, seed=1)
        monitor = pretraining_monitor(pretrain, dev_old_full, per_class=args.monitor_per_class, seed=cfg.seed)
        t0 = time.perf_counter()
        result = train_prototypical(model, pretrain, dev_old, cfg, monitor=monitor)
        seconds = time.perf_counter() - t0
        model.eval()
        untuned = {}
        for n in plan.n_fine:
            idx, _ = split.finetune_indices(n)
            fine = pool.take(idx)
            untuned[n] = {"dev": geometry_stats(model, fine, dev_new, new_ids),
                          "test": geometry_stats(model, fine, test, new_ids)}

    report = {
        "dataset": plan.dataset, "model": args.model, "profile": args.profile, "settings": args.settings,
        "split": args.split, "machine": machine_description(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": {k: v for k, v in hp.items() if k != "description"},
        "new_classes": split.new_classes, "new_labels": new,
        "init_episode": init_scale, "pretrain_steps": result.steps, "pretrain_seconds": seconds,
        "best_dev_old": result.best_dev_acc, "stopped_early": result.stopped_early,
        "history": result.history, "untuned": untuned,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print_summary(report)


def print_summary(r: dict) -> None:
    hyp = r["model"] == "hyp"
    print(f"{r['dataset']} {r['model']} {r['profile']} {' '.join(r['settings'])}  ({r['machine']}, {r['date']})")
    e = r["init_episode"]
    print(f"init episode (train mode): d2 mean {e['d2']['mean']:.3g} p10 {e['d2']['p10']:.3g} p90 {e['d2']['p90']:.3g}; "
          f"row std {e['d2_row_std']['mean']:.3g}; loss {e['loss']:.3f} (chance {e['chance_loss']:.3f})")
    print(f"pretrained {r['pretrain_steps']} episodes in {r['pretrain_seconds']:.0f}s, best dev_old {r['best_dev_old']:.3f}, "
          f"early stop {r['stopped_early']}")
    print(" step   loss  dev   |h| q mean  |h| proto  r(q)   r(proto)  d2_own  d2_other  margin_p50  max_pred_share")
    for h in r["history"]:
        g = h["geometry"]
        r_q = g["query"].get("radius", {}).get("mean", float("nan"))
        r_p = g["prototype"].get("radius", {}).get("mean", float("nan"))
        print(f"{h['step']:5d} {h.get('loss', float('nan')):6.3f} {h.get('dev_acc', g['acc']):.3f} "
              f"{g['query']['h_norm']['mean']:9.3g} {g['prototype']['h_norm']['mean']:9.3g} {r_q:6.2f} {r_p:8.2f} "
              f"{g['d2_own']['mean']:8.3g} {g['d2_nearest_other']['mean']:8.3g} {g['margin']['p50']:10.3g} "
              f"{g['pred_max_share']:.2f}")
    for n, parts in r["untuned"].items():
        for part, g in parts.items():
            nw, od = g["new"], g["old"]
            line = (f"un-tuned n_fine={n} {part}: acc {g['acc']:.3f}; new: acc {nw['acc']:.3f} pred_share {nw['pred_share']:.3f} "
                    f"(true {nw['true_share']:.3f}); old: acc {od['acc']:.3f}")
            print(line)
            for name, grp in (("new", nw), ("old", od)):
                pr = grp["prototype"]
                rad = f" r {pr['radius']['mean']:.2f} (queries r {grp['query']['radius']['mean']:.2f}, support r {grp['support']['radius']['mean']:.2f})" if hyp else ""
                print(f"    {name} protos |h| {pr['h_norm']['mean']:.3g}{rad}; support spread d2 {grp['support_spread_d2'].get('mean', float('nan')):.3g}; "
                      f"own-group queries: nearest in-group d2 {grp['d2_nearest_in_group']['mean']:.3g}, "
                      f"nearest out-group d2 {grp['d2_nearest_out_group']['mean']:.3g}")


if __name__ == "__main__":
    main()
