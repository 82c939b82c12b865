"""Measured: how the paper's encoder depends on the size of its word vectors, downward from the 50-d
GloVe that ships (docs/results.md §8.4): a GloVe text file cut to its top principal components.

    dyntc export-glove --dataset news --out runs/glove-news-50d.txt
    python research/glove_reduce.py runs/glove-news-50d.txt --dim 25 --out runs/glove-news-25d.txt
    dyntc reproduce --dataset news --profile quick --embeddings runs/glove-news-25d.txt ...

The paper used 300-d GloVe; only the 50-d vectors ship on the package index here, so how the encoder's
results depend on the vectors' size cannot be measured upward. This measures it downward: each vector
is centred on the mean vector and projected on the top ``--dim`` right singular vectors of the centred
matrix (PCA, float64), i.e. the best ``--dim``-dimensional linear summary of the same vectors. The
words and their order are kept, so `dyntc reproduce --embeddings` builds the same vocabulary.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from dyntc.errors import DyntcError
from dyntc.core.files import atomic_write
from dyntc.core.text import read_glove_file


def principal_components(vectors: np.ndarray, dim: int) -> tuple[np.ndarray, float]:
    """(n, dim) projection of the centred vectors on their top `dim` principal axes, and the share of
    the variance it keeps."""
    if not 0 < dim <= vectors.shape[1]:
        raise DyntcError(f"--dim {dim}: must be between 1 and the vectors' {vectors.shape[1]} dimensions")
    centred = vectors - vectors.mean(axis=0)
    _, singular, axes = np.linalg.svd(centred, full_matrices=False)
    kept = float((singular[:dim] ** 2).sum() / (singular**2).sum())
    return centred @ axes[:dim].T, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("glove", type=Path, help="GloVe text file (e.g. from `dyntc export-glove`)")
    parser.add_argument("--dim", type=int, required=True, help="dimensions to keep")
    parser.add_argument("--out", type=Path, required=True, help="GloVe text file to write")
    args = parser.parse_args()
    try:
        if args.dim < 1:
            raise DyntcError(f"--dim {args.dim}: must be at least 1")
        index, vectors = read_glove_file(args.glove)
        reduced, kept = principal_components(vectors.astype(np.float64), args.dim)
    except DyntcError as exc:
        raise SystemExit(f"error: {exc}") from None
    words = sorted(index, key=index.get)  # the file's order (rows follow it)
    lines = (f"{word} " + " ".join(f"{v:.6f}" for v in row) for word, row in zip(words, reduced))
    with atomic_write(args.out) as tmp:
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(words)} words, {vectors.shape[1]} -> {args.dim} dimensions, {kept:.1%} of the variance kept: {args.out}")


if __name__ == "__main__":
    main()
