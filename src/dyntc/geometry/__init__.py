"""Geometry for prototypical networks: :mod:`~dyntc.geometry.euclidean` (squared distances, means),
:mod:`~dyntc.geometry.lorentz` (hyperboloid model: distances, exp/log maps, Fréchet mean), and the
metric objects over them (:mod:`~dyntc.geometry.metrics`)."""

from dyntc.geometry import euclidean, lorentz
from dyntc.geometry.metrics import METRIC_OBJECTS, Euclidean, Hyperboloid, Metric, get_metric

#: The metric spaces a model can embed into.
METRICS = tuple(METRIC_OBJECTS)

__all__ = ["METRICS", "Euclidean", "Hyperboloid", "Metric", "euclidean", "get_metric", "lorentz"]
