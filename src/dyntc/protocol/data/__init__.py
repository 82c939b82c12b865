"""The paper's datasets, their label hierarchies and dynamic label splits."""

from dyntc.protocol.data.hierarchy import LabelTree
from dyntc.protocol.data.types import Dataset, Split
from dyntc.protocol.data import discovery_sets  # noqa: F401  registers StackOverflow and M-CID in datasets.DATASETS

__all__ = ["Dataset", "LabelTree", "Split"]
