"""A label tree: leaves are the classes a dataset uses, inner nodes are coarser labels."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dyntc.errors import DyntcError

ROOT = "ROOT"


class LabelTree:
    """A rooted tree over label names, built from a child -> parent mapping.

    Every node other than the root has exactly one parent; the root is ``ROOT`` and is not a label.
    ``depth`` counts the levels below the root (a flat label set under the root has depth 1).
    """

    def __init__(self, parent: Mapping[str, str]):
        self.parent: dict[str, str] = dict(parent)
        if ROOT in self.parent:
            raise DyntcError(f"LabelTree: the root {ROOT!r} cannot have a parent")
        self.children: dict[str, list[str]] = {ROOT: []}
        for child, par in self.parent.items():
            if par != ROOT and par not in self.parent:
                raise DyntcError(f"LabelTree: parent {par!r} of {child!r} is not a node of the tree")
            self.children.setdefault(par, []).append(child)
            self.children.setdefault(child, [])
        for node in self.parent:  # detects cycles: every walk must reach the root
            seen = set()
            while node != ROOT:
                if node in seen:
                    raise DyntcError(f"LabelTree: cycle through {node!r}")
                seen.add(node)
                node = self.parent[node]
        for kids in self.children.values():
            kids.sort()

    @classmethod
    def from_paths(cls, paths: Iterable[Iterable[str]]) -> "LabelTree":
        """Build from root-to-leaf paths, e.g. ``[("COMPUTER", "GRAPHICS"), ("FORSALE",)]``."""
        parent: dict[str, str] = {}
        for path in paths:
            above = ROOT
            for node in path:
                if parent.setdefault(node, above) != above:
                    raise DyntcError(f"LabelTree: {node!r} has two parents ({parent[node]!r}, {above!r})")
                above = node
        return cls(parent)

    @property
    def leaves(self) -> list[str]:
        return sorted(n for n in self.parent if not self.children[n])

    @property
    def depth(self) -> int:
        return max((len(self.ancestors(leaf)) + 1 for leaf in self.leaves), default=0)

    def ancestors(self, node: str) -> list[str]:
        """Labels above `node`, nearest first, root excluded."""
        out = []
        node = self.parent[node]
        while node != ROOT:
            out.append(node)
            node = self.parent[node]
        return out

    def leaves_under(self, node: str) -> list[str]:
        if not self.children.get(node):
            return [node]
        return sorted(leaf for child in self.children[node] for leaf in self.leaves_under(child))

    def __contains__(self, node: str) -> bool:
        return node in self.parent

    def __repr__(self) -> str:
        return f"LabelTree({len(self.leaves)} leaves, depth {self.depth})"
