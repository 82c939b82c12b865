"""A hashed bag of words and word pairs: the fast, dependency-free encoder.

A text's point is ``x / |x|`` where ``x[j] = Σ_t sign(t) log(1 + count(t))`` over its lower-cased
words and adjacent word pairs t with ``hash(t) mod dim = j`` (``sign(t)``: one more bit of the hash,
so that collisions cancel on average instead of adding up; Weinberger et al. 2009). Deterministic
(BLAKE2b, not Python's salted ``hash``), nothing to download and nothing to train: with
``DynamicClassifier(encoder="hashing")`` fitting only counts words. Texts that share words land near
each other, which is all a nearest-prototype classifier needs to be exercised end to end, so the test
suite uses it as its fast encoder; on real data it is a lexical baseline, well below MiniLM.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from dyntc.core.encoders.base import TextEncoder, config_from_options
from dyntc.errors import DyntcError, is_int

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True)
class HashingConfig:
    dim: int = 256  #: coordinates of a point
    pairs: bool = True  #: also hash adjacent word pairs

    def __post_init__(self) -> None:
        if not (is_int(self.dim) and self.dim >= 2):
            raise DyntcError(f"dim must be an integer >= 2, got {self.dim!r}")
        if not isinstance(self.pairs, bool):
            raise DyntcError(f"pairs must be True or False, got {self.pairs!r}")

    @classmethod
    def from_options(cls, **options) -> "HashingConfig":
        """The config from keyword options (``None`` = the default), unknown names refused."""
        return config_from_options(cls, "hashing", " (it takes dim, pairs)", **options)


def hashed_counts(text: str, dim: int, pairs: bool = True) -> torch.Tensor:
    """The unnormalised ``(dim,)`` vector of the module docstring."""
    words = _WORD.findall(text.lower())
    terms = Counter(words)
    if pairs:
        terms.update(f"{a} {b}" for a, b in zip(words, words[1:]))
    x = torch.zeros(dim, dtype=torch.float32)
    for term, count in terms.items():
        h = int.from_bytes(hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest(), "little")
        x[h % dim] += (1.0 if (h >> 63) & 1 else -1.0) * math.log1p(count)
    return x


class HashingEncoder(TextEncoder):
    """Texts to unit vectors of hashed word and word-pair counts; no parameters."""

    def __init__(self, config: HashingConfig | None = None):
        super().__init__()
        self.cfg = config or HashingConfig()
        self.output_dim = self.cfg.dim

    @classmethod
    def create(cls, name: str, train_texts: Sequence[str] | None = None, **options) -> "HashingEncoder":
        return cls(HashingConfig.from_options(**options))

    @staticmethod
    def check_options(name: str, **options) -> None:
        HashingConfig.from_options(**options)

    def featurize(self, texts: Sequence[str]) -> list[torch.Tensor]:
        if isinstance(texts, str):
            raise DyntcError("featurize takes a list of texts, not a single string")
        out = []
        for text in texts:
            x = hashed_counts(text, self.cfg.dim, self.cfg.pairs)
            norm = x.norm()
            out.append(x / norm if norm > 0 else x)  # a text of no words sits at the origin
        return out

    def collate(self, items: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"features": torch.stack(list(items))}

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def config(self) -> dict:
        return {"kind": "hashing", **asdict(self.cfg)}

    @classmethod
    def from_config(cls, config: dict, extra: dict | None = None) -> "HashingEncoder":
        return cls(HashingConfig(**{k: v for k, v in config.items() if k in HashingConfig.__dataclass_fields__}))
