"""Text encoders: the paper's GloVe + SRU, and pretrained sentence encoders (optional extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dyntc.encoders.base import TextEncoder
from dyntc.errors import DyntcError

__all__ = ["TextEncoder", "build_encoder", "check_encoder_options", "create_encoder"]


def _require_known(name: str) -> None:
    from dyntc.encoders.pretrained import is_pretrained_name

    if name != "sru" and not is_pretrained_name(name):
        raise DyntcError(
            f"unknown encoder {name!r}: use 'sru', 'minilm', or the path of a local sentence-transformers model"
        )


def check_encoder_options(name: str, **options) -> None:
    """Raise DyntcError unless `options` are valid config values for encoder `name` (cheap: builds
    no model, loads no file), so that a bad option fails before any data is read or trained on."""
    _require_known(name)
    if name == "sru":
        from dyntc.encoders.glove_sru import GloveSRUConfig

        GloveSRUConfig.from_options(**options)
    else:
        from dyntc.encoders.pretrained import config_from_options

        config_from_options(name, **options)


def create_encoder(name: str, train_texts: Sequence[str], **options) -> TextEncoder:
    """A fresh encoder: ``"sru"`` (GloVe + SRU; vocabulary from `train_texts`), or ``"minilm"`` /
    a local sentence-transformers directory (pretrained backbone + trainable head).

    `options` are the encoder's config fields (e.g. ``hidden_size``, ``num_layers``, ``dropout``,
    ``max_len``, ``embeddings`` for SRU); ``None`` values mean "use the default".
    """
    _require_known(name)
    if name == "sru":
        from dyntc.encoders.glove_sru import GloveSRUConfig, GloveSRUEncoder

        return GloveSRUEncoder.from_texts(train_texts, GloveSRUConfig.from_options(**options))
    from dyntc.encoders.pretrained import PretrainedEncoder

    return PretrainedEncoder.create(name, train_texts, **options)


def build_encoder(config: dict, extra: dict[str, Any] | None = None) -> TextEncoder:
    """Rebuild an encoder from ``config()`` (and ``extra_files()``) of a saved one."""
    kind = config.get("kind")
    if kind == "glove-sru":
        from dyntc.encoders.glove_sru import GloveSRUEncoder

        return GloveSRUEncoder.from_config(config, extra or {})
    if kind == "pretrained":
        from dyntc.encoders.pretrained import PretrainedEncoder

        return PretrainedEncoder.from_config(config, extra or {})
    raise DyntcError(f"unknown encoder kind {kind!r} in config; expected 'glove-sru' or 'pretrained'")
