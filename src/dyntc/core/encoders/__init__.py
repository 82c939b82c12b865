"""Text encoders: the paper's GloVe + SRU, pretrained sentence encoders (optional extra), and a hashed
bag of words (fast, nothing to download).

One registry maps what a user names (``"sru"``, ``"hashing"``, ``"minilm"`` or a model directory) and
what a saved config records (its ``kind``) to the encoder class; each class brings its own
``check_options``, ``create`` and ``from_config``. Classes are imported when first used (the
pretrained one needs sentence-transformers).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dyntc.core.encoders.base import TextEncoder
from dyntc.errors import DyntcError

__all__ = ["ENCODERS", "TextEncoder", "build_encoder", "check_encoder_options", "create_encoder", "encoder_kind",
           "encoder_name", "encoder_options_for"]


def _pretrained_name(name: str) -> bool:
    from dyntc.core.encoders.pretrained import is_pretrained_name

    return is_pretrained_name(name)


@dataclass(frozen=True)
class EncoderKind:
    kind: str  #: what ``config()["kind"]`` records
    accepts: Callable[[str], bool]  #: whether a user-given encoder name means this kind
    module: str
    cls: str
    train_modes: tuple[str, ...]  #: what DynamicClassifier(train=...) may ask of it; the first is the default
    #: the options of a model's shape and training it takes (:func:`encoder_options_for`; others are its own)
    shape: tuple[str, ...]
    #: built on word vectors (GloVe) and trained as a whole, as in the paper: it takes ``embeddings``, has a
    #: vocabulary, featurizes texts into token ids (no sentence embeddings), and its dropout is the model's
    word_vectors: bool = False

    def load(self) -> type:
        return getattr(importlib.import_module(self.module), self.cls)


ENCODERS = (
    EncoderKind("glove-sru", lambda name: name == "sru", "dyntc.core.encoders.glove_sru", "GloveSRUEncoder", ("encoder",),
                ("hidden_size", "num_layers", "dropout", "max_len", "embeddings"), word_vectors=True),
    EncoderKind("hashing", lambda name: name == "hashing", "dyntc.core.encoders.hashing", "HashingEncoder", ("none",),
                ()),
    EncoderKind("pretrained", _pretrained_name, "dyntc.core.encoders.pretrained", "PretrainedEncoder",
                ("none", "backbone", "head"), ("mode", "train_layers", "hidden_size", "num_layers", "dropout", "max_len")),
)


def encoder_kind(name: Any) -> EncoderKind:
    """The registry entry of a user-given encoder name, with a clear error for anything else."""
    if isinstance(name, str) and name:
        for entry in ENCODERS:
            if entry.accepts(name):
                return entry
    raise DyntcError(
        f"unknown encoder {name!r}: use 'minilm', 'sru', 'hashing', or the path of a local sentence-transformers model"
    )


def encoder_options_for(name: str, *, mode: str | None = None, train_layers: int | None = None,
                        hidden_size: int | None = None, num_layers: int | None = None, dropout: float | None = None,
                        max_len: int | None = None, embeddings: str | None = None,
                        overrides: dict | None = None) -> dict:
    """Keyword options of :func:`create_encoder` for encoder `name` in a model of this shape, trained
    this way: those the encoder's kind takes (:attr:`EncoderKind.shape`: the GloVe + SRU's own size,
    depth, dropout, length and word vectors; a pretrained backbone's mode, trained layers and head; the
    hashing encoder none), then `overrides` (the user's own options, which win). None means the
    encoder's default."""
    given = {"mode": mode, "train_layers": train_layers, "hidden_size": hidden_size, "num_layers": num_layers,
             "dropout": dropout, "max_len": max_len, "embeddings": embeddings}
    shape = encoder_kind(name).shape
    return {**{k: v for k, v in given.items() if k in shape and v is not None}, **(overrides or {})}


def encoder_name(config: dict) -> str:
    """What a user would pass to rebuild an encoder of this saved `config`: ``"sru"``, ``"hashing"``,
    or the pretrained backbone (``"minilm"`` or its directory)."""
    kind = config.get("kind")
    if kind == "pretrained":
        return config["backbone"]
    names = {"glove-sru": "sru", "hashing": "hashing"}
    if kind not in names:
        raise DyntcError(f"unknown encoder kind {kind!r} in config")
    return names[kind]


def check_encoder_options(name: str, **options) -> None:
    """Raise DyntcError unless `options` are valid config values for encoder `name` (cheap: builds
    no model, loads no file), so that a bad option fails before any data is read or trained on."""
    encoder_kind(name).load().check_options(name, **options)


def create_encoder(name: str, train_texts: Sequence[str], **options) -> TextEncoder:
    """A fresh encoder: ``"sru"`` (GloVe + SRU; vocabulary from `train_texts`), ``"hashing"``, or
    ``"minilm"`` / a local sentence-transformers directory (pretrained backbone + trainable head).

    `options` are the encoder's config fields (e.g. ``hidden_size``, ``num_layers``, ``dropout``,
    ``max_len``, ``embeddings`` for SRU); ``None`` values mean "use the default".
    """
    return encoder_kind(name).load().create(name, train_texts, **options)


def build_encoder(config: dict, extra: dict[str, Any] | None = None) -> TextEncoder:
    """Rebuild an encoder from ``config()`` (and ``extra_files()``) of a saved one."""
    kind = config.get("kind")
    for entry in ENCODERS:
        if entry.kind == kind:
            return entry.load().from_config(config, extra or {})
    known = ", ".join(repr(e.kind) for e in ENCODERS)
    raise DyntcError(f"unknown encoder kind {kind!r} in config; expected one of {known}")
