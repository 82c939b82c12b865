"""The metric spaces as objects: a caller holds a :class:`Metric` and calls its methods, never branching
on a metric's name. Each method is a thin call into :mod:`~dyntc.core.geometry.euclidean` or
:mod:`~dyntc.core.geometry.lorentz`, whose functions carry the formulas.
"""

from __future__ import annotations

import torch

from dyntc.errors import DyntcError
from dyntc.core.geometry import euclidean, lorentz


class Metric:
    """A space that encoder outputs ``h ∈ R^d`` are lifted into, with its mean and squared distance."""

    name: str
    #: coordinates a point has beyond the encoder's d (the hyperboloid's x0)
    extra_coordinates: int = 0
    #: whether distances need float64 coordinates (float32 hyperboloid points lose small distances)
    needs_float64: bool = False
    #: the space's (constant, sectional) curvature: 0 for a flat one; a Euclidean warm-up of a model
    #: in a curved space is a training of its own (``TrainConfig.euclidean_warmup``), of a flat one not
    curvature: float = 0.0

    def lift(self, h: torch.Tensor) -> torch.Tensor:
        """Encoder outputs ``(..., d)`` to points of the space."""
        raise NotImplementedError

    def mean(self, grouped: torch.Tensor, weights: torch.Tensor, *, max_iter: int = 50,
             differentiable: bool = False) -> torch.Tensor:
        """Weighted means of point sets ``(C, m, dim)`` with weights ``(C, m)`` -> ``(C, dim)``."""
        raise NotImplementedError

    def sq_distance_matrix(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``(n, k)`` squared distances between the rows of `x` ``(n, dim)`` and of `y` ``(k, dim)``."""
        raise NotImplementedError

    def sq_distance(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Squared distances of corresponding rows of `x` and `y` ``(..., dim)`` -> ``(...)``."""
        raise NotImplementedError

    def euclidean_part(self, points: torch.Tensor) -> torch.Tensor:
        """The encoder-space coordinates ``h`` of points (what :meth:`lift` was given)."""
        return points

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self):
        # one object per metric: a copied or unpickled model holds the same one
        return get_metric, (self.name,)


class Euclidean(Metric):
    """``R^d`` with ``|x - y|²``; the mean is the arithmetic mean."""

    name = "euclidean"

    def lift(self, h):
        return h

    def mean(self, grouped, weights, *, max_iter=50, differentiable=False):
        return euclidean.mean(grouped, weights)

    def sq_distance_matrix(self, x, y):
        return euclidean.sq_distance_matrix(x, y)

    def sq_distance(self, x, y):
        return (x - y).square().sum(-1)


class Hyperboloid(Metric):
    """The hyperboloid model ``{x : <x, x>_L = -1, x0 > 0}``, ``h -> (sqrt(1 + |h|²), h)``, squared
    geodesic distance ``arccosh(-<x, y>_L)²``; the mean is the Fréchet mean."""

    name = "hyperbolic"
    extra_coordinates = 1
    needs_float64 = True
    curvature = -1.0

    def lift(self, h):
        return lorentz.project(h)

    def mean(self, grouped, weights, *, max_iter=50, differentiable=False):
        return lorentz.frechet_mean(grouped, weights, max_iter=max_iter, differentiable=differentiable)

    def sq_distance_matrix(self, x, y):
        return lorentz.sq_distance_matrix(x, y)

    def sq_distance(self, x, y):
        return lorentz.sq_distance(x, y)

    def euclidean_part(self, points):
        return points[..., 1:]


METRIC_OBJECTS: dict[str, Metric] = {m.name: m for m in (Euclidean(), Hyperboloid())}


def get_metric(name: str) -> Metric:
    """The metric called `name` (``"euclidean"`` or ``"hyperbolic"``)."""
    try:
        return METRIC_OBJECTS[name]
    except (KeyError, TypeError):
        raise DyntcError(f"metric must be one of {tuple(METRIC_OBJECTS)}, got {name!r}") from None
