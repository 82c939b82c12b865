"""Dataset readers: counts, hierarchies, seeded splits, verification and error messages.

Uses the data under ``$DYNTC_DATA`` (default ``<repo>/../shared/datasets``); a dataset's tests are
skipped only when its files are absent.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import urllib.request
from pathlib import Path

import pytest

from dyntc.protocol.data.datasets import (
    DATASETS, WOS_DOCS, describe_all, load, load_wos_labels, load_wos_tsv, resolve_name,
    stratified_split,
)
from dyntc.protocol.data.hierarchy import ROOT
from dyntc.errors import DyntcError

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DYNTC_DATA") or REPO.parent / "shared" / "datasets").absolute()
WOS_PARTIAL = DATA / "wos46985-partial"

FILES = {
    "news": "20newsgroups/20news-bydate.tar.gz",
    "sent": "twitter-airline-sentiment/Tweets.csv",
    "clinc150": "clinc150/data_full.json",
    "hwu64": "hwu64/train/seq.in",
}
EXPECTED = {  # train, dev, test, labels, depth
    "news": (9050, 2264, 7532, 20, 3),
    "sent": (5860, 732, 732, 10, "flat"),
    "clinc150": (15000, 3000, 4500, 150, 2),
    "hwu64": (8954, 1076, 1076, 64, 2),
}
# distinct texts shared by two splits that the raw data itself causes (documented in datasets.py)
MAX_CROSS_SPLIT = {"news": 16, "sent": 0, "clinc150": 5, "hwu64": 0}


def need(name: str) -> Path:
    path = DATA / FILES[name]
    if not path.is_file():
        pytest.skip(f"{name}: {path} not found (set DYNTC_DATA to the datasets folder)")
    return path


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """Loading must never download anything implicitly."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


_cache: dict = {}


def get(name: str, seed: int = 0):
    need(name)
    if (name, seed) not in _cache:
        _cache[name, seed] = load(name, DATA, seed=seed)
    return _cache[name, seed]


@pytest.mark.data
@pytest.mark.parametrize("name", list(EXPECTED))
def test_counts_labels_and_texts(name):
    ds = get(name)
    train, dev, test, labels, depth = EXPECTED[name]
    assert (len(ds.train), len(ds.dev), len(ds.test)) == (train, dev, test)
    assert len(ds.labels) == labels
    assert ds.summary()["depth"] == depth
    assert ds.name == name
    for split in (ds.train, ds.dev, ds.test):
        assert all(t and t == t.strip() for t in split.texts)
        assert set(split.labels) <= set(ds.labels)
    if ds.hierarchy is not None:
        assert set(ds.hierarchy.leaves) == set(ds.labels)
    info = ds.info
    assert info["counts"]["train"] == train and info["dropped_empty"] == 0
    assert info["sha256_verified"] and all(len(h) == 64 for h in info["sha256_verified"].values())
    # no text in two splits beyond the duplicates of the raw data, which are counted in info
    tr, dv, te = set(ds.train.texts), set(ds.dev.texts), set(ds.test.texts)
    shared = len((tr & dv) | (tr & te) | (dv & te))
    assert shared == info["cross_split_duplicates"] <= MAX_CROSS_SPLIT[name]


@pytest.mark.data
def test_news_hierarchy_is_the_papers_tree():
    ds = get("news")
    tree = ds.hierarchy
    assert tree.depth == 3 and len(tree.leaves) == 20 and set(tree.leaves) == set(ds.labels)
    # the paper's FORSALE leaf is the newsgroup misc.forsale, directly under the root
    assert tree.children[ROOT] == ["COMPUTER", "POLITICS", "RECREATIONAL", "RELIGION", "SCIENCE", "misc.forsale"]
    assert tree.ancestors("comp.windows.x") == ["WINDOWS", "COMPUTER"]
    assert tree.ancestors("comp.sys.mac.hardware") == ["HARDWARE", "COMPUTER"]
    assert tree.ancestors("rec.sport.hockey") == ["SPORTS", "RECREATIONAL"]
    assert tree.ancestors("sci.med") == ["SCIENCE"]
    assert tree.ancestors("alt.atheism") == ["RELIGION"]
    assert tree.ancestors("misc.forsale") == []
    assert tree.leaves_under("POLITICS") == ["talk.politics.guns", "talk.politics.mideast", "talk.politics.misc"]
    # headers other than Subject are dropped
    assert not any(t.startswith("From:") or "\nLines:" in t[:300] for t in ds.test.texts[:500])


