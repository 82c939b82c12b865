"""The label set of a :class:`~dyntc.classifier.DynamicClassifier`: support examples and prototypes.

For every label the set keeps its support texts, their points in the metric space (computed once,
when the examples arrive) and its prototype. A label made by merging others keeps one prototype per
merged label (its *parts*) and a text's distance to it is the distance to the nearest part: the mean
of two unrelated intents lies between them, far from both (docs/results.md §9.2). New examples of
such a label join its nearest part. A label operation touches only the labels it names:
their prototypes are recomputed (one batched mean over those labels) and no stored example is
re-encoded. :class:`Support` objects are never modified in place, so :meth:`LabelSet.copy` is a
cheap copy-on-write snapshot: a reader holding the old set keeps seeing the old labels while a
writer changes the copy (the HTTP service relies on this).

``changed`` records the labels an operation added, changed or removed since the last commit to a
store, and ``log`` what was done; the store then writes only those labels.

**Support-size correction** (``debias``, on by default). A prototype estimated from n examples sits
off its label's true mean μ, and on average that adds the spread of the mean to every distance:
``E ||x - p̂||² = ||x - μ||² + σ²/n`` for a label with within-label spread
``σ² = E ||x - μ||²``. A 5-example label therefore looks farther than a 100-example one by
``σ²(1/5 - 1/100)``, and is predicted less often than it occurs. With ``debias`` the score of label c
is the unbiased estimate ``d²(x, p̂_c) - σ²/n_c``, with σ² pooled over all labels (a 5-example label's
own spread is too noisy): ``σ² = Σ_c Σ_i d²(x_ci, p̂_c) / Σ_c (n_c - 1)``. On the hyperboloid the
same formula holds to first order (in the tangent space at the mean), with Fréchet variances. The
measurement is in docs/results.md §9.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dyntc.classifier.space import MetricSpace
from dyntc.errors import DyntcError, LabelExistsError, UnknownLabelError


@dataclass(frozen=True)
class Support:
    """One label's support set: its texts, their points (CPU, float32) and each one's part."""

    texts: tuple[str, ...]
    points: torch.Tensor  # (n, dim)
    parts: tuple[int, ...] = ()  # per example its part 0..k-1, every part non-empty; () = a single part

    @property
    def n_parts(self) -> int:
        return max(self.parts) + 1 if self.parts else 1

    def part_ids(self) -> torch.Tensor:
        return torch.as_tensor(self.parts, dtype=torch.long) if self.parts else torch.zeros(len(self.texts), dtype=torch.long)

    def stored_parts(self) -> list[int]:
        return list(self.parts) if self.parts else [0] * len(self.texts)

    @classmethod
    def of(cls, texts: Sequence[str], points: torch.Tensor, parts: Sequence[int] | None = None) -> "Support":
        """A support set; `parts` renumbered 0..k-1 in order of first appearance (one part: stored as ())."""
        order: dict[int, int] = {}
        ids = tuple(order.setdefault(int(p), len(order)) for p in (parts or ()))
        if ids and len(ids) != len(texts):
            raise DyntcError(f"a support set has {len(texts)} texts but {len(ids)} part ids: the store is damaged")
        return cls(tuple(texts), points, ids if len(order) > 1 else ())


def check_name(name: Any, arg: str = "name", *, new: bool = False) -> str:
    """A label name: a non-empty str without control characters. A `new` name (one being created) must
    moreover read as what it is: no invisible format characters (zero-width spaces and joiners,
    bidirectional overrides, a byte order mark: Unicode category Cf) and in NFC, so that no two labels
    look alike (``"café"`` as ``e`` + combining accent beside ``"café"``): refused, not silently
    changed, so the name stored is the name sent."""
    if not isinstance(name, str):
        raise DyntcError(f"{arg} must be a label name (str), got {type(name).__name__}")
    if not name.strip():
        raise DyntcError(f"{arg} must be a non-empty label name, got {name!r}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise DyntcError(f"{arg} must not contain control characters (NUL, newline, tab, ...), got {name[:40]!r}")
    from dyntc.core.text import is_unicode

    if not is_unicode(name):
        raise DyntcError(f"{arg} is not valid Unicode (it holds a lone surrogate code point): send UTF-8 text")
    if new:
        hidden = sorted({f"U+{ord(c):04X}" for c in name if unicodedata.category(c) == "Cf"})
        if hidden:
            raise DyntcError(f"{arg} {name[:40]!r} holds invisible format characters ({', '.join(hidden[:5])}: "
                             "zero-width or bidirectional controls), so it could pass for another name: remove them")
        if unicodedata.normalize("NFC", name) != name:
            raise DyntcError(f"{arg} {name[:40]!r} is not in Unicode NFC form (a letter and a combining accent "
                             "where one code point exists), so it could pass for another name: send "
                             f"{unicodedata.normalize('NFC', name)[:40]!r}")
    return name


def check_examples(examples: Any, arg: str = "examples", *, allow_empty: bool = False) -> list[str]:
    from dyntc.core.text import check_texts

    if isinstance(examples, str):
        raise DyntcError(f"{arg} must be a list of texts, not a single string: wrap it as [{examples[:30]!r}]")
    if not isinstance(examples, Iterable):
        raise DyntcError(f"{arg} must be a list of texts, got {type(examples).__name__}")
    examples = list(examples)
    if not examples and not allow_empty:
        raise DyntcError(f"{arg} is empty: a label needs at least one example text")
    check_texts(examples, arg)
    for i, text in enumerate(examples):
        if "\x00" in text:  # PostgreSQL cannot store it; SQLite could: refused on both, so a model copies anywhere
            raise DyntcError(f"{arg}[{i}] contains a NUL character (\\x00), which a model store cannot keep: remove it")
    return examples


class LabelSet:
    """Labels -> support sets and prototypes in one :class:`MetricSpace`, with the label operations."""

    def __init__(self, space: MetricSpace, *, debias: bool = True):
        self.space = space
        self.debias = debias
        self._support: dict[str, Support] = {}
        self._prototypes: dict[str, torch.Tensor] = {}
        self._spread: dict[str, float] = {}  # label -> sum of its support points' d² to their part's prototype
        # (every part's prototype, labels in `classes` order; the label index of each row), made lazily
        # and set in one assignment: the service's threads read a committed set concurrently, and a
        # reader must never see the matrix of one fill beside the owners of none (a race seen under load)
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._correction: torch.Tensor | None = None
        self.changed: set[str] = set()
        self.log: list[dict] = []
        # the classifier's cosine head (classifier/live_head.py): its last refresh (an immutable
        # `Trained`, replaced in one assignment) and the scoring view made from it (a cache)
        self.head: Any = None
        self.head_view: Any = None

    @classmethod
    def from_groups(cls, space: MetricSpace, groups: Mapping[str, tuple], *, debias: bool = True) -> "LabelSet":
        """A set from ``{label: (texts, points)}`` or ``{label: (texts, points, parts)}``; every
        prototype computed in one batch."""
        self = cls(space, debias=debias)
        self._support = {name: Support.of(*group) for name, group in sorted(groups.items())}
        self._refresh(self._support)
        return self

    @classmethod
    def embedded(cls, space: MetricSpace, texts: Sequence[str], labels: Sequence[str], items: list | None = None,
                 parts: Sequence[int] | None = None, *, debias: bool = True) -> "LabelSet":
        """A set from (`texts`, `labels`), every text embedded (from its features `items`, if given) and
        every prototype built; `parts`: each text's part of its label (merged labels). Every label
        counts as changed (a commit writes them all)."""
        points = space.embed(texts, items)
        groups: dict[str, list[int]] = {}
        for i, y in enumerate(labels):
            groups.setdefault(y, []).append(i)
        self = cls.from_groups(space, {
            y: ([texts[i] for i in idx], points[torch.as_tensor(idx, dtype=torch.long)].clone(),
                None if parts is None else [parts[i] for i in idx])
            for y, idx in groups.items()
        }, debias=debias)
        self.changed = set(groups)
        return self

    def copy(self) -> "LabelSet":
        other = LabelSet(self.space, debias=self.debias)
        other._support, other._prototypes, other._rows = dict(self._support), dict(self._prototypes), self._rows
        other._spread, other._correction = dict(self._spread), self._correction
        other.changed, other.log = set(self.changed), list(self.log)
        other.head, other.head_view = self.head, self.head_view  # immutable: shared, never changed
        return other

    def with_changes(self, supports: Mapping[str, tuple], removed: Iterable[str]) -> "LabelSet":
        """A copy with the labels in `removed` gone and those in `supports` (re)defined by stored
        ``(texts, points, parts)``: a later version of this set read as its difference to it. Only
        the changed labels are recomputed; the others keep their support objects (and so their
        trained head weights). Nothing counts as changed: it is a committed version."""
        other = self.copy()
        for name in removed:
            other._support.pop(name, None)
        for name, group in supports.items():
            other._support[name] = Support.of(*group)
        other._support = dict(sorted(other._support.items()))
        other._rows = other._correction = None
        other.head_view = None
        other._refresh(supports)
        other.changed, other.log = set(), []
        return other

    # ---------------------------------------------------------------- reading

    @property
    def classes(self) -> list[str]:
        return sorted(self._support)

    def __len__(self) -> int:
        return len(self._support)

    def __contains__(self, name: object) -> bool:
        return name in self._support

    def support(self, name: str) -> Support:
        return self._support[self.require(name)]

    def items(self) -> list[tuple[str, Support]]:
        return [(c, self._support[c]) for c in self.classes]

    def counts(self) -> dict[str, int]:
        return {c: len(self._support[c].texts) for c in self.classes}

    def prototypes(self) -> torch.Tensor:
        """Every part's prototype, ``(n_parts_total, dim)``, labels in ``classes`` order (one row per
        label unless labels were merged; :meth:`prototype_owner` maps rows to labels)."""
        return self._prototype_rows()[0]

    def prototype_owner(self) -> torch.Tensor:
        """The label index (in ``classes``) of each row of :meth:`prototypes`."""
        return self._prototype_rows()[1]

    def _prototype_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._rows
        if rows is None:
            classes = self.classes
            owner = torch.repeat_interleave(torch.arange(len(classes)),
                                            torch.tensor([len(self._prototypes[c]) for c in classes]))
            rows = self._rows = (torch.cat([self._prototypes[c] for c in classes]), owner)
        return rows

    def sq_distances(self, points: torch.Tensor) -> torch.Tensor:
        """Squared distances from `points` to every label, ``(n, n_classes)``: to its nearest part's
        prototype; with ``debias`` each part's ``σ²/n_part`` subtracted first (module docstring), so an
        entry can be slightly negative."""
        matrix, owner = self._prototype_rows()
        d2 = self.space.sq_distances(points, matrix)
        if self.debias:
            d2 = d2 - self.support_correction()
        if len(owner) == len(self):
            return d2
        out = torch.full((len(points), len(self)), float("inf"), dtype=d2.dtype)
        return out.scatter_reduce(1, owner.expand(len(points), -1), d2, reduce="amin")

    def pooled_spread(self) -> float:
        """σ²: the within-label spread ``Σ_c Σ_i d²(x_ci, p_c) / Σ_c (n_c - 1)`` (over parts, for merged
        labels); 0 if no label has two examples."""
        dof = sum(len(s.texts) - s.n_parts for s in self._support.values())
        return sum(self._spread.values()) / dof if dof > 0 else 0.0

    def support_correction(self) -> torch.Tensor:
        """``σ²/n`` per row of :meth:`prototypes` (per label, unless merged): the expected excess
        squared distance to a prototype estimated from ``n`` examples."""
        correction = self._correction
        if correction is None:
            counts = torch.cat([torch.bincount(self._support[c].part_ids(), minlength=self._support[c].n_parts)
                                for c in self.classes]).to(torch.float32)
            correction = self._correction = self.pooled_spread() / counts
        return correction

    def require(self, name: Any, arg: str = "name") -> str:
        check_name(name, arg)
        if name not in self._support:
            known = ", ".join(repr(c) for c in self.classes[:10])
            more = f" and {len(self) - 10} more" if len(self) > 10 else ""
            raise UnknownLabelError(f"label {name!r} does not exist; the labels are {known}{more}")
        return name

    def require_new(self, name: Any, arg: str = "name", allowed: Iterable[str] = ()) -> str:
        check_name(name, arg, new=True)
        if name in self._support and name not in set(allowed):
            raise LabelExistsError(f"label {name!r} already exists: use add_examples to give it more examples, or pick another name")
        return name

    # ---------------------------------------------------------------- operations

    def _set(self, name: str, support: Support | None) -> None:
        if support is None:
            self._support.pop(name, None)
        else:
            self._support[name] = support
        self.changed.add(name)

    def _new_support(self, texts: Sequence[str]) -> Support:
        return Support(tuple(texts), self.space.embed_new(texts))

    def add_label(self, name: str, examples: Sequence[str]) -> None:
        self.require_new(name)
        examples = check_examples(examples)
        self._set(name, self._new_support(examples))
        self._refresh([name])
        self.log.append({"op": "add_label", "label": name, "examples": len(examples)})

    def add_examples(self, name: str, examples: Sequence[str]) -> None:
        self.require(name)
        examples = check_examples(examples)
        new, old = self._new_support(examples), self._support[name]
        parts = old.parts
        if old.n_parts > 1:  # each new example joins the nearest part of a merged label
            nearest = self.space.sq_distances(new.points, self._prototypes[name]).argmin(1)
            parts = old.parts + tuple(nearest.tolist())
        self._set(name, Support(old.texts + new.texts, torch.cat([old.points, new.points]), parts))
        self._refresh([name])
        self.log.append({"op": "add_examples", "label": name, "examples": len(examples)})

    def remove_examples(self, name: str, examples: Sequence[str]) -> None:
        """Remove every occurrence of each of `examples` from label `name`'s support (stored points of the
        others kept, nothing re-encoded); at least one example must remain."""
        self.require(name)
        examples = set(check_examples(examples))
        old = self._support[name]
        missing = sorted(examples - set(old.texts))
        if missing:
            raise DyntcError(f"{missing[0][:60]!r} is not an example of label {name!r}"
                             + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
        keep = [i for i, t in enumerate(old.texts) if t not in examples]
        if not keep:
            raise DyntcError(f"removing these examples would leave label {name!r} with none: remove the label instead")
        parts = [old.stored_parts()[i] for i in keep] if old.parts else None
        self._set(name, Support.of([old.texts[i] for i in keep], old.points[keep], parts))
        self._refresh([name])
        self.log.append({"op": "remove_examples", "label": name, "examples": len(old.texts) - len(keep)})

    def remove_label(self, name: str) -> None:
        self.require(name)
        if len(self) == 1:
            raise DyntcError(f"cannot remove {name!r}: it is the only label left and predictions need at least one")
        self._set(name, None)
        self._refresh([])
        self.log.append({"op": "remove_label", "label": name})

    def split_label(self, name: str, parts: Mapping[str, Sequence[str]], *, reassign: bool = False) -> None:
        """Replace `name` by the labels of `parts` (``{new: examples}``, at least two). With `reassign`
        each old support example not given again in `parts` also joins the new label whose prototype
        is nearest (stored points reused, nothing re-encoded)."""
        self.require(name)
        if not isinstance(reassign, bool):
            raise DyntcError(f"reassign must be True or False, got {reassign!r}")
        if not isinstance(parts, Mapping):
            raise DyntcError("parts must be a dict {new_label: [example texts, ...]}")
        if len(parts) < 2:
            raise DyntcError(f"split_label needs at least two new labels in parts, got {len(parts)}: "
                             "to give the label a new name use rename_label")
        checked = {}
        for new, examples in parts.items():
            self.require_new(new, "new label name", allowed=[name])
            checked[new] = check_examples(examples, f"examples of {new!r}")
        new_sets = {new: self._new_support(examples) for new, examples in checked.items()}
        old = self._support[name]
        self._set(name, None)
        if reassign:
            names = list(new_sets)
            protos = self.space.means([new_sets[n].points for n in names])
            nearest = self.space.sq_distances(old.points, protos).argmin(1)
            given = {t for s in new_sets.values() for t in s.texts}  # an old example given again is not doubled
            keep = torch.tensor([t not in given for t in old.texts], dtype=torch.bool)
            for j, new in enumerate(names):
                idx = torch.nonzero((nearest == j) & keep).flatten()
                if len(idx):
                    s = new_sets[new]
                    new_sets[new] = Support(s.texts + tuple(old.texts[i] for i in idx.tolist()),
                                            torch.cat([s.points, old.points[idx]]))
        for new, support in new_sets.items():
            self._set(new, support)
        self._refresh(new_sets)
        self.log.append({"op": "split_label", "label": name, "into": list(new_sets), "reassign": reassign})

    def merge_labels(self, names: Sequence[str], into: str) -> None:
        if isinstance(names, str) or not isinstance(names, Iterable):
            raise DyntcError("names must be a list of at least two label names")
        names = list(names)
        if len(names) < 2:
            raise DyntcError(f"merge_labels needs at least two labels to merge, got {len(names)}")
        if len(set(names)) != len(names):
            raise DyntcError(f"merge_labels got a label twice: {names}")
        for n in names:
            self.require(n, "names")
        self.require_new(into, "into", allowed=names)
        merged = [self._support[n] for n in names]
        parts, offset = [], 0
        for s in merged:  # each merged label's parts stay parts of the new one
            parts += (s.part_ids() + offset).tolist()
            offset += s.n_parts
        for n in names:
            self._set(n, None)
        self._set(into, Support(tuple(t for s in merged for t in s.texts), torch.cat([s.points for s in merged]),
                                tuple(parts)))
        self._refresh([into])
        self.log.append({"op": "merge_labels", "labels": names, "into": into})

    def rename_label(self, old: str, new: str) -> None:
        self.require(old, "old")
        check_name(new, "new", new=True)
        if new == old:
            raise DyntcError(f"rename_label: old and new names are both {old!r}")
        self.require_new(new, "new")
        support, proto = self._support[old], self._prototypes.pop(old)
        self._set(old, None)
        self._set(new, support)
        self._prototypes[new] = proto
        self._spread[new] = self._spread.pop(old)
        self._rows = self._correction = None
        self.log.append({"op": "rename_label", "label": old, "to": new})

    def _refresh(self, names: Iterable[str]) -> None:
        """Recompute the prototypes of `names`; drop those of labels that no longer exist."""
        names = [n for n in dict.fromkeys(names) if n in self._support]
        groups, label_of = [], []  # one group per part of each label
        for i, n in enumerate(names):
            support = self._support[n]
            ids = support.part_ids()
            groups += [support.points[ids == p] for p in range(support.n_parts)]
            label_of += [i] * support.n_parts
        protos = self.space.means(groups)
        if names:  # each point's squared distance to its own part's prototype, in one batch
            label_of = torch.tensor(label_of)
            for i, n in enumerate(names):
                self._prototypes[n] = protos[label_of == i]
            points = torch.cat(groups)
            group = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
            own = self.space.sq_distances(points, protos).gather(1, group[:, None]).squeeze(1).double()
            sums = torch.zeros(len(names), dtype=torch.float64).index_add_(0, label_of[group], own)
            self._spread.update({n: float(sums[i]) for i, n in enumerate(names)})
        for gone in set(self._prototypes) - set(self._support):
            del self._prototypes[gone]
            self._spread.pop(gone, None)
        self._rows = self._correction = None
