"""ONNX Runtime inference of the frozen backbone (``runtime="onnx"`` / ``"onnx-int8"``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dyntc import DynamicClassifier, DyntcError

pytest.importorskip("sentence_transformers")
pytest.importorskip("onnxruntime")

from dyntc.core.encoders import onnx_runtime, pretrained  # noqa: E402
from dyntc.core.encoders.pretrained import PretrainedEncoder  # noqa: E402

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
    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})
    return tmp_path


def _embed(runtime, texts):
    enc = PretrainedEncoder.create("minilm", num_layers=0, runtime=runtime, cache=False)
    return torch.stack(enc.featurize(texts)).numpy()


@pytest.mark.data
def test_onnx_equals_torch(texts, cache):
    batch = [t for t, _ in texts["test"]]
    np.testing.assert_allclose(_embed("onnx", batch), _embed("torch", batch), atol=2e-6)
    (folder,) = (cache / "onnx").iterdir()
    assert folder.name.endswith(f"-{onnx_runtime.RECIPE}") and [p.name for p in folder.iterdir()] == ["model.onnx"]


@pytest.mark.data
def test_onnx_int8_is_close_and_classifies_alike(texts, cache):
    """Per-channel int8: cosine > 0.98 to the float32 embedding for each of these 80 texts (over 2,000
    CLINC150 texts the least is 0.95, docs/results.md §9.3), and the same nearest-centroid predictions
    (10-shot centroids of 8 intents) for nearly all of them."""
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


@pytest.mark.data
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
    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})  # a fresh process's view
    np.testing.assert_array_equal(_embed("onnx-int8", batch), first)
    assert [f.stat().st_mtime_ns for f in files] == stamps


@pytest.mark.data
def test_classifier_runtime_round_trip(texts, cache, tmp_path):
    train = texts["train"]
    clf = DynamicClassifier(encoder_options={"runtime": "onnx-int8"}).fit([t for t, _ in train], [y for _, y in train])
    test = [t for t, _ in texts["test"]]
    expected = clf.predict_proba(test)
    pretrained._BACKBONES.clear()  # the loaded model embeds afresh (a new process's view), not from memory
    back = DynamicClassifier.load(clf.save(tmp_path / "model"))
    assert back.model_.encoder.cfg.runtime == "onnx-int8"
    np.testing.assert_allclose(back.predict_proba(test), expected, atol=1e-6)
    acc = np.mean([p == y for p, (_, y) in zip(back.predict(test), texts["test"])])
    assert acc > 0.85


@pytest.mark.data
def test_runtime_bad_input(texts, cache, monkeypatch):
    with pytest.raises(DyntcError, match=r"runtime must be one of \('torch', 'onnx', 'onnx-int8'\), got 'tensorrt'"):
        PretrainedEncoder.create("minilm", runtime="tensorrt")
    with pytest.raises(DyntcError, match="runtime='onnx' runs a frozen backbone; mode='finetune' trains it"):
        PretrainedEncoder.create("minilm", mode="finetune", runtime="onnx")
    with pytest.raises(DyntcError, match="runs a frozen backbone"):
        DynamicClassifier(train="backbone", encoder_options={"runtime": "onnx"}).fit(["a b", "c d"] * 3, ["x", "y"] * 3)

    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})
    enc = PretrainedEncoder.create("minilm", num_layers=0, runtime="onnx", cache=False)
    with pytest.warns(UserWarning, match="runtime='onnx' embeds on the CPU, not on cuda"):
        enc._frozen.embed(["warm up"], 16, torch.device("cuda"), 8)  # never touches CUDA
    model = next((cache / "onnx").rglob("model.onnx"))
    model.write_bytes(b"not an onnx file")
    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})
    with pytest.raises(DyntcError, match=r"onnxruntime could not load .*model.onnx.*delete the file"):
        _embed("onnx", ["a text"])

    import builtins

    real_import = builtins.__import__

    def without_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_onnxruntime)
    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})
    with pytest.raises(DyntcError, match=r"need onnxruntime, which is not installed: pip install"):
        _embed("onnx", ["a text"])


@pytest.mark.data
def test_cache_off_exports_to_a_temporary_directory(texts, monkeypatch):
    monkeypatch.setenv("DYNTC_CACHE", "off")
    monkeypatch.setattr("dyntc.core.encoders.pretrained._BACKBONES", {})
    monkeypatch.setattr(onnx_runtime, "_TEMP_DIRS", {})
    batch = [t for t, _ in texts["test"][:4]]
    np.testing.assert_allclose(_embed("onnx", batch), _embed("torch", batch), atol=2e-6)
    (folder,) = onnx_runtime._TEMP_DIRS.values()
    assert [p.name for p in Path(folder).iterdir()] == ["model.onnx"]


@pytest.mark.data
def test_unwritable_cache_falls_back_to_a_temporary_directory(texts, cache, monkeypatch):
    """An export that cannot be written under DYNTC_CACHE warns and goes to a temporary directory;
    a half-written export left by a killed process is removed once stale."""
    blocked = cache / "onnx"
    blocked.write_text("a file where the folder should be")  # mkdir under it fails
    monkeypatch.setattr(onnx_runtime, "_TEMP_DIRS", {})
    with pytest.warns(UserWarning, match="could not write the ONNX export"):
        _embed("onnx", ["a text"])
    assert len(onnx_runtime._TEMP_DIRS) == 1
    blocked.unlink()
    folder = next(iter(onnx_runtime._TEMP_DIRS.values()))
    import os
    import time

    stale = Path(folder) / ".model-int8-1-1.onnx"
    stale.write_bytes(b"half")
    os.utime(stale, (time.time() - 2 * onnx_runtime.STALE_SECONDS,) * 2)
    monkeypatch.setenv("DYNTC_CACHE", "off")
    pretrained._BACKBONES.clear()
    _embed("onnx-int8", ["a text"])
    assert not stale.exists() and (Path(folder) / "model-int8.onnx").is_file()


def test_a_failing_export_is_a_clear_error(cache, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("unsupported operator")

    monkeypatch.setattr(onnx_runtime, "export", broken)
    with pytest.raises(DyntcError, match=r"could not build the 'onnx' model of this backbone \(RuntimeError: unsupported operator\); use runtime='torch'"):
        _embed("onnx", ["a text"])
    assert not list((cache / "onnx").rglob("*.onnx"))  # nothing half-written left