@pytest.mark.data
def test_news_dev_is_stratified_20_percent_of_bydate_train():
    ds = get("news")
    for label, n_dev in ds.dev.label_counts().items():
        n_total = n_dev + ds.train.label_counts()[label]
        assert n_dev == round(0.2 * n_total)


@pytest.mark.data
def test_intent_hierarchies():
    clinc = get("clinc150")
    tree = clinc.hierarchy
    assert len(tree.children[ROOT]) == 10 and tree.depth == 2
    assert all(len(tree.children[d]) == 15 for d in tree.children[ROOT])
    assert "oos" not in clinc.labels
    assert clinc.info["cross_split_duplicates"] == 5
    hwu = get("hwu64")
    tree = hwu.hierarchy
    assert len(tree.children[ROOT]) == 18 and len(tree.leaves) == 64 and tree.depth == 2
    assert tree.ancestors("alarm_query") == ["alarm"]
    assert hwu.info["within_split_duplicates"] == {"train": 3, "dev": 70, "test": 0}


@pytest.mark.data
def test_sent_filter_and_dedup():
    ds = get("sent")
    assert ds.hierarchy is None
    assert ds.info["filtered_rows"] == 7389 and ds.info["duplicates_dropped"] == 65
    all_texts = ds.train.texts + ds.dev.texts + ds.test.texts
    assert len(all_texts) == len(set(all_texts)) == 7324
    assert "Late Flight" in ds.labels and "longlines" in ds.labels


@pytest.mark.data
@pytest.mark.parametrize("name", ["sent", "news"])
def test_seeded_splits(name):
    a = get(name, 0)
    if name == "sent":  # cheap to reload: same seed, same split
        b = load(name, DATA, seed=0)
        assert a.dev.texts == b.dev.texts and a.train.labels == b.train.labels and a.test.texts == b.test.texts
    c = get(name, 1)
    assert set(c.dev.texts) != set(a.dev.texts)
    assert (len(c.train), len(c.dev), len(c.test)) == (len(a.train), len(a.dev), len(a.test))
    if name == "news":  # the official test split does not move
        assert c.test.texts == a.test.texts


@pytest.mark.data
def test_official_splits_ignore_seed():
    need("hwu64")
    assert load("hwu64", DATA, seed=3).dev.texts == get("hwu64").dev.texts


def test_names_and_aliases():
    assert resolve_name("NEWS") == "news" and resolve_name("20newsgroups") == "news"
    assert resolve_name("CLINC") == "clinc150" and resolve_name("Twitter") == "sent"
    assert set(DATASETS) == {"news", "sent", "wos", "clinc150", "hwu64", "stackoverflow", "mcid"}
    with pytest.raises(DyntcError) as err:
        load("imdb", DATA)
    for name in DATASETS:
        assert name in str(err.value)


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DyntcError) as err:
        load("clinc150", missing)
    msg = str(err.value)
    assert str(missing) in msg and "does not exist" in msg
    assert str(missing / "clinc150" / "data_full.json") in msg and "github.com/clinc/oos-eval" in msg


def test_missing_file_and_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNTC_DATA", str(tmp_path))
    with pytest.raises(DyntcError) as err:
        load("sent")
    msg = str(err.value)
    assert str(tmp_path / "twitter-airline-sentiment" / "Tweets.csv") in msg and "kaggle" in msg.lower()


