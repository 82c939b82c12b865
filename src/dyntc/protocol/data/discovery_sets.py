"""Readers for the two corpora of the new-intent-discovery protocol that CLINC150 and HWU64 do not cover.

Both come in the split published with MTP-CLNN (Zhang et al., ACL 2022, "New Intent Discovery with
Pre-training and Contrastive Learning"; repository fanolabs/NID_ACLARR2022, folder ``data/``): one
``{train,dev,test}.tsv`` per corpus, header ``text<TAB>label``, UTF-8. A row is split at its last tab
and taken literally (StackOverflow titles contain quotes, which are text, not CSV quoting).

* **stackoverflow** (Xu et al. 2015): 20 technical question categories, labelled ``1`` to ``20``
  (the files carry no names), 18,000 / 1,000 / 1,000.
* **mcid** (Arora et al. 2020, English part): 16 Covid-19 assistant intents, 1,220 / 176 / 349.

Importing this module registers them in :data:`dyntc.protocol.data.datasets.DATASETS` beside the
other readers; the package ``dyntc.protocol.data`` imports it, so ``load("stackoverflow")`` and
``dyntc datasets`` always know them.
"""

from __future__ import annotations

from pathlib import Path

from dyntc.protocol.data.datasets import (
    _ALIASES, _LOADERS, DATASETS, DatasetSpec, FileSpec, _clean, _count_error, _finish, _read_lines, _require,
    _where_from,
)
from dyntc.protocol.data.types import Dataset, Split
from dyntc.errors import DyntcError

_NID_REPO = "https://github.com/fanolabs/NID_ACLARR2022 (commit c2bef5a)"
_SPLITS = (("train", "train"), ("dev", "dev"), ("test", "test"))

STACKOVERFLOW_SPEC = DatasetSpec(
    name="stackoverflow",
    folder="stackoverflow",
    description="StackOverflow question titles, 20 categories (new intent discovery split)",
    source=f"{_NID_REPO}, folder data/stackoverflow/ (train.tsv, dev.tsv, test.tsv)",
    files=(
        FileSpec("train.tsv", 975797, ("9b5eeaf8ffa9f16b692684419695d7b8f2d093e9da9528658fe631ac026fc28d",)),
        FileSpec("dev.tsv", 53198, ("4c02e8d422e3db998b95e8af49fbae59443e6c2617b3d4c9279aaa7705434921",)),
        FileSpec("test.tsv", 54710, ("08a8bd2e82cef0a5b61715687953302abaa9fb43a17f847e260b15ae5fdadc8c",)),
    ),
    expected={"train": 18000, "dev": 1000, "test": 1000, "labels": 20, "depth": "flat"},
    aliases=("stack-overflow", "so"),
)

MCID_SPEC = DatasetSpec(
    name="mcid",
    folder="mcid",
    description="M-CID English Covid-19 intents, 16 intents (new intent discovery split)",
    source=f"{_NID_REPO}, folder data/mcid/ (train.tsv, dev.tsv, test.tsv)",
    files=(
        FileSpec("train.tsv", 65848, ("0177524a00cb928d2dbd5fd38c125d4541b14b7cba6132ad3655c08a8f7f8477",)),
        FileSpec("dev.tsv", 9491, ("c5102fff253705107edce5de4c2eca712c26eb16d4bc19a710a3ac0293a2490e",)),
        FileSpec("test.tsv", 18797, ("f3f7326be32ae045e9680c08de295fae77a6fcf4f1ea3d7779d81e19cd8daf66",)),
    ),
    expected={"train": 1220, "dev": 176, "test": 349, "labels": 16, "depth": "flat"},
    aliases=("m-cid", "mcid-en"),
)


def read_tsv(path: Path, spec: DatasetSpec) -> tuple[list[str], list[str]]:
    """Texts and labels of a ``text<TAB>label`` file with that header."""
    lines = _read_lines(path, spec)
    if not lines or lines[0].split("\t") != ["text", "label"]:
        raise DyntcError(f"dataset {spec.name!r}: {path} does not start with the header 'text<TAB>label'; "
                         f"replace it with the canonical file ({_where_from(spec)})")
    texts, labels = [], []
    for no, line in enumerate(lines[1:], 2):
        text, tab, label = line.rpartition("\t")
        if not tab or not label.strip():
            raise DyntcError(f"dataset {spec.name!r}: {path} line {no} has no label after a tab; "
                             f"replace it with the canonical file ({_where_from(spec)})")
        texts.append(text)
        labels.append(label.strip())
    return texts, labels


def _loader(spec: DatasetSpec):
    def load(root: Path, seed: int, verify: bool) -> Dataset:
        files = _require(root, spec, verify)
        splits: dict[str, Split] = {}
        dropped = 0
        for key, name in _SPLITS:
            path = files[f"{key}.tsv"][0]
            texts, labels = read_tsv(path, spec)
            if len(texts) != spec.expected[name]:
                raise _count_error(spec, path, "rows", spec.expected[name], len(texts))
            splits[name], d = _clean(texts, labels)
            dropped += d
        return _finish(spec, splits["train"], splits["dev"], splits["test"], None, files=files, seed=seed,
                       split="published train/dev/test of the discovery protocol (seed unused)",
                       dropped_empty=dropped, where=str(root / spec.folder),
                       check={"labels": spec.expected["labels"]},
                       notes=["rows split at the last tab, quotes kept as text"])

    return load


SPECS = (STACKOVERFLOW_SPEC, MCID_SPEC)
LOADERS = {spec.name: _loader(spec) for spec in SPECS}

DATASETS.update({s.name: s for s in SPECS})
_ALIASES.update({alias: s.name for s in SPECS for alias in (s.name, *s.aliases)})
_LOADERS.update(LOADERS)
