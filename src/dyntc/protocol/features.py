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
from dyntc.errors import DyntcError
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
        from dyntc.core.encoders import create_encoder

        hp = self.hp
        if self.plan.encoder == "sru":
            dropout = hp["dropout"] if dropout is None else dropout
            options = dict(hidden_size=hp["hidden_size"], num_layers=hp["num_layers"], dropout=dropout, max_len=hp["max_len"],
                           embeddings=self.plan.embeddings)
        else:  # a pretrained backbone: max_len counts word pieces; the head keeps its own dropout default
            options = dict(max_len=hp["max_len"], hidden_size=hp["hidden_size"])
        torch.manual_seed(derive_seed(self.plan.seed, split_seed, "encoder"))
        try:
            enc = create_encoder(self.plan.encoder, self.data.train.texts, **options)
        except TypeError as exc:  # a pretrained encoder that takes fewer options
            raise DyntcError(f"encoder {self.plan.encoder!r} does not accept the profile's options ({exc})") from exc
        if self.plan.encoder == "sru":
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
        dropout = self.plan.model_hp(model)["dropout"]
        if self.plan.encoder != "sru" or dropout == self.hp["dropout"]:
            return copy.deepcopy(enc0)
        return self.fresh(split_seed, dropout=dropout)
