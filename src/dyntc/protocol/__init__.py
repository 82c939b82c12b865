"""The paper's dynamic classification protocol (Wohlwend et al. 2019, Sections 4-5), end to end.

For each random label split (:mod:`dyntc.protocol.data.dynamic`) and each model (MLP, EUC, HYP):

1. **pretrain** on the pretraining pool labelled with ``Y_old`` (early stopping on ``dev_old``);
2. for each ``n_fine``, take ``n_fine`` examples per class of ``Y_new`` from the fine-tuning pool and
   evaluate three variants on the test set (labelled with ``Y_new``):

   - ``fine-tuned``: train the pretrained model further on the ``n_fine`` examples (MLP: new output
     layer + supervised training; EUC/HYP: episodic training); prototypes from those examples;
   - ``un-tuned``: no training; prototypes from the pretrained encoder and the ``n_fine`` examples
     (MLP: k-NN, k=5, on its penultimate layer = the paper's MLP-KNN);
   - ``scratch``: the fine-tuned recipe applied to a freshly initialised model (no pretraining; EUC/HYP
     with ``scratch_like_pretraining``: the pretraining recipe);

   Early stopping during fine-tuning / scratch training uses the dev set labelled with ``Y_new``
   (``dev_new``), with prototypes built from the ``n_fine`` examples.

Accuracy is reported over all test examples (``acc_all``), over those whose true label is a new class
(``acc_new``) and over the others (``acc_old``). Every finished (model, variant, n_fine, split) cell is
written at once to ``results.json`` (atomically), so an interrupted run resumes where it stopped.
Pretrained weights are cached under ``checkpoints/`` of the run directory, and so is the state of
a training stage while it runs (``*.partial.pt``, rewritten at each dev evaluation): a run stopped
mid-stage resumes that stage where it was, with the same result.

Texts are featurized once per run (the SRU vocabulary comes from the full training split's texts:
GloVe is frozen, so this leaks no label information) and reused by every split, model and ``n_fine``.

Modules, in the order of the data flow: :mod:`~dyntc.protocol.profiles` (every hyperparameter),
:mod:`~dyntc.protocol.options` (a run's options and their defaults),
:mod:`~dyntc.protocol.plan` (a validated run: dataset, profile, selection, fingerprint, seeds),
:mod:`~dyntc.protocol.run` (the units: pretraining and cells), :mod:`~dyntc.protocol.evaluation`
(prediction and accuracies of a cell), :mod:`~dyntc.protocol.results` (``results.json`` and the
weights on disk), :mod:`~dyntc.protocol.tuning` (per-model settings chosen on ``dev_old``).
"""

from dyntc.protocol.evaluation import accuracies
from dyntc.protocol.options import PlanOptions, ReproduceOptions
from dyntc.protocol.plan import RunPlan, cell_key, derive_seed, make_plan, model_view, parse_int_list, parse_names
from dyntc.protocol.profiles import (
    ALL_MODELS,
    DEFAULT_MODELS,
    METRIC_MODELS,
    MODEL_VARIANTS,
    PAPER,
    PROFILES,
    QUICK,
    TINY,
    VARIANTS,
    Profile,
    get_profile,
    override,
    parse_overrides,
)
from dyntc.protocol.results import RESULTS_FORMAT, ResultsFile, merge_results
from dyntc.protocol.run import ProtocolRun, SplitData, Unit
from dyntc.protocol.tuning import tune_profile

__all__ = [
    "ALL_MODELS", "DEFAULT_MODELS", "METRIC_MODELS", "MODEL_VARIANTS", "PAPER", "PROFILES", "QUICK", "RESULTS_FORMAT",
    "TINY", "VARIANTS", "PlanOptions", "Profile", "ProtocolRun", "ReproduceOptions", "ResultsFile", "RunPlan",
    "SplitData", "Unit", "accuracies", "cell_key", "derive_seed", "get_profile", "make_plan", "merge_results",
    "model_view", "override", "parse_int_list", "parse_overrides", "parse_names", "tune_profile",
]
