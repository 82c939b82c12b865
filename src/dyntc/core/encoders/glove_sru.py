"""The paper's encoder: frozen GloVe -> unidirectional SRU -> hidden state at the last real token."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from dyntc.core.encoders.base import TextEncoder, config_from_options
from dyntc.core.encoders.sru import SRU
from dyntc.errors import DyntcError, is_int, is_number
from dyntc.core.text import Vocabulary, build_vocabulary_and_embeddings, glove_lookup, tokenize


@dataclass
class GloveSRUConfig:
    hidden_size: int = 128
    num_layers: int = 4
    dropout: float = 0.5  # between SRU layers (paper: 0.5 NEWS/SENT, 0.3 WOS)
    max_len: int = 200  # tokens kept per text
    lower: bool = True
    min_count: int = 1
    embeddings: str | None = None  # GloVe text file; None = packaged glove.6B.50d

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "max_len", "min_count"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise DyntcError(f"{name} must be an integer >= 1, got {value!r}")
        if not (is_number(self.dropout) and 0.0 <= self.dropout < 1.0):
            raise DyntcError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not isinstance(self.lower, bool):
            raise DyntcError(f"lower must be True or False, got {self.lower!r}")
        if self.embeddings is not None:
            if not isinstance(self.embeddings, (str, os.PathLike)):
                raise DyntcError(f"embeddings must be the path of a GloVe text file or None, got {self.embeddings!r}")
            self.embeddings = os.fspath(self.embeddings)  # saved in the model's JSON config

    @classmethod
    def from_options(cls, **options) -> "GloveSRUConfig":
        """The config from keyword options (``None`` = the default), unknown names refused."""
        return config_from_options(cls, "sru", "", **options)


class GloveSRUEncoder(TextEncoder):
    """Frozen word vectors into a stack of SRU layers; a text's embedding is the top layer's
    output at its last non-padding token (the paper's "last-token state")."""

    def __init__(self, vocab: Vocabulary, vectors: np.ndarray, config: GloveSRUConfig):
        super().__init__()
        if vectors.shape[0] != len(vocab):
            raise DyntcError(f"{len(vocab)} vocabulary entries but {vectors.shape[0]} embedding rows")
        self.vocab = vocab
        self.cfg = config
        self.embedding = nn.Embedding.from_pretrained(torch.from_numpy(np.asarray(vectors)), freeze=True, padding_idx=0)
        self.sru = SRU(vectors.shape[1], config.hidden_size, num_layers=config.num_layers, dropout=config.dropout)
        self.output_dim = config.hidden_size

    @classmethod
    def create(cls, name: str, train_texts: Sequence[str], **options) -> "GloveSRUEncoder":
        """A fresh encoder whose vocabulary is the words of `train_texts` (options: GloveSRUConfig's fields)."""
        return cls.from_texts(train_texts, GloveSRUConfig.from_options(**options))

    @staticmethod
    def check_options(name: str, **options) -> None:
        GloveSRUConfig.from_options(**options)

    @classmethod
    def from_texts(cls, texts: Sequence[str], config: GloveSRUConfig | None = None) -> "GloveSRUEncoder":
        """Build the vocabulary from (training) `texts` and look its words up in GloVe."""
        config = config or GloveSRUConfig()
        vocab, vectors = build_vocabulary_and_embeddings(
            texts, lower=config.lower, min_count=config.min_count, embeddings=config.embeddings
        )
        return cls(vocab, vectors, config)

    def featurize(self, texts: Sequence[str]) -> list[torch.Tensor]:
        return [
            torch.tensor(self.vocab.ids(tokenize(t, self.cfg.lower), self.cfg.max_len), dtype=torch.long)
            for t in texts
        ]

    def collate(self, items: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        lengths = torch.tensor([len(x) for x in items], dtype=torch.long)
        ids = nn.utils.rnn.pad_sequence(list(items), batch_first=False, padding_value=0)  # (T, B)
        return {"ids": ids, "lengths": lengths}

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        steps = ids.shape[0]
        mask_pad = torch.arange(steps, device=ids.device)[:, None] >= lengths[None, :]
        output, _ = self.sru(self.embedding(ids), mask_pad=mask_pad)
        return output[lengths - 1, torch.arange(ids.shape[1], device=ids.device)]

    def extend_vocabulary(self, texts: Sequence[str]) -> int:
        """Append the unseen words of `texts` that GloVe knows, with their frozen vectors; returns how many.

        Nothing is trained: texts embedded before keep their points, and later examples of new labels
        are not reduced to ``<unk>``.
        """
        new = sorted({w for t in texts for w in tokenize(t, self.cfg.lower)} - self.vocab.index.keys())
        if not new:
            return 0
        found, dim = glove_lookup(new, self.cfg.embeddings, require=False)  # unknown words stay <unk>
        words = [w for w in new if w in found]
        old = self.embedding.weight.detach()
        if not words or dim != old.shape[1]:
            return 0
        rows = torch.as_tensor(np.stack([found[w] for w in words]), dtype=old.dtype, device=old.device)
        self.embedding = nn.Embedding.from_pretrained(torch.cat([old, rows]), freeze=True, padding_idx=0)
        self.vocab = Vocabulary(self.vocab.tokens + words)
        return len(words)

    def config(self) -> dict:
        return {"kind": "glove-sru", "vectors_shape": list(self.embedding.weight.shape), **asdict(self.cfg)}

    def extra_files(self) -> dict:
        return {"vocab": self.vocab.tokens}

    @classmethod
    def from_config(cls, config: dict, extra: dict) -> "GloveSRUEncoder":
        if "vocab" not in extra:
            raise DyntcError("saved glove-sru encoder is missing its vocabulary (vocab.json)")
        fields = {k: v for k, v in config.items() if k in GloveSRUConfig.__dataclass_fields__}
        rows, dim = config["vectors_shape"]
        # The frozen vectors are restored from the state dict; zeros are placeholders of the right shape.
        return cls(Vocabulary(extra["vocab"]), np.zeros((rows, dim), np.float32), GloveSRUConfig(**fields))
