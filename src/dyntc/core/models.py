"""The paper's three models on top of any :class:`~dyntc.core.encoders.base.TextEncoder`.

- :class:`PrototypicalNetwork` (EUC / HYP): a class is the mean of its embedded support examples
  (Euclidean mean, or hyperbolic Fréchet mean on the hyperboloid); logits are ``-d²`` to each prototype.
- :class:`MLPClassifier` (MLP): the same encoder and a linear output layer, replaced for a new label set.
- :class:`KNNProbe` (MLP-KNN): k-nearest-neighbour vote on the MLP's penultimate layer (the encoder output).
- :class:`ModelKind` / :data:`MODELS` / :func:`model_kind`: the three by name (``"mlp"``, ``"euc"``,
  ``"hyp"``) and the research protocol's ``"logreg"`` baseline (no network), each with what its callers
  ask (a network? prototypes? episodes? an output layer? a curved space?).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from dyntc.core.encoders.base import TextEncoder, eval_mode
from dyntc.errors import DyntcError, is_number
from dyntc.core.geometry import METRICS, euclidean, get_metric
from dyntc.core.geometry.metrics import Metric as MetricObject

Metric = Literal["euclidean", "hyperbolic"]


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state dict without its frozen parameters (e.g. GloVe rows, which the encoder rebuilds):
    what checkpoints, snapshots and the early-stopping copy need to keep (tensors shared, not copied)."""
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def load_trainable_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a :func:`trainable_state` (a full state dict works too) into `model`; the frozen parameters
    stay. Checked before anything is loaded: a missing trainable tensor or an unknown key is an error."""
    expected = set(trainable_state(model))
    missing, unknown = expected - set(state), set(state) - set(model.state_dict())
    if missing or unknown:
        raise DyntcError(f"state does not fit the model: missing {sorted(missing)[:5]}, unknown {sorted(unknown)[:5]}")
    model.load_state_dict(state, strict=False)


def group_by_class(labels: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of each class's examples, padded: ``index (C, m)`` and ``mask (C, m)``, m = largest class.

    Lets per-class means run as one batched operation instead of a Python loop over classes.
    """
    labels = labels.long()
    counts = torch.bincount(labels, minlength=n_classes)
    if len(counts) > n_classes:
        raise DyntcError(f"label id {int(labels.max())} out of range for {n_classes} classes")
    if (counts == 0).any():
        missing = torch.nonzero(counts == 0).flatten().tolist()
        raise DyntcError(f"classes {missing[:10]} have no support examples; every class needs at least one")
    order = torch.argsort(labels, stable=True)
    sorted_labels = labels[order]
    starts = torch.cumsum(counts, 0) - counts
    position = torch.arange(len(labels), device=labels.device) - starts[sorted_labels]
    width = int(counts.max())
    index = torch.zeros(n_classes, width, dtype=torch.long, device=labels.device)
    mask = torch.zeros(n_classes, width, dtype=torch.bool, device=labels.device)
    index[sorted_labels, position] = order
    mask[sorted_labels, position] = True
    return index, mask


