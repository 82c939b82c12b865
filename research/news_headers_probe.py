"""Measured: how much NEWS's message headers are worth to a few-shot classifier, by n_fine
(docs/results.md §8.4).

    python research/news_headers_probe.py --n-fine 5,10,20,50,100,500 --seeds 5

dyntc's NEWS text is a message's Subject value and body; the other headers (From, Organization,
Lines, NNTP-Posting-Host, ...) are dropped because they name the author and the site. The paper does
not say how it preprocessed 20 Newsgroups (its 19,243 documents are not the bydate version's 18,846).
This probe measures what keeping them would change, with no neural network: for each seed it draws
n_fine training messages per newsgroup (the same messages for every text form), fits TF-IDF
(word unigrams + bigrams, sublinear tf) and a nearest-centroid rule (cosine, the prototype rule) and a
logistic regression, and scores the bydate test set over all 20 newsgroups. Text forms:

- ``subject+body``: dyntc's text (:func:`dyntc.protocol.data.datasets.news_message_text`);
- ``all headers``: the message as stored (bydate already dropped Path, Newsgroups, Xref, Date, ...);
- ``... first 200 tokens``: each form cut to the paper profile's ``max_len`` with dyntc's tokenizer.

It reads the tarball with dyntc's own reader (same files, order and checks) and prints one table.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import normalize

from dyntc.protocol.data.datasets import NEWS_SPEC, data_root, load, news_message_text, read_news_tarball
from dyntc.errors import DyntcError
from dyntc.protocol.plan import parse_int_list
from dyntc.core.text import tokenize


def read_news_messages(root: Path, verify: bool = True,
                       text: Callable[[str], str] = news_message_text) -> dict[str, tuple[list[str], list[str]]]:
    """The bydate tarball under `root` as ``{"train"|"test": (texts, newsgroups)}``, read by dyntc's own
    reader (counts, folders; with `verify`, the dataset's files checked as `dyntc reproduce` checks them
    first); each stored message becomes ``text(raw)`` (default: Subject and body; ``lambda raw: raw``
    keeps it whole)."""
    if verify:
        load("news", root)
    return read_news_tarball(Path(root) / NEWS_SPEC.folder / "20news-bydate.tar.gz", text)


def first_tokens(text: str, n: int) -> str:
    return " ".join(tokenize(text)[:n])


def scores(train_texts, train_y, test_texts, test_y) -> tuple[float, float]:
    """(nearest centroid, logistic regression) test accuracy."""
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1)
    x_train, x_test = vec.fit_transform(train_texts), vec.transform(test_texts)
    classes = np.unique(train_y)
    centroids = normalize(np.vstack([np.asarray(x_train[train_y == c].mean(axis=0)) for c in classes]))
    nc = classes[np.asarray(x_test @ centroids.T).argmax(axis=1)]
    lr = LogisticRegression(C=10.0, max_iter=2000).fit(x_train, train_y).predict(x_test)
    return float((nc == test_y).mean()), float((lr == test_y).mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", help="datasets directory (default: $DYNTC_DATA, else ~/.cache/dyntc)")
    ap.add_argument("--n-fine", default="5,10,20,50,100,500")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-len", type=int, default=200)
    args = ap.parse_args(argv)
    try:
        n_fines = list(parse_int_list(args.n_fine, "--n-fine") or ())
        if not n_fines or min(n_fines) < 1 or args.seeds < 1 or args.max_len < 1:
            raise DyntcError("--n-fine needs whole numbers >= 1, and --seeds and --max-len must be >= 1")
        raw = read_news_messages(data_root(args.data_dir), text=lambda message: message)
    except DyntcError as exc:
        raise SystemExit(f"error: {exc}") from None
    forms = {
        "subject+body": news_message_text,
        "all headers": lambda raw: raw,
        f"subject+body, first {args.max_len} tokens": lambda raw: first_tokens(news_message_text(raw), args.max_len),
        f"all headers, first {args.max_len} tokens": lambda raw: first_tokens(raw, args.max_len),
    }
    train_y, test_y = np.array(raw["train"][1]), np.array(raw["test"][1])
    texts = {name: ([f(t) for t in raw["train"][0]], [f(t) for t in raw["test"][0]]) for name, f in forms.items()}
    table = {name: {n: [] for n in n_fines} for name in forms}
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        for n in n_fines:
            pick = np.concatenate([rng.permutation(np.flatnonzero(train_y == c))[:n] for c in np.unique(train_y)])
            for name, (tr, te) in texts.items():
                table[name][n].append(scores([tr[i] for i in pick], train_y[pick], te, test_y))
    print(f"NEWS bydate test ({len(test_y)} messages, 20 newsgroups); mean over {args.seeds} draws of n_fine "
          "training messages per newsgroup; nearest centroid / logistic regression on TF-IDF, accuracy %")
    print("| text | " + " | ".join(f"n_fine {n}" for n in n_fines) + " |")
    print("|---|" + "---|" * len(n_fines))
    for name in forms:
        cells = [np.mean(table[name][n], axis=0) * 100 for n in n_fines]
        print(f"| {name} | " + " | ".join(f"{c[0]:.1f} / {c[1]:.1f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
