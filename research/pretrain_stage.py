"""Measured: one pretraining stage of `dyntc reproduce`, alone: the selection runs of HYP's recipe on
NEWS (docs/results.md §8.2).

    python research/pretrain_stage.py runs/news-hyp-fixed10 max_norm=none fixed_norm=10
    python research/pretrain_stage.py OUT max_norm=5 --dataset news --model hyp --split 2

Pretrains `--model` on split `--split` of `--dataset` exactly as the `paper` profile's run does (same
split, seeds, encoder and model; FIELD=VALUE arguments override profile fields as `--set` does, and
the model's own settings as `--tune` does), except
that by default nothing stops it early (``pretrain_min_episodes`` at the episode budget), so the
whole dev_old trajectory is seen. The stage keeps its snapshot in OUT/checkpoints/ and resumes from
it when rerun; at its end it saves the pretrained weights there (MODEL.safetensors and MODEL.json).
Both fit the real run's stage with the same settings while the profile's own stopping rule, replayed
on the dev history, would not have stopped the stage sooner, or would have stopped it where its best
dev score so far was not beaten later (the stage may be killed once `--show` says the rule stops it):
copy the snapshot (to go on there, or taken as the stage's end) or the finished weights (used as they
are, with a note in results.json) into the run's checkpoints/splitK/. Prints the dev_old history at the end; `--show` prints the
history a stage's snapshot holds, without training (or, for a run directory, the finished stage's
history in its results.json: `--show docs/runs/news-sru-paper --split 1`), and where the profile's
own rule would stop that history with its best dev_old by then: what the real run's stage keeps.
`--against RUN[:MODEL]` adds a run's own stage (or another model's) beside it, evaluation by evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dyntc.protocol.data.datasets import load
from dyntc.protocol.data.dynamic import make_split
from dyntc.errors import DyntcError
from dyntc.protocol import ProtocolRun, get_profile, make_plan, parse_overrides
from dyntc.protocol.profiles import TUNABLE, parse_setting
from dyntc.core.stopping import chance_loss, stop_step


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("settings", nargs="*", help="profile overrides FIELD=VALUE")
    ap.add_argument("--dataset", default="news")
    ap.add_argument("--model", default="hyp", choices=["euc", "hyp", "mlp"])
    ap.add_argument("--split", type=int, default=2)
    ap.add_argument("--profile", default="paper")
    ap.add_argument("--device", default="cpu", help="cpu or cuda, as for `dyntc reproduce` (a GPU host runs several stages side by side)")
    ap.add_argument("--embeddings", type=Path, default=None,
                    help="GloVe text file, as `dyntc reproduce --embeddings` (e.g. a `dyntc export-glove` subset sent to a GPU host)")
    ap.add_argument("--show", action="store_true", help="print the history of OUT's snapshot of the stage and stop")
    ap.add_argument("--against", type=Path, action="append", default=[], metavar="RUN",
                    help="with --show: also the dev_old of RUN's same stage at each evaluation (repeatable; "
                         "RUN:MODEL for another model's, e.g. docs/runs/news-sru-paper:euc)")
    args = ap.parse_args(argv)
    if args.show:
        return _show(args)
    torch.set_num_threads(1)
    plan = _plan(args, selection=True)
    data = load(plan.dataset, None, seed=plan.seed)
    run = ProtocolRun(data, plan, args.out, progress=False, log=lambda m: print(m, flush=True))
    run.pretrained(args.split, args.model)
    _print_history(run.results["pretraining"][str(args.split)][args.model]["history"])


def _plan(args: argparse.Namespace, selection: bool):
    """The run's plan with the FIELD=VALUE overrides; a `selection` run does not stop early by default.
    A bad setting, profile, device or GloVe file ends the script with the message, not a traceback."""
    try:
        return _plan_or_raise(args, selection)
    except DyntcError as exc:
        raise SystemExit(f"pretrain_stage.py: {exc}") from None


def _plan_or_raise(args: argparse.Namespace, selection: bool):
    settings = parse_overrides(args.settings, option="settings")
    profile = get_profile(args.profile)
    if selection:
        settings.setdefault("pretrain_min_episodes", settings.get("pretrain_episodes", str(profile.pretrain_episodes)))
    # the model's own settings (lr, dropout, its options) go where --tune puts them, over the profile's
    # per-model entry for the dataset (e.g. `max_norm=none fixed_norm=10` replaces NEWS HYP's clip)
    own = {k: parse_setting(k, settings.pop(k)) for k in list(settings) if k in TUNABLE}
    if own:
        per_model = dict(profile.per_model.get(args.dataset, profile.per_model.get("*")) or {})
        per_model[args.model] = {**per_model.get(args.model, {}), **own}
        profile = replace(profile, per_model={**profile.per_model, args.dataset: per_model})
    return make_plan(args.dataset, profile, splits=args.split + 1, models=args.model, variants="un-tuned",
                     n_fine="5", settings=settings, device=args.device, embeddings=args.embeddings)


def _print_history(history: list[dict], others: list[tuple[str, dict]] = ()) -> None:
    print("\t".join(["step", "dev_old", "loss", *(name for name, _ in others)]))
    for record in history:
        if "dev_acc" in record:
            step = record.get("step", record.get("epoch"))
            theirs = [f"{scores[step]:.3f}" if step in scores else "" for _, scores in others]
            print("\t".join([str(step), f"{record['dev_acc']:.3f}", f"{record['loss']:.3f}", *theirs]))


def _run_history(spec: Path, split: int, model: str) -> tuple[str, dict]:
    """(name, {step: dev_old}) of a run's finished pretraining stage; `spec` is RUN or RUN:MODEL."""
    run, _, other = str(spec).partition(":")
    model = other or model
    results = Path(run) / "results.json"
    try:
        info = json.loads(results.read_text())["pretraining"][str(split)][model]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"--against {spec}: no finished {model} pretraining of split {split} in {results} ({exc!r})")
    scores = {r.get("step", r.get("epoch")): r["dev_acc"] for r in info["history"] if "dev_acc" in r}
    return f"{Path(run).name}:{model}", scores


