"""Warnings about training data that is accepted but probably not what the user meant.

Each is a :class:`~dyntc.errors.DyntcWarning` whose message names the fix (filter the category to
silence them):

- **duplicates**: the same text twice under the same label counts twice in its prototype;
- **conflicts**: the same text under two labels cannot be told apart by any classifier;
- **small labels**: a label of fewer than ``MIN_EXAMPLES`` examples has a prototype of one or two
  texts, at the mercy of their wording;
- **dropped examples**: ``split_label`` without ``reassign`` drops the old label's stored examples
  that are not among the new labels' examples.

Texts are compared after stripping surrounding white space and case-folding ("Hi " and "hi" are the
same example to a user).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from dyntc.errors import DyntcWarning

#: A label with fewer examples than this is warned about at ``fit``, ``add_label`` and ``add_examples``.
MIN_EXAMPLES = 3
SHOWN = 3  # examples quoted in a message


def _key(text: str) -> str:
    return " ".join(text.split()).casefold()


def _keys(support: Any) -> frozenset[str]:
    """The keys of a support set's texts, computed once per support set: support sets are immutable
    and shared by every copy of a label set, so a write to a large model normalises its own examples,
    not every stored one again (which held the interpreter lock for tens of milliseconds per write on
    15,000 examples, delaying the predictions running beside it)."""
    keys = support.__dict__.get("_text_keys")
    if keys is None:  # a frozen dataclass: the cache goes into its __dict__, beside the fields
        keys = support.__dict__["_text_keys"] = frozenset(map(_key, support.texts))
    return keys


def _warn(message: str, stacklevel: int) -> None:
    # `stacklevel` counts from the caller of the public function below (1 = that caller), as warnings.warn
    # does; the estimator passes the depth of its user's call, so the warning points at the user's line
    warnings.warn(message, DyntcWarning, stacklevel=stacklevel + 2)


def _quote(items: Sequence[Any]) -> str:
    more = f" and {len(items) - SHOWN} more" if len(items) > SHOWN else ""
    return ", ".join(repr(x) for x in items[:SHOWN]) + more


def check_training_set(texts: Sequence[str], labels: Sequence[Any], stacklevel: int = 1) -> dict:
    """Warn about duplicate (text, label) pairs, texts under several labels and labels under
    ``MIN_EXAMPLES`` examples in (`texts`, `labels`); returns what was found."""
    seen: dict[str, dict] = {}  # text key -> {label: count}
    counts: dict[Any, int] = {}
    for text, label in zip(texts, labels):
        by_label = seen.setdefault(_key(text), {})
        by_label[label] = by_label.get(label, 0) + 1
        counts[label] = counts.get(label, 0) + 1
    duplicates = sum(n - 1 for by_label in seen.values() for n in by_label.values())
    conflicts = {t: list(by_label) for t, by_label in seen.items() if len(by_label) > 1}
    small = [label for label, n in counts.items() if n < MIN_EXAMPLES]
    if duplicates:
        _warn(f"{duplicates} duplicate (text, label) pairs, e.g. "
              f"{_quote([t for t, b in seen.items() if max(b.values()) > 1])}: each copy weighs again in its "
              "label's prototype; drop the duplicates (e.g. pandas drop_duplicates())", stacklevel)
    if conflicts:
        first = next(iter(conflicts.items()))
        _warn(f"{len(conflicts)} texts appear under two or more labels, e.g. {first[0]!r} under "
              f"{_quote(first[1])}: no classifier can tell those labels apart on them; keep each text under one label", stacklevel)
    if small:
        _warn(f"{len(small)} labels have fewer than {MIN_EXAMPLES} examples ({_quote(small)}): their prototypes "
              "rest on one or two wordings; add examples (5-10 per label is a good start)", stacklevel)
    return {"duplicates": duplicates, "conflicts": len(conflicts), "small_labels": small}


def check_new_examples(labels: Any, name: str, examples: Sequence[str], *, new_label: bool,
                       stacklevel: int = 1) -> dict:
    """Warn about `examples` for label `name` of the label set `labels` that repeat each other or an
    example it already has, that another label already has, or (a new label) that are too few."""
    own = frozenset() if new_label else _keys(labels.support(name))
    keys = [_key(t) for t in examples]
    duplicates = [t for i, (t, k) in enumerate(zip(examples, keys)) if k in own or k in keys[:i]]
    wanted = set(keys)
    elsewhere = {}
    for other, support in labels.items():
        if other != name and not wanted.isdisjoint(_keys(support)):
            for t in support.texts:
                if _key(t) in wanted:
                    elsewhere.setdefault(t, other)
    if duplicates:
        _warn(f"{len(duplicates)} examples for {name!r} are already among its examples or repeated "
              f"({_quote(duplicates)}): each copy weighs again in its prototype; leave them out", stacklevel)
    if elsewhere:
        text, other = next(iter(elsewhere.items()))
        _warn(f"{len(elsewhere)} examples for {name!r} are already examples of another label, e.g. {text!r} of "
              f"{other!r}: the two labels cannot be told apart on them; keep each text under one label "
              "(or merge_labels if they mean the same)", stacklevel)
    if new_label and len(set(keys)) < MIN_EXAMPLES:
        _warn(f"label {name!r} has {len(set(keys))} distinct examples, fewer than {MIN_EXAMPLES}: its prototype rests "
              "on one or two wordings; add examples (5-10 per label is a good start)", stacklevel)
    return {"duplicates": len(duplicates), "conflicts": len(elsewhere)}


def warn_dropped(name: Any, old: Sequence[str], parts: Mapping[Any, Sequence[str]], stacklevel: int = 1) -> list[str]:
    """After ``split_label(name, parts, reassign=False)``: warn which of the old label's stored examples
    `old` were dropped (not among the new labels' examples in `parts`); returns them."""
    keep = {_key(t) for examples in parts.values() for t in examples}
    dropped = [t for t in old if _key(t) not in keep]
    if dropped:
        _warn(f"split_label dropped {len(dropped)} of the {len(old)} stored examples of {name!r} ({_quote(dropped)}): "
              "only the examples given for the new labels define them; pass reassign=True to keep the old "
              "examples, each under the nearest new label", stacklevel)
    return dropped