def _copy_clinc(tmp_path) -> Path:
    need("clinc150")
    shutil.copytree(DATA / "clinc150", tmp_path / "clinc150")
    return tmp_path / "clinc150" / "data_full.json"


@pytest.mark.data
def test_truncated_file(tmp_path):
    path = _copy_clinc(tmp_path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(DyntcError) as err:
        load("clinc150", tmp_path)
    msg = str(err.value)
    assert str(path) in msg and "1000 bytes" in msg and "2495390" in msg


@pytest.mark.data
def test_altered_file_checksum_then_counts(tmp_path):
    path = _copy_clinc(tmp_path)
    raw = path.read_bytes()
    i = raw.index(b"italian")
    path.write_bytes(raw[:i] + b"ITALIAN" + raw[i + 7:])  # same size, different content
    with pytest.raises(DyntcError, match="sha256 mismatch") as err:
        load("clinc150", tmp_path)
    assert str(path) in str(err.value) and "36923c3705a59e08" in str(err.value)
    data = json.loads(raw)
    data["train"] = data["train"][1:]
    path.write_text(json.dumps(data))
    with pytest.raises(DyntcError) as err:  # without checksums, the count check still catches it
        load("clinc150", tmp_path, verify_checksums=False)
    msg = str(err.value)
    assert str(path) in msg and "15000" in msg and "14999" in msg


@pytest.mark.data
def test_hwu_line_mismatch(tmp_path):
    need("hwu64")
    shutil.copytree(DATA / "hwu64", tmp_path / "hwu64")
    seq = tmp_path / "hwu64" / "test" / "seq.in"
    seq.write_text("".join(seq.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(DyntcError, match="sha256|bytes"):
        load("hwu64", tmp_path)
    with pytest.raises(DyntcError) as err:
        load("hwu64", tmp_path, verify_checksums=False)
    assert "1076" in str(err.value) and "1075" in str(err.value)


def _need_wos_labels() -> None:
    if not (WOS_PARTIAL / "WOS46985" / "Y.txt").is_file():
        pytest.skip(f"WOS label files not found under {WOS_PARTIAL}")


@pytest.mark.data
def test_wos_without_text_is_a_clear_error():
    _need_wos_labels()
    with pytest.raises(DyntcError) as err:
        load("wos", DATA)
    msg = str(err.value)
    assert "X.txt" in msg and str(DATA / "wos46985" / "WOS46985" / "X.txt") in msg and "mendeley" in msg.lower()


@pytest.mark.data
def test_wos_labels_and_noise():
    _need_wos_labels()
    lab = load_wos_labels(DATA)
    tree = lab["tree"]
    assert len(lab["labels"]) == WOS_DOCS
    assert len(tree.leaves) == 134 and len(tree.children[ROOT]) == 7 and tree.depth == 2
    assert lab["relabelled"] == 130 + 38 + 2  # Y=40, 43, 76 resolved to their majority domain
    assert tree.ancestors("Psychology.40") == ["Psychology"]


@pytest.mark.data
def test_wos_x_txt_reader_with_placeholder_text(tmp_path):
    _need_wos_labels()
    (tmp_path / "wos46985" / "WOS46985").mkdir(parents=True)
    (tmp_path / "wos46985" / "WOS46985" / "X.txt").write_text("".join(f"abstract {i}\n" for i in range(WOS_DOCS)))
    shutil.copytree(WOS_PARTIAL / "WOS46985", tmp_path / "wos46985-partial" / "WOS46985")  # labels found there
    ds = load("wos", tmp_path, seed=0)
    assert (len(ds.train), len(ds.dev), len(ds.test)) == (25187, 6296, 15502)
    assert len(ds.labels) == 134 and ds.hierarchy.depth == 2 and ds.info["relabelled_documents"] == 170
    assert ds.train.texts[0].startswith("abstract ")


@pytest.mark.data
def test_wos_tab_sample():
    path = WOS_PARTIAL / "Data1k.txt"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    ds = load_wos_tsv(path, seed=0)
    n = len(ds.train) + len(ds.dev) + len(ds.test)
    assert n == 1000 and ds.info["documents"] == 1000
    assert len(ds.hierarchy.children[ROOT]) == 7 and ds.hierarchy.depth == 2
    assert set(ds.hierarchy.leaves) == set(ds.labels)  # every leaf has a training example
    assert 0.45 < len(ds.train) / n < 0.6 and 0.25 < len(ds.test) / n < 0.4
    assert "Parallel computing" in ds.hierarchy.leaves_under("CS")
    assert ds.info["relabelled_documents"] == 3  # 'Depression' occurs under Psychology and Medical
    again = load_wos_tsv(path, seed=0)
    assert again.dev.texts == ds.dev.texts
    assert set(load_wos_tsv(path, seed=1).dev.texts) != set(ds.dev.texts)
    with pytest.raises(DyntcError, match="46985"):
        load_wos_tsv(path, expected_docs=WOS_DOCS)


def test_stratified_split_partitions():
    labels = ["a"] * 10 + ["b"] * 3 + ["c"]
    parts = stratified_split(labels, (0.8, 0.1, 0.1), seed=0)
    assert sorted(i for p in parts for i in p) == list(range(len(labels)))
    assert {labels[i] for i in parts[0]} == {"a", "b", "c"}


@pytest.mark.data
def test_describe_all(tmp_path):
    rows = {r["name"]: r for r in describe_all(tmp_path / "empty")}
    assert set(rows) == set(DATASETS) and not any(r["present"] for r in rows.values())
    assert str(tmp_path / "empty" / "clinc150" / "data_full.json") in rows["clinc150"]["missing"]
    _copy_clinc(tmp_path)  # a data dir holding clinc150 only (keeps the test fast)
    rows = {r["name"]: r for r in describe_all(tmp_path)}
    assert rows["clinc150"]["present"] and rows["clinc150"]["counts"] == {
        "train": 15000, "dev": 3000, "test": 4500, "labels": 150, "depth": 2}
    assert not rows["wos"]["present"] and str(tmp_path / "wos46985" / "WOS46985" / "X.txt") in rows["wos"]["missing"]
    assert not rows["news"]["present"]


@pytest.mark.data
def test_download_is_explicit_and_verified(tmp_path, monkeypatch):
    with pytest.raises(DyntcError, match="by hand"):  # Kaggle needs a login: no direct URL
        load("sent", tmp_path, download=True)
    need("clinc150")
    served = []

    def fake_urlopen(url, timeout):
        served.append(url)
        body = (DATA / "clinc150" / url.rsplit("/", 1)[1]).read_bytes()
        return io.BytesIO(body if "domains" in url else body[:-1] + b" ")

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    with pytest.raises(DyntcError, match="sha256"):
        load("clinc150", tmp_path, download=True)
    assert not (tmp_path / "clinc150" / "data_full.json").exists()
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: io.BytesIO((DATA / "clinc150" / url.rsplit("/", 1)[1]).read_bytes()))
    assert len(load("clinc150", tmp_path, download=True).train) == 15000
    assert served and all(u.startswith("https://raw.githubusercontent.com/clinc/oos-eval/") for u in served)


@pytest.mark.data
def test_clinc150_out_of_scope_splits(data_dir):
    from dyntc.protocol.data.datasets import clinc150_out_of_scope

    if not (data_dir / "clinc150" / "data_full.json").is_file():
        pytest.skip("clinc150 not present")
    sizes = {split: len(clinc150_out_of_scope(split, data_dir)) for split in ("train", "val", "test")}
    assert sizes == {"train": 100, "val": 100, "test": 1000}
    assert all(isinstance(t, str) and t.strip() for t in clinc150_out_of_scope("val", data_dir))
    with pytest.raises(DyntcError, match="split must be one of train, val, test, got 'dev'"):
        clinc150_out_of_scope("dev", data_dir)
