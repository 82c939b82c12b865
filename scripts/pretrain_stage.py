"""One pretraining stage of `dyntc reproduce`, alone: the selection runs of docs/results.md §8 (NEWS, HYP).

    DYNTC_DATA=../shared/datasets python scripts/pretrain_stage.py runs/news-hyp-fixed10 max_norm=none fixed_norm=10
    DYNTC_DATA=../shared/datasets python scripts/pretrain_stage.py OUT max_norm=5 --dataset news --model hyp --split 2

Pretrains `--model` on split `--split` of `--dataset` exactly as the `paper` profile's run does (same
split, seeds, encoder and model; FIELD=VALUE arguments override profile fields as `--set` does, and
the model's own settings as `--tune` does), except
that by default nothing stops it early (``pretrain_min_episodes`` at the episode budget), so the
whole dev_old trajectory is seen. The stage keeps its snapshot in OUT/checkpoints/ and resumes from
it when rerun, and its snapshot fits the real run's stage with the same settings (copy it into the
run's checkpoints/splitK/ to go on there). Prints the dev_old history at the end; `--show` prints
the history a stopped stage's snapshot holds, without training (or, for a run directory, the
finished stage's history in its results.json: `--show docs/runs/news-sru-paper --split 1`).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dyntc.data.datasets import load
from dyntc.protocol import ProtocolRun, get_profile, make_plan
from dyntc.protocol.profiles import TUNABLE, parse_setting


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("settings", nargs="*", help="profile overrides FIELD=VALUE")
    ap.add_argument("--dataset", default="news")
    ap.add_argument("--model", default="hyp", choices=["euc", "hyp", "mlp"])
    ap.add_argument("--split", type=int, default=2)
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--show", action="store_true", help="print the history of OUT's snapshot of the stage and stop")
    args = ap.parse_args(argv)
    if args.show:
        return _show(args.out, args.split, args.model)
    torch.set_num_threads(1)
    settings = dict(item.split("=", 1) for item in args.settings)
    profile = get_profile(args.profile)
    settings.setdefault("pretrain_min_episodes", settings.get("pretrain_episodes", str(profile.pretrain_episodes)))
    # the model's own settings (lr, dropout, its options) go where --tune puts them, over the profile's
    # per-model entry for the dataset (e.g. `max_norm=none fixed_norm=10` replaces NEWS HYP's clip)
    own = {k: parse_setting(k, settings.pop(k)) for k in list(settings) if k in TUNABLE}
    if own:
        per_model = dict(profile.per_model.get(args.dataset, profile.per_model.get("*")) or {})
        per_model[args.model] = {**per_model.get(args.model, {}), **own}
        profile = replace(profile, per_model={**profile.per_model, args.dataset: per_model})
    plan = make_plan(args.dataset, profile, splits=args.split + 1, models=args.model, variants="un-tuned",
                     n_fine="5", settings=settings)
    data = load(plan.dataset, None, seed=plan.seed)
    run = ProtocolRun(data, plan, args.out, progress=False, log=lambda m: print(m, flush=True))
    d = run._data(args.split)
    run._pretrained(args.split, d.seed, args.model, d.enc0, d.pretrain, d.dev_old)
    _print_history(run.results["pretraining"][str(args.split)][args.model]["history"])


def _print_history(history: list[dict]) -> None:
    for record in history:
        if "dev_acc" in record:
            print(f"{record.get('step', record.get('epoch'))}\tdev_old {record['dev_acc']:.3f}\tloss {record['loss']:.3f}")


def _show(out: Path, split: int, model: str) -> None:
    snapshot = out / "checkpoints" / f"split{split}" / f"{model}-pretrain.partial.pt"
    if snapshot.is_file():
        state = torch.load(snapshot, map_location="cpu", weights_only=False)
        print(f"{snapshot}: stopped after episode {state['step']}")
        return _print_history(state["history"])
    results = out / "results.json"
    info = json.loads(results.read_text()).get("pretraining", {}).get(str(split), {}).get(model) if results.is_file() else None
    if info is None:
        raise SystemExit(f"--show: neither a snapshot at {snapshot} nor split {split}'s {model} pretraining in "
                         f"{results} (give the OUT, --split and --model of the stage)")
    print(f"{results}: split {split}, {model}, {info['steps']} steps, {info.get('machine', '')}")
    _print_history(info["history"])


if __name__ == "__main__":
    sys.exit(main())
