"""A run's encoders and featurized texts: the fresh encoder every split starts from (seeded from the
split), a model's own copy of it, and the dataset's texts featurized once per process."""

from __future__ import annotations

import copy
import hashlib
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from dyntc.protocol.data.types import Dataset
from dyntc.protocol.plan import RunPlan, derive_seed
from dyntc.core.inference import Encoded


@dataclass
class Featurized:
    """Featurized items of a dataset's train / dev / test texts, shared by all splits."""

    train: list[Any]
    dev: list[Any]
    test: list[Any]
    signature: Any  # the encoder's extra_files(): equal signatures featurize identically

    def encoded(self, part: str, indices: np.ndarray, labels: list[str], classes: list[str]) -> Encoded:
        items = getattr(self, part)
        return Encoded.from_items([items[i] for i in indices], labels, classes)


def vocabulary_digest(enc) -> dict[str, Any]:
    """Size, dimension and sha256 of an SRU encoder's frozen vocabulary and vectors."""
    digest = hashlib.sha256("\n".join(enc.vocab.tokens).encode("utf-8"))
    digest.update(enc.embedding.weight.detach().cpu().numpy().astype("<f4").tobytes())
    return {"words": len(enc.vocab), "dim": int(enc.embedding.weight.shape[1]), "sha256": digest.hexdigest()}


class RunEncoders:
    """Encoders of `plan` over `data`. `check_vocabulary(digest, source)` sees every fresh SRU encoder's
    vocabulary (the results file refuses one that differs from the run's)."""

    def __init__(self, data: Dataset, plan: RunPlan, check_vocabulary: Callable[[dict, str], None],
                 log: Callable[[str], None]):
        self.data, self.plan, self.hp = data, plan, plan.hp
        self.check_vocabulary, self.log = check_vocabulary, log
        self._featurized: Featurized | None = None

    def fresh(self, split_seed: int, dropout: float | None = None):
        """The untrained encoder of the split with seed `split_seed` (the profile's dropout unless given)."""
        from dyntc.core.encoders import create_encoder, encoder_kind, encoder_options_for

        hp, name = self.hp, self.plan.encoder
        word_vectors = encoder_kind(name).word_vectors
        # the paper's SRU takes the profile's depth and dropout; a pretrained backbone's head keeps its own
        # (its max_len counts word pieces)
        options = encoder_options_for(
            name, hidden_size=hp["hidden_size"], max_len=hp["max_len"], embeddings=self.plan.embeddings,
            num_layers=hp["num_layers"] if word_vectors else None,
            dropout=(hp["dropout"] if dropout is None else dropout) if word_vectors else None)
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, "encoder"))
        enc = create_encoder(name, self.data.train.texts, **options)
        if word_vectors:
            self.check_vocabulary(vocabulary_digest(enc), self.plan.embeddings or "the packaged glove.6B.50d")
        return enc

    def features(self, enc) -> Featurized:
        """The dataset's texts featurized by `enc` (kept while encoders featurize alike)."""
        signature = enc.extra_files()
        if self._featurized is None or self._featurized.signature != signature:
            t0 = time.perf_counter()
            self._featurized = Featurized(
                enc.featurize(self.data.train.texts), enc.featurize(self.data.dev.texts),
                enc.featurize(self.data.test.texts), signature,
            )
            self.log(f"featurized {len(self.data.train) + len(self.data.dev) + len(self.data.test)} texts "
                     f"in {time.perf_counter() - t0:.1f}s")
        return self._featurized

    def for_model(self, model: str, enc0, split_seed: int):
        """A copy of the split's encoder `enc0`, or a fresh one (same seed) where `model` has its own
        dropout (a per-model setting, e.g. from tuning)."""
        from dyntc.core.encoders import encoder_kind

        dropout = self.plan.model_hp(model)["dropout"]
        if not encoder_kind(self.plan.encoder).word_vectors or dropout == self.hp["dropout"]:
            return copy.deepcopy(enc0)
        return self.fresh(split_seed, dropout=dropout)
