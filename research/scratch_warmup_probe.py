"""Measured: why NEWS HYP does not train from scratch (docs/results.md §8.2, scratch_unclipped_warmup). The first EPISODES episodes of a HYP scratch cell
of the `paper` profile (its seeds, data and config, from `dyntc reproduce`'s own helpers), with profile
overrides, printing dev_new and the encoder output's norm before and after. Dev only; no test figures.

    python research/scratch_warmup_probe.py --episodes 600 [--set max_norm=none ...]

(The whole cell under a setting is `dyntc reproduce ... --variants scratch --set ...`.)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from dyntc.protocol.data.datasets import load
from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, derive_seed, make_plan, parse_overrides
from dyntc.core.training import train_prototypical
from dyntc.core.machine import machine_description


def norms(model, fine, n: int = 400) -> list[float]:
    """10th / 50th / 90th percentile of |h| (encoder output, before any clip) over the first n texts."""
    model.eval()
    with torch.no_grad():
        h = torch.cat([model.encoder(**model.encoder.collate(fine.items[i:i + 100])) for i in range(0, min(n, len(fine)), 100)])
    return [round(float(v), 2) for v in torch.quantile(h.norm(dim=1), torch.tensor([0.1, 0.5, 0.9]))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="news")
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--n-fine", type=int, default=100)
    ap.add_argument("--episodes", type=int, default=600)
    ap.add_argument("--set", dest="settings", action="append", default=[], help="profile override FIELD=VALUE")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    try:  # a bad --set is a one-line error, before any work
        plan = make_plan(args.dataset, "paper", splits=args.split + 1, models="hyp", n_fine=str(args.n_fine),
                         variants="scratch", settings=parse_overrides(args.settings))
    except DyntcError as exc:
        ap.error(str(exc))
    data = load(plan.dataset, None, seed=plan.seed)
    with tempfile.TemporaryDirectory() as tmp:
        run = ProtocolRun(data, plan, Path(tmp), progress=False, log=lambda m: print(m, file=sys.stderr))
        d = run.split_data(args.split)
        idx, _ = d.split.finetune_indices(args.n_fine)
        fine = d.pool.take(idx)
        model = run.new_model("hyp", d.enc0, d.seed, len(fine.classes))
        seed = derive_seed(plan.seed, d.seed, "hyp", "scratch", args.n_fine)
        torch.manual_seed(seed)  # as the runner's cell does
        cfg = replace(run._cfg("scratch", seed, model="hyp"), max_episodes=args.episodes, min_steps=args.episodes, progress=False)
        print(f"{args.dataset} split {args.split} n_fine {args.n_fine}, {args.settings or 'paper as is'}: "
              f"max_norm {model.max_norm}, warm-up {cfg.euclidean_warmup} (clip {'on' if cfg.euclidean_warmup_clip else 'off'}), "
              f"lr {cfg.lr}; {machine_description()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"|h| p10/p50/p90 at the start: {norms(model, fine)}")
        t0 = time.perf_counter()
        result = train_prototypical(model, fine, d.dev_new, cfg)
        for record in result.history:
            print(f"episode {record['step']:5d}  loss {record['loss']:.3f}  dev_new {record['dev_acc']:.3f}")
        print(f"|h| p10/p50/p90 at the end: {norms(model, fine)}; logit scale {float(model.scale()):.3f}; "
              f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
