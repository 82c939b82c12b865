"""ONNX Runtime inference of the frozen backbone (``runtime="onnx"`` / ``"onnx-int8"``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")

from dyntc.encoders import onnx_runtime  # noqa: E402
from dyntc.encoders.pretrained import PretrainedEncoder  # noqa: E402

LABELS = ["alarm", "balance", "book_hotel", "timer", "transfer", "weather", "translate", "flip_coin"]


@pytest.fixture(scope="module")
def texts(clinc_raw):
    """10 training and 10 test texts of each of 8 CLINC150 intents, with their labels."""
    out = {}
    for key in ("train", "test"):
        rows = [(t, y) for t, y in clinc_raw[key] if y in LABELS]
        out[key] = [(t, y) for y in LABELS for t in [t for t, z in rows if z == y][:10]]
    return out


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A fresh export cache, and fresh process-wide backbones (their ONNX sessions point into it)."""
    monkeypatch.setenv("DYNTC_CACHE", str(tmp_path))
    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})
    return tmp_path


def _embed(runtime, texts):
    enc = PretrainedEncoder.create("minilm", num_layers=0, runtime=runtime, cache=False)
    return torch.stack(enc.featurize(texts)).numpy()


def test_onnx_equals_torch(texts, cache):
    batch = [t for t, _ in texts["test"]]
    np.testing.assert_allclose(_embed("onnx", batch), _embed("torch", batch), atol=2e-6)
    assert (cache / "onnx").is_dir() and len(list((cache / "onnx").glob("*/model.onnx"))) == 1


def test_onnx_int8_is_close_and_classifies_alike(texts, cache):
    """Per-channel int8: cosine >= 0.98 to the float32 embedding for every text, and the same
    nearest-centroid predictions (10-shot centroids of 8 intents) for nearly all test texts."""
    train, test = [t for t, _ in texts["train"]], [t for t, _ in texts["test"]]
    y = np.array([LABELS.index(v) for _, v in texts["train"]])
    preds = {}
    for runtime in ("torch", "onnx-int8"):
        a, b = _embed(runtime, train), _embed(runtime, test)
        centroids = np.stack([a[y == k].mean(0) for k in range(len(LABELS))])
        preds[runtime] = ((b[:, None] - centroids[None]) ** 2).sum(-1).argmin(1)
    cos = (_embed("onnx-int8", test) * _embed("torch", test)).sum(1)
    assert cos.min() > 0.98 and cos.mean() > 0.99
    assert (preds["torch"] == preds["onnx-int8"]).mean() >= 0.97
    assert len(list((cache / "onnx").glob("*/model-int8.onnx"))) == 1


def test_exported_files_are_reused(texts, cache, monkeypatch):
    batch = [t for t, _ in texts["test"][:8]]
    first = _embed("onnx-int8", batch)
    files = sorted((cache / "onnx").rglob("*.onnx"))
    assert [f.name for f in files] == ["model-int8.onnx", "model.onnx"]
    stamps = [f.stat().st_mtime_ns for f in files]

    def no_export(*args, **kwargs):
        raise AssertionError("exported again although the file is cached")

    monkeypatch.setattr(onnx_runtime, "export", no_export)
    monkeypatch.setattr(onnx_runtime, "quantize", no_export)
    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})  # a fresh process's view
    np.testing.assert_array_equal(_embed("onnx-int8", batch), first)
    assert [f.stat().st_mtime_ns for f in files] == stamps


def test_classifier_runtime_round_trip(texts, cache, tmp_path):
    train = texts["train"]
    clf = DynamicClassifier(encoder_options={"runtime": "onnx-int8"}).fit([t for t, _ in train], [y for _, y in train])
    test = [t for t, _ in texts["test"]]
    back = DynamicClassifier.load(clf.save(tmp_path / "model"))
    assert back.model_.encoder.cfg.runtime == "onnx-int8"
    np.testing.assert_array_equal(back.predict_proba(test), clf.predict_proba(test))
    acc = np.mean([p == y for p, (_, y) in zip(back.predict(test), texts["test"])])
    assert acc > 0.85


def test_runtime_bad_input(texts, cache, monkeypatch):
    with pytest.raises(DyntcError, match=r"runtime must be one of \('torch', 'onnx', 'onnx-int8'\), got 'tensorrt'"):
        PretrainedEncoder.create("minilm", runtime="tensorrt")
    with pytest.raises(DyntcError, match="runtime='onnx' runs a frozen backbone; mode='finetune' trains it"):
        PretrainedEncoder.create("minilm", mode="finetune", runtime="onnx")
    with pytest.raises(DyntcError, match="runs a frozen backbone"):
        DynamicClassifier(train="backbone", encoder_options={"runtime": "onnx"}).fit(["a b", "c d"] * 3, ["x", "y"] * 3)

    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})
    _embed("onnx", ["warm up"])
    model = next((cache / "onnx").rglob("model.onnx"))
    model.write_bytes(b"not an onnx file")
    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})
    with pytest.raises(DyntcError, match=r"onnxruntime could not load .*model.onnx.*delete the file"):
        _embed("onnx", ["a text"])

    import builtins

    real_import = builtins.__import__

    def without_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_onnxruntime)
    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})
    with pytest.raises(DyntcError, match=r"need onnxruntime, which is not installed: pip install"):
        _embed("onnx", ["a text"])


def test_cache_off_exports_to_a_temporary_directory(texts, monkeypatch):
    monkeypatch.setenv("DYNTC_CACHE", "off")
    monkeypatch.setattr("dyntc.encoders.pretrained._BACKBONES", {})
    monkeypatch.setattr(onnx_runtime, "_TEMP_DIRS", {})
    batch = [t for t, _ in texts["test"][:4]]
    np.testing.assert_allclose(_embed("onnx", batch), _embed("torch", batch), atol=2e-6)
    (folder,) = onnx_runtime._TEMP_DIRS.values()
    assert [p.name for p in Path(folder).iterdir()] == ["model.onnx"]
