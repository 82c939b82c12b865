"""Text encoders: the paper's GloVe + SRU, and pretrained sentence encoders (optional extra)."""

from __future__ import annotations

from collections.abc import Sequence

from dyntc.encoders.base import TextEncoder, build_encoder
from dyntc.errors import DyntcError

__all__ = ["TextEncoder", "build_encoder", "create_encoder"]


def create_encoder(name: str, train_texts: Sequence[str], **options) -> TextEncoder:
    """A fresh encoder: ``"sru"`` (GloVe + SRU; vocabulary from `train_texts`), or ``"minilm"`` /
    a local sentence-transformers directory (pretrained backbone + trainable head).

    `options` are the encoder's config fields (e.g. ``hidden_size``, ``num_layers``, ``dropout``,
    ``max_len``, ``embeddings`` for SRU); ``None`` values mean "use the default".
    """
    options = {k: v for k, v in options.items() if v is not None}
    if name == "sru":
        from dyntc.encoders.glove_sru import GloveSRUConfig, GloveSRUEncoder

        unknown = set(options) - set(GloveSRUConfig.__dataclass_fields__)
        if unknown:
            raise DyntcError(f"options {sorted(unknown)} do not apply to the sru encoder")
        return GloveSRUEncoder.from_texts(train_texts, GloveSRUConfig(**options))
    from dyntc.encoders.pretrained import PretrainedEncoder, is_pretrained_name

    if is_pretrained_name(name):
        return PretrainedEncoder.create(name, train_texts, **options)
    raise DyntcError(
        f"unknown encoder {name!r}: use 'sru', 'minilm', or the path of a local sentence-transformers model"
    )
