"""What every text encoder offers the models and trainers.

An encoder turns texts into vectors in two steps, so that the expensive, text-only part runs once
per text and not once per episode:

1. ``featurize(texts)`` -> one CPU item per text (token ids for the SRU, a cached backbone embedding
   for a frozen pretrained encoder). Deterministic, no gradient; trainers call it once per dataset.
2. ``collate(items)`` -> a dict of batched CPU tensors; ``forward(**batch)`` -> ``(B, output_dim)``.

``config()`` returns a JSON-able dict from which ``build_encoder(config)`` rebuilds an encoder of the
same shape (weights then come from a state dict); it must include ``"kind"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dyntc.errors import DyntcError


class TextEncoder(nn.Module):
    output_dim: int

    def featurize(self, texts: Sequence[str]) -> list[Any]:
        raise NotImplementedError

    def collate(self, items: Sequence[Any]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def config(self) -> dict:
        raise NotImplementedError

    def extra_files(self) -> dict[str, Any]:
        """JSON-able objects to save beside the weights (e.g. the vocabulary); see `build_encoder`."""
        return {}

    def encode(self, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
        """Embed `texts` without gradient, batches of similar length; ``(N, output_dim)``."""
        from dyntc.training import embed  # training builds on this module

        if len(texts) == 0:
            return torch.zeros(0, self.output_dim)
        return embed(self, self, self.featurize(texts), batch_size).cpu()


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
