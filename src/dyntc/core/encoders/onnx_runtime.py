"""ONNX Runtime inference of a frozen sentence-transformers backbone on the CPU (beyond the paper).

``runtime="onnx"`` runs the backbone's transformer exported to ONNX: the same float32 computation
(embeddings equal PyTorch's to ~1e-6), with ONNX Runtime's fused kernels: 1.4x PyTorch's throughput
with MiniLM on the 2-core CPU. ``runtime="onnx-int8"`` also quantizes the weights of every matrix
product to int8, one scale per output channel (activations quantized per batch at run time): 2.3x,
at cosine 0.99 on average (0.95 at worst) to the float32 embeddings, within 0.9 points of its
accuracy in the CLINC150 and HWU64 scenarios (docs/results.md §9.3). Only the transformer runs in ONNX; the model's own pooling and normalisation
modules run after it in PyTorch, so any sentence-transformers pooling configuration is kept.

The exported files are cached under ``$DYNTC_CACHE/onnx/<backbone fingerprint>-<recipe>/`` (written
atomically; a temporary directory when ``DYNTC_CACHE=off`` or unwritable) and rebuilt only when
missing. ONNX Runtime runs on the CPU even where a CUDA device is asked for (with a warning).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dyntc.errors import DyntcError

RUNTIMES = ("torch", "onnx", "onnx-int8")
INSTALL_HINT = "pip install 'dyntc[pretrained]' (it brings onnxruntime and onnx)"
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# what the exported files depend on (opset, quantization scheme): part of their folder's name and of the
# int8 embeddings' cache name, so a changed recipe never reuses old files
RECIPE = "opset17-int8pc"
STALE_SECONDS = 3600  # a half-written export older than this was left by a killed process
_TEMP_DIRS: dict[str, str] = {}  # cache off: one temporary export directory per backbone and process
_BUILD_LOCK = threading.Lock()


def check_runtime(runtime: str, mode: str) -> None:
    """`runtime` is one of :data:`RUNTIMES`, and ONNX runtimes go with a frozen backbone only."""
    if runtime not in RUNTIMES:
        raise DyntcError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    if runtime != "torch" and mode != "frozen":
        raise DyntcError(f"runtime={runtime!r} runs a frozen backbone; mode={mode!r} trains it, so it needs runtime='torch'")


def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as exc:
        raise DyntcError(f"runtime 'onnx' and 'onnx-int8' need onnxruntime, which is not installed: {INSTALL_HINT}") from exc
    return onnxruntime


class _TokenEmbeddings(nn.Module):
    """The transformer of a sentence-transformers model as a function of named int64 inputs."""

    def __init__(self, transformer: nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.transformer, self.names = transformer, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.transformer(**dict(zip(self.names, inputs))).last_hidden_state


def _hf_transformer(model) -> nn.Module:
    """The Hugging Face model inside the first module of a sentence-transformers pipeline."""
    first = model[0]
    hf = getattr(first, "auto_model", None)
    if not isinstance(hf, nn.Module):
        raise DyntcError("ONNX runtimes need a sentence-transformers model whose first module is a Transformer "
                         f"(found {type(first).__name__}); use runtime='torch'")
    return hf


def export(model, sample: dict[str, torch.Tensor], path: Path) -> None:
    """Export the transformer of sentence-transformers `model` to ONNX at `path`: inputs the token
    tensors its tokenizer makes (`sample`: one such batch; batch and length dynamic), output
    ``token_embeddings``."""
    names = tuple(k for k in _INPUTS if isinstance(sample.get(k), torch.Tensor))
    wrapper = _TokenEmbeddings(_hf_transformer(model), names).eval()
    axes = {name: {0: "batch", 1: "tokens"} for name in names + ("token_embeddings",)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(sample[n].to(torch.long) for n in names), str(path), input_names=list(names),
                          output_names=["token_embeddings"], dynamic_axes=axes, opset_version=17, dynamo=False)


def quantize(source: Path, target: Path) -> None:
    """Dynamic int8 quantization of `source`'s matrix products, one weight scale per output channel
    (per-tensor scales cost MiniLM 0.04 cosine; per channel 0.009)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs advice on static quantization pre-processing: not ours
    try:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)


def _temporary_folder(name: str) -> Path:
    if name not in _TEMP_DIRS:
        _TEMP_DIRS[name] = tempfile.mkdtemp(prefix="dyntc-onnx-")
        atexit.register(shutil.rmtree, _TEMP_DIRS[name], ignore_errors=True)
    return Path(_TEMP_DIRS[name])


def _build(model, sample: dict[str, torch.Tensor], folder: Path, runtime: str) -> Path:
    target = folder / ("model-int8.onnx" if runtime == "onnx-int8" else "model.onnx")
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{target.stem}-*.onnx"):  # left by a process killed while building
        if time.time() - stale.stat().st_mtime > STALE_SECONDS:
            stale.unlink(missing_ok=True)
    tmp = folder / f".{target.stem}-{os.getpid()}-{threading.get_ident()}.onnx"
    try:
        try:
            if runtime == "onnx-int8":
                quantize(_build(model, sample, folder, "onnx"), tmp)
            else:
                export(model, sample, tmp)
        except (OSError, DyntcError):
            raise
        except Exception as exc:  # noqa: BLE001 - the exporter and quantizer raise many types
            raise DyntcError(f"could not build the {runtime!r} model of this backbone ({type(exc).__name__}: {exc}); "
                             "use runtime='torch'") from exc
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def model_file(model, sample: dict[str, torch.Tensor], name: str, runtime: str, cache_root: Path | None) -> Path:
    """The ONNX file of `runtime` for backbone `model` (fingerprint `name`), built if missing, in
    ``cache_root/onnx/<name>-<RECIPE>/``; in a temporary directory (removed at exit) when `cache_root` is
    None or cannot be written."""
    with _BUILD_LOCK:  # one build per file within a process; across processes the rename is atomic
        if cache_root is not None:
            folder = cache_root / "onnx" / f"{name}-{RECIPE}"
            try:
                return _build(model, sample, folder, runtime)
            except OSError as exc:
                warnings.warn(f"dyntc: could not write the ONNX export under {folder} ({exc}); exporting to a "
                              "temporary directory instead (set DYNTC_CACHE to a writable directory)", stacklevel=4)
        return _build(model, sample, _temporary_folder(name), runtime)


class OnnxTokenEmbeddings:
    """Token embeddings of a backbone by ONNX Runtime on the CPU; call with the tokenizer's tensors
    (`sample`: one batch of them, for the export)."""

    def __init__(self, model, sample: dict[str, torch.Tensor], name: str, runtime: str, cache_root: Path | None):
        ort = _import_onnxruntime()
        self.path = model_file(model, sample, name, runtime, cache_root)
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
            raise DyntcError(f"onnxruntime could not load {self.path} ({type(exc).__name__}: {exc}): delete the "
                             "file and it is rebuilt") from exc
        self.inputs = [i.name for i in self.session.get_inputs()]

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        feed = {name: batch[name].to(torch.long).numpy() for name in self.inputs}
        return torch.from_numpy(np.asarray(self.session.run(None, feed)[0], dtype=np.float32))
