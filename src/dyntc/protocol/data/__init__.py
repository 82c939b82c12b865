"""The paper's datasets, their label hierarchies and dynamic label splits."""

from dyntc.protocol.data.hierarchy import LabelTree
from dyntc.protocol.data.types import Dataset, Split

__all__ = ["Dataset", "LabelTree", "Split"]
