"""Geometry for prototypical networks: :mod:`~dyntc.geometry.euclidean` (squared distances, means)
and :mod:`~dyntc.geometry.lorentz` (hyperboloid model: distances, exp/log maps, Fréchet mean)."""

from dyntc.geometry import euclidean, lorentz

__all__ = ["euclidean", "lorentz"]
