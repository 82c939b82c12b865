"""The StackOverflow and M-CID readers (the new-intent-discovery splits): counts, verified files, and
the errors for a missing, altered or malformed file. Tests on the real files skip when they are absent."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from dyntc.errors import DyntcError
from dyntc.protocol.data.datasets import DATASETS, load, resolve_name

DATA = Path(os.environ.get("DYNTC_DATA") or Path(__file__).resolve().parents[3] / "shared" / "datasets").absolute()
EXPECTED = {"stackoverflow": (18000, 1000, 1000, 20), "mcid": (1220, 176, 349, 16)}


def need(name: str) -> Path:
    folder = DATA / DATASETS[name].folder
    if not (folder / "train.tsv").is_file():
        pytest.skip(f"{folder} not found")
    return folder


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_load_counts_and_checksums(name):
    need(name)
    ds = load(name, DATA)
    train, dev, test, labels = EXPECTED[name]
    assert (len(ds.train), len(ds.dev), len(ds.test)) == (train, dev, test)
    assert len(set(ds.train.labels)) == labels and ds.hierarchy is None
    assert set(ds.info["sha256_verified"]) == {"train.tsv", "dev.tsv", "test.tsv"}
    assert all(t and t == t.strip() for t in ds.train.texts)


def test_stackoverflow_quotes_are_text():
    need("stackoverflow")
    ds = load("stackoverflow", DATA)
    quoted = [t for t in ds.train.texts if '"' in t]
    assert quoted and all(y.isdigit() for y in ds.train.labels)


def test_aliases():
    assert resolve_name("StackOverflow") == "stackoverflow" and resolve_name("M-CID") == "mcid"


def test_missing_file_names_where_to_get_it(tmp_path):
    with pytest.raises(DyntcError) as err:
        load("mcid", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "mcid" / "train.tsv") in msg and "fanolabs/NID_ACLARR2022" in msg


def _copy(tmp_path: Path) -> Path:
    src = need("mcid")
    dst = tmp_path / "mcid"
    shutil.copytree(src, dst)
    for f in dst.iterdir():
        f.chmod(0o644)
    return dst


def test_altered_file_is_refused(tmp_path):
    dst = _copy(tmp_path)
    (dst / "dev.tsv").write_bytes((dst / "dev.tsv").read_bytes().replace(b"donate", b"donato", 1))
    with pytest.raises(DyntcError, match="sha256 mismatch for .*dev.tsv"):
        load("mcid", tmp_path)


def test_malformed_rows_are_refused_without_checksums(tmp_path):
    dst = _copy(tmp_path)
    (dst / "test.tsv").write_text("text\tlabel\nno tab here\n")
    with pytest.raises(DyntcError, match="line 2 has no label after a tab"):
        load("mcid", tmp_path, verify_checksums=False)
    (dst / "test.tsv").write_text("utterance,intent\n")
    with pytest.raises(DyntcError, match="does not start with the header"):
        load("mcid", tmp_path, verify_checksums=False)
    (dst / "test.tsv").write_text("text\tlabel\nhow can i donate\tdonate\n")
    with pytest.raises(DyntcError, match="expected 349 rows, found 1"):
        load("mcid", tmp_path, verify_checksums=False)