def soft_clip_norm(h: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``h * R tanh(|h| / R) / |h|`` with ``R = max_norm``: the norm squashed smoothly below ``R``.

    Close to the identity for ``|h| << R`` (derivative 1 at 0), direction kept, norm ``< R``. Before the
    hyperbolic lift this bounds a point's distance to the origin by ``arcsinh(R)``. ``tanh(u)/u`` is taken
    from its series near 0 so that ``h = 0`` has a finite value and gradient.
    """
    norm = h.norm(dim=-1, keepdim=True)
    u = norm / max_norm
    small = u < 1e-4
    u_safe = torch.where(small, torch.ones_like(u), u)
    ratio = torch.where(small, 1.0 - u.square() / 3.0, torch.tanh(u_safe) / u_safe)  # tanh(u) / u
    return h * ratio


def project_to_norm(h: torch.Tensor, norm: float, eps: float = 1e-12) -> torch.Tensor:
    """``R h / |h|`` with ``R = norm``: only the direction of ``h`` is kept.

    Before the hyperbolic lift every point then lies at distance ``arcsinh(R)`` from the origin. Unlike
    :func:`soft_clip_norm` the norm gets no gradient at all, so training cannot push it outwards (on
    NEWS the soft clip saturates: every text ends at the bound while the encoder's own norm grows and
    the gradient reaching its direction shrinks as ``R / |h|``; docs/results.md §8).
    """
    return h * (norm / h.norm(dim=-1, keepdim=True).clamp_min(eps))


class PrototypicalNetwork(nn.Module):
    """Nearest-prototype classifier in a learned Euclidean or hyperbolic space.

    Hyperbolic: the encoder output ``h`` is lifted to the hyperboloid ``(sqrt(1+|h|²), h)``; a
    prototype is the Fréchet mean of its support points, started at the normalised Euclidean mean
    and solved for ``train_mean_iters`` steps in training (paper: 5) and ``eval_mean_iters`` at
    evaluation (paper: 100; our solver usually converges much sooner). By default the mean is
    detached from the graph as in the paper; ``differentiable_mean=True`` backpropagates through it.
    """

    def __init__(
        self,
        encoder: TextEncoder,
        metric: Metric | MetricObject = "euclidean",
        *,
        train_mean_iters: int = 5,
        eval_mean_iters: int = 100,
        differentiable_mean: bool = False,
        logit_scale: float = 1.0,
        learn_scale: bool = False,
        max_norm: float | None = None,
        fixed_norm: float | None = None,
    ):
        super().__init__()
        if not isinstance(metric, MetricObject) and metric not in METRICS:
            raise DyntcError(f"metric must be one of {METRICS}, got {metric!r}")
        if not (is_number(logit_scale) and logit_scale > 0):
            raise DyntcError(f"logit_scale must be a number > 0 (the logits are -logit_scale * d²), got {logit_scale!r}")
        if max_norm is not None and not (is_number(max_norm) and max_norm > 0):
            raise DyntcError(f"max_norm must be None (no clip) or a number > 0, got {max_norm!r}")
        if fixed_norm is not None and not (is_number(fixed_norm) and fixed_norm > 0):
            raise DyntcError(f"fixed_norm must be None (no projection) or a number > 0, got {fixed_norm!r}")
        if fixed_norm is not None and max_norm is not None:
            raise DyntcError("max_norm (a soft clip) and fixed_norm (a projection to that norm) exclude each other: set one")
        if not isinstance(learn_scale, bool):
            raise DyntcError(f"learn_scale must be True or False, got {learn_scale!r}")
        self.encoder = encoder
        #: the metric object (geometry.metrics) of its space: lift, mean, squared distances
        self.space: MetricObject = metric if isinstance(metric, MetricObject) else get_metric(metric)
        self.train_mean_iters = train_mean_iters
        self.eval_mean_iters = eval_mean_iters
        self.differentiable_mean = differentiable_mean
        self.logit_scale = float(logit_scale)  # the initial value when learnt
        self.learn_scale = learn_scale
        self.max_norm = None if max_norm is None else float(max_norm)
        self.fixed_norm = None if fixed_norm is None else float(fixed_norm)
        if learn_scale:
            # learnt in log space (stays positive); a parameter only when learnt, so that checkpoints of
            # models without it keep loading strictly
            self.log_scale = nn.Parameter(torch.tensor(math.log(logit_scale)))

    def config(self) -> dict:
        return {
            "metric": self.metric,
            "train_mean_iters": self.train_mean_iters,
            "eval_mean_iters": self.eval_mean_iters,
            "differentiable_mean": self.differentiable_mean,
            "logit_scale": self.logit_scale,
            "learn_scale": self.learn_scale,
            "max_norm": self.max_norm,
            # only when set: configurations (and snapshot keys) of models without it stay as they were
            **({"fixed_norm": self.fixed_norm} if self.fixed_norm is not None else {}),
        }

    @contextmanager
    def metric_as(self, metric: Metric) -> Iterator[None]:
        """Within the block, measure with `metric` instead of the model's own (same encoder, same
        parameters): HYP's Euclidean warm-up (``TrainConfig.euclidean_warmup``)."""
        if metric not in METRICS:
            raise DyntcError(f"metric must be one of {METRICS}, got {metric!r}")
        own, self.space = self.space, get_metric(metric)
        try:
            yield
        finally:
            self.space = own

    @contextmanager
    def clip_suspended(self) -> Iterator[None]:
        """Within the block, no soft clip (``max_norm``) before the metric: HYP's Euclidean warm-up
        without it (``TrainConfig.euclidean_warmup_clip=False``) is EUC's training exactly."""
        own, self.max_norm = self.max_norm, None
        try:
            yield
        finally:
            self.max_norm = own

    def scale(self) -> torch.Tensor | float:
        """The factor ``s`` of the logits ``-s d²`` (learnt or fixed)."""
        return self.log_scale.exp() if self.learn_scale else self.logit_scale

    def embed(self, **batch: torch.Tensor) -> torch.Tensor:
        """Points in the metric space: ``(B, d)`` Euclidean or ``(B, d+1)`` on the hyperboloid."""
        return self.to_metric_space(self.encoder(**batch))

    @property
    def metric(self) -> Metric:
        """The name of its metric (``"euclidean"`` or ``"hyperbolic"``), as configs record it."""
        return self.space.name

    def to_metric_space(self, h: torch.Tensor) -> torch.Tensor:
        if self.max_norm is not None:
            h = soft_clip_norm(h, self.max_norm)
        if self.fixed_norm is not None:
            h = project_to_norm(h, self.fixed_norm)
        return self.space.lift(h)

    def prototypes(self, points: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
        """One prototype per class ``0..n_classes-1`` from labelled points -> ``(n_classes, dim)``."""
        index, mask = group_by_class(labels, n_classes)
        iters = self.train_mean_iters if self.training else self.eval_mean_iters
        return self.space.mean(points[index], mask.to(points.dtype), max_iter=iters,
                               differentiable=self.differentiable_mean)

    def sq_distances(self, queries: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
        return self.space.sq_distance_matrix(queries, prototypes)

    @torch.no_grad()
    def nearest_prototypes(self, support_points: torch.Tensor, support_labels, n_classes: int,
                           query_points: torch.Tensor) -> torch.Tensor:
        """The one nearest-prototype rule of the research protocol: prototypes (eval-mode means) of
        the labelled support points, then ``(n_query, n_classes)`` squared distances from each query
        point to them; the prediction is their argmin. The model is left in the mode it was in."""
        with eval_mode(self):
            labels = torch.as_tensor(support_labels, device=support_points.device)
            return self.sq_distances(query_points, self.prototypes(support_points, labels, n_classes))

    def logits(self, queries: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
        """``-s d²(query, prototype)`` (``s = scale()``, 1 by default): softmax over these is the model's
        class distribution. A positive ``s`` changes no prediction, only the loss's temperature."""
        return self.logits_from_sq_distances(self.sq_distances(queries, prototypes))

    def logits_from_sq_distances(self, d2: torch.Tensor) -> torch.Tensor:
        """``-s d²`` from squared distances (see :meth:`logits`)."""
        return -d2 if not self.learn_scale and self.logit_scale == 1.0 else -self.scale() * d2

    def episode_loss(
        self,
        support: dict[str, torch.Tensor],
        support_labels: torch.Tensor,
        query: dict[str, torch.Tensor],
        query_labels: torch.Tensor,
        n_classes: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy over ``softmax(-d²)`` of the queries; returns ``(loss, logits)``, the logits
        of shape (n_query, n_classes)."""
        return self.points_loss(self.embed(**support), support_labels, self.embed(**query), query_labels, n_classes)

    def points_loss(self, support_points: torch.Tensor, support_labels: torch.Tensor, query_points: torch.Tensor,
                    query_labels: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`episode_loss` from points already embedded (support and query in one batch, say)."""
        logits = self.logits(query_points, self.prototypes(support_points, support_labels, n_classes))
        return nn.functional.cross_entropy(logits, query_labels), logits


class MLPClassifier(nn.Module):
    """The paper's baseline: the encoder followed by one linear output layer."""

    def __init__(self, encoder: TextEncoder, n_classes: int):
        super().__init__()
        if n_classes < 2:
            raise DyntcError(f"n_classes must be >= 2, got {n_classes}")
        self.encoder = encoder
        self.head = nn.Linear(encoder.output_dim, n_classes)

    def config(self) -> dict:
        return {"n_classes": self.head.out_features}

    def forward(self, **batch: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(**batch))

    def replace_head(self, n_classes: int) -> None:
        """A fresh output layer for a new label set; the encoder is kept (the paper's fine-tuning)."""
        if n_classes < 2:
            raise DyntcError(f"n_classes must be >= 2, got {n_classes}")
        device = self.head.weight.device
        self.head = nn.Linear(self.encoder.output_dim, n_classes).to(device)


class KNNProbe:
    """k-nearest-neighbour vote (Euclidean) on fixed features; ties go to the nearer neighbours."""

    def __init__(self, k: int = 5):
        if k < 1:
            raise DyntcError(f"k must be >= 1, got {k}")
        self.k = k
        self._features: torch.Tensor | None = None

    def fit(self, features: torch.Tensor, labels: torch.Tensor) -> "KNNProbe":
        if len(features) != len(labels) or len(features) == 0:
            raise DyntcError(f"KNNProbe.fit needs as many labels as features (>0), got {len(features)}, {len(labels)}")
        self._features, self._labels = features.float(), labels.long()
        self._n_classes = int(labels.max()) + 1
        return self

    @torch.no_grad()
    def predict(self, features: torch.Tensor) -> torch.Tensor:
        if self._features is None:
            raise DyntcError("KNNProbe.predict called before fit")
        k = min(self.k, len(self._features))
        dist = euclidean.sq_distance_matrix(features.float(), self._features)
        nearest = dist.topk(k, dim=1, largest=False).indices  # (N, k), nearest first
        votes = torch.zeros(len(features), self._n_classes)
        # Each neighbour votes 1, plus a tie-breaking bonus smaller than one vote that favours nearer ones.
        weight = 1.0 + (k - torch.arange(k, dtype=torch.float32)) / (k * (k + 1))
        votes.scatter_add_(1, self._labels[nearest], weight.expand(len(features), k).contiguous())
        return votes.argmax(1)


@dataclass(frozen=True)
class ModelKind:
    """One of the paper's models as the research protocol sees it: a name (``"euc"``, ``"hyp"``,
    ``"mlp"``, ``"logreg"``: the key of results, fingerprints, profiles and command lines) and the
    space its prototypes live in. Callers ask a kind what they need to know; they never compare model
    names.

    Every other property follows from `metric` and `network`: a model with a metric is a
    :class:`PrototypicalNetwork` trained by episodes; a network without one is an
    :class:`MLPClassifier` trained by mini-batches; a kind without a network (the logistic-regression
    baseline on frozen sentence embeddings) is neither pretrained nor trained here.
    """

    name: str
    #: the metric object (dyntc.core.geometry) of its prototypes; None: no prototypes
    metric: MetricObject | None
    #: whether it is a network of this module (False: a probe fitted on frozen embeddings, nothing to build)
    network: bool = True

    @property
    def prototypical(self) -> bool:
        """Classifies by the nearest class prototype (:class:`PrototypicalNetwork`), and so takes its
        options (logit scale, norm clip, ...); un-tuned, its prototypes come from the new examples."""
        return self.metric is not None

    @property
    def episodic(self) -> bool:
        """Trained by episodes (``train_prototypical``: episode budgets and minimum, the hold at the
        chance loss, the cosine learning rate, scratch cells with the pretraining recipe); otherwise by
        mini-batches over epochs (``train_supervised``)."""
        return self.prototypical

    @property
    def has_output_layer(self) -> bool:
        """Ends in a linear output layer, replaced for a new label set, that fine-tuning may fit first
        (``TrainConfig.fit_head``); un-tuned, it classifies by a k-NN vote on its encoder's output."""
        return self.network and self.metric is None

    @property
    def euclidean_warmup(self) -> bool:
        """Its space is curved, so a Euclidean warm-up before training in it means something (the
        ``euclidean_warmup*`` settings, ``scratch_unclipped_warmup``)."""
        return self.metric is not None and self.metric.curvature != 0

    @property
    def steps(self) -> str:
        """What its training steps are called in logs and reports."""
        return "episodes" if self.episodic else "batches"

    def build(self, encoder: TextEncoder, n_classes: int, **options) -> PrototypicalNetwork | MLPClassifier:
        """An untrained model of this kind on `encoder` (see :func:`build_model`)."""
        if not self.network:
            raise DyntcError(f"the {self.name} baseline is a probe fitted on frozen embeddings, not a network to build")
        if not self.prototypical:
            if options:
                raise DyntcError(f"the {self.name} model takes no options, got {sorted(options)}")
            return MLPClassifier(encoder, n_classes)
        return PrototypicalNetwork(encoder, self.metric, **options)


#: The models by name, in the paper's order: MLP (encoder + output layer), EUC and HYP (prototypical
#: networks), and the research protocol's baseline LogReg (a logistic regression on frozen embeddings).
MODELS: dict[str, ModelKind] = {
    kind.name: kind
    for kind in (
        ModelKind("mlp", None),
        ModelKind("euc", get_metric("euclidean")),
        ModelKind("hyp", get_metric("hyperbolic")),
        ModelKind("logreg", None, network=False),
    )
}


def model_kind(name: str) -> ModelKind:
    """The :class:`ModelKind` called `name`; an unknown name is a :class:`DyntcError` naming the choices."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise DyntcError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None


def build_model(name: str, encoder: TextEncoder, n_classes: int, **options) -> PrototypicalNetwork | MLPClassifier:
    """``"euc"`` / ``"hyp"`` -> :class:`PrototypicalNetwork` (`options` are its keyword options, e.g.
    ``logit_scale``), ``"mlp"`` -> :class:`MLPClassifier` (no options); ``"logreg"`` has no network."""
    return model_kind(name).build(encoder, n_classes, **options)