def _show(args: argparse.Namespace) -> None:
    out, split, model = args.out, args.split, args.model
    snapshot = out / "checkpoints" / f"split{split}" / f"{model}-pretrain.partial.pt"
    weights = out / "checkpoints" / f"split{split}" / f"{model}.json"
    if weights.is_file() and not snapshot.is_file():  # the finished stage's weights
        info = json.loads(weights.read_text())
        print(f"{weights}: finished after episode {info['steps']}, {info.get('machine', '')}, {info['seconds']:.0f} s")
        history = info["history"]
    elif snapshot.is_file():
        state = torch.load(snapshot, map_location="cpu", weights_only=False)
        history = state["history"] if "history" in state else state["result"]["history"]
        print(f"{snapshot}: {'finished' if state.get('done') else 'stopped'} after episode "
              f"{state.get('step') or state['result']['steps']}")
    else:
        results = out / "results.json"
        info = json.loads(results.read_text()).get("pretraining", {}).get(str(split), {}).get(model) if results.is_file() else None
        if info is None:
            raise SystemExit(f"--show: no snapshot or weights of split {split}'s {model} in {out / 'checkpoints'}, nor its "
                             f"pretraining in {results} (give the OUT, --split and --model of the stage)")
        print(f"{results}: split {split}, {model}, {info['steps']} steps, {info.get('machine', '')}")
        history = info["history"]
    _print_history(history, [_run_history(spec, split, model) for spec in args.against])
    if model != "mlp":
        _print_rule_outcome(history, args)


def _print_rule_outcome(history: list[dict], args: argparse.Namespace) -> None:
    """Where the profile's own early stopping (with the FIELD=VALUE overrides) would have ended this
    stage, and its best dev_old by then: what the real run's stage would have kept (a selection run
    trains on to the budget)."""
    if not any("dev_acc" in r for r in history):
        return print("no dev evaluation yet")
    plan = _plan(args, selection=False)
    cfg = plan.train_config("pretrain", 0, model=args.model)
    split_data = make_split(load(plan.dataset, None, seed=plan.seed), plan.seed + args.split, plan.hp["p"])
    chance = chance_loss(split_data.pretrain.labels, cfg.max_classes)
    stop = stop_step(history, cfg, chance)
    kept = [r for r in history if "dev_acc" in r and (stop is None or r["step"] <= stop)]
    best = max(kept, key=lambda r: r["dev_acc"])  # the first of equal scores: the loop keeps strict improvements
    where = f"stops after episode {stop}" if stop is not None else "does not stop it"
    print(f"{args.profile} profile's stopping rule (floor {cfg.min_steps}, patience {cfg.patience} evaluations, "
          f"held at chance {cfg.hold_at_chance}): {where}; best dev_old {best['dev_acc']:.3f} at episode {best['step']}")


if __name__ == "__main__":
    sys.exit(main())
