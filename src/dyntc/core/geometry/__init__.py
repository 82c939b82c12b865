"""Geometry for prototypical networks: :mod:`~dyntc.core.geometry.euclidean` (squared distances, means),
:mod:`~dyntc.core.geometry.lorentz` (hyperboloid model: distances, exp/log maps, Fréchet mean), and the
metric objects over them (:mod:`~dyntc.core.geometry.metrics`)."""

from dyntc.core.geometry import euclidean, lorentz
from dyntc.core.geometry.metrics import METRIC_OBJECTS, Euclidean, Hyperboloid, Metric, get_metric

#: The metric spaces a model can embed into.
METRICS = tuple(METRIC_OBJECTS)

__all__ = ["METRICS", "Euclidean", "Hyperboloid", "Metric", "euclidean", "get_metric", "lorentz"]
