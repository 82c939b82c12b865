"""A prototypical network's geometry, for the probes of why HYP under-performed (hyp_diagnose.py).

:func:`geometry_stats` embeds a support set and a query set with the model (eval mode), builds the
prototypes as the model does, and summarises what decides its predictions:

- ``h_norm``: the encoder output's Euclidean norm ``|h|`` (before the hyperbolic lift);
- ``x0`` / ``radius``: for HYP the time coordinate ``x0 = sqrt(1 + |h|²)`` and the hyperbolic
  distance to the origin ``r = arccosh(x0)``, of query points and of prototypes;
- ``d2_own`` / ``d2_nearest_other`` / ``d2_all``: squared distances (the negative logits) from each
  query to its own class's prototype, to the nearest other prototype, and to all prototypes;
- ``pred_rate`` / ``true_rate``: the share of queries predicted as / belonging to each class, and the
  ``confusion`` matrix (rows: true class, columns: predicted);
- with ``new_classes`` given, the same split into new and old classes (``*_new`` / ``*_old``).

:func:`pretraining_monitor` turns it into a callback for :func:`dyntc.core.training.train_prototypical`, so
that every dev evaluation of a training run records these figures in the run's history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from dyntc.core.encoders.base import eval_mode
from dyntc.core.geometry import Metric
from dyntc.core.models import PrototypicalNetwork
from dyntc.core.inference import Encoded, embed_points


def _summary(values: torch.Tensor) -> dict[str, float]:
    """Mean and the 10th / 50th / 90th percentiles of a 1-D tensor (float64 for the quantiles)."""
    v = values.detach().double().flatten()
    if v.numel() == 0:
        return {}
    q = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return {"mean": float(v.mean()), "p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2])}


def _norm_stats(points: torch.Tensor, space: Metric) -> dict[str, dict[str, float]]:
    out = {"h_norm": _summary(space.euclidean_part(points).norm(dim=1))}
    if space.extra_coordinates:  # the hyperboloid's x0 and the geodesic radius it gives
        x0 = points[:, 0].double()
        out["x0"] = _summary(x0)
        out["radius"] = _summary(torch.acosh(x0.clamp_min(1.0)))
    return out


@torch.no_grad()
def geometry_stats(
    model: PrototypicalNetwork,
    support: Encoded,
    query: Encoded,
    new_classes: Sequence[int] | None = None,
) -> dict:
    """Norms, distance scales and per-class prediction rates of `model` (see the module docstring).

    `support` and `query` share their class list; prototypes come from all of `support`. `new_classes`
    (class ids) splits the figures into new and old classes. Returns a JSON-able dict.
    """
    space = model.space
    n_classes = len(support.classes)
    s_points = embed_points(model, support.items)
    q_points = embed_points(model, query.items)
    d2 = model.nearest_prototypes(s_points, support.labels, n_classes, q_points).double().cpu()
    with eval_mode(model), torch.no_grad():
        protos = model.prototypes(s_points, torch.as_tensor(support.labels, device=s_points.device), n_classes)
    labels = torch.as_tensor(query.labels)
    rows = torch.arange(len(labels))
    own = d2[rows, labels]
    others = d2.clone()
    others[rows, labels] = float("inf")
    pred = d2.argmin(1)
    out: dict = {
        "acc": float((pred == labels).double().mean()),
        "logit_scale": float(model.scale()),
        "query": _norm_stats(q_points.cpu(), space),
        "prototype": _norm_stats(protos.cpu(), space),
        "d2_own": _summary(own),
        "d2_nearest_other": _summary(others.min(1).values),
        "d2_all": _summary(d2),
        # margin > 0: the query is nearer its own prototype than any other (= correct)
        "margin": _summary(others.min(1).values - own),
        "pred_rate": np.bincount(pred.numpy(), minlength=n_classes).astype(float).tolist(),
        "true_rate": np.bincount(labels.numpy(), minlength=n_classes).astype(float).tolist(),
        # confusion[i][j]: queries of class i predicted as j
        "confusion": np.bincount(labels.numpy() * n_classes + pred.numpy(), minlength=n_classes * n_classes)
        .reshape(n_classes, n_classes).tolist(),
    }
    out["pred_rate"] = [c / len(labels) for c in out["pred_rate"]]
    out["true_rate"] = [c / len(labels) for c in out["true_rate"]]
    if new_classes is not None and len(new_classes):
        new = torch.zeros(n_classes, dtype=torch.bool)
        new[torch.as_tensor(list(new_classes), dtype=torch.long)] = True
        q_new = new[labels]
        args = (d2, labels, pred, protos.cpu(), s_points.cpu(), q_points.cpu(), support, space)
        out["new"] = _split_stats(q_new, new, *args)
        out["old"] = _split_stats(~q_new, ~new, *args)
    return out


def _split_stats(q_mask, class_mask, d2, labels, pred, protos, s_points, q_points, support: Encoded, space: Metric) -> dict:
    """Figures of one group of classes (new or old): their queries and their prototypes."""
    s_labels = torch.as_tensor(support.labels)
    in_group = class_mask[s_labels]
    # spread of each support point around its own prototype: a few-example / unseen class has a wide one
    spread = d2.new_tensor([])
    if in_group.any():
        own_proto = protos[s_labels[in_group]]
        pts = s_points[in_group]
        spread = _pair_sq_dist(pts, own_proto, space)
    nearest_in = d2[:, class_mask].min(1).values
    nearest_out = d2[:, ~class_mask].min(1).values if (~class_mask).any() else torch.full_like(nearest_in, float("inf"))
    return {
        "acc": float((pred[q_mask] == labels[q_mask]).double().mean()) if q_mask.any() else None,
        "pred_share": float(class_mask[pred].double().mean()),  # share of all queries predicted as one of these classes
        "true_share": float(q_mask.double().mean()),
        "prototype": _norm_stats(protos[class_mask], space),
        "query": _norm_stats(q_points[q_mask], space),
        "support": _norm_stats(s_points[in_group], space),
        "support_spread_d2": _summary(spread),
        # for the queries of these classes: nearest prototype of the group vs of the other group
        "d2_nearest_in_group": _summary(nearest_in[q_mask]),
        "d2_nearest_out_group": _summary(nearest_out[q_mask]),
        # for every query: how far the group's nearest prototype is (the group "wins" where this is smallest)
        "d2_nearest_in_group_all_queries": _summary(nearest_in),
    }


def _pair_sq_dist(a: torch.Tensor, b: torch.Tensor, space: Metric) -> torch.Tensor:
    return space.sq_distance(a.double(), b.double())


def pretraining_monitor(
    support: Encoded, query: Encoded, *, per_class: int | None = 50, seed: int = 0
) -> Callable[[PrototypicalNetwork], dict]:
    """A ``monitor`` for :func:`dyntc.core.training.train_prototypical`: :func:`geometry_stats` of the model on
    `query` with prototypes from at most `per_class` examples per class of `support`, without the
    per-class lists (kept short for the history)."""
    sup = support.per_class(per_class, seed=seed)

    def monitor(model: PrototypicalNetwork) -> dict:
        stats = geometry_stats(model, sup, query)
        stats["pred_max_share"] = max(stats.pop("pred_rate"))
        stats.pop("true_rate")
        stats.pop("confusion")
        return {"geometry": stats}

    return monitor
