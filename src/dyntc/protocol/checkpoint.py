"""Saving and loading trained models: one directory with weights (safetensors) and JSON config.

Layout of a model directory::

    config.json        format version, dyntc version, model kind and config, encoder config, meta
    encoder.json       encoder side files (e.g. the vocabulary)
    model.safetensors  the model's state dict, plus extra tensors under the "extra." prefix

Writes are atomic: everything goes to a temporary sibling directory that then replaces the target,
so an interrupted save never leaves a half-written model behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from dyntc._version import __version__
from dyntc.core.encoders import build_encoder
from dyntc.errors import DyntcError
from dyntc.core.files import atomic_directory, write_json
from dyntc.core.models import MLPClassifier, PrototypicalNetwork

FORMAT_VERSION = 1
_EXTRA = "extra."


# the networks a model directory may hold, by the "kind" its config.json names: class, and how it is
# made from the encoder and the rest of its config (the network's config())
_KINDS = {
    "prototypical": (PrototypicalNetwork, lambda encoder, spec: PrototypicalNetwork(encoder, **spec)),
    "mlp": (MLPClassifier, lambda encoder, spec: MLPClassifier(encoder, spec["n_classes"])),
}


def _model_kind(model) -> str:
    for kind, (cls, _) in _KINDS.items():
        if isinstance(model, cls):
            return kind
    raise DyntcError(f"cannot save a {type(model).__name__}")


def save_model(
    path: str | Path,
    model: PrototypicalNetwork | MLPClassifier,
    *,
    tensors: dict[str, torch.Tensor] | None = None,
    meta: dict | None = None,
) -> Path:
    """Save `model` (plus optional extra `tensors` and JSON-able `meta`) to the directory `path`."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    for name, value in (tensors or {}).items():
        state[_EXTRA + name] = value.detach().cpu().contiguous()
    config = {
        "format_version": FORMAT_VERSION,
        "dyntc_version": __version__,
        "model": {"kind": _model_kind(model), **model.config()},
        "encoder": model.encoder.config(),
        "meta": meta or {},
    }
    with atomic_directory(path) as tmp:
        save_file(state, str(tmp / "model.safetensors"))
        write_json(tmp / "encoder.json", model.encoder.extra_files())
        write_json(tmp / "config.json", config)
    return Path(path)


def read_config(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise DyntcError(f"model directory {str(path)!r} does not exist")
    files = ["config.json", "encoder.json", "model.safetensors"]
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        raise DyntcError(f"model directory {str(path)!r} is incomplete: missing {', '.join(missing)}")
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DyntcError(f"{path / 'config.json'} is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise DyntcError(f"{path / 'config.json'} is not a dyntc model config (a JSON object)")
    version = config.get("format_version")
    if version != FORMAT_VERSION:
        raise DyntcError(
            f"{path} was saved in model format {version!r} (dyntc {config.get('dyntc_version')}); "
            f"this dyntc {__version__} reads format {FORMAT_VERSION}: retrain or use the matching dyntc version"
        )
    return config


def load_model(path: str | Path) -> tuple[PrototypicalNetwork | MLPClassifier, dict[str, torch.Tensor], dict]:
    """Load a model saved by :func:`save_model` onto the CPU: ``(model, extra tensors, meta)``.

    A directory with the right files but damaged contents is a :class:`DyntcError` naming it."""
    path = Path(path)
    config = read_config(path)
    try:
        return _load_model(path, config)
    except (ValueError, KeyError, TypeError, AttributeError, OSError, SafetensorError) as exc:  # JSONDecodeError: ValueError
        if isinstance(exc, DyntcError):
            raise
        raise DyntcError(f"model directory {str(path)!r} is damaged ({type(exc).__name__}: {exc}); "
                         "save it again or restore it") from exc


def _load_model(path: Path, config: dict) -> tuple[PrototypicalNetwork | MLPClassifier, dict[str, torch.Tensor], dict]:
    extra_files = json.loads((path / "encoder.json").read_text(encoding="utf-8"))
    encoder = build_encoder(config["encoder"], extra_files)
    spec = dict(config["model"])
    kind = spec.pop("kind")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise DyntcError(f"{path}/config.json: unknown model kind {kind!r}")
    model = _KINDS[kind][1](encoder, spec)
    state = load_file(str(path / "model.safetensors"), device="cpu")
    tensors = {k[len(_EXTRA):]: v for k, v in state.items() if k.startswith(_EXTRA)}
    weights = {k: v for k, v in state.items() if not k.startswith(_EXTRA)}
    try:
        model.load_state_dict(weights)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[-1][:300]
        raise DyntcError(f"{path}/model.safetensors does not match its config.json ({first})") from exc
    return model.eval(), tensors, config["meta"]
