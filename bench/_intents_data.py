"""Data for ``bench.intents``: the texts of CLINC150 / HWU64 and their frozen MiniLM embeddings,
embedded once and cached on disk (``runs/intents_cache/`` by default)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CACHE_DIR = Path(__file__).resolve().parent.parent / "runs" / "intents_cache"


@dataclass
class Part:
    x: np.ndarray  # (n, 384) float32, unit length (MiniLM's own Normalize)
    y: np.ndarray  # (n,) int label ids into Data.classes (-1: out of scope)
    texts: list[str]


@dataclass
class Data:
    name: str
    classes: list[str]
    train: Part
    dev: Part
    test: Part
    oos_dev: Part | None = None
    oos_test: Part | None = None
    dev_note: str = ""


def _key(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def embed_cached(texts: list[str], cache_dir: Path = CACHE_DIR, tag: str = "minilm") -> np.ndarray:
    """Frozen all-MiniLM-L6-v2 sentence embeddings of `texts` (the product's own encoder path:
    ``create_encoder("minilm").featurize``), cached as one ``.npy`` per text list."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"{tag}-{len(texts)}-{_key(texts)}.npy"
    if path.is_file():
        arr = np.load(path)
        if arr.shape[0] == len(texts):
            return arr
    import torch

    from dyntc.core.encoders import create_encoder

    os.environ.setdefault("DYNTC_CACHE", "off")
    encoder = create_encoder("minilm", texts[:10])
    unique = list(dict.fromkeys(texts))
    emb = torch.stack(encoder.featurize(unique)).numpy().astype(np.float32)
    row = {t: i for i, t in enumerate(unique)}
    arr = emb[[row[t] for t in texts]]
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, arr)
    tmp.replace(path)
    return arr


def load_data(name: str, cache_dir: Path = CACHE_DIR) -> Data:
    from dyntc.protocol.data.datasets import clinc150_out_of_scope, load

    ds = load(name)
    classes = sorted(set(ds.train.labels))
    index = {c: i for i, c in enumerate(classes)}
    parts = {}
    oos = {}
    all_texts: list[str] = []
    spans = {}
    for key, split in (("train", ds.train), ("dev", ds.dev), ("test", ds.test)):
        spans[key] = (len(all_texts), len(split.texts))
        all_texts += list(split.texts)
    if name == "clinc150":
        for key, split in (("oos_dev", "val"), ("oos_test", "test")):
            texts = clinc150_out_of_scope(split)
            spans[key] = (len(all_texts), len(texts))
            all_texts += texts
    x = embed_cached(all_texts, cache_dir, tag=f"minilm-{name}")
    for key, (start, n) in spans.items():
        texts = all_texts[start:start + n]
        if key.startswith("oos"):
            oos[key] = Part(x[start:start + n], np.full(n, -1), texts)
        else:
            labels = getattr(ds, key).labels
            parts[key] = Part(x[start:start + n], np.array([index[y] for y in labels]), texts)
    note = {"clinc150": "CLINC150's official val split (3,000 texts, 20 per intent)",
            "hwu64": "HWU64's valid split of the DNNC-format release (1,076 texts, disjoint from test)"}[name]
    return Data(name, classes, parts["train"], parts["dev"], parts["test"], oos.get("oos_dev"), oos.get("oos_test"), note)
