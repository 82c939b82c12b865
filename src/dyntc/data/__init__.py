"""Datasets, label hierarchies, dynamic label splits and episode sampling."""

from dyntc.data.hierarchy import LabelTree
from dyntc.data.types import Dataset, Split

__all__ = ["Dataset", "LabelTree", "Split"]
