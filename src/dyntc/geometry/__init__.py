"""Geometry for prototypical networks: :mod:`~dyntc.geometry.euclidean` (squared distances, means)
and :mod:`~dyntc.geometry.lorentz` (hyperboloid model: distances, exp/log maps, Fréchet mean)."""

from dyntc.geometry import euclidean, lorentz

#: The metric spaces a model can embed into.
METRICS = ("euclidean", "hyperbolic")

__all__ = ["METRICS", "euclidean", "lorentz"]
