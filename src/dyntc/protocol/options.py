"""The options of a protocol run, declared once: :class:`PlanOptions` (what :func:`~dyntc.protocol.make_plan`
takes) and :class:`ReproduceOptions` (those and how the run is executed:
:func:`dyntc.protocol.reproduce.reproduce`). Each field holds the option's default and, in its metadata,
the help of the ``dyntc reproduce`` option built from it (:mod:`dyntc.cli.options`).

Metadata keys: ``help``; ``flag``, the option's name where it is not the field's (``--set``);
``command_line_default``, a value or a function giving it, where the command's default differs from
the library's. A union type's first member is the type the command line parses (``--n-fine 5,20``:
a string); a ``dict[str, str]`` is given as repeatable ``FIELD=VALUE`` items.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dyntc.protocol.profiles import DEFAULT_MODELS, VARIANTS


def available_device() -> str:
    """The GPU where there is one, else the CPU (a function: asked when the command is built, not
    whenever the options are imported, e.g. by a worker process)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class PlanOptions:
    """Which cells a run has and how they are seeded, trained and encoded (:func:`~dyntc.protocol.make_plan`).

    Of these, `p` and `settings` (through the resolved profile), `encoder` and `seed` make the run's
    fingerprint; the others (the selection of cells, the device, the GloVe file) may change when
    a run is resumed."""

    splits: int | None = field(default=None, metadata={"help": "Number of random label splits (default: the profile's)"})
    # the default selections spelled as the command line takes them, so that its help shows them
    models: str | tuple[str, ...] | None = field(default=",".join(DEFAULT_MODELS), metadata={
        "help": "Comma-separated: mlp, euc, hyp, logreg (logreg needs a pretrained encoder)"})
    variants: str | tuple[str, ...] | None = field(default=",".join(VARIANTS), metadata={
        "help": "Comma-separated: fine-tuned, un-tuned, scratch"})
    n_fine: str | tuple[int, ...] | None = field(default=None, metadata={
        "help": "Comma-separated examples per class for fine-tuning (default: the profile's)"})
    scratch_n_fine: str | tuple[int, ...] | None = field(default=None, metadata={
        "help": "Run the scratch variant only at these n_fine (default: at all)"})
    encoder: str = field(default="sru", metadata={
        "help": "sru (GloVe + SRU, the paper's) | minilm | path to a sentence-transformers model"})
    p: float | None = field(default=None, metadata={"help": "Fraction of labels removed / leaves collapsed (default 0.3)"})
    seed: int = field(default=0, metadata={"help": "Base seed: split k uses seed + k"})
    only_splits: str | tuple[int, ...] | None = field(default=None, metadata={
        "help": "Run only these split indices now, e.g. 2 or 0,3 "
                "(the others' cells stay to do; a later run with the same --out does them)"})
    settings: dict[str, str] | None = field(default=None, metadata={
        "flag": "--set",
        "help": "Override a profile field for every model (over a per-model entry of the profile too), "
                "e.g. --set pretrain_episodes=2000 (repeatable)"})
    # the command uses the GPU where there is one; a library call stays on the CPU unless told
    device: str = field(default="cpu", metadata={"help": "cpu | cuda", "command_line_default": available_device})
    embeddings: Path | str | None = field(default=None, metadata={
        "help": "GloVe text file for the sru encoder (default: the packaged glove.6B.50d; see dyntc export-glove)"})


@dataclass
class ReproduceOptions(PlanOptions):
    """A run's plan options and how it is executed (:func:`dyntc.protocol.reproduce.reproduce`): where
    the data and the units are, what to do with earlier results, per-model tuning, progress display."""

    data_dir: Path | str | None = field(default=None, metadata={
        "help": "Data directory (default: $DYNTC_DATA or ~/.cache/dyntc)"})
    # None leaves the calling process's torch threads as they are (workers take 1); the command sets
    # one thread in its own process too, usually fastest for the SRU
    threads: int | None = field(default=None, metadata={
        "help": "CPU threads for torch in each process (1 is usually fastest for the SRU's small matrices)",
        "command_line_default": 1})
    jobs: int = field(default=1, metadata={
        "help": "Work units (split x model) run at once, one process each; results are identical to --jobs 1"})
    # "\\[" keeps the command's rich help from reading [ray] as markup
    executor: str = field(default="local", metadata={
        "help": "local (this machine: --jobs processes) | ray (each unit a task on a Ray cluster; "
                "needs pip install 'dyntc\\[ray]'; see docs/cluster.md)"})
    address: str | None = field(default=None, metadata={
        "help": "With --executor ray: the cluster's address, e.g. HEAD_IP:6379, or auto "
                "(the cluster `ray start` began on this machine); default: RAY_ADDRESS, "
                "else a local Ray instance for the run"})
    force: bool = field(default=False, metadata={"help": "Discard results in OUT from a different configuration"})
    redo: str | tuple[str, ...] | None = field(default=None, metadata={
        "help": "Comma-separated models whose finished cells in OUT "
                "are discarded where their settings changed (e.g. hyp's), instead of refusing the run "
                "(scratch cells stay where only pretraining settings changed); "
                "the others' work stays, and the same command again resumes"})
    progress: bool = field(default=True, metadata={"help": "Show progress bars"})
    tune: bool = field(default=False, metadata={
        "help": "First select each model's lr and dropout on split 0's pretraining dev set "
                "(the paper's per-model tuning); the choice goes into results.json"})
    tune_grid: str | None = field(default=None, metadata={
        "help": "Grid for --tune, e.g. 'lr=1e-3,3e-3;dropout=0.3,0.5;hyp.learn_scale=0,1' "
                "(default: lr 1e-3,3e-3,1e-2 x dropout 0.3,0.5)"})


__all__ = ["PlanOptions", "ReproduceOptions", "available_device"]
